//! The config sections: one serde struct per TOML table, each with its defaults.
//!
//! What lives here is shape and defaults only: a section's fields are what its table may
//! hold, typed as far as serde can type them. A default that a part of abe also has on its
//! own (the core's, the runtime's, the sim executor's) is read from that part, so each is
//! written once. What must never happen here: reading the
//! environment or a file (that is `layering`), or judging a value (that is `settings`).

use super::millis::Millis;
use super::secret::Secret;
use super::sim_backends::SimBackendLatency;
use crate::core::balancer::BalancerKind;
use crate::core::circuit::CircuitParams;
use crate::core::continuous::ContinuousConfig;
pub use crate::core::strategy::research::keys::DynamicConfig;
use crate::core::strategy::research::ResearchConfig;
use crate::core::strategy::StrategyKind;
use crate::core::{BatchingMode, CoreConfig, Priority};
use crate::exec::latency::{LatencyKind, LatencyModel};
use crate::exec::roofline::presets::{Gpu, Llm};
use crate::exec::roofline::Roofline;
use crate::exec::sim::{FaultSettings, SimConfig};
use crate::router::{BackendConfig, RoutingConfig};
use crate::runtime::idle::IdlePolicy;
use crate::runtime::RuntimeConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[server]`: the HTTP front end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Head and body must arrive within this long of a request's first byte (else 408).
    pub read_timeout: Millis,
    /// A response that cannot be written within this long closes the connection.
    pub write_timeout: Millis,
    /// An idle keep-alive connection is closed after this long.
    pub keep_alive_timeout: Millis,
    /// A request head or body arriving slower than this (bytes per second, averaged since its
    /// first byte) is answered 408 and closed once `min_data_rate_grace` has passed; at the
    /// connection limit it may be closed at once to make room. 0 turns the check off.
    pub min_data_rate_bytes_per_sec: u64,
    /// How long a request may take before the minimum data rate applies (TCP slow start,
    /// a client pausing between head and body).
    pub min_data_rate_grace: Millis,
    /// io threads running the mio event loop.
    pub io_threads: usize,
    /// Open connections at once. At the limit a new connection first takes the place of an
    /// idle one, then of one sending below the minimum data rate; only when there is neither
    /// is it refused with 503.
    pub max_connections: usize,
    /// Largest request head (request line + headers); more is 431.
    pub max_header_bytes: usize,
    /// Largest request body; more is 413.
    pub max_body_bytes: usize,
    /// Requests parsed ahead on one connection (pipelining) before reading pauses.
    pub max_pipelined: usize,
    /// Response bytes staged but not yet taken by a client before reading pauses (a client
    /// that sends without reading cannot make the server buffer without bound).
    pub max_write_buffer_bytes: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: u32,
    /// Prompts per completions request / inputs per embeddings request (a completions
    /// request's prompts times `n`).
    pub max_batch_inputs: usize,
    /// vLLM's `max_model_len`: prompt tokens + `max_tokens` above this are refused with
    /// vLLM's 400. 0 (the default): the roofline preset's context length when the workers
    /// run a `roofline` model (as `auto` does in continuous mode), else no limit.
    pub max_model_len: u32,
    /// Serve /admin/* endpoints.
    pub admin_enabled: bool,
    /// Bearer token for /admin/* (empty: none; then only a loopback bind is allowed).
    /// Never shown: `abe config show` and `Debug` print `<redacted>`.
    pub admin_token: Secret,
    /// Drain time on SIGINT/SIGTERM before what remains is answered with an error.
    pub shutdown_timeout: Millis,
    /// Model name served by the default sim backend, used only when no `[[backends]]` is
    /// configured (see [`Config::effective_backends`]).
    pub model_name: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            read_timeout: Millis(30_000),
            write_timeout: Millis(30_000),
            keep_alive_timeout: Millis(60_000),
            // Kestrel's defaults (MinRequestBodyDataRate: 240 B/s after a 5 s grace): far
            // below any real client, far above a slowloris dribbling a byte at a time.
            min_data_rate_bytes_per_sec: 240,
            min_data_rate_grace: Millis(5_000),
            io_threads: 1,
            max_connections: 4096,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_pipelined: 64,
            max_write_buffer_bytes: 4 * 1024 * 1024,
            max_tokens_limit: ResearchConfig::default().max_tokens_limit,
            max_batch_inputs: 2048,
            max_model_len: 0,
            admin_enabled: true,
            admin_token: Secret::default(),
            shutdown_timeout: Millis(30_000),
            model_name: crate::runtime::DEFAULT_MODEL.into(),
        }
    }
}

/// Per-priority max wait (ms) after which a request is flushed regardless.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriorityWaits {
    pub low: f64,
    pub normal: f64,
    pub high: f64,
    pub critical: f64,
}

impl Default for PriorityWaits {
    fn default() -> Self {
        let w = CoreConfig::default().priority_max_wait_ms;
        PriorityWaits {
            low: w[Priority::Low.index()],
            normal: w[Priority::Normal.index()],
            high: w[Priority::High.index()],
            critical: w[Priority::Critical.index()],
        }
    }
}

/// `[batching]`: queueing and flush rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// request (batches formed by a strategy) | continuous (iteration-level, `[continuous]`)
    pub mode: BatchingMode,
    /// auto | fixed | queue_depth | latency_aware | dynamic | multi_bin
    pub strategy: StrategyKind,
    pub min_batch_size: usize,
    pub max_batch_size: usize,
    pub min_wait_ms: f64,
    pub max_wait_ms: f64,
    pub queue_depth_low_threshold: u32,
    pub queue_depth_high_threshold: u32,
    pub queue_capacity: usize,
    pub token_bucketing_enabled: bool,
    pub priority_enabled: bool,
    /// latency_aware's p99 target.
    pub target_p99_ms: f64,
    /// While a worker is idle, dispatch a non-empty queue at once.
    pub dispatch_when_idle: bool,
    /// A request still queued this long fails with a clear error.
    pub request_timeout: Millis,
    pub priority_max_wait_ms: PriorityWaits,
    pub dynamic: DynamicConfig,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        let c = CoreConfig::default();
        let p = c.strategy_params;
        BatchingConfig {
            mode: BatchingMode::default(),
            strategy: c.strategy,
            min_batch_size: c.min_batch_size,
            max_batch_size: c.max_batch_size,
            min_wait_ms: p.min_wait_ms,
            max_wait_ms: p.max_wait_ms,
            queue_depth_low_threshold: p.queue_depth_low,
            queue_depth_high_threshold: p.queue_depth_high,
            queue_capacity: c.queue_capacity,
            token_bucketing_enabled: c.token_bucketing,
            priority_enabled: c.priority_enabled,
            target_p99_ms: p.target_p99_ms,
            dispatch_when_idle: c.dispatch_when_idle,
            request_timeout: Millis::from_nanos(c.request_timeout_ns),
            priority_max_wait_ms: PriorityWaits::default(),
            dynamic: DynamicConfig::default(),
        }
    }
}

/// `[continuous]`: iteration-level batching (`batching.mode = "continuous"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContinuousSection {
    /// Slots (concurrent requests) per replica.
    pub max_slots: usize,
    /// Most prompt tokens one slot prefills in one step.
    pub prefill_chunk: u32,
    /// Token budget of one step (decode tokens + prefill tokens).
    pub n_batch: u32,
    /// Requests waiting for a slot, at most; more are 429.
    pub max_queue: usize,
    /// Mean of the exponential distribution of a request's natural output length (it stops
    /// by itself, finish_reason "stop"), capped by max_tokens; 0: run to max_tokens.
    pub natural_length_mean_tokens: u32,
    /// Keep finished prompts' KV blocks and start a prompt's prefill after its longest
    /// cached prefix.
    pub prefix_caching: bool,
    /// Tokens per KV block (prefix caching shares whole blocks).
    pub kv_block_tokens: u32,
}

