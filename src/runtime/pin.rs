//! Thread pinning with core_affinity, and the placement of runtime threads on cores.
//!
//! A failed pin is logged with the thread's name and the thread runs unpinned.

use super::idle::IdlePolicy;

/// Which core each runtime thread is pinned to, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub engine: Option<usize>,
    pub workers: Vec<Option<usize>>,
    /// The HTTP io threads (pinned by the front end, which asks the runtime's handle).
    pub io: Vec<Option<usize>>,
}

/// Plans placement on `cores` cores for `workers` worker threads and `io` io threads.
///
/// A server (io threads present) on 1 or 2 cores puts every thread on the last core, which
/// leaves the other one to clients and the rest of the system: the threads hand work to each
/// other by yielding, at once and with warm caches, instead of waking each other across
/// cores. Measured on 2 cores with wrk at c=64 (BENCHMARKS.md): 6.1 us of server CPU per
/// request against 6.8 with the workers on the other core and 7.2 unpinned. Without io
/// threads (the in-process `Handle`) the callers' threads are not ours to place, and the
/// engine sharing its core with the workers measured worse (`runtime/round_trip` 17.5 us
/// against 6.3), so otherwise the engine gets the last core, io threads the cores below it
/// (one each, while that leaves a core for workers; otherwise they share the engine's), and
/// workers the cores left, round-robin (on one core, where none is left, the engine's).
/// Threads that busy-spin (idle policy `spin`) never share one core on purpose: each would
/// burn the others' time. Unpinned when `pin` is false.
pub fn plan(pin: bool, cores: usize, workers: usize, io: usize, idle: IdlePolicy) -> Placement {
    if !pin || cores == 0 {
        return Placement {
            engine: None,
            workers: vec![None; workers],
            io: vec![None; io],
        };
    }
    let engine = cores - 1;
    if cores <= 2 && io > 0 && idle != IdlePolicy::Spin {
        return Placement {
            engine: Some(engine),
            workers: vec![Some(engine); workers],
            io: vec![Some(engine); io],
        };
    }
    let io_own_cores = cores >= io + 2;
    let io_cores = (0..io)
        .map(|i| Some(if io_own_cores { engine - 1 - i } else { engine }))
        .collect();
    let worker_cores = if io_own_cores {
        cores - 1 - io
    } else {
        cores - 1
    };
    // On one core (the in-process handle, or a spinning server) no core is left for the
    // workers: they share the engine's, the only one there is.
    let workers = if worker_cores == 0 {
        vec![Some(engine); workers]
    } else {
        (0..workers).map(|i| Some(i % worker_cores)).collect()
    };
    Placement {
        engine: Some(engine),
        workers,
        io: io_cores,
    }
}

/// Pins the calling thread to core `id` (by position in core_affinity's list).
pub fn pin_current(name: &str, id: Option<usize>) {
    let Some(id) = id else { return };
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    match ids.get(id) {
        Some(core) if core_affinity::set_for_current(*core) => {
            tracing::debug!(thread = name, core = id, "pinned");
        }
        _ => tracing::warn!(
            thread = name,
            core = id,
            "could not pin thread; running unpinned"
        ),
    }
}

/// Number of cores core_affinity can see (1 when unknown).
pub fn core_count() -> usize {
    core_affinity::get_core_ids()
        .map(|v| v.len())
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IdlePolicy = IdlePolicy::Adaptive;

    #[test]
    fn spinning_threads_are_not_put_on_one_core() {
        let p = plan(true, 2, 4, 1, IdlePolicy::Spin);
        assert_eq!(p.engine, Some(1));
        assert_eq!(p.workers, vec![Some(0); 4]);
        assert_eq!(
            plan(true, 2, 4, 1, IdlePolicy::Park).workers,
            vec![Some(1); 4]
        );
    }

    #[test]
    fn a_server_on_two_cores_or_fewer_puts_everything_on_the_last_core() {
        let p = plan(true, 2, 4, 1, A);
        assert_eq!(p.engine, Some(1));
        assert_eq!(p.io, vec![Some(1)]);
        assert_eq!(p.workers, vec![Some(1); 4]);
        let p = plan(true, 1, 2, 1, A);
        assert_eq!(
            (p.engine, p.io, p.workers),
            (Some(0), vec![Some(0)], vec![Some(0); 2])
        );
        assert_eq!(plan(false, 4, 2, 1, A).engine, None);
        assert_eq!(plan(false, 4, 2, 1, A).io, vec![None]);
        assert_eq!(plan(false, 4, 2, 1, A).workers, vec![None; 2]);
    }

    #[test]
    fn on_more_cores_engine_io_and_workers_get_cores_of_their_own() {
        // 8 cores, 2 io threads: engine 7, io 6 and 5, workers on 0..=4.
        let p = plan(true, 8, 6, 2, A);
        assert_eq!(p.engine, Some(7));
        assert_eq!(p.io, vec![Some(6), Some(5)]);
        assert_eq!(
            p.workers,
            vec![Some(0), Some(1), Some(2), Some(3), Some(4), Some(0)]
        );
        // 4 cores, no io threads (in-process use): workers on 0..=2.
        let p = plan(true, 4, 4, 0, A);
        assert_eq!(p.workers, vec![Some(0), Some(1), Some(2), Some(0)]);
        // 3 cores, 2 io threads: no core would be left for workers, so io shares the engine's.
        let p = plan(true, 3, 2, 2, A);
        assert_eq!(p.io, vec![Some(2), Some(2)]);
        assert_eq!(p.workers, vec![Some(0), Some(1)]);
    }

    #[test]
    fn one_core_without_io_threads_or_spinning_puts_the_workers_on_the_engines_core() {
        // Used to divide by zero: no core is left for workers (`i % 0`).
        let p = plan(true, 1, 3, 0, A);
        assert_eq!((p.engine, p.workers), (Some(0), vec![Some(0); 3]));
        let p = plan(true, 1, 2, 1, IdlePolicy::Spin);
        assert_eq!(
            (p.engine, p.io, p.workers),
            (Some(0), vec![Some(0)], vec![Some(0); 2])
        );
        assert_eq!(plan(true, 1, 0, 0, A).workers, Vec::new());
    }
}
