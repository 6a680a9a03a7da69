//! Thread pinning with core_affinity, and the placement of runtime threads on cores.
//!
//! A failed pin is logged with the thread's name and the thread runs unpinned.

/// Which core each runtime thread is pinned to, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub engine: Option<usize>,
    pub workers: Vec<Option<usize>>,
}

/// Plans placement on `cores` cores for `workers` worker threads. The engine gets the last
/// core to itself; workers share the others round-robin (with one core, everything shares
/// it). Unpinned when `pin` is false.
pub fn plan(pin: bool, cores: usize, workers: usize) -> Placement {
    if !pin || cores == 0 {
        return Placement {
            engine: None,
            workers: vec![None; workers],
        };
    }
    let engine = cores - 1;
    let others = if cores > 1 { cores - 1 } else { 1 };
    Placement {
        engine: Some(engine),
        workers: (0..workers).map(|i| Some(i % others)).collect(),
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

    #[test]
    fn engine_gets_its_own_core_and_workers_share_the_rest() {
        let p = plan(true, 2, 4);
        assert_eq!(p.engine, Some(1));
        assert_eq!(p.workers, vec![Some(0); 4]);
        let p = plan(true, 4, 4);
        assert_eq!(p.workers, vec![Some(0), Some(1), Some(2), Some(0)]);
        assert_eq!(plan(false, 4, 2).engine, None);
    }
}
