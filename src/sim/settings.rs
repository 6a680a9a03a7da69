//! Engine settings of a simulation: the subset of the core's configuration a scenario, a
//! flag or a sweep point may set, layered over the core's defaults.
//!
//! Every field is optional; [`EngineSettings::overlay`] stacks layers (scenario file, then
//! flags, then a sweep point) and [`EngineSettings::core_config`] validates the result into a
//! [`CoreConfig`] with errors naming the key, so the core's own assertions never fire on user
//! input. Keys are documented in `abe simulate --help`.

use super::SimError;
use crate::core::balancer::BalancerKind;
use crate::core::continuous::ContinuousConfig;
use crate::core::request::ms_to_nanos;
use crate::core::settings::WORKERS_MAX;
use crate::core::strategy::research::bins::BIN_COUNT_MAX;
use crate::core::strategy::research::keys::DynamicConfig;
use crate::core::strategy::StrategyKind;
use crate::core::{BatchingMode, CoreConfig, Priority};
use crate::exec::latency::LatencyModel;
use serde::{Deserialize, Serialize};

/// The `[engine]` table of a scenario. Absent keys keep the core's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_batch_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_bucketing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_when_idle: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_wait_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth_low: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth_high: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_capacity: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_timeout_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balancer: Option<BalancerKind>,
    /// Max wait per priority in ms: `[low, normal, high, critical]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_max_wait_ms: Option<[f64; Priority::COUNT]>,
    /// Bins K of the `multi_bin` strategy (overrides `dynamic.bins`; other strategies
    /// ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<u32>,
    /// Largest output length the `multi_bin` bins span before they have statistics (the
    /// server's `server.max_tokens_limit`; default 32768).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_limit: Option<u32>,
    /// The `dynamic` / `multi_bin` settings, same keys as `[batching.dynamic]` in
    /// config.toml (memory model, SLA controller, bin policy, predictor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicConfig>,
    /// Emulate K-bin batching for any strategy by oracle pre-binning of a saturated
    /// backlog (see [`super::binning`]); 1 or absent: requests in arrival order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_bins: Option<u32>,
    /// `request` (a strategy forms batches; the default) or `continuous` (iteration-level
    /// batching in [`super::continuous`]; strategies do not apply). `--mode` sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BatchingMode>,
    /// Continuous: slots per replica (`workers` replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_slots: Option<usize>,
    /// Continuous: token budget of one step (decode + prefill tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_batch: Option<u32>,
    /// Continuous: most prompt tokens one sequence prefills in one step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_chunk: Option<u32>,
    /// Continuous: KV cache per replica, tokens (default: the roofline model's, from GPU
    /// memory, else the `[batching.dynamic]` memory model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// Continuous: keep finished prompts' KV blocks and skip a new prompt's cached prefix
    /// (default true; false: KV counted in tokens, nothing shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<bool>,
    /// Continuous: tokens per KV block with prefix caching (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_block_tokens: Option<u32>,
    /// Continuous: `workers` replicas, each its own backend, behind a router with this
    /// strategy ([`super::cluster`]); absent: one central queue for all replicas. A
    /// scenario's `[routing] strategy` sets it; the sweep key `routing` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<super::cluster::ClusterRouting>,
    /// LoRA adapter slots per replica (continuous) or distinct adapters per batch
    /// (request-level): `[lora] max_loras` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loras: Option<usize>,
    /// What loading an adapter into a slot costs, ms (`[lora] lora_load_ms`, default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_load_ms: Option<f64>,
    /// The adapter mix: requests spread evenly (by a hash of their index) over this many
    /// LoRA adapters; absent or 0: every request runs on the base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_adapters: Option<u16>,
}

/// The LoRA side of a simulated run: which adapter each request uses, what a load costs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SimLora {
    /// Adapters the requests spread over (0: none).
    pub adapters: u16,
    pub load_ms: f64,
}

impl SimLora {
    /// The adapter of the `i`-th request of the sequence (0: base model).
    pub fn adapter_of(&self, i: usize) -> crate::core::lora::AdapterId {
        if self.adapters == 0 {
            return crate::core::lora::BASE_MODEL;
        }
        // splitmix64: neighbouring requests land on unrelated adapters.
        let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        1 + (z % u64::from(self.adapters)) as u16
    }
}

/// Most slots per replica a simulation accepts.
pub const SLOTS_MAX: u64 = 4096;

/// Most tokens per KV block (vLLM allows up to 256 on GPUs; abe takes more for coarse
/// what-ifs, not past a 512-token trace block's worth times eight).
pub const BLOCK_TOKENS_MAX: u64 = 4096;

macro_rules! overlay_fields {
    ($base:expr, $top:expr, $($f:ident),*) => {
        EngineSettings { $($f: $top.$f.clone().or_else(|| $base.$f.clone()),)* }
    };
}

fn check_ms(key: &str, v: f64) -> Result<f64, SimError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(SimError::invalid(
            format!("engine.{key}"),
            format!("{v} must be a finite number of ms >= 0"),
        ))
    }
}

