//! Snapshots the engine publishes for readers (metrics, admin, tests).
//!
//! The engine copies its counters into a preallocated snapshot every `SNAPSHOT_INTERVAL`
//! with `try_lock`: it never waits for a reader and never allocates to publish. Readers clone
//! the snapshot out under the lock.

use crate::buckets::{PHASE_TIME_BOUNDS_NS, TOKEN_COUNT_BOUNDS};
use crate::core::pool::{WorkerStatus, WorkerView};
use crate::core::strategy::auto::AutoSnapshot;
use crate::core::strategy::StrategyKind;
use crate::core::{CoreStats, Nanos, CLASS_COUNT};
use hdrhistogram::Histogram;

/// How often the engine publishes (ns).
pub const SNAPSHOT_INTERVAL_NS: Nanos = 50_000_000;

use crate::latency_histogram::latency_histogram;

/// One worker as published.
#[derive(Clone, Copy, Debug)]
pub struct WorkerSnapshot {
    /// The backend whose worker it is (its index in the router's backend order).
    pub backend: u16,
    pub status: WorkerStatus,
    pub circuit: crate::core::circuit::CircuitState,
    pub pending: u32,
    pub busy_ns: Nanos,
    pub batches_ok: u64,
    pub batches_failed: u64,
}

impl WorkerSnapshot {
    /// From the core's view at `now`, of a worker of backend `backend`.
    pub fn from_view(w: &WorkerView, backend: u16, now: Nanos) -> Self {
        WorkerSnapshot {
            backend,
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
    /// Prefix-cache counters over every replica (`None`: prefix caching off).
    pub prefix: Option<crate::core::prefix::PrefixStats>,
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
    /// State of the `dynamic` / `multi_bin` controllers (they learn only while one of them is
    /// in force; under another strategy this is what they learned when one last ran).
    pub research: crate::core::strategy::research::ResearchSnapshot,
    /// Slots, KV and step counters when running continuous batching.
    pub continuous: Option<ContinuousSnapshot>,
    /// One per backend, in the router's backend order.
    pub backends: Vec<BackendSnapshot>,
    /// Their names (set at start; from the config, never from a client).
    pub backend_names: Vec<String>,
    /// `auto`'s learned cost, arrivals and decisions, one per backend lane in the router's
    /// backend order (request-level batching; empty in continuous batching, which has no
    /// lanes). `auto` learns only while it is in force; under another strategy this is what
    /// it learned when it last ran.
    pub auto: Vec<AutoSnapshot>,
    /// Tokens, finish reasons, prefill and decode time of answered requests, since start.
    pub finished: FinishedStats,
    /// LoRA adapters running and waiting (`vllm:lora_requests_info`).
    pub lora: LoraSnapshot,
}

/// LoRA adapters as published: ids only (the io threads name them from `router::lora`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoraSnapshot {
    /// Adapters with a request in a running step or batch.
    pub running: crate::core::lora::AdapterSet,
    /// Adapters with a request waiting.
    pub waiting: crate::core::lora::AdapterSet,
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
    /// Active, draining (removed, finishing what it holds) or empty (gone: no series).
    pub slot: crate::router::SlotState,
    /// The `seq` of the last `SetSlot` the engine took for this slot: a control plane that
    /// sees `Empty` with the seq of its own last ask knows the drain it asked for is over
    /// (an older `Empty` may predate it).
    pub slot_seq: u32,
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
            slot: crate::router::SlotState::Active,
            slot_seq: 0,
        }
    }
}

impl Snapshot {
    /// An empty snapshot for `workers` workers (allocates once).
    pub fn new(workers: usize, strategy: StrategyKind) -> Self {
        let idle = WorkerSnapshot {
            backend: 0,
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
            finished: FinishedStats::default(),
            lora: LoraSnapshot::default(),
        }
    }
}

/// A histogram over fixed, ascending bounds given by the caller, as plain counters: `Copy`,
/// recorded in O(log N) without allocating (the engine records one per finished request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundedCounts<const N: usize> {
    /// `counts[i]`: values in `(bounds[i-1], bounds[i]]` (not cumulative).
    pub counts: [u64; N],
    /// Values above the last bound.
    pub overflow: u64,
    /// Sum of the recorded values (saturating).
    pub sum: u64,
}