impl Default for ContinuousSection {
    fn default() -> Self {
        let c = ContinuousConfig::default();
        ContinuousSection {
            max_slots: c.max_slots,
            prefill_chunk: c.prefill_chunk,
            n_batch: c.n_batch,
            max_queue: c.max_queue,
            natural_length_mean_tokens: SimConfig::default().natural_length_mean_tokens,
            prefix_caching: c.prefix_caching,
            kv_block_tokens: c.block_tokens,
        }
    }
}

/// `[workers]`: the simulated model replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConfig {
    pub count: usize,
    /// auto | none | linear | calibrated | max_of_batch | affine_step | roofline
    /// (`exec::latency`); auto: linear in request mode, roofline in continuous mode.
    pub latency_model: LatencyKind,
    /// linear: per-batch base.
    pub base_latency_ms: f64,
    /// linear: per token of the batch.
    pub per_token_latency_ms: f64,
    /// linear: noise sd as a fraction of the base.
    pub latency_variance: f64,
    /// calibrated, max_of_batch, affine_step: prefill per prompt token.
    pub prefill_ms_per_token: f64,
    /// calibrated: beta, the one-request decode step.
    pub decode_beta_ms: f64,
    /// calibrated: gamma, the step's growth with the batch.
    pub decode_gamma: f64,
    /// max_of_batch: what every request costs on top of its tokens.
    pub max_of_batch_base_ms: f64,
    /// max_of_batch: per output token of one request.
    pub max_of_batch_decode_ms_per_token: f64,
    /// affine_step: a decode step with b requests generating costs `a x b + c`.
    pub affine_step_a_ms: f64,
    pub affine_step_c_ms: f64,
    /// roofline: the model preset, the GPU preset, GPUs per replica (tensor parallelism),
    /// and achieved / peak FLOP/s and memory bandwidth (`exec::roofline`).
    pub llm: Llm,
    pub gpu: Gpu,
    pub tp: u32,
    pub flops_efficiency: f64,
    pub bandwidth_efficiency: f64,
    pub max_batch_tokens: u32,
    /// round_robin | least_loaded | power_of_two
    pub balancer: BalancerKind,
    /// Batches one worker holds at once.
    pub max_inflight: u32,
    /// A batch not answered within this long fails and counts against its worker.
    pub batch_timeout: Millis,
    pub embedding_dimensions: u32,
    /// synthetic | echo: what text the sim executor answers with (`exec::sim::TextMode`).
    pub text: crate::exec::sim::TextMode,
    pub seed: u64,
    /// Fault injection: probability a batch fails.
    pub fault_error_rate: f64,
    /// Fault injection: latency added to every batch.
    pub fault_added_latency_ms: f64,
    /// Fault injection: probability a batch hangs for `fault_hang_ms`.
    pub fault_hang_rate: f64,
    pub fault_hang_ms: f64,
    /// Failures by kind, answered in front of the engine (`api::faults`): rates 0..=1 of
    /// 429 (with `Retry-After: fault_retry_after_s`), 401, vLLM's context-length 400, 404,
    /// 500 and 503 (summing to at most 1), and of streams cut without `[DONE]`, reset, or
    /// stalled for `fault_stream_stall_ms` after `fault_stream_after_chunks` events.
    pub fault_rate_limited_rate: f64,
    pub fault_retry_after_s: u32,
    pub fault_unauthorized_rate: f64,
    pub fault_context_length_rate: f64,
    pub fault_model_not_found_rate: f64,
    pub fault_internal_error_rate: f64,
    pub fault_unavailable_rate: f64,
    pub fault_stream_cut_rate: f64,
    pub fault_stream_reset_rate: f64,
    pub fault_stream_stall_rate: f64,
    pub fault_stream_after_chunks: u32,
    pub fault_stream_stall_ms: u32,
    /// `[workers.backends.<name>]`: a `sim` backend's own latency keys over these
    /// ([`SimBackendLatency`]); file-only.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<String, SimBackendLatency>,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        let [base_latency_ms, per_token_latency_ms, latency_variance] =
            LatencyModel::LINEAR_DEFAULT.params();
        let [prefill_ms_per_token, decode_beta_ms, decode_gamma] =
            LatencyModel::CALIBRATED_DEFAULT.params();
        let [max_of_batch_base_ms, _, max_of_batch_decode_ms_per_token] =
            LatencyModel::MAX_OF_BATCH_DEFAULT.params();
        let [_, affine_step_a_ms, affine_step_c_ms] = LatencyModel::AFFINE_STEP_DEFAULT.params();
        let (core, sim, faults) = (
            CoreConfig::default(),
            SimConfig::default(),
            FaultSettings::default(),
        );
        WorkersConfig {
            count: core.workers,
            latency_model: LatencyKind::Auto,
            base_latency_ms,
            per_token_latency_ms,
            latency_variance,
            prefill_ms_per_token,
            decode_beta_ms,
            decode_gamma,
            max_of_batch_base_ms,
            max_of_batch_decode_ms_per_token,
            affine_step_a_ms,
            affine_step_c_ms,
            llm: Roofline::DEFAULT.llm,
            gpu: Roofline::DEFAULT.gpu,
            tp: Roofline::DEFAULT.tp,
            flops_efficiency: Roofline::DEFAULT.flops_efficiency,
            bandwidth_efficiency: Roofline::DEFAULT.bandwidth_efficiency,
            max_batch_tokens: core.max_batch_tokens,
            balancer: core.balancer,
            max_inflight: core.max_inflight_per_worker,
            batch_timeout: Millis::from_nanos(core.batch_timeout_ns),
            embedding_dimensions: sim.embedding_dimensions,
            text: sim.text,
            // The sim executor's seed; the core's own default seed is for in-process use
            // without a config, where nothing else is seeded.
            seed: sim.seed,
            fault_error_rate: faults.error_rate,
            fault_added_latency_ms: faults.added_latency_ms,
            fault_hang_rate: faults.hang_rate,
            fault_hang_ms: faults.hang_ms,
            // Failures by kind (`api::faults` reads them): all off; a 429's Retry-After
            // 1 s; stream faults after 2 events, stalls of 500 ms.
            fault_rate_limited_rate: 0.0,
            fault_retry_after_s: 1,
            fault_unauthorized_rate: 0.0,
            fault_context_length_rate: 0.0,
            fault_model_not_found_rate: 0.0,
            fault_internal_error_rate: 0.0,
            fault_unavailable_rate: 0.0,
            fault_stream_cut_rate: 0.0,
            fault_stream_reset_rate: 0.0,
            fault_stream_stall_rate: 0.0,
            fault_stream_after_chunks: 2,
            fault_stream_stall_ms: 500,
            backends: BTreeMap::new(),
        }
    }
}