impl EngineSettings {
    /// `top`'s keys where set, else `self`'s.
    pub fn overlay(&self, top: &EngineSettings) -> EngineSettings {
        overlay_fields!(
            self,
            top,
            workers,
            max_batch_size,
            min_batch_size,
            max_batch_tokens,
            token_bucketing,
            priority_enabled,
            dispatch_when_idle,
            max_wait_ms,
            min_wait_ms,
            queue_depth_low,
            queue_depth_high,
            target_p99_ms,
            queue_capacity,
            request_timeout_ms,
            batch_timeout_ms,
            max_inflight,
            balancer,
            priority_max_wait_ms,
            bins,
            max_tokens_limit,
            dynamic,
            oracle_bins,
            mode,
            max_slots,
            n_batch,
            prefill_chunk,
            kv_capacity_tokens,
            prefix_caching,
            kv_block_tokens,
            routing,
            max_loras,
            lora_load_ms,
            lora_adapters
        )
    }

    /// `max_loras`, checked (default 1).
    pub fn max_loras_checked(&self) -> Result<usize, SimError> {
        let most = crate::core::lora::MAX_LORAS_MOST;
        match self.max_loras.unwrap_or(1) {
            n @ 1.. if n <= most => Ok(n),
            n => Err(SimError::invalid(
                "engine.max_loras",
                format!("{n} must be in 1..={most}"),
            )),
        }
    }

    /// The run's adapter mix and load cost.
    pub fn sim_lora(&self) -> Result<SimLora, SimError> {
        Ok(SimLora {
            adapters: self.lora_adapters.unwrap_or(0),
            load_ms: self.lora_load_ms_checked()?,
        })
    }

    /// `lora_load_ms`, checked (default 0).
    pub fn lora_load_ms_checked(&self) -> Result<f64, SimError> {
        check_ms("lora_load_ms", self.lora_load_ms.unwrap_or(0.0))
    }

    /// The batching mode (request-level unless set).
    pub fn batching_mode(&self) -> BatchingMode {
        self.mode.unwrap_or_default()
    }

    /// The continuous scheduler's configuration: `workers` replicas, `queue_capacity`
    /// waiting requests at most, KV capacity from the key, else from `latency` (roofline),
    /// else the scheduler's default.
    pub fn continuous_config(&self, latency: &LatencyModel) -> Result<ContinuousConfig, SimError> {
        let d = ContinuousConfig::default();
        let whole = |key: &str, v: u64, max: u64| {
            if (1..=max).contains(&v) {
                Ok(v)
            } else {
                Err(SimError::invalid(
                    format!("engine.{key}"),
                    format!("{v} must be in 1..={max}"),
                ))
            }
        };
        let c = ContinuousConfig {
            replicas: whole(
                "workers",
                self.workers.unwrap_or(CoreConfig::default().workers) as u64,
                WORKERS_MAX as u64,
            )? as usize,
            max_slots: whole(
                "max_slots",
                self.max_slots.unwrap_or(d.max_slots) as u64,
                SLOTS_MAX,
            )? as usize,
            prefill_chunk: whole(
                "prefill_chunk",
                u64::from(self.prefill_chunk.unwrap_or(d.prefill_chunk)),
                u64::from(u32::MAX),
            )? as u32,
            n_batch: whole(
                "n_batch",
                u64::from(self.n_batch.unwrap_or(d.n_batch)),
                u64::from(u32::MAX),
            )? as u32,
            kv_capacity_tokens: whole(
                "kv_capacity_tokens",
                self.kv_capacity_tokens
                    .or(latency.kv_capacity_tokens())
                    .unwrap_or(d.kv_capacity_tokens),
                u64::MAX,
            )?,
            max_queue: whole(
                "queue_capacity",
                self.queue_capacity.unwrap_or(d.max_queue) as u64,
                u64::from(u32::MAX) - 1,
            )? as usize,
            prefix_caching: self.prefix_caching.unwrap_or(d.prefix_caching),
            block_tokens: whole(
                "kv_block_tokens",
                u64::from(self.kv_block_tokens.unwrap_or(d.block_tokens)),
                BLOCK_TOKENS_MAX,
            )? as u32,
            max_loras: self.max_loras_checked()?,
        };
        Ok(c)
    }

