//! Checked settings: the one place that judges the layered [`Config`] and turns it into
//! what each part of abe runs on (the core, the runtime and its sim executors, continuous
//! batching, the router).
//!
//! What must never happen here: reading files or the environment (the one exception, an
//! `embed` model's omitted context length, is `embed_context`'s), or starting anything.
//! Every problem is an error naming the key, the value and why; nothing falls back
//! silently.

use super::error::{invalid, ConfigError};
use super::millis::Millis;
use super::sections::{Config, WorkersConfig, DEFAULT_SIM_CONTEXT_LENGTH, ROUTING_MAX_RETRIES_MAX};
use crate::core::circuit::CircuitParams;
use crate::core::settings::WORKERS_MAX;
use crate::core::strategy::StrategyParams;
use crate::core::{BatchingMode, CoreConfig};
use crate::exec::latency::LatencyModel;
use crate::exec::sim::{FaultSettings, SimConfig};
use crate::router::{BackendConfig, BackendKindName, Router, UnknownStrategy};
use crate::runtime::RuntimeConfig;
use std::net::IpAddr;

/// The configuration checked once, as what each part of abe runs on. Built by
/// [`Config::check`], once per start; nothing downstream checks or parses the config again.
#[derive(Debug)]
pub struct Settings {
    /// The live runtime's settings: the core's (`runtime.core`), the sim executors'
    /// (`runtime.sim`, `runtime.faults`), continuous batching's (`runtime.continuous`) and
    /// the engine threads' (`[engine]`).
    pub runtime: RuntimeConfig,
    /// What abe routes to: the `[[backends]]` tables, or the default sim backend.
    pub backends: Vec<BackendConfig>,
    /// Each of `backends`' latency model if it is `sim` (index for index): its
    /// `[workers.backends.<name>]` keys over `[workers]`', else `[workers]`' own
    /// (`runtime.sim.latency`).
    pub sim_latency: Vec<LatencyModel>,
    /// The router `backends` and `[routing]` describe, seeded with `workers.seed`.
    pub router: Router,
    /// Set when `routing.strategy` names no strategy (`smart` is used): to be logged.
    pub routing_warning: Option<UnknownStrategy>,
    /// The `discovery` tables, each expanded into empty upstream slots of `backends`.
    pub discovery: Vec<crate::router::DiscoveryPlan>,
    /// The spare slots' indexes into `backends` (`routing.spare_backend_slots`), empty
    /// placeholders an add or a reload fills with a backend the config did not have.
    pub spare: Vec<usize>,
    /// The layered config these came from: the HTTP front end reads its `[server]` section
    /// (limits and timeouts, all typed by serde) and `[upstream]`, `[health]` from it.
    pub config: Config,
}

/// Most `lora.max_lora_adapters` (adapter ids are `u16`; the scheduler's tables by id are
/// sized from it).
pub const LORA_ADAPTERS_MOST: usize = crate::core::lora::ADAPTER_IDS - 1;

