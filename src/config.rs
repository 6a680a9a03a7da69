//! Typed configuration: embedded defaults, then a TOML file, then `ABE_*` environment
//! overrides, then command-line flags; validated once with errors that name the key, the
//! value and why.
//!
//! Keys follow the Go spec's config (server, batching, workers, health, metrics) plus abe's
//! own (`engine`, `continuous`) and routing across backends (`[[backends]]`, `[routing]`,
//! `[upstream]`, whose types live in [`crate::router`]). `config.toml` at the repository
//! root documents every key; a test keeps it in sync with [`Config::default`]. Nothing here
//! runs after start-up.

use crate::core::balancer::BalancerKind;
use crate::core::circuit::CircuitParams;
use crate::core::research::ResearchConfig;
use crate::core::strategy::bins::{BinPolicy, PredictorKind, BIN_COUNT_MAX};
use crate::core::strategy::memory::MemoryModel;
use crate::core::strategy::sla::SlaParams;
use crate::core::strategy::{StrategyKind, StrategyParams};
use crate::core::CoreConfig;
use crate::exec::latency::LatencyModel;
use crate::exec::sim::{FaultSettings, SimConfig};
use crate::router::{
    BackendConfig, BackendKindName, Router, RouterConfigError, RoutingConfig, Strategy,
    UnknownStrategy,
};
use crate::runtime::idle::IdlePolicy;
use crate::runtime::RuntimeConfig;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;

/// A configuration problem, naming the key, the value and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML for abe: {message}")]
    Parse { path: String, message: String },
    #[error("invalid value for {key} = {value}: {why}")]
    Invalid {
        key: String,
        value: String,
        why: String,
    },
    #[error("unknown environment override {var}: no config key {key} (keys look like ABE_BATCHING_STRATEGY)")]
    UnknownEnv { var: String, key: String },
    /// An `ABE_*` variable addressing a part of the config that only a file can set.
    #[error("environment override {var} is not supported: {why}")]
    UnsupportedEnv { var: String, why: String },
    /// `[[backends]]` or `[routing]` does not build a router; the message names the backend,
    /// model, alias or key at fault.
    #[error(transparent)]
    Routing(#[from] RouterConfigError),
}

fn invalid(key: &str, value: impl fmt::Display, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        why: why.into(),
    }
}

/// A duration written as `"30s"`, `"100ms"`, `"5m"`, `"1h"`, `"250us"` (or an integer of ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Millis(pub u64);

impl Millis {
    /// As nanoseconds.
    pub fn nanos(self) -> u64 {
        self.0.saturating_mul(1_000_000)
    }
    /// As a std duration.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms > 0 && ms % 3_600_000 == 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms > 0 && ms % 60_000 == 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms > 0 && ms % 1000 == 0 {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl FromStr for Millis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("'{s}' is not a duration like 30s, 100ms, 5m, 1h"))?;
        let ms = match unit.trim() {
            "" | "ms" => n,
            "us" => n / 1000.0,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            "h" => n * 3_600_000.0,
            other => {
                return Err(format!(
                    "unknown duration unit '{other}' in '{s}': use ms, s, m or h"
                ))
            }
        };
        if !ms.is_finite() || ms < 0.0 {
            return Err(format!("'{s}' is not a non-negative duration"));
        }
        Ok(Millis(ms.round() as u64))
    }
}

impl Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(ms) => Ok(Millis(ms)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

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
    /// io threads running the mio event loop.
    pub io_threads: usize,
    /// Open connections at once; more are refused with 503.
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
    /// Prompts per completions request / inputs per embeddings request.
    pub max_batch_inputs: usize,
    /// Serve /admin/* endpoints.
    pub admin_enabled: bool,
    /// Bearer token for /admin/* (empty: none; then only a loopback bind is allowed).
    pub admin_token: String,
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
            io_threads: 1,
            max_connections: 4096,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_pipelined: 64,
            max_write_buffer_bytes: 4 * 1024 * 1024,
            max_tokens_limit: 32_768,
            max_batch_inputs: 2048,
            admin_enabled: true,
            admin_token: String::new(),
            shutdown_timeout: Millis(30_000),
            model_name: "abe-sim".into(),
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
        PriorityWaits {
            low: 100.0,
            normal: 50.0,
            high: 20.0,
            critical: 5.0,
        }
    }
}

/// `[batching.dynamic]`: the `dynamic` and `multi_bin` strategies (memory model, SLA
/// controller, bins).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DynamicConfig {
    /// multi_bin: number of bins K (1..=64).
    pub bins: usize,
    /// multi_bin: round_robin | longest_queue
    pub bin_policy: String,
    /// Predicted output length: max_tokens | ema_by_prompt_bucket (a request's
    /// `predicted_output_tokens` hint wins).
    pub predictor: String,
    /// Bin boundaries are recomputed (equal mass) every this many completed requests.
    pub recompute_every: u32,
    pub m_max_gb: f64,
    pub m_model_gb: f64,
    pub kv_gb_per_token: f64,
    pub memory_margin_gb: f64,
    pub safety_fraction: f64,
    pub b_min: u32,
    pub b_max: u32,
    pub sla_tbt_ms: f64,
    pub sla_epsilon_ms: f64,
    pub sla_alpha: u32,
    pub sla_delta: u32,
}

impl Default for DynamicConfig {
    fn default() -> Self {
        let m = MemoryModel::default();
        let s = SlaParams::default();
        DynamicConfig {
            bins: 4,
            bin_policy: BinPolicy::RoundRobin.as_str().into(),
            predictor: PredictorKind::MaxTokens.as_str().into(),
            recompute_every: 1000,
            m_max_gb: m.m_max_gb,
            m_model_gb: m.m_model_gb,
            kv_gb_per_token: m.kv_gb_per_token,
            memory_margin_gb: m.margin_gb,
            safety_fraction: m.safety_fraction,
            b_min: m.b_min,
            b_max: m.b_max,
            sla_tbt_ms: s.d_sla_ms,
            sla_epsilon_ms: s.epsilon_ms,
            sla_alpha: s.alpha,
            sla_delta: s.delta,
        }
    }
}