    /// The core configuration for `strategy`, seeded with `seed`.
    pub fn core_config(&self, strategy: StrategyKind, seed: u64) -> Result<CoreConfig, SimError> {
        let mut c = CoreConfig {
            strategy,
            seed,
            max_loras: self.max_loras_checked()?,
            ..CoreConfig::default()
        };
        if let Some(v) = self.workers {
            if !(1..=WORKERS_MAX).contains(&v) {
                return Err(SimError::invalid(
                    "engine.workers",
                    format!("{v} must be in 1..={WORKERS_MAX}"),
                ));
            }
            c.workers = v;
        }
        if let Some(v) = self.max_batch_size {
            if v == 0 {
                return Err(SimError::invalid(
                    "engine.max_batch_size",
                    "must be at least 1",
                ));
            }
            c.max_batch_size = v;
        }
        if let Some(v) = self.min_batch_size {
            c.min_batch_size = v.max(1);
        }
        if c.min_batch_size > c.max_batch_size {
            return Err(SimError::invalid(
                "engine.min_batch_size",
                format!(
                    "{} exceeds max_batch_size {}",
                    c.min_batch_size, c.max_batch_size
                ),
            ));
        }
        if let Some(v) = self.max_batch_tokens {
            c.max_batch_tokens = v.max(1);
        }
        c.token_bucketing = self.token_bucketing.unwrap_or(c.token_bucketing);
        c.priority_enabled = self.priority_enabled.unwrap_or(c.priority_enabled);
        c.dispatch_when_idle = self.dispatch_when_idle.unwrap_or(c.dispatch_when_idle);
        let p = &mut c.strategy_params;
        if let Some(v) = self.max_wait_ms {
            p.max_wait_ms = check_ms("max_wait_ms", v)?;
        }
        if let Some(v) = self.min_wait_ms {
            p.min_wait_ms = check_ms("min_wait_ms", v)?;
        }
        if p.min_wait_ms > p.max_wait_ms {
            // A sweep over max_wait_ms below the default min: keep the pair ordered.
            p.min_wait_ms = p.max_wait_ms;
        }
        p.queue_depth_low = self.queue_depth_low.unwrap_or(p.queue_depth_low);
        p.queue_depth_high = self.queue_depth_high.unwrap_or(p.queue_depth_high);
        if p.queue_depth_low > p.queue_depth_high {
            return Err(SimError::invalid(
                "engine.queue_depth_low",
                format!(
                    "{} exceeds queue_depth_high {}",
                    p.queue_depth_low, p.queue_depth_high
                ),
            ));
        }
        if let Some(v) = self.target_p99_ms {
            p.target_p99_ms = check_ms("target_p99_ms", v)?;
        }
        if let Some(v) = self.queue_capacity {
            if v == 0 || v >= u32::MAX as usize {
                return Err(SimError::invalid(
                    "engine.queue_capacity",
                    format!("{v} must be in 1..{}", u32::MAX),
                ));
            }
            c.queue_capacity = v;
        }
        if let Some(v) = self.request_timeout_ms {
            c.request_timeout_ns = ms_to_nanos(check_ms("request_timeout_ms", v)?).max(1);
        }
        if let Some(v) = self.batch_timeout_ms {
            c.batch_timeout_ns = ms_to_nanos(check_ms("batch_timeout_ms", v)?).max(1);
        }
        if let Some(v) = self.max_inflight {
            c.max_inflight_per_worker = v.max(1);
        }
        c.balancer = self.balancer.unwrap_or(c.balancer);
        if let Some(waits) = self.priority_max_wait_ms {
            for (i, w) in waits.iter().enumerate() {
                check_ms(&format!("priority_max_wait_ms[{i}]"), *w)?;
            }
            c.priority_max_wait_ms = waits;
        }
        if self.dynamic.is_some() || self.max_tokens_limit.is_some() {
            let limit = self.max_tokens_limit.unwrap_or(c.research.max_tokens_limit);
            if limit == 0 {
                return Err(SimError::invalid(
                    "engine.max_tokens_limit",
                    "must be at least 1",
                ));
            }
            c.research = self
                .dynamic
                .clone()
                .unwrap_or_default()
                .research_config("batching.dynamic", limit)
                .map_err(|e| SimError::invalid("engine.dynamic", e.to_string()))?;
        }
        if let Some(bins) = self.bins {
            if !(1..=BIN_COUNT_MAX as u32).contains(&bins) {
                return Err(SimError::invalid(
                    "engine.bins",
                    format!("{bins} must be in 1..={BIN_COUNT_MAX}"),
                ));
            }
            c.research.bins = bins as usize;
        }
        if self.oracle_bins == Some(0) {
            return Err(SimError::invalid(
                "engine.oracle_bins",
                "must be at least 1",
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_takes_the_top_layer_where_set() {
        let base = EngineSettings {
            workers: Some(2),
            max_batch_size: Some(16),
            ..Default::default()
        };
        let top = EngineSettings {
            workers: Some(8),
            ..Default::default()
        };
        let m = base.overlay(&top);
        assert_eq!(m.workers, Some(8));
        assert_eq!(m.max_batch_size, Some(16));
        let c = m.core_config(StrategyKind::Fixed, 3).unwrap();
        assert_eq!((c.workers, c.max_batch_size, c.seed), (8, 16, 3));
    }

    #[test]
    fn bad_values_are_errors_naming_the_key_not_panics() {
        let e = EngineSettings {
            workers: Some(0),
            ..Default::default()
        }
        .core_config(StrategyKind::Fixed, 0)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid engine.workers: 0 must be in 1..=1024"
        );
        let e = EngineSettings {
            min_batch_size: Some(64),
            ..Default::default()
        }
        .core_config(StrategyKind::Fixed, 0)
        .unwrap_err();
        assert!(e.to_string().contains("engine.min_batch_size"));
        let e = toml::from_str::<EngineSettings>("balancer = \"fastest\"").unwrap_err();
        assert!(
            e.to_string().contains("unknown balancer 'fastest'")
                && e.to_string().contains("round_robin"),
            "{e}"
        );
    }
}