impl Config {
    /// Checks every key and builds the settings of every part, once; the first problem is
    /// returned with its key, value and reason. An unknown `routing.strategy` is not a
    /// problem: it comes back as [`Settings::routing_warning`].
    pub fn check(mut self) -> Result<Settings, ConfigError> {
        let runtime = self.runtime_config()?;
        let (backends, discovery) =
            crate::router::slots::expand_discovery(self.effective_backends())?;
        let mut backends = super::embed_context::fill(backends)?;
        let spare_slots = self
            .routing
            .spare_backend_slots
            .unwrap_or_else(|| crate::router::slots::spare_slots_default(&backends));
        let spare_kind = match self.batching.mode {
            BatchingMode::Continuous => BackendKindName::Sim,
            BatchingMode::Request => BackendKindName::Upstream,
        };
        let spare = crate::router::slots::add_spares(&mut backends, spare_slots, spare_kind)?;
        match &runtime.continuous {
            // One scheduler: its queue and every replica's slots, in one lane.
            Some(c) => queue_places_fit(
                "continuous.max_queue",
                c.max_queue,
                c.max_queue
                    .saturating_add(c.replicas.saturating_mul(c.max_slots)),
                1,
            )?,
            None => queue_places_fit(
                "batching.queue_capacity",
                self.batching.queue_capacity,
                self.batching.queue_capacity,
                backends.len(),
            )?,
        }
        let (router, routing_warning) = self.check_routing(&backends)?;
        let sim_latency = self.sim_latency(&backends, &runtime)?;
        if self.server.max_model_len == 0 {
            // vLLM's default: the served model's context length; with several roofline
            // models (a sim backend's own), the shortest, so no backend is handed a request
            // longer than its model takes.
            let sim_models = backends
                .iter()
                .zip(&sim_latency)
                .filter(|(b, _)| b.kind == BackendKindName::Sim)
                .map(|(_, l)| l);
            let mut rooflines = sim_models
                .chain(std::iter::once(&runtime.sim.latency))
                .filter_map(|l| match l {
                    LatencyModel::Roofline(r) => Some(r.max_model_len()),
                    _ => None,
                });
            if let Some(first) = rooflines.next() {
                self.server.max_model_len = rooflines.fold(first, u32::min);
            }
        }
        self.check_server()?;
        Ok(Settings {
            runtime,
            backends,
            sim_latency,
            router,
            routing_warning,
            discovery,
            spare,
            config: self,
        })
    }