impl DynamicConfig {
    /// The core's settings, validated.
    pub fn research_config(&self, max_tokens_limit: u32) -> Result<ResearchConfig, ConfigError> {
        let k = "batching.dynamic";
        if !(1..=BIN_COUNT_MAX).contains(&self.bins) {
            return Err(invalid(
                &format!("{k}.bins"),
                self.bins,
                format!("must be between 1 and {BIN_COUNT_MAX}"),
            ));
        }
        let bin_policy: BinPolicy =
            self.bin_policy
                .parse()
                .map_err(|e: crate::core::strategy::bins::UnknownName| {
                    invalid(&format!("{k}.bin_policy"), &self.bin_policy, e.to_string())
                })?;
        let predictor: PredictorKind =
            self.predictor
                .parse()
                .map_err(|e: crate::core::strategy::bins::UnknownName| {
                    invalid(&format!("{k}.predictor"), &self.predictor, e.to_string())
                })?;
        at_least(
            &format!("{k}.recompute_every"),
            self.recompute_every as usize,
            1,
        )?;
        let memory = MemoryModel {
            m_max_gb: self.m_max_gb,
            m_model_gb: self.m_model_gb,
            kv_gb_per_token: self.kv_gb_per_token,
            margin_gb: self.memory_margin_gb,
            safety_fraction: self.safety_fraction,
            b_min: self.b_min,
            b_max: self.b_max,
            ..MemoryModel::default()
        };
        memory
            .validate()
            .map_err(|e| invalid(&format!("{k} ({})", e.param), "(see key)", e.reason))?;
        let sla = SlaParams {
            d_sla_ms: self.sla_tbt_ms,
            epsilon_ms: self.sla_epsilon_ms,
            alpha: self.sla_alpha,
            delta: self.sla_delta,
            b_min: self.b_min,
            b_max: self.b_max,
            ..SlaParams::default()
        };
        sla.validate()
            .map_err(|e| invalid(&format!("{k} ({})", e.param), "(see key)", e.reason))?;
        Ok(ResearchConfig {
            memory,
            sla,
            bins: self.bins,
            bin_policy,
            predictor,
            max_tokens_limit,
            recompute_every: self.recompute_every,
        })
    }
}

/// `[batching]`: queueing and flush rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// request (batches formed by a strategy) | continuous (iteration-level, [continuous])
    pub mode: String,
    pub strategy: String,
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
        let p = StrategyParams::default();
        BatchingConfig {
            mode: "request".into(),
            strategy: StrategyKind::QueueDepth.as_str().into(),
            min_batch_size: 1,
            max_batch_size: 32,
            min_wait_ms: p.min_wait_ms,
            max_wait_ms: p.max_wait_ms,
            queue_depth_low_threshold: p.queue_depth_low,
            queue_depth_high_threshold: p.queue_depth_high,
            queue_capacity: 10_000,
            token_bucketing_enabled: true,
            priority_enabled: true,
            target_p99_ms: p.target_p99_ms,
            dispatch_when_idle: true,
            request_timeout: Millis(30_000),
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
}

impl Default for ContinuousSection {
    fn default() -> Self {
        ContinuousSection {
            max_slots: 16,
            prefill_chunk: 512,
            n_batch: 2048,
            max_queue: 1024,
            natural_length_mean_tokens: 0,
        }
    }
}