impl WorkersConfig {
    /// These settings with a `[workers.backends.<name>]` table's keys set over them
    /// (every other key, counts and faults included, stays as here).
    pub fn with_backend_keys(&self, table: &SimBackendLatency) -> WorkersConfig {
        let mut w = self.clone();
        w.backends.clear();
        macro_rules! set {
            ($($key:ident),*) => {
                $(if let Some(v) = table.$key {
                    w.$key = v;
                })*
            };
        }
        set!(
            latency_model,
            base_latency_ms,
            per_token_latency_ms,
            latency_variance,
            prefill_ms_per_token,
            decode_beta_ms,
            decode_gamma,
            max_of_batch_base_ms,
            max_of_batch_decode_ms_per_token,
            affine_step_a_ms,
            affine_step_c_ms,
            llm,
            gpu,
            tp,
            flops_efficiency,
            bandwidth_efficiency
        );
        w
    }

    /// The chosen latency model with its parameters from this section
    /// (`prefill_ms_per_token` is shared by the models that prefill per token); `auto`
    /// resolves by batching `mode`.
    pub fn latency(&self, mode: BatchingMode) -> LatencyModel {
        let kind = match (self.latency_model, mode) {
            (LatencyKind::Auto, BatchingMode::Request) => LatencyKind::Linear,
            (LatencyKind::Auto, BatchingMode::Continuous) => LatencyKind::Roofline,
            (kind, _) => kind,
        };
        let params = match kind {
            LatencyKind::None => [0.0; 3],
            LatencyKind::Linear => [
                self.base_latency_ms,
                self.per_token_latency_ms,
                self.latency_variance,
            ],
            LatencyKind::Calibrated => [
                self.prefill_ms_per_token,
                self.decode_beta_ms,
                self.decode_gamma,
            ],
            LatencyKind::MaxOfBatch => [
                self.max_of_batch_base_ms,
                self.prefill_ms_per_token,
                self.max_of_batch_decode_ms_per_token,
            ],
            LatencyKind::AffineStep => [
                self.prefill_ms_per_token,
                self.affine_step_a_ms,
                self.affine_step_c_ms,
            ],
            LatencyKind::Auto => unreachable!("resolved above"),
            LatencyKind::Roofline => {
                return LatencyModel::Roofline(Roofline {
                    llm: self.llm,
                    gpu: self.gpu,
                    tp: self.tp,
                    flops_efficiency: self.flops_efficiency,
                    bandwidth_efficiency: self.bandwidth_efficiency,
                })
            }
        };
        LatencyModel::from_params(kind, params)
    }
}