    /// [`check`](Self::check)s a copy, for `abe config check` and tests.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.clone().check().map(|_| ())
    }

    /// Each backend's latency model (see [`Settings::sim_latency`]). A
    /// `[workers.backends.<name>]` table must name a `sim` backend; its merged keys are
    /// judged as `[workers]`' are. In continuous batching every replica has one KV capacity
    /// (`runtime.continuous`: `[workers]`' roofline's, else `[batching.dynamic]`'s), so a
    /// table whose roofline would hold a different one is refused.
    fn sim_latency(
        &self,
        backends: &[BackendConfig],
        runtime: &RuntimeConfig,
    ) -> Result<Vec<LatencyModel>, ConfigError> {
        let mode = self.batching.mode;
        let mut own: Vec<(&str, LatencyModel)> = Vec::with_capacity(self.workers.backends.len());
        for (name, table) in &self.workers.backends {
            let key = format!("workers.backends.{name}");
            let Some(backend) = backends.iter().find(|b| b.name == *name) else {
                let names: Vec<&str> = backends
                    .iter()
                    .filter(|b| b.kind == BackendKindName::Sim)
                    .map(|b| b.name.as_str())
                    .collect();
                return Err(invalid(
                    &key,
                    format!("\"{name}\""),
                    format!(
                        "names no backend; the sim backends are: {}{}",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        },
                        if self.backends.is_empty() {
                            " (with no [[backends]], abe runs one sim backend named \"sim\")"
                        } else {
                            ""
                        }
                    ),
                ));
            };
            if backend.kind != BackendKindName::Sim {
                return Err(invalid(
                    &key,
                    format!("\"{name}\""),
                    format!(
                        "backend '{name}' is kind = \"{}\": only sim backends have a latency model",
                        match backend.kind {
                            BackendKindName::Sim => "sim",
                            BackendKindName::Upstream => "upstream",
                            BackendKindName::Embed => "embed",
                        }
                    ),
                ));
            }
            let latency = checked_latency(&key, &self.workers.with_backend_keys(table), mode)?;
            if let (Some(c), LatencyModel::Roofline(r)) = (&runtime.continuous, &latency) {
                let own = r.kv_capacity_tokens();
                if own != c.kv_capacity_tokens {
                    let from = match runtime.sim.latency {
                        LatencyModel::Roofline(_) => "[workers]' roofline (its llm, gpu and tp)",
                        _ => "[batching.dynamic]'s memory model",
                    };
                    return Err(invalid(
                        &format!("{key}.latency_model"),
                        "\"roofline\"",
                        format!(
                            "this backend's roofline ({} on {} x{}) holds {own} tokens of KV \
                             cache, but continuous batching gives every replica one capacity, \
                             {} tokens from {from}; give it the same llm, gpu and tp as \
                             [workers] (speeds and efficiencies may differ)",
                            r.llm.as_str(),
                            r.gpu.as_str(),
                            r.tp,
                            c.kv_capacity_tokens
                        ),
                    ));
                }
            }
            own.push((name, latency));
        }
        Ok(backends
            .iter()
            .map(|b| {
                own.iter()
                    .find(|(name, _)| *name == b.name)
                    .map_or(runtime.sim.latency, |&(_, latency)| latency)
            })
            .collect())
    }

    /// Checks `[server]`.
    fn check_server(&self) -> Result<(), ConfigError> {
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
        positive_ms("server.min_data_rate_grace", s.min_data_rate_grace)?;
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
        // workers.count is checked to 1..=WORKERS_MAX; saturate rather than wrap if unvalidated.
        sim.max_concurrent_batches = u32::try_from(self.workers.count).unwrap_or(u32::MAX);
        sim.models[0].adapters = self.lora.adapters.clone();
        vec![sim]
    }

    /// Checks `[[backends]]`, `[routing]`, `[upstream]` and how they fit the rest, and
    /// builds the router `backends` and `[routing]` describe (with the unknown-strategy
    /// warning, if any).
    fn check_routing(
        &self,
        backends: &[BackendConfig],
    ) -> Result<(Router, Option<UnknownStrategy>), ConfigError> {
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
        let (router, warning) = Router::build(backends, &self.routing, self.workers.seed)?;
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
        if self.batching.mode == BatchingMode::Continuous {
            // Continuous batching schedules tokens on replicas abe runs itself (`sim`
            // backends, each backend's workers its replicas). An upstream server runs its
            // own continuous batching and takes whole requests: nothing abe could step.
            if let Some(b) = backends.iter().find(|b| b.kind != BackendKindName::Sim) {
                return Err(invalid(
                    "batching.mode",
                    "continuous",
                    format!(
                        "cannot run with the upstream backend \"{}\": an upstream server \
                         (vLLM, TGI, SGLang, llama.cpp, Ollama) runs its own continuous \
                         batching and takes whole requests, so abe has no steps to schedule \
                         there; use batching.mode = \"request\" to batch and route requests \
                         to upstream backends, or keep only \"sim\" backends for continuous \
                         batching",
                        b.name
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
        Ok((router, warning))
    }

    /// The runtime settings this config describes (checking the engine-side keys).
    fn runtime_config(&self) -> Result<RuntimeConfig, ConfigError> {
        let b = &self.batching;
        let w = &self.workers;
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
        if w.count > WORKERS_MAX {
            return Err(invalid(
                "workers.count",
                w.count,
                format!("must be at most {WORKERS_MAX}"),
            ));
        }
        at_least("workers.max_batch_tokens", w.max_batch_tokens as usize, 1)?;
        at_least("workers.max_inflight", w.max_inflight as usize, 1)?;
        positive_ms("workers.batch_timeout", w.batch_timeout)?;
        at_least(
            "workers.embedding_dimensions",
            w.embedding_dimensions as usize,
            1,
        )?;
        let latency = checked_latency("workers", w, b.mode)?;
        probability("workers.fault_error_rate", w.fault_error_rate)?;
        probability("workers.fault_hang_rate", w.fault_hang_rate)?;
        non_negative("workers.fault_added_latency_ms", w.fault_added_latency_ms)?;
        non_negative("workers.fault_hang_ms", w.fault_hang_ms)?;
        let http_rates = [
            ("workers.fault_rate_limited_rate", w.fault_rate_limited_rate),
            ("workers.fault_unauthorized_rate", w.fault_unauthorized_rate),
            (
                "workers.fault_context_length_rate",
                w.fault_context_length_rate,
            ),
            (
                "workers.fault_model_not_found_rate",
                w.fault_model_not_found_rate,
            ),
            (
                "workers.fault_internal_error_rate",
                w.fault_internal_error_rate,
            ),
            ("workers.fault_unavailable_rate", w.fault_unavailable_rate),
        ];
        let stream_rates = [
            ("workers.fault_stream_cut_rate", w.fault_stream_cut_rate),
            ("workers.fault_stream_reset_rate", w.fault_stream_reset_rate),
            ("workers.fault_stream_stall_rate", w.fault_stream_stall_rate),
        ];
        // One draw picks at most one kind of each group (`api::faults`).
        for group in [&http_rates[..], &stream_rates[..]] {
            for &(key, rate) in group {
                probability(key, rate)?;
            }
            let sum: f64 = group.iter().map(|(_, r)| r).sum();
            if sum > 1.0 + 1e-9 {
                let keys: Vec<&str> = group.iter().map(|(k, _)| *k).collect();
                return Err(invalid(
                    &keys.join(" + "),
                    sum,
                    "one draw picks at most one kind, so these rates must sum to at most 1",
                ));
            }
        }
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
            strategy: b.strategy,
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
            balancer: w.balancer,
            circuit: CircuitParams {
                failure_threshold: h.failure_threshold,
                recovery_ns: h.recovery_timeout.nanos(),
            },
            latency_window: m.percentile_window_size,
            p99_refresh_ns: m.collection_interval.nanos(),
            seed: w.seed,
            research: b
                .dynamic
                .research_config("batching.dynamic", self.server.max_tokens_limit)?,
            max_loras: self.check_lora()?,
            // Per backend lane, set where the lanes are built (`router::Backend::alone`).
            alone: crate::core::Alone::Never,
        };
        Ok(RuntimeConfig {
            core,
            sim: SimConfig {
                latency,
                embedding_dimensions: w.embedding_dimensions,
                seed: w.seed,
                natural_length_mean_tokens: self.continuous.natural_length_mean_tokens,
                text: w.text,
                lora_load_ms: self.lora.lora_load_ms,
            },
            continuous: self.continuous_config(w.count, &latency)?,
            faults: FaultSettings {
                error_rate: w.fault_error_rate,
                added_latency_ms: w.fault_added_latency_ms,
                hang_rate: w.fault_hang_rate,
                hang_ms: w.fault_hang_ms,
            },
            pin: e.pin,
            idle: e.idle,
            spin_us: e.spin_us,
            ring_capacity: e.ring_capacity,
            max_submitters: self.server.io_threads + 8,
            io_threads: self.server.io_threads,
            on_thread_start: None,
        })
    }

    /// Checks `[lora]`; its `max_loras`.
    fn check_lora(&self) -> Result<usize, ConfigError> {
        let l = &self.lora;
        let most = crate::core::lora::MAX_LORAS_MOST;
        if !(1..=most).contains(&l.max_loras) {
            return Err(invalid(
                "lora.max_loras",
                l.max_loras,
                format!("must be in 1..={most} (adapters one step applies at once)"),
            ));
        }
        if l.max_lora_adapters > LORA_ADAPTERS_MOST {
            return Err(invalid(
                "lora.max_lora_adapters",
                l.max_lora_adapters,
                format!("must be at most {LORA_ADAPTERS_MOST}"),
            ));
        }
        non_negative("lora.lora_load_ms", l.lora_load_ms)?;
        if !self.backends.is_empty() && !l.adapters.is_empty() {
            // `[lora] adapters` belongs to the server's own model, which [[backends]]
            // replace: taken silently, they would be served nowhere.
            let names: Vec<&str> = l.adapters.iter().map(|a| a.name()).collect();
            return Err(invalid(
                "lora.adapters",
                format!("[{}]", names.join(", ")),
                "is for the server's own model, and [[backends]] are configured: list each \
                 adapter on the model it runs on, as [[backends.models]] adapters = [...]",
            ));
        }
        let backends = self.effective_backends();
        if let Err(e) = crate::router::lora::LoraTable::from_backends(0, &backends) {
            let key = if self.backends.is_empty() {
                "lora.adapters"
            } else {
                "backends.models.adapters"
            };
            return Err(invalid(key, "[...]", e.to_string()));
        }
        // Distinct adapters: one listed by several backends of its model (replicas) is one.
        let listed = crate::router::lora::configured(&backends).map_or(0, |c| c.len());
        if listed > l.max_lora_adapters {
            return Err(invalid(
                "lora.max_lora_adapters",
                l.max_lora_adapters,
                format!("the models list {listed} adapters; raise it to at least that"),
            ));
        }
        Ok(l.max_loras)
    }

    /// The continuous scheduler's settings when `batching.mode = "continuous"`.
    /// KV capacity: the roofline model's (GPU memory less weights), else
    /// `[batching.dynamic]`'s memory model.
    fn continuous_config(
        &self,
        replicas: usize,
        latency: &LatencyModel,
    ) -> Result<Option<crate::core::continuous::ContinuousConfig>, ConfigError> {
        if self.batching.mode == BatchingMode::Request {
            return Ok(None);
        }
        let c = &self.continuous;
        at_least("continuous.max_slots", c.max_slots, 1)?;
        at_least("continuous.prefill_chunk", c.prefill_chunk as usize, 1)?;
        at_least("continuous.n_batch", c.n_batch as usize, 1)?;
        at_least("continuous.max_queue", c.max_queue, 1)?;
        at_least("continuous.kv_block_tokens", c.kv_block_tokens as usize, 1)?;
        if c.kv_block_tokens > 4096 {
            return Err(invalid(
                "continuous.kv_block_tokens",
                c.kv_block_tokens,
                "must be at most 4096 tokens per block",
            ));
        }
        let d = &self.batching.dynamic;
        let kv = latency.kv_capacity_tokens().unwrap_or_else(|| {
            crate::core::continuous::kv_capacity_tokens(
                d.m_max_gb,
                d.m_model_gb,
                d.kv_gb_per_token,
                d.safety_fraction,
            )
        });
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
            prefix_caching: c.prefix_caching,
            block_tokens: c.kv_block_tokens,
            max_loras: self.lora.max_loras,
        }))
    }
}