/// `[workers]`: the simulated model replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersConfig {
    pub count: usize,
    /// none | linear | calibrated
    pub latency_model: String,
    pub base_latency_ms: f64,
    pub per_token_latency_ms: f64,
    pub latency_variance: f64,
    pub prefill_ms_per_token: f64,
    pub decode_beta_ms: f64,
    pub decode_gamma: f64,
    pub max_batch_tokens: u32,
    /// round_robin | least_loaded | power_of_two
    pub balancer: String,
    /// Batches one worker holds at once.
    pub max_inflight: u32,
    /// A batch not answered within this long fails and counts against its worker.
    pub batch_timeout: Millis,
    pub embedding_dimensions: u32,
    pub seed: u64,
    /// Fault injection: probability a batch fails.
    pub fault_error_rate: f64,
    /// Fault injection: latency added to every batch.
    pub fault_added_latency_ms: f64,
    /// Fault injection: probability a batch hangs for `fault_hang_ms`.
    pub fault_hang_rate: f64,
    pub fault_hang_ms: f64,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            count: 4,
            latency_model: "linear".into(),
            base_latency_ms: 10.0,
            per_token_latency_ms: 0.5,
            latency_variance: 0.1,
            prefill_ms_per_token: 0.02,
            decode_beta_ms: 5.74,
            decode_gamma: 0.316,
            max_batch_tokens: 8192,
            balancer: BalancerKind::LeastLoaded.as_str().into(),
            max_inflight: 1,
            batch_timeout: Millis(60_000),
            embedding_dimensions: 384,
            seed: 1,
            fault_error_rate: 0.0,
            fault_added_latency_ms: 0.0,
            fault_hang_rate: 0.0,
            fault_hang_ms: 0.0,
        }
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
        HealthConfig {
            check_interval: Millis(5_000),
            failure_threshold: 5,
            recovery_timeout: Millis(30_000),
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
        MetricsConfig {
            collection_interval: Millis(100),
            percentile_window_size: 1000,
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
    pub idle: String,
    /// How long `adaptive` yields before parking, in microseconds.
    pub spin_us: u64,
    /// Capacity of each submission ring (per priority x bucket, per io thread).
    pub ring_capacity: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            pin: true,
            idle: IdlePolicy::Adaptive.as_str().into(),
            spin_us: 20,
            ring_capacity: 1024,
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
}

/// Command-line overrides for the common keys.
#[derive(Clone, Debug, Default)]
pub struct FlagOverrides {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub strategy: Option<String>,
    pub workers: Option<usize>,
}

impl Config {
    /// Reads a TOML file over the defaults (not yet validated).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.display().to_string(),
            message,
        })
    }

    /// Parses TOML text over the defaults (not yet validated).
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The effective config: defaults, then `file`, then `env` (`ABE_*` pairs), then flags;
    /// validated.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &FlagOverrides,
    ) -> Result<Config, ConfigError> {
        let mut cfg = match file {
            Some(p) => Self::from_file(p)?,
            None => Config::default(),
        };
        cfg.apply_env(env)?;
        cfg.apply_flags(flags);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Applies `ABE_<SECTION>_<KEY>=value` overrides (e.g. `ABE_BATCHING_STRATEGY=fixed`,
    /// `ABE_BATCHING_PRIORITY_MAX_WAIT_MS_LOW=80`). Unknown `ABE_` keys are errors, so a typo
    /// is not silently ignored. `RUST_LOG`-style non-`ABE_` variables are not looked at.
    pub fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        // The tree holds only what the environment may set. `[[backends]]` and the alias and
        // fallback maps are file-only: they are left out of the tree (an `ABE_BACKENDS_*`
        // variable gets a clear error, and no alias or model name can be mistaken for a
        // key) and carried over untouched. Round-tripping them through the tree would also
        // replace every api_key with its redacted serialised form.
        let mut bare = self.clone();
        bare.backends.clear();
        bare.routing.aliases.clear();
        bare.routing.fallbacks.clear();
        let mut tree = toml::Value::try_from(&bare).expect("config serialises to TOML");
        let mut any = false;
        for (var, value) in env {
            let Some(rest) = var.strip_prefix("ABE_") else {
                continue;
            };
            let path = rest.to_ascii_lowercase();
            if let Some(why) = file_only(&path) {
                return Err(ConfigError::UnsupportedEnv {
                    var,
                    why: why.into(),
                });
            }
            let key_display = path.replace('_', ".");
            let Some(slot) = find_key(&mut tree, &path) else {
                return Err(ConfigError::UnknownEnv {
                    var,
                    key: key_display,
                });
            };
            let (dotted, target) = slot;
            *target = parse_like(target, &value).map_err(|why| invalid(&dotted, &value, why))?;
            any = true;
        }
        if any {
            let mut updated: Config = tree
                .try_into()
                .map_err(|e: toml::de::Error| invalid("environment", "ABE_*", e.to_string()))?;
            updated.backends = std::mem::take(&mut self.backends);
            updated.routing.aliases = std::mem::take(&mut self.routing.aliases);
            updated.routing.fallbacks = std::mem::take(&mut self.routing.fallbacks);
            *self = updated;
        }
        Ok(())
    }

    /// Applies command-line flags.
    pub fn apply_flags(&mut self, f: &FlagOverrides) {
        if let Some(h) = &f.host {
            self.server.host = h.clone();
        }
        if let Some(p) = f.port {
            self.server.port = p;
        }
        if let Some(s) = &f.strategy {
            self.batching.strategy = s.clone();
        }
        if let Some(w) = f.workers {
            self.workers.count = w;
        }
    }

    /// Checks every key; the first problem is returned with its key, value and reason.
    /// An unknown `routing.strategy` is not a problem: see [`Config::routing_warning`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.runtime_config().map(|_| ())?;
        self.validate_routing()?;
        let s = &self.server;
        let host: IpAddr = s.host.parse().map_err(|_| {
            invalid(
                "server.host",
                &s.host,
                "must be an IP address such as 127.0.0.1 or 0.0.0.0",
            )
        })?;
        at_least("server.io_threads", s.io_threads, 1)?;
        at_least("server.max_connections", s.max_connections, 1)?;
        at_least("server.max_header_bytes", s.max_header_bytes, 256)?;
        at_least("server.max_body_bytes", s.max_body_bytes, 1)?;
        at_least("server.max_pipelined", s.max_pipelined, 1)?;
        at_least(
            "server.max_write_buffer_bytes",
            s.max_write_buffer_bytes,
            1024,
        )?;
        at_least("server.max_batch_inputs", s.max_batch_inputs, 1)?;
        at_least("server.max_tokens_limit", s.max_tokens_limit as usize, 1)?;
        positive_ms("server.read_timeout", s.read_timeout)?;
        positive_ms("server.write_timeout", s.write_timeout)?;
        positive_ms("server.keep_alive_timeout", s.keep_alive_timeout)?;
        if s.model_name.trim().is_empty() {
            return Err(invalid("server.model_name", "\"\"", "must not be empty"));
        }
        if s.admin_enabled && s.admin_token.is_empty() && !host.is_loopback() {
            return Err(invalid(
                "server.admin_token",
                "\"\"",
                format!(
                    "admin endpoints are enabled and the server binds non-loopback address {host}: \
                     set server.admin_token (ABE_SERVER_ADMIN_TOKEN) or server.admin_enabled = false"
                ),
            ));
        }
        Ok(())
    }

    /// The backends abe routes to: the `[[backends]]` tables, or when there are none, one
    /// sim backend named `sim` serving `server.model_name` (context
    /// [`DEFAULT_SIM_CONTEXT_LENGTH`], every capability) with `workers.count` concurrent
    /// batches, i.e. what abe served before routing existed.
    pub fn effective_backends(&self) -> Vec<BackendConfig> {
        if !self.backends.is_empty() {
            return self.backends.clone();
        }
        let mut sim =
            BackendConfig::default_sim(&self.server.model_name, DEFAULT_SIM_CONTEXT_LENGTH);
        // workers.count is validated to 1..=1024; saturate rather than wrap if unvalidated.
        sim.max_concurrent_batches = u32::try_from(self.workers.count).unwrap_or(u32::MAX);
        vec![sim]
    }

    /// The router `[[backends]]` (or the default sim backend) and `[routing]` describe,
    /// seeded with `workers.seed`, and the unknown-strategy warning if any.
    pub fn router(&self) -> Result<(Router, Option<UnknownStrategy>), ConfigError> {
        Router::build(&self.effective_backends(), &self.routing, self.workers.seed)
            .map_err(ConfigError::from)
    }

    /// The warning to log when `routing.strategy` names no strategy (`smart` is used then;
    /// not an error).
    pub fn routing_warning(&self) -> Option<String> {
        Strategy::from_name(&self.routing.strategy)
            .1
            .map(|w| w.to_string())
    }

    /// Checks `[[backends]]`, `[routing]`, `[upstream]` and how they fit the rest.
    fn validate_routing(&self) -> Result<(), ConfigError> {
        for b in &self.backends {
            if b.kind != BackendKindName::Upstream {
                continue;
            }
            if let Some(url) = b.base_url.as_deref() {
                if url
                    .get(..8)
                    .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
                {
                    return Err(invalid(
                        &format!("backends['{}'].base_url", b.name),
                        url,
                        "https is not supported: abe speaks plain HTTP/1.1 to upstreams; put a \
                         TLS-terminating proxy (nginx, Caddy, envoy, stunnel) next to abe and \
                         point base_url at its http:// address",
                    ));
                }
            }
        }
        let backends = self.effective_backends();
        Router::build(&backends, &self.routing, self.workers.seed)?;
        let r = &self.routing;
        if r.max_retries > ROUTING_MAX_RETRIES_MAX {
            return Err(invalid(
                "routing.max_retries",
                r.max_retries,
                format!(
                    "must be at most {ROUTING_MAX_RETRIES_MAX} (each retry sends a failed batch \
                     to one more backend)"
                ),
            ));
        }
        if self.batching.mode == "continuous" {
            let sims = backends
                .iter()
                .filter(|b| b.kind == BackendKindName::Sim)
                .count();
            if backends.len() != 1 || sims != 1 {
                return Err(invalid(
                    "batching.mode",
                    "continuous",
                    format!(
                        "continuous batching supports exactly one backend, of kind \"sim\"; \
                         [[backends]] has {} ({} sim, {} upstream): remove the others or use \
                         batching.mode = \"request\" to route across backends",
                        backends.len(),
                        sims,
                        backends.len() - sims
                    ),
                ));
            }
        }
        let u = &self.upstream;
        positive_ms("upstream.connect_timeout", u.connect_timeout)?;
        positive_ms("upstream.request_timeout", u.request_timeout)?;
        positive_ms("upstream.health_timeout", u.health_timeout)?;
        if !u.health_path.starts_with('/') {
            return Err(invalid(
                "upstream.health_path",
                format!("\"{}\"", u.health_path),
                "must be a path starting with /, e.g. \"/v1/models\" or \"/health\"",
            ));
        }
        Ok(())
    }

    /// The runtime settings this config describes (validating the engine-side keys).
    pub fn runtime_config(&self) -> Result<RuntimeConfig, ConfigError> {
        let b = &self.batching;
        let w = &self.workers;
        let strategy: StrategyKind =
            b.strategy
                .parse()
                .map_err(|e: crate::core::strategy::UnknownStrategy| {
                    invalid("batching.strategy", &b.strategy, e.to_string())
                })?;
        at_least("batching.max_batch_size", b.max_batch_size, 1)?;
        at_least("batching.min_batch_size", b.min_batch_size, 1)?;
        if b.min_batch_size > b.max_batch_size {
            return Err(invalid(
                "batching.min_batch_size",
                b.min_batch_size,
                format!(
                    "must not exceed batching.max_batch_size ({})",
                    b.max_batch_size
                ),
            ));
        }
        at_least("batching.queue_capacity", b.queue_capacity, 1)?;
        non_negative("batching.min_wait_ms", b.min_wait_ms)?;
        non_negative("batching.max_wait_ms", b.max_wait_ms)?;
        if b.min_wait_ms > b.max_wait_ms {
            return Err(invalid(
                "batching.min_wait_ms",
                b.min_wait_ms,
                format!("must not exceed batching.max_wait_ms ({})", b.max_wait_ms),
            ));
        }
        if b.queue_depth_low_threshold > b.queue_depth_high_threshold {
            return Err(invalid(
                "batching.queue_depth_low_threshold",
                b.queue_depth_low_threshold,
                format!(
                    "must not exceed batching.queue_depth_high_threshold ({})",
                    b.queue_depth_high_threshold
                ),
            ));
        }
        positive("batching.target_p99_ms", b.target_p99_ms)?;
        positive_ms("batching.request_timeout", b.request_timeout)?;
        let pw = &b.priority_max_wait_ms;
        non_negative("batching.priority_max_wait_ms.low", pw.low)?;
        non_negative("batching.priority_max_wait_ms.normal", pw.normal)?;
        non_negative("batching.priority_max_wait_ms.high", pw.high)?;
        non_negative("batching.priority_max_wait_ms.critical", pw.critical)?;

        at_least("workers.count", w.count, 1)?;
        if w.count > 1024 {
            return Err(invalid("workers.count", w.count, "must be at most 1024"));
        }
        at_least("workers.max_batch_tokens", w.max_batch_tokens as usize, 1)?;
        at_least("workers.max_inflight", w.max_inflight as usize, 1)?;
        positive_ms("workers.batch_timeout", w.batch_timeout)?;
        at_least(
            "workers.embedding_dimensions",
            w.embedding_dimensions as usize,
            1,
        )?;
        non_negative("workers.base_latency_ms", w.base_latency_ms)?;
        non_negative("workers.per_token_latency_ms", w.per_token_latency_ms)?;
        non_negative("workers.latency_variance", w.latency_variance)?;
        non_negative("workers.prefill_ms_per_token", w.prefill_ms_per_token)?;
        non_negative("workers.decode_beta_ms", w.decode_beta_ms)?;
        non_negative("workers.decode_gamma", w.decode_gamma)?;
        probability("workers.fault_error_rate", w.fault_error_rate)?;
        probability("workers.fault_hang_rate", w.fault_hang_rate)?;
        non_negative("workers.fault_added_latency_ms", w.fault_added_latency_ms)?;
        non_negative("workers.fault_hang_ms", w.fault_hang_ms)?;
        let latency = match w.latency_model.as_str() {
            "none" => LatencyModel::None,
            "linear" => LatencyModel::Linear {
                base_ms: w.base_latency_ms,
                per_token_ms: w.per_token_latency_ms,
                variance: w.latency_variance,
            },
            "calibrated" => LatencyModel::Calibrated {
                prefill_ms_per_token: w.prefill_ms_per_token,
                beta_ms: w.decode_beta_ms,
                gamma: w.decode_gamma,
            },
            other => {
                return Err(invalid(
                    "workers.latency_model",
                    other,
                    "valid models are none, linear, calibrated",
                ))
            }
        };
        let balancer: BalancerKind = w
            .balancer
            .parse()
            .map_err(|e: String| invalid("workers.balancer", &w.balancer, e))?;
        let h = &self.health;
        at_least("health.failure_threshold", h.failure_threshold as usize, 1)?;
        positive_ms("health.check_interval", h.check_interval)?;
        let m = &self.metrics;
        at_least(
            "metrics.percentile_window_size",
            m.percentile_window_size,
            1,
        )?;
        positive_ms("metrics.collection_interval", m.collection_interval)?;
        let e = &self.engine;
        let idle: IdlePolicy = e
            .idle
            .parse()
            .map_err(|why: String| invalid("engine.idle", &e.idle, why))?;
        at_least("engine.ring_capacity", e.ring_capacity, 2)?;
        if e.spin_us > 1_000_000 {
            return Err(invalid(
                "engine.spin_us",
                e.spin_us,
                "must be at most 1000000 (1 s)",
            ));
        }
        let core = CoreConfig {
            queue_capacity: b.queue_capacity,
            max_batch_size: b.max_batch_size,
            min_batch_size: b.min_batch_size,
            max_batch_tokens: w.max_batch_tokens,
            token_bucketing: b.token_bucketing_enabled,
            priority_enabled: b.priority_enabled,
            strategy,
            strategy_params: StrategyParams {
                max_wait_ms: b.max_wait_ms,
                min_wait_ms: b.min_wait_ms,
                queue_depth_low: b.queue_depth_low_threshold,
                queue_depth_high: b.queue_depth_high_threshold,
                target_p99_ms: b.target_p99_ms,
            },
            priority_max_wait_ms: [pw.low, pw.normal, pw.high, pw.critical],
            dispatch_when_idle: b.dispatch_when_idle,
            request_timeout_ns: b.request_timeout.nanos(),
            batch_timeout_ns: w.batch_timeout.nanos(),
            workers: w.count,
            max_inflight_per_worker: w.max_inflight,
            balancer,
            circuit: CircuitParams {
                failure_threshold: h.failure_threshold,
                recovery_ns: h.recovery_timeout.nanos(),
            },
            latency_window: m.percentile_window_size,
            p99_refresh_ns: m.collection_interval.nanos(),
            seed: w.seed,
            research: b.dynamic.research_config(self.server.max_tokens_limit)?,
        };
        Ok(RuntimeConfig {
            core,
            sim: SimConfig {
                latency,
                embedding_dimensions: w.embedding_dimensions,
                seed: w.seed,
                natural_length_mean_tokens: self.continuous.natural_length_mean_tokens,
            },
            continuous: self.continuous_config(w.count)?,
            faults: FaultSettings {
                error_rate: w.fault_error_rate,
                added_latency_ms: w.fault_added_latency_ms,
                hang_rate: w.fault_hang_rate,
                hang_ms: w.fault_hang_ms,
            },
            pin: e.pin,
            idle,
            spin_us: e.spin_us,
            ring_capacity: e.ring_capacity,
            max_submitters: self.server.io_threads + 8,
            io_threads: self.server.io_threads,
            on_thread_start: None,
        })
    }

    /// The continuous scheduler's settings when `batching.mode = "continuous"`.
    fn continuous_config(
        &self,
        replicas: usize,
    ) -> Result<Option<crate::core::continuous::ContinuousConfig>, ConfigError> {
        match self.batching.mode.as_str() {
            "request" => return Ok(None),
            "continuous" => {}
            other => {
                return Err(invalid(
                    "batching.mode",
                    other,
                    "valid modes are request, continuous",
                ))
            }
        }
        let c = &self.continuous;
        at_least("continuous.max_slots", c.max_slots, 1)?;
        at_least("continuous.prefill_chunk", c.prefill_chunk as usize, 1)?;
        at_least("continuous.n_batch", c.n_batch as usize, 1)?;
        at_least("continuous.max_queue", c.max_queue, 1)?;
        let d = &self.batching.dynamic;
        let kv = crate::core::continuous::kv_capacity_tokens(
            d.m_max_gb,
            d.m_model_gb,
            d.kv_gb_per_token,
            d.safety_fraction,
        );
        if kv == 0 {
            return Err(invalid(
                "batching.dynamic.m_max_gb",
                d.m_max_gb,
                "leaves no KV cache for continuous batching (must exceed m_model_gb)",
            ));
        }
        Ok(Some(crate::core::continuous::ContinuousConfig {
            replicas,
            max_slots: c.max_slots,
            prefill_chunk: c.prefill_chunk,
            n_batch: c.n_batch,
            kv_capacity_tokens: kv,
            max_queue: c.max_queue,
        }))
    }

    /// The effective config as TOML (for `abe config show`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serialises to TOML")
    }
}

