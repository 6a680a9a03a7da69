//! Figures both renderers compute from a snapshot (unit conversions, utilisation, throughput,
//! request outcomes, label tables), kept in one place so /metrics and /metrics/json agree.
//!
//! Pure functions of their arguments: no clock reads, no shared state. They run on io
//! threads, never on the engine thread.

use crate::core::circuit::CircuitState;
use crate::core::pool::WorkerStatus;
use crate::core::{CoreStats, Nanos};
use crate::runtime::Snapshot;
use hdrhistogram::Histogram;

/// Nanoseconds in a second, as `f64` for conversions.
pub const NANOS_PER_SECOND_F64: f64 = 1e9;
/// Nanoseconds in a millisecond, as `f64` for conversions.
pub const NANOS_PER_MS_F64: f64 = 1e6;

/// `ns` in seconds.
pub fn ns_to_seconds(ns: Nanos) -> f64 {
    ns as f64 / NANOS_PER_SECOND_F64
}

/// `ns` in milliseconds.
pub fn ns_to_ms(ns: Nanos) -> f64 {
    ns as f64 / NANOS_PER_MS_F64
}

/// Fraction `0..=1` of `elapsed_ns` a worker spent busy (0 before any time has passed).
/// Clamped: the worker's busy clock and the engine clock are read at slightly different
/// instants, so the raw ratio can overshoot 1 by a hair.
pub fn utilization_ratio(busy_ns: Nanos, elapsed_ns: Nanos) -> f64 {
    if elapsed_ns == 0 {
        return 0.0;
    }
    (busy_ns as f64 / elapsed_ns as f64).clamp(0.0, 1.0)
}

/// Completed requests per second over `elapsed_ns` (0 before any time has passed).
pub fn throughput_rps(completed: u64, elapsed_ns: Nanos) -> f64 {
    if elapsed_ns == 0 {
        return 0.0;
    }
    completed as f64 / ns_to_seconds(elapsed_ns)
}

/// The value at `quantile` of a histogram in ns, in milliseconds (0 when empty).
pub fn quantile_ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    if histogram.is_empty() {
        return 0.0;
    }
    ns_to_ms(histogram.value_at_quantile(quantile))
}

/// Approximate sum of a histogram's recorded values: mean of bucket midpoints times count
/// (hdrhistogram keeps 3 significant digits, so this is within 0.1 % of the true sum).
pub fn approx_sum(histogram: &Histogram<u64>) -> f64 {
    histogram.mean() * histogram.len() as f64
}

/// Label / key of worker `index`: "worker-0", "worker-1", ...
pub fn worker_id(index: usize) -> String {
    format!("worker-{index}")
}

/// The workers both renderers list, with their ids: those of every backend slot that is not
/// empty (an empty slot's workers wait for a backend to fill it).
pub fn shown_workers(
    snapshot: &Snapshot,
) -> impl Iterator<Item = (String, &crate::runtime::snapshot::WorkerSnapshot)> {
    snapshot
        .workers
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            snapshot
                .backends
                .get(usize::from(w.backend))
                .is_none_or(|b| b.slot != crate::router::SlotState::Empty)
        })
        .map(|(i, w)| (worker_id(i), w))
}

/// Every worker status, in metric order.
pub const WORKER_STATUSES: [WorkerStatus; 3] = [
    WorkerStatus::Idle,
    WorkerStatus::Busy,
    WorkerStatus::Unhealthy,
];

/// Every circuit state, in metric order.
pub const CIRCUIT_STATES: [CircuitState; 3] = [
    CircuitState::Closed,
    CircuitState::Open,
    CircuitState::HalfOpen,
];