/// `w`'s latency model for `mode`, its keys judged and named under `prefix`
/// (`workers`, `workers.backends.<name>`).
fn checked_latency(
    prefix: &str,
    w: &WorkersConfig,
    mode: BatchingMode,
) -> Result<LatencyModel, ConfigError> {
    let key = |k: &str| format!("{prefix}.{k}");
    for (k, v) in [
        ("base_latency_ms", w.base_latency_ms),
        ("per_token_latency_ms", w.per_token_latency_ms),
        ("latency_variance", w.latency_variance),
        ("prefill_ms_per_token", w.prefill_ms_per_token),
        ("decode_beta_ms", w.decode_beta_ms),
        ("decode_gamma", w.decode_gamma),
        ("max_of_batch_base_ms", w.max_of_batch_base_ms),
        (
            "max_of_batch_decode_ms_per_token",
            w.max_of_batch_decode_ms_per_token,
        ),
        ("affine_step_a_ms", w.affine_step_a_ms),
        ("affine_step_c_ms", w.affine_step_c_ms),
    ] {
        non_negative(&key(k), v)?;
    }
    let latency = w.latency(mode);
    if let LatencyModel::Roofline(r) = &latency {
        r.check()
            .map_err(|why| invalid(&key("latency_model"), "\"roofline\"", why))?;
    }
    Ok(latency)
}

/// The engine numbers every queue place of every lane in 32 bits
/// (`runtime::engine::places_fit`): request-level batching has a lane per backend (spare
/// slots included) of `queue_capacity` places, continuous batching one lane of its queue and
/// every replica's slots. `key = value` is the setting named in the error.
fn queue_places_fit(
    key: &str,
    value: usize,
    places_per_lane: usize,
    lanes: usize,
) -> Result<(), ConfigError> {
    if !crate::runtime::engine::places_fit(places_per_lane, lanes) {
        let per_lane = places_per_lane.max(1).checked_next_power_of_two();
        let per_lane = per_lane.map_or_else(|| "over 2^63".to_string(), |p| p.to_string());
        let lanes_text = if lanes > 1 {
            format!("{lanes} backends (spare slots included) of ")
        } else {
            String::new()
        };
        return Err(invalid(
            key,
            value,
            format!(
                "{lanes_text}{per_lane} queue places (rounded up to a power of two) exceed \
                 2^32 places in all; lower it"
            ),
        ));
    }
    Ok(())
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