/// Why an env key path (lowercased, `ABE_` stripped) addresses a file-only part of the
/// config, or `None` when it may be an ordinary key.
fn file_only(path: &str) -> Option<&'static str> {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}_"));
    if under("backends") {
        Some("[[backends]] tables can only be set in the config file (--config FILE)")
    } else if under("routing_aliases") || under("routing_fallbacks") {
        Some(
            "[routing.aliases] and [routing.fallbacks] can only be set in the config file \
             (--config FILE)",
        )
    } else {
        None
    }
}

/// Finds the TOML value addressed by an env key path like `batching_max_batch_size`
/// (underscores are ambiguous, so every split against the actual tree is tried), returning
/// its dotted name and the value.
fn find_key<'a>(tree: &'a mut toml::Value, path: &str) -> Option<(String, &'a mut toml::Value)> {
    let keys = key_path(tree, path)?;
    let mut node = tree;
    for k in &keys {
        node = node.as_table_mut()?.get_mut(k)?;
    }
    Some((keys.join("."), node))
}

/// The table keys leading to the leaf that `path` names, longest key match first.
fn key_path(tree: &toml::Value, path: &str) -> Option<Vec<String>> {
    let table = tree.as_table()?;
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for key in keys {
        let child = &table[key.as_str()];
        if path == key.as_str() && !child.is_table() {
            return Some(vec![key.clone()]);
        }
        if let Some(rest) = path.strip_prefix(&format!("{key}_")) {
            if let Some(mut tail) = key_path(child, rest) {
                tail.insert(0, key.clone());
                return Some(tail);
            }
        }
    }
    None
}