/// `[health]`: circuit breaking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// How often the health checker probes each `upstream` backend (GET
    /// `upstream.health_path`); a failed probe takes the backend out of routing until one
    /// succeeds.
    pub check_interval: Millis,
    /// Consecutive failures that open a worker's circuit.
    pub failure_threshold: u32,
    /// How long an open circuit waits before one probe batch.
    pub recovery_timeout: Millis,
}

impl Default for HealthConfig {
    fn default() -> Self {
        let circuit = CircuitParams::default();
        HealthConfig {
            check_interval: Millis(5_000),
            failure_threshold: circuit.failure_threshold,
            recovery_timeout: Millis::from_nanos(circuit.recovery_ns),
        }
    }
}

/// `[metrics]`: observation windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// How often the observed p99 (latency_aware) is recomputed.
    pub collection_interval: Millis,
    /// Latencies kept for the observed p99.
    pub percentile_window_size: usize,
    /// How long time series are kept for the dashboard.
    pub history_retention: Millis,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        MetricsConfig {
            collection_interval: Millis::from_nanos(core.p99_refresh_ns),
            percentile_window_size: core.latency_window,
            history_retention: Millis(3_600_000),
        }
    }
}

/// `[upstream]`: how abe talks to `upstream` backends (remote OpenAI-compatible servers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// A TCP connection to an upstream not established within this long fails.
    pub connect_timeout: Millis,
    /// An upstream request not answered within this long fails with 504.
    pub request_timeout: Millis,
    /// Path the health checker GETs on every upstream (every `health.check_interval`);
    /// a 2xx answer is healthy.
    pub health_path: String,
    /// A health probe not answered within this long counts as failed.
    pub health_timeout: Millis,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout: Millis(2_000),
            request_timeout: Millis(60_000),
            health_path: "/v1/models".into(),
            health_timeout: Millis(2_000),
        }
    }
}

