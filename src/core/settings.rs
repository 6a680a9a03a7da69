//! The core's own settings: plain numbers and choices, already checked by whoever built
//! them (`crate::config` for the live server, `crate::sim::settings` for the simulator).
//! Nothing here reads text beyond the names of its choices.

use super::balancer::BalancerKind;
use super::circuit::CircuitParams;
use super::request::{Nanos, Priority};
use super::strategy::{StrategyKind, StrategyParams};

/// How requests become work for the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BatchingMode {
    /// Request-level: a strategy forms batches from per-class queues ([`super::Core`]).
    #[default]
    Request,
    /// Iteration-level: every tick one forward pass mixing decode tokens and prefill
    /// chunks over a replica's slots ([`super::continuous::Continuous`]).
    Continuous,
}

impl BatchingMode {
    /// Every mode, in the order they are listed to users.
    pub const ALL: [BatchingMode; 2] = [BatchingMode::Request, BatchingMode::Continuous];

    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BatchingMode::Request => "request",
            BatchingMode::Continuous => "continuous",
        }
    }
}

impl std::fmt::Display for BatchingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BatchingMode {
    type Err = super::strategy::research::bins::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| super::strategy::research::bins::UnknownName {
                what: "batching mode",
                name: s.to_string(),
                valid: "request, continuous",
            })
    }
}

super::names::serde_by_name!(BatchingMode);

/// Most workers one core schedules (`workers.count`, a scenario's `engine.workers`).
pub const WORKERS_MAX: usize = 1024;

/// Everything the scheduling core needs to be built. All sizes are fixed at `Core::new`.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    /// Requests the table holds (queued + in flight). Spec default 10000.
    pub queue_capacity: usize,
    /// Most requests in one batch. Spec default 32.
    pub max_batch_size: usize,
    /// A strategy timeout releases a batch only once it holds this many requests (max wait,
    /// critical, full, idle worker and drain still release smaller ones). Spec default 1.
    pub min_batch_size: usize,
    /// Most estimated tokens in one batch (a single larger request still goes alone).
    pub max_batch_tokens: u32,
    /// A batch holds requests of one token bucket only.
    pub token_bucketing: bool,
    /// When false every request is treated as `normal` priority.
    pub priority_enabled: bool,
    /// Strategy in force at start.
    pub strategy: StrategyKind,
    /// Strategy parameters.
    pub strategy_params: StrategyParams,
    /// Per-priority max wait in ms, indexed by [`Priority::index`] (low, normal, high, critical).
    pub priority_max_wait_ms: [f64; Priority::COUNT],
    /// While a worker is idle, dispatch a non-empty queue at once.
    pub dispatch_when_idle: bool,
    /// A request still queued this long after arrival fails (no worker could take it).
    pub request_timeout_ns: Nanos,
    /// A dispatched batch not answered within this long fails and counts against its worker.
    pub batch_timeout_ns: Nanos,
    /// Number of workers.
    pub workers: usize,
    /// Batches one worker may hold at once (1 = the worker only gets a batch when idle).
    pub max_inflight_per_worker: u32,
    /// How batches are spread over workers.
    pub balancer: BalancerKind,
    /// Circuit breaker settings.
    pub circuit: CircuitParams,
    /// Latencies kept for the observed p99 (spec `percentile_window_size`).
    pub latency_window: usize,
    /// How often the observed p99 is recomputed, in ns (spec `collection_interval`).
    pub p99_refresh_ns: Nanos,
    /// Seed for the balancer's RNG.
    pub seed: u64,
    /// Settings of the `dynamic` and `multi_bin` strategies.
    pub research: super::strategy::research::ResearchConfig,
    /// Distinct LoRA adapters one batch may hold, and adapter slots per worker
    /// (`[lora] max_loras`, `1..=core::lora::MAX_LORAS_MOST`).
    pub max_loras: usize,
    /// Which requests go in a batch of their own, under every strategy (`router::Backend::alone`).
    pub alone: Alone,
}

/// Which requests go in a batch of their own: those a lane's executor sends as requests of
/// their own and answers only when the batch's last is back (an `upstream` backend), where
/// a batch of several would only hold each answer for the slowest. The others batch as
/// usual.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Alone {
    /// None (the `sim` and `embed` executors run a batch as one).
    #[default]
    Never,
    /// Chats and streams (`RequestMeta::own_request`): an `upstream` backend that takes
    /// prompt arrays sends a batch's plain completions as one request, its embeddings as
    /// one input array, and each chat and stream alone.
    OwnRequests,
    /// Every completion, chats and streams included: an `upstream` backend without prompt
    /// arrays. Its embeddings still go as one input array a batch.
    Completions,
}

impl Alone {
    /// Whether `meta`'s request goes in a batch of its own.
    #[inline]
    pub fn of(self, meta: &super::request::RequestMeta) -> bool {
        match self {
            Alone::Never => false,
            Alone::OwnRequests => meta.own_request,
            Alone::Completions => meta.kind == super::request::Kind::Completion,
        }
    }
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            queue_capacity: 10_000,
            max_batch_size: 32,
            min_batch_size: 1,
            priority_enabled: true,
            max_batch_tokens: 8192,
            token_bucketing: true,
            strategy: StrategyKind::Auto,
            strategy_params: StrategyParams::default(),
            priority_max_wait_ms: [100.0, 50.0, 20.0, 5.0],
            dispatch_when_idle: true,
            request_timeout_ns: 30_000_000_000,
            batch_timeout_ns: 60_000_000_000,
            workers: 4,
            max_inflight_per_worker: 1,
            balancer: BalancerKind::LeastLoaded,
            circuit: CircuitParams::default(),
            latency_window: 1000,
            p99_refresh_ns: 100_000_000,
            seed: 0x00ab_e5eed,
            research: super::strategy::research::ResearchConfig::default(),
            max_loras: 1,
            alone: Alone::Never,
        }
    }
}