/// Parses `text` as a value of the same TOML type as `like`.
fn parse_like(like: &toml::Value, text: &str) -> Result<toml::Value, String> {
    match like {
        toml::Value::String(_) => Ok(toml::Value::String(text.to_string())),
        toml::Value::Integer(_) => text
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| "expected an integer".to_string()),
        toml::Value::Float(_) => text
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| "expected a number".to_string()),
        toml::Value::Boolean(_) => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err("expected true or false".to_string()),
        },
        _ => Err("this key cannot be set from the environment".to_string()),
    }
}

fn at_least(key: &str, v: usize, min: usize) -> Result<(), ConfigError> {
    if v < min {
        return Err(invalid(key, v, format!("must be at least {min}")));
    }
    Ok(())
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(key, v, "must be a finite number >= 0"));
    }
    Ok(())
}

fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(invalid(key, v, "must be a finite number > 0"));
    }
    Ok(())
}

fn positive_ms(key: &str, v: Millis) -> Result<(), ConfigError> {
    if v.0 == 0 {
        return Err(invalid(key, v, "must be longer than 0ms"));
    }
    Ok(())
}

fn probability(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(key, v, "must be a probability between 0 and 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let c = Config::default();
        c.validate().unwrap();
        let r = c.runtime_config().unwrap();
        assert_eq!(r.core.queue_capacity, 10_000);
        assert_eq!(r.core.max_batch_size, 32);
        assert_eq!(r.core.max_batch_tokens, 8192);
        assert_eq!(r.core.strategy, StrategyKind::QueueDepth);
        assert_eq!(r.core.priority_max_wait_ms, [100.0, 50.0, 20.0, 5.0]);
        assert_eq!(r.core.circuit.failure_threshold, 5);
        assert_eq!(r.core.circuit.recovery_ns, 30_000_000_000);
        assert_eq!(r.sim.latency, LatencyModel::LINEAR_DEFAULT);
    }

    #[test]
    fn durations_parse_in_go_style() {
        assert_eq!("30s".parse::<Millis>().unwrap(), Millis(30_000));
        assert_eq!("100ms".parse::<Millis>().unwrap(), Millis(100));
        assert_eq!("1h".parse::<Millis>().unwrap(), Millis(3_600_000));
        assert_eq!("1.5s".parse::<Millis>().unwrap(), Millis(1500));
        assert!("10 parsecs".parse::<Millis>().is_err());
        let c = Config::from_toml(
            "[server]\nread_timeout = \"5s\"\n[health]\nrecovery_timeout = 250\n",
        )
        .unwrap();
        assert_eq!(c.server.read_timeout, Millis(5000));
        assert_eq!(c.health.recovery_timeout, Millis(250));
    }

    #[test]
    fn env_overrides_reach_nested_keys_and_typos_are_errors() {
        let mut c = Config::default();
        c.apply_env(env(&[
            ("ABE_BATCHING_STRATEGY", "fixed"),
            ("ABE_BATCHING_MAX_BATCH_SIZE", "8"),
            ("ABE_BATCHING_PRIORITY_MAX_WAIT_MS_LOW", "80"),
            ("ABE_SERVER_READ_TIMEOUT", "2s"),
            ("ABE_ENGINE_PIN", "false"),
            ("PATH", "/usr/bin"),
        ]))
        .unwrap();
        assert_eq!(c.batching.strategy, "fixed");
        assert_eq!(c.batching.max_batch_size, 8);
        assert_eq!(c.batching.priority_max_wait_ms.low, 80.0);
        assert_eq!(c.server.read_timeout, Millis(2000));
        assert!(!c.engine.pin);
        let err = Config::default()
            .apply_env(env(&[("ABE_BATCHING_STRATEGI", "fixed")]))
            .unwrap_err();
        assert!(err.to_string().contains("ABE_BATCHING_STRATEGI"), "{err}");
        let err = Config::default()
            .apply_env(env(&[("ABE_BATCHING_MAX_BATCH_SIZE", "lots")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value for batching.max_batch_size = lots: expected an integer"
        );
    }

    #[test]
    fn bad_values_name_the_key_the_value_and_why() {
        let mut c = Config::default();
        c.batching.strategy = "fastest".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("invalid value for batching.strategy = fastest: unknown strategy"),
            "{e}"
        );
        let mut c = Config::default();
        c.batching.min_wait_ms = 200.0;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("batching.min_wait_ms = 200") && e.contains("max_wait_ms"),
            "{e}"
        );
        let mut c = Config::default();
        c.workers.fault_error_rate = 1.5;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("probability"));
        assert!(Config::from_toml("[batching]\nmax_batch_sise = 3\n")
            .unwrap_err()
            .contains("max_batch_sise"));
    }

    #[test]
    fn admin_without_token_on_a_public_address_is_refused() {
        let mut c = Config::default();
        c.server.host = "0.0.0.0".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("server.admin_token"), "{e}");
        c.server.admin_token = "secret".into();
        c.validate().unwrap();
        c.server.admin_token.clear();
        c.server.admin_enabled = false;
        c.validate().unwrap();
    }

    #[test]
    fn flags_override_env_and_file() {
        let dir = std::env::temp_dir().join(format!("abe-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, "[server]\nport = 9000\n[workers]\ncount = 2\n").unwrap();
        let c = Config::load(
            Some(&path),
            env(&[("ABE_SERVER_PORT", "9100")]),
            &FlagOverrides {
                workers: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.server.port, 9100);
        assert_eq!(c.workers.count, 3);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Two backends (one sim, one upstream with a key), an alias and a fallback.
    const TWO_BACKENDS: &str = r#"
        [[backends]]
        name = "local"
        kind = "sim"
        priority = 10
        max_concurrent_batches = 2
        [[backends.models]]
        name = "llama3:8b"
        context_length = 8192
        capabilities = { tools = true, json_mode = true }

        [[backends]]
        name = "gpu-a"
        kind = "upstream"
        base_url = "http://10.0.0.5:8000"
        api_key = "sk-live-0123456789"
        priority = 0
        max_concurrent_batches = 8
        [[backends.models]]
        name = "llama3:70b"
        context_length = 32768
        [[backends.models]]
        name = "llama3:8b"
        context_length = 8192

        [routing]
        strategy = "least_loaded"
        max_retries = 3
        [routing.weights]
        priority = 40
        load = 40
        latency = 20
        [routing.aliases]
        "gpt-4o" = "llama3:70b"
        [routing.fallbacks]
        "llama3:70b" = ["llama3:8b"]

        [upstream]
        request_timeout = "90s"
    "#;

    fn two_backends() -> Config {
        Config::from_toml(TWO_BACKENDS).expect("parses")
    }

    fn validate_err(c: &Config) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn backends_routing_and_upstream_parse_and_validate() {
        let c = two_backends();
        c.validate().unwrap();
        assert_eq!(c.routing_warning(), None);
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[1].kind, BackendKindName::Upstream);
        assert_eq!(
            c.backends[1].api_key.as_ref().unwrap().expose(),
            "sk-live-0123456789"
        );
        assert_eq!(c.routing.max_retries, 3);
        assert_eq!(c.routing.aliases["gpt-4o"], "llama3:70b");
        assert_eq!(c.routing.fallbacks["llama3:70b"], ["llama3:8b"]);
        assert_eq!(c.upstream.request_timeout, Millis(90_000));
        assert_eq!(c.upstream.connect_timeout, Millis(2_000));
        assert_eq!(
            c.effective_backends(),
            c.backends,
            "configured backends win"
        );
        let (mut router, warning) = c.router().unwrap();
        assert!(warning.is_none());
        let d = router
            .route(&crate::router::Requirements::text("gpt-4o", 100))
            .unwrap();
        assert_eq!(
            router.describe(&d).to_string(),
            "backend=gpu-a; model=llama3:70b; via=alias; requested=gpt-4o"
        );
    }

    #[test]
    fn effective_backends_default_to_one_sim_backend_from_server_and_workers() {
        let mut c = Config::default();
        c.server.model_name = "tiny".into();
        c.workers.count = 3;
        let b = c.effective_backends();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].kind, BackendKindName::Sim);
        assert_eq!(b[0].max_concurrent_batches, 3);
        assert_eq!(b[0].models.len(), 1);
        assert_eq!(b[0].models[0].name, "tiny");
        assert_eq!(b[0].models[0].context_length, DEFAULT_SIM_CONTEXT_LENGTH);
        c.validate().unwrap();
        let (mut router, _) = c.router().unwrap();
        let d = router
            .route(&crate::router::Requirements::text("tiny", 1))
            .unwrap();
        assert_eq!(
            router.describe(&d).to_string(),
            "backend=sim; model=tiny; via=direct"
        );
    }

    #[test]
    fn router_config_errors_keep_their_message() {
        let mut c = two_backends();
        c.routing.aliases.insert("a".into(), "b".into());
        c.routing.aliases.insert("b".into(), "a".into());
        let e = validate_err(&c);
        assert!(
            e.contains("routing.aliases") && e.contains("a -> b -> a"),
            "{e}"
        );

        let mut c = two_backends();
        c.routing.weights.latency = 30;
        let e = validate_err(&c);
        assert!(
            e.contains("routing.weights") && e.contains("must sum to 100") && e.contains("110"),
            "{e}"
        );

        let mut c = two_backends();
        c.backends[1].name = "local".into();
        let e = validate_err(&c);
        assert!(e.contains("'local'") && e.contains("unique"), "{e}");

        let mut c = two_backends();
        c.backends[0].base_url = Some("http://h:1".into());
        let e = validate_err(&c);
        assert!(e.contains("'local'") && e.contains("upstream"), "{e}");
        let mut c = two_backends();
        c.backends[0].api_key = Some(crate::router::ApiKey::new("k"));
        let e = validate_err(&c);
        assert!(e.contains("'local'") && e.contains("api_key"), "{e}");
    }

    #[test]
    fn upstream_base_url_must_be_plain_http() {
        let mut c = two_backends();
        c.backends[1].base_url = None;
        let e = validate_err(&c);
        assert!(
            e.contains("'gpu-a'") && e.contains("base_url") && e.contains("http://"),
            "{e}"
        );
        c.backends[1].base_url = Some("https://gpu-a.example:443".into());
        let e = validate_err(&c);
        assert!(
            e.starts_with(
                "invalid value for backends['gpu-a'].base_url = https://gpu-a.example:443: \
                 https is not supported"
            ) && e.contains("TLS-terminating proxy"),
            "{e}"
        );
        c.backends[1].base_url = Some("HTTPS://gpu-a.example".into());
        assert!(validate_err(&c).contains("https is not supported"));
    }

    #[test]
    fn continuous_mode_needs_exactly_one_sim_backend() {
        let mut c = two_backends();
        c.batching.mode = "continuous".into();
        let e = validate_err(&c);
        assert!(
            e.starts_with("invalid value for batching.mode = continuous")
                && e.contains("exactly one backend")
                && e.contains("1 sim, 1 upstream"),
            "{e}"
        );
        c.backends.remove(1);
        c.routing.aliases.clear();
        c.routing.fallbacks.clear();
        c.validate().unwrap();
        let mut c = Config::default();
        c.batching.mode = "continuous".into();
        c.validate().unwrap();
    }

    #[test]
    fn max_retries_is_at_most_8() {
        let mut c = Config::default();
        c.routing.max_retries = 8;
        c.validate().unwrap();
        c.routing.max_retries = 9;
        let e = validate_err(&c);
        assert!(
            e.starts_with("invalid value for routing.max_retries = 9: must be at most 8"),
            "{e}"
        );
    }

    #[test]
    fn upstream_keys_are_checked() {
        let mut c = Config::default();
        c.upstream.request_timeout = Millis(0);
        assert!(validate_err(&c).contains("upstream.request_timeout"));
        let mut c = Config::default();
        c.upstream.health_path = "health".into();
        assert!(validate_err(&c).contains("upstream.health_path"));
    }

    #[test]
    fn env_overrides_reach_routing_and_upstream() {
        let mut c = two_backends();
        c.apply_env(env(&[
            ("ABE_ROUTING_STRATEGY", "round_robin"),
            ("ABE_ROUTING_MAX_RETRIES", "5"),
            ("ABE_ROUTING_WEIGHTS_PRIORITY", "30"),
            ("ABE_ROUTING_WEIGHTS_LOAD", "50"),
            ("ABE_UPSTREAM_REQUEST_TIMEOUT", "2m"),
            ("ABE_UPSTREAM_HEALTH_PATH", "/health"),
        ]))
        .unwrap();
        assert_eq!(c.routing.strategy, "round_robin");
        assert_eq!(c.routing.max_retries, 5);
        assert_eq!(c.routing.weights.priority, 30);
        assert_eq!(c.routing.weights.load, 50);
        assert_eq!(c.upstream.request_timeout, Millis(120_000));
        assert_eq!(c.upstream.health_path, "/health");
        c.validate().unwrap();
        let untouched = two_backends();
        assert_eq!(
            c.backends, untouched.backends,
            "backends survive, key and all"
        );
        assert_eq!(c.routing.aliases, untouched.routing.aliases);
        assert_eq!(c.routing.fallbacks, untouched.routing.fallbacks);

        for var in [
            "ABE_BACKENDS",
            "ABE_BACKENDS_0_NAME",
            "ABE_ROUTING_ALIASES_GPT-4O",
            "ABE_ROUTING_FALLBACKS",
        ] {
            let before = two_backends();
            let mut c = before.clone();
            let e = c.apply_env(env(&[(var, "x")])).unwrap_err().to_string();
            assert!(
                e.contains(var) && e.contains("only be set in the config file"),
                "{e}"
            );
            assert_eq!(c, before, "a failed override changes nothing");
        }
        let e = Config::default()
            .apply_env(env(&[("ABE_ROUTING_MAX_RETRIES", "many")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid value for routing.max_retries = many: expected an integer"
        );
    }

    #[test]
    fn an_unknown_routing_strategy_is_a_warning_not_an_error() {
        let mut c = Config::default();
        c.routing.strategy = "fastest".into();
        c.validate().unwrap();
        let w = c.routing_warning().expect("a warning");
        assert!(
            w.contains("routing.strategy = \"fastest\"") && w.contains("smart"),
            "{w}"
        );
        let (router, warning) = c.router().unwrap();
        assert_eq!(router.strategy(), Strategy::Smart);
        assert_eq!(warning.map(|w| w.to_string()), Some(w));
    }

    #[test]
    fn config_show_prints_backends_and_routing_without_api_keys() {
        let c = two_backends();
        let shown = c.to_toml();
        assert!(!shown.contains("sk-live"), "{shown}");
        assert!(shown.contains("api_key = \"<redacted>\""), "{shown}");
        assert!(shown.contains("[[backends]]") && shown.contains("[[backends.models]]"));
        assert!(shown.contains("[routing.aliases]") && shown.contains("[upstream]"));
        let back = Config::from_toml(&shown).expect("show output parses");
        assert_eq!(back.routing, c.routing);
        assert_eq!(back.upstream, c.upstream);
        assert_eq!(back.backends.len(), 2);
        assert_eq!(
            back.backends[0], c.backends[0],
            "no key: round-trips exactly"
        );
        assert_eq!(
            back.backends[1].api_key.as_ref().unwrap().expose(),
            crate::router::ApiKey::REDACTED
        );
        assert!(
            !format!("{c:?}").contains("sk-live"),
            "Debug is redacted too"
        );
        let default_shown = Config::default().to_toml();
        assert_eq!(
            Config::from_toml(&default_shown).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn config_check_validates_backends_in_a_file() {
        let dir = std::env::temp_dir().join(format!("abe-config-routing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, TWO_BACKENDS).unwrap();
        let c = Config::load(Some(&path), env(&[]), &FlagOverrides::default()).unwrap();
        assert_eq!(c.backends.len(), 2);
        std::fs::write(
            &path,
            TWO_BACKENDS.replace("\"llama3:8b\"]", "\"llama3:8b\", \"llama3:70b\"]"),
        )
        .unwrap();
        let e = Config::load(Some(&path), env(&[]), &FlagOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("routing.fallbacks: 'llama3:70b'") && e.contains("itself"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_documented_config_file_is_the_default_config() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
        let documented = Config::from_file(&path).expect("config.toml parses");
        assert_eq!(
            documented,
            Config::default(),
            "config.toml drifted from the defaults"
        );
    }
}