impl<const N: usize> Default for BoundedCounts<N> {
    fn default() -> Self {
        BoundedCounts {
            counts: [0; N],
            overflow: 0,
            sum: 0,
        }
    }
}

impl<const N: usize> BoundedCounts<N> {
    /// Counts `value` in the first bucket whose bound is at least `value`.
    #[inline]
    pub fn record(&mut self, bounds: &[u64; N], value: u64) {
        let i = bounds.partition_point(|&b| b < value);
        match self.counts.get_mut(i) {
            Some(c) => *c += 1,
            None => self.overflow += 1,
        }
        self.sum = self.sum.saturating_add(value);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.overflow
    }

    /// `(bound, values <= bound)` for every bound, ascending.
    pub fn cumulative<'a>(&'a self, bounds: &'a [u64; N]) -> impl Iterator<Item = (u64, u64)> + 'a {
        let mut below = 0;
        bounds.iter().zip(self.counts).map(move |(&b, c)| {
            below += c;
            (b, below)
        })
    }
}

/// Why a request left the engine, as vLLM's `finished_reason` label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishedReason {
    /// A stop sequence, end of sequence, or an embedding / tool call answered.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Failed or cancelled after admission.
    Abort,
}

impl FinishedReason {
    pub const COUNT: usize = 3;
    pub const ALL: [FinishedReason; 3] = [
        FinishedReason::Stop,
        FinishedReason::Length,
        FinishedReason::Abort,
    ];

    /// vLLM's label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            FinishedReason::Stop => "stop",
            FinishedReason::Length => "length",
            FinishedReason::Abort => "abort",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Per-request counts of finished requests (both batching modes): what vLLM exports per
/// request and abe's core does not keep (tokens, finish reasons, prefill and decode time).
/// Plain counters the engine updates in place as it answers each request and copies into
/// the snapshot at publish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishedStats {
    /// Requests answered, by [`FinishedReason::index`].
    pub by_reason: [u64; FinishedReason::COUNT],
    /// Prompt tokens of requests answered with an output.
    pub prompt_tokens: BoundedCounts<16>,
    /// Output tokens of completions answered.
    pub generation_tokens: BoundedCounts<16>,
    /// `max_tokens` asked for by completions answered.
    pub max_tokens: BoundedCounts<16>,
    /// Arrival to first token (streams), or to the answer (queue time included: abe does
    /// not stamp the instant a request is scheduled).
    pub prefill_ns: BoundedCounts<20>,
    /// First token to the answer (0 when the whole answer came at once).
    pub decode_ns: BoundedCounts<20>,
}

impl FinishedStats {
    /// Records one answer with an output, `now` being when it is answered.
    #[inline]
    pub fn record_output(
        &mut self,
        output: &crate::exec::OutputSummary,
        max_tokens: u32,
        arrival_ns: Nanos,
        first_token_ns: Nanos,
        now: Nanos,
    ) {
        use crate::exec::FinishReason;
        let reason = match output.finish_reason {
            Some(finish_reason) => {
                self.generation_tokens
                    .record(&TOKEN_COUNT_BOUNDS, u64::from(output.completion_tokens));
                self.max_tokens
                    .record(&TOKEN_COUNT_BOUNDS, u64::from(max_tokens));
                match finish_reason {
                    FinishReason::Length => FinishedReason::Length,
                    FinishReason::Stop | FinishReason::ToolCalls => FinishedReason::Stop,
                }
            }
            // An embedding.
            None => FinishedReason::Stop,
        };
        let prompt = output.prompt_tokens;
        self.prompt_tokens
            .record(&TOKEN_COUNT_BOUNDS, u64::from(prompt));
        self.by_reason[reason.index()] += 1;
        let first = if first_token_ns == 0 {
            now
        } else {
            first_token_ns
        };
        self.prefill_ns
            .record(&PHASE_TIME_BOUNDS_NS, first.saturating_sub(arrival_ns));
        self.decode_ns
            .record(&PHASE_TIME_BOUNDS_NS, now.saturating_sub(first));
    }

    /// Records one request that failed after admission.
    #[inline]
    pub fn record_abort(&mut self) {
        self.by_reason[FinishedReason::Abort.index()] += 1;
    }
}