// Exhaustive matches: a new status or circuit state breaks the build here until the tables
// above list it.
const _: () = {
    const fn status_position(s: WorkerStatus) -> usize {
        match s {
            WorkerStatus::Idle => 0,
            WorkerStatus::Busy => 1,
            WorkerStatus::Unhealthy => 2,
        }
    }
    const fn circuit_position(c: CircuitState) -> usize {
        match c {
            CircuitState::Closed => 0,
            CircuitState::Open => 1,
            CircuitState::HalfOpen => 2,
        }
    }
    let mut i = 0;
    while i < 3 {
        assert!(status_position(WORKER_STATUSES[i]) == i);
        assert!(circuit_position(CIRCUIT_STATES[i]) == i);
        i += 1;
    }
};

/// Number of request outcomes in [`request_outcomes`].
pub const OUTCOME_COUNT: usize = 10;

/// Final outcomes of requests, `(label, count)`. Each finished or refused request is in
/// exactly one: `completed` plus the failure reasons sum to `stats.completed + stats.failed`
/// (`failed_other` holds failures of any reason the core adds later), and the `rejected_*`
/// outcomes are requests never admitted.
pub fn request_outcomes(snapshot: &Snapshot) -> [(&'static str, u64); OUTCOME_COUNT] {
    let s = &snapshot.stats;
    [
        ("completed", s.completed),
        ("expired", s.expired),
        ("batch_timeout", s.batch_timeouts),
        ("worker_error", s.worker_errors),
        ("cancelled", s.cancelled),
        ("aborted", s.aborted),
        ("failed_other", failed_other(s)),
        ("rejected_full", s.rejected_full),
        ("rejected_draining", s.rejected_draining),
        ("rejected_busy", snapshot.rejected_busy),
    ]
}

/// Failures not attributed to a known reason (0 while the core counts every reason).
pub fn failed_other(stats: &CoreStats) -> u64 {
    let known = stats.expired
        + stats.batch_timeouts
        + stats.worker_errors
        + stats.cancelled
        + stats.aborted;
    stats.failed.saturating_sub(known)
}

/// Requests refused before admission, any reason.
pub fn rejected_total(snapshot: &Snapshot) -> u64 {
    snapshot.stats.rejected_full + snapshot.stats.rejected_draining + snapshot.rejected_busy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::strategy::StrategyKind;

    #[test]
    fn utilization_is_a_clamped_fraction() {
        assert_eq!(utilization_ratio(0, 0), 0.0);
        assert_eq!(utilization_ratio(5, 0), 0.0);
        assert_eq!(utilization_ratio(250, 1000), 0.25);
        assert_eq!(utilization_ratio(1001, 1000), 1.0);
    }

    #[test]
    fn throughput_is_per_second_of_engine_time() {
        assert_eq!(throughput_rps(10, 0), 0.0);
        assert_eq!(throughput_rps(300, 2_000_000_000), 150.0);
    }

    #[test]
    fn quantiles_of_an_empty_histogram_are_zero() {
        let snap = Snapshot::new(0, StrategyKind::Fixed);
        assert_eq!(quantile_ms(&snap.latency, 0.99), 0.0);
        assert_eq!(approx_sum(&snap.latency), 0.0);
    }

    #[test]
    fn outcomes_partition_finished_and_refused_requests() {
        let mut snap = Snapshot::new(0, StrategyKind::Fixed);
        let s = &mut snap.stats;
        s.completed = 10;
        s.failed = 9;
        s.expired = 1;
        s.batch_timeouts = 2;
        s.worker_errors = 1;
        s.cancelled = 1;
        s.aborted = 1;
        s.rejected_full = 4;
        s.rejected_draining = 2;
        snap.rejected_busy = 3;
        let outcomes = request_outcomes(&snap);
        let get = |name| outcomes.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(get("failed_other"), 3);
        let finished: u64 = outcomes
            .iter()
            .filter(|(n, _)| !n.starts_with("rejected_"))
            .map(|(_, c)| c)
            .sum();
        assert_eq!(finished, 19);
        assert_eq!(rejected_total(&snap), 9);
    }
}