/// Context length (tokens) of the model the default sim backend serves when no
/// `[[backends]]` is configured: 128 Ki, a long-context model's, so the router refuses
/// for length only what a real long-context server would.
pub const DEFAULT_SIM_CONTEXT_LENGTH: u32 = 131_072;

/// Most `routing.max_retries`: each retry is one more backend tried for one failed batch.
pub const ROUTING_MAX_RETRIES_MAX: u32 = 8;

/// `[engine]`: threads and rings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Pin the runtime threads (engine, workers, io threads) to cores (`runtime::pin::plan`).
    pub pin: bool,
    /// spin | adaptive | park
    pub idle: IdlePolicy,
    /// How long `adaptive` yields before parking, in microseconds.
    pub spin_us: u64,
    /// Capacity of each submission ring (per priority x bucket, per io thread).
    pub ring_capacity: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let r = RuntimeConfig::default();
        EngineConfig {
            pin: r.pin,
            idle: r.idle,
            spin_us: r.spin_us,
            ring_capacity: r.ring_capacity,
        }
    }
}

/// `[lora]`: LoRA adapters (vLLM's `--enable-lora`, `--max-loras`, `--max-cpu-loras`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    /// Adapters one step (continuous) or batch (request-level) applies at once, per
    /// replica: vLLM's `--max-loras` (default 1, as vLLM's). A request whose adapter is not
    /// resident waits for a slot; requests of resident adapters and of the base model go on.
    pub max_loras: usize,
    /// Adapter ids abe holds (configured plus loaded at run time), like vLLM's
    /// `--max-cpu-loras`; tables are sized from it at start.
    pub max_lora_adapters: usize,
    /// What loading an adapter into a slot costs, added to the step or batch that loads it
    /// (live `sim` workers and `abe simulate`).
    pub lora_load_ms: f64,
    /// Adapters of the server's own model (`server.model_name`, when there are no
    /// `[[backends]]`): `"name"` or `{ name, path }`.
    pub adapters: Vec<crate::router::lora::AdapterConfig>,
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection {
            max_loras: 1,
            max_lora_adapters: 16,
            lora_load_ms: 10.0,
            adapters: Vec::new(),
        }
    }
}

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub batching: BatchingConfig,
    pub workers: WorkersConfig,
    pub health: HealthConfig,
    pub metrics: MetricsConfig,
    pub engine: EngineConfig,
    pub continuous: ContinuousSection,
    /// `[[backends]]`: what abe routes to. Empty: one default sim backend (see
    /// [`Config::effective_backends`]).
    pub backends: Vec<BackendConfig>,
    /// `[routing]`: strategy, weights, aliases, fallbacks, retries.
    pub routing: RoutingConfig,
    /// `[upstream]`: timeouts and health probes of `upstream` backends.
    pub upstream: UpstreamConfig,
    /// `[lora]`: adapter slots, ids, load cost, the server model's adapters.
    pub lora: LoraSection,
}
