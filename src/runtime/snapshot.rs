//! Snapshots the engine publishes for readers (metrics, admin, tests).
//!
//! The engine copies its counters into a preallocated snapshot every `SNAPSHOT_INTERVAL`
//! with `try_lock`: it never waits for a reader and never allocates to publish. Readers clone
//! the snapshot out under the lock.

use crate::core::pool::{WorkerStatus, WorkerView};
use crate::core::strategy::auto::AutoSnapshot;
use crate::core::strategy::StrategyKind;
use crate::core::{CoreStats, Nanos, CLASS_COUNT};
use hdrhistogram::Histogram;

/// How often the engine publishes (ns).
pub const SNAPSHOT_INTERVAL_NS: Nanos = 50_000_000;

/// Highest latency the histograms track exactly: 1 hour in ns; larger values saturate.
pub const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// A new latency histogram in ns, 3 significant digits, fixed range (never resizes).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("static histogram bounds are valid")
}

/// One worker as published.
#[derive(Clone, Copy, Debug)]
pub struct WorkerSnapshot {
    pub status: WorkerStatus,
    pub circuit: crate::core::circuit::CircuitState,
    pub pending: u32,
    pub busy_ns: Nanos,
    pub batches_ok: u64,
    pub batches_failed: u64,
}

impl WorkerSnapshot {
    /// From the core's view at `now`.
    pub fn from_view(w: &WorkerView, now: Nanos) -> Self {
        WorkerSnapshot {
            status: w.status(),
            circuit: w.circuit.last_state(),
            pending: w.pending,
            busy_ns: w.busy_ns(now),
            batches_ok: w.batches_ok,
            batches_failed: w.batches_failed,
        }
    }
}

/// Continuous-batching state (only in `batching.mode = "continuous"`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ContinuousSnapshot {
    pub stats: crate::core::continuous::ContinuousStats,
    pub slots_total: usize,
    pub active_slots: usize,
    pub kv_used_tokens: u64,
    pub kv_capacity_tokens: u64,
    /// Output tokens generated, over all completed requests.
    pub output_tokens: u64,
}

/// Everything the engine publishes.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Engine clock at publication.
    pub at_ns: Nanos,
    pub stats: CoreStats,
    pub strategy: StrategyKind,
    pub queued_by_class: [usize; CLASS_COUNT],
    pub queued: usize,
    pub live_requests: usize,
    pub observed_p99_ns: Option<Nanos>,
    pub workers: Vec<WorkerSnapshot>,
    /// End-to-end latency of completed requests (ns), since start.
    pub latency: Histogram<u64>,
    /// The same, per priority class (indexed by `Priority::index`, low = 0).
    pub latency_by_priority: [Histogram<u64>; crate::core::Priority::COUNT],
    /// Batch sizes, since start.
    pub batch_size: Histogram<u64>,
    /// Continuous batching: time to first token (ns), since start.
    pub ttft: Histogram<u64>,
    /// Continuous batching: time per output token after the first (ns), since start.
    pub tpot: Histogram<u64>,
    /// Requests refused before reaching the core (intake ring full).
    pub rejected_busy: u64,
    /// Latency / batch-size samples lost because a reader held the snapshot lock while the
    /// engine's sample buffer was full (expected 0).
    pub samples_dropped: u64,
    pub draining: bool,
    /// State of the `dynamic` / `multi_bin` controllers (kept current whatever the strategy).
    pub research: crate::core::research::ResearchSnapshot,
    /// Slots, KV and step counters when running continuous batching.
    pub continuous: Option<ContinuousSnapshot>,
    /// One per backend, in the router's backend order.
    pub backends: Vec<BackendSnapshot>,
    /// Their names (set at start; from the config, never from a client).
    pub backend_names: Vec<String>,
    /// `auto`'s learned cost, arrivals and decisions, one per backend lane in the router's
    /// backend order (request-level batching; empty in continuous batching, which has no
    /// lanes). Kept current whatever the strategy: the model learns under every strategy.
    pub auto: Vec<AutoSnapshot>,
}

/// A backend's routing state and counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackendSnapshot {
    /// Last health probe succeeded (always true for `sim` backends).
    pub healthy: bool,
    /// Closed while any of its workers takes work; half-open while one is due a probe
    /// batch; open while every worker's circuit is open.
    pub circuit: crate::core::circuit::CircuitState,
    /// Batches dispatched and not yet back.
    pub pending_batches: u32,
    /// Smoothed batch latency (ms); `None` before the first batch.
    pub latency_ema_ms: Option<f64>,
    /// Requests routed here (first choice or retry).
    pub routed: u64,
    /// Requests moved from here to another backend after a failure.
    pub retried_away: u64,
    /// Requests answered with this backend's error (no retry left).
    pub failed: u64,
    /// Requests routed here through an alias or a fallback chain.
    pub via_alias: u64,
    pub via_fallback: u64,
}

impl Default for BackendSnapshot {
    fn default() -> Self {
        BackendSnapshot {
            healthy: true,
            circuit: crate::core::circuit::CircuitState::Closed,
            pending_batches: 0,
            latency_ema_ms: None,
            routed: 0,
            retried_away: 0,
            failed: 0,
            via_alias: 0,
            via_fallback: 0,
        }
    }
}

impl Snapshot {
    /// An empty snapshot for `workers` workers (allocates once).
    pub fn new(workers: usize, strategy: StrategyKind) -> Self {
        let idle = WorkerSnapshot {
            status: WorkerStatus::Idle,
            circuit: crate::core::circuit::CircuitState::Closed,
            pending: 0,
            busy_ns: 0,
            batches_ok: 0,
            batches_failed: 0,
        };
        Snapshot {
            at_ns: 0,
            stats: CoreStats::default(),
            strategy,
            queued_by_class: [0; CLASS_COUNT],
            queued: 0,
            live_requests: 0,
            observed_p99_ns: None,
            workers: vec![idle; workers],
            latency: latency_histogram(),
            latency_by_priority: std::array::from_fn(|_| latency_histogram()),
            batch_size: Histogram::new_with_bounds(1, 1 << 20, 3)
                .expect("static histogram bounds are valid"),
            ttft: latency_histogram(),
            tpot: latency_histogram(),
            rejected_busy: 0,
            samples_dropped: 0,
            draining: false,
            research: Default::default(),
            continuous: None,
            backends: Vec::new(),
            backend_names: Vec::new(),
            auto: Vec::new(),
        }
    }
}
