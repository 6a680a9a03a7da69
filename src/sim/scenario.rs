//! Scenarios: a named workload plus the engine settings, latency model and SLA to run it
//! with. Built-in scenarios are defined here; each is also shipped as a TOML file in
//! `scenarios/` (a test keeps the two identical), and users write their own in that format.
//!
//! Loading a file resolves a replay trace's relative path against the file's folder. Nothing
//! here runs a simulation or writes anything.

use super::arrivals::Arrivals;
use super::dist::LengthDist;
use super::priority::PriorityMix;
use super::settings::EngineSettings;
use super::workload::Workload;
use super::SimError;
use crate::core::strategy::research::keys::DynamicConfig;
use crate::exec::latency::LatencyModel;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A scenario file. Keys are documented in `abe simulate --help`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Requests to simulate (`--requests` overrides).
    #[serde(default = "default_requests")]
    pub requests: u64,
    /// End-to-end latency target for SLA attainment, in ms (`--sla-ms` overrides).
    #[serde(default = "default_sla_ms")]
    pub sla_ms: f64,
    pub workload: Workload,
    #[serde(default)]
    pub engine: EngineSettings,
    /// Absent: `calibrated` with its defaults.
    #[serde(default = "default_latency")]
    pub latency: LatencyModel,
    /// Continuous mode's goodput: a completed request counts when its time to first token
    /// and its time per output token meet these, ms (`--ttft-target-ms`, `--tpot-target-ms`).
    #[serde(default = "default_ttft_target_ms")]
    pub ttft_target_ms: f64,
    #[serde(default = "default_tpot_target_ms")]
    pub tpot_target_ms: f64,
    /// `[routing] strategy`: continuous mode's replicas behind a router
    /// ([`super::cluster`]); absent: one central queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<super::cluster::ScenarioRouting>,
}

/// An interactive chat's first token: half a second.
pub fn default_ttft_target_ms() -> f64 {
    500.0
}

/// 50 ms per output token: 20 tokens/s, faster than people read.
pub fn default_tpot_target_ms() -> f64 {
    50.0
}

fn default_latency() -> LatencyModel {
    LatencyModel::CALIBRATED_DEFAULT
}

fn default_requests() -> u64 {
    100_000
}

fn default_sla_ms() -> f64 {
    1000.0
}

/// Names of the built-in scenarios, in the order they are listed.
pub const BUILTIN_NAMES: [&str; 13] = [
    "steady_state",
    "ramp_up",
    "spike_test",
    "mixed_priority",
    "long_tail",
    "multibin_paper",
    "light_load",
    "medium_load",
    "heavy_load",
    "bursty",
    "closed_loop",
    "kv_bound",
    "chat_8b_h100",
];

/// Built-ins kept as their shipped file (long comments on how to run them live there): the
/// text is compiled in and parsed on use; `every_builtin_is_listed_and_generates` checks it
/// parses.
fn from_shipped(name: &str, text: &str) -> Scenario {
    Scenario::from_toml(Path::new(name), text)
        .unwrap_or_else(|e| panic!("shipped scenario {name} does not parse: {e}"))
}

/// Chat-like prompts: median 128 tokens, long right tail, at most 2048.
fn chat_prompt() -> LengthDist {
    LengthDist::Lognormal {
        median: 128.0,
        sigma: 0.6,
        max: Some(2048.0),
    }
}

/// Short answers: median 24 tokens, at most 1024.
fn chat_output() -> LengthDist {
    LengthDist::Lognormal {
        median: 24.0,
        sigma: 0.5,
        max: Some(1024.0),
    }
}

fn chat(name: &str, description: &str, requests: u64, arrivals: Arrivals) -> Scenario {
    Scenario {
        name: name.into(),
        description: description.into(),
        requests,
        sla_ms: default_sla_ms(),
        workload: Workload {
            arrivals,
            prompt_tokens: chat_prompt(),
            output_tokens: chat_output(),
            priority: PriorityMix::ALL_NORMAL,
            prediction_error_sigma: 0.0,
        },
        engine: EngineSettings::default(),
        latency: LatencyModel::CALIBRATED_DEFAULT,
        ttft_target_ms: default_ttft_target_ms(),
        tpot_target_ms: default_tpot_target_ms(),
        routing: None,
    }
}

/// The built-in scenario `name`.
pub fn builtin(name: &str) -> Option<Scenario> {
    Some(match name {
        "steady_state" => chat(
            "steady_state",
            "Constant 100 requests/s of chat-like requests.",
            100_000,
            Arrivals::Constant { rate_rps: 100.0 },
        ),
        "ramp_up" => chat(
            "ramp_up",
            "Poisson arrivals ramping from 10 to 500 requests/s over 60 s, then holding 500.",
            100_000,
            Arrivals::Ramp {
                start_rps: 10.0,
                end_rps: 500.0,
                ramp_s: 60.0,
                poisson: true,
            },
        ),
        "spike_test" => chat(
            "spike_test",
            "Poisson 100 requests/s with a 10x spike from t = 60 s to 70 s.",
            40_000,
            Arrivals::Spike {
                base_rps: 100.0,
                multiplier: 10.0,
                spike_start_s: 60.0,
                spike_duration_s: 10.0,
                poisson: true,
            },
        ),
        "mixed_priority" => {
            let mut s = chat(
                "mixed_priority",
                "Poisson 100 requests/s: 80 % normal, 15 % high, 5 % critical.",
                100_000,
                Arrivals::Poisson { rate_rps: 100.0 },
            );
            s.workload.priority = PriorityMix {
                low: 0.0,
                normal: 0.8,
                high: 0.15,
                critical: 0.05,
            };
            s
        }
        "long_tail" => {
            let mut s = chat(
                "long_tail",
                "Poisson 5 requests/s; outputs bimodal: 70 % short (~64 tokens), 30 % long (~1024); SLA 10 s.",
                50_000,
                Arrivals::Poisson { rate_rps: 5.0 },
            );
            // A 1024-token answer alone takes ~6 s to decode: the multi-bin spec's
            // per-request SLA (D_SLA_REQUEST = 10 s) fits this mix.
            s.sla_ms = 10_000.0;
            s.workload.output_tokens = LengthDist::Bimodal {
                weight: 0.7,
                first: Box::new(LengthDist::Normal {
                    mean: 64.0,
                    std_dev: 16.0,
                    min: Some(1.0),
                    max: None,
                }),
                second: Box::new(LengthDist::Lognormal {
                    median: 1024.0,
                    sigma: 0.3,
                    max: Some(4096.0),
                }),
            };
            s
        }
        "multibin_paper" => multibin_paper(),
        // Poisson chat traffic at a share of the default engine's capacity. A request alone
        // takes ~150 ms (24 decode steps at 5.74 ms), so at low load the 4 workers serve
        // mostly batches of one and utilisation is about rate x 0.15 s / 4 (measured,
        // seed 7: 6 rps 24 %, 14 rps 54 %, 28 rps 88 %; see BENCHMARKS.md).
        "light_load" => chat(
            "light_load",
            "Poisson 6 requests/s of chat-like requests: workers ~24 % busy.",
            20_000,
            Arrivals::Poisson { rate_rps: 6.0 },
        ),
        "medium_load" => chat(
            "medium_load",
            "Poisson 14 requests/s of chat-like requests: workers ~54 % busy.",
            20_000,
            Arrivals::Poisson { rate_rps: 14.0 },
        ),
        "heavy_load" => chat(
            "heavy_load",
            "Poisson 28 requests/s of chat-like requests: workers ~88 % busy.",
            20_000,
            Arrivals::Poisson { rate_rps: 28.0 },
        ),
        "bursty" => chat(
            "bursty",
            "Bursts of 16 requests 1 ms apart, burst starts Poisson at 0.75/s (12 requests/s).",
            20_000,
            Arrivals::Bursty {
                bursts_per_s: 0.75,
                burst_size: 16,
                gap_ms: 1.0,
            },
        ),
        "closed_loop" => closed_loop(),
        "kv_bound" => from_shipped("kv_bound", include_str!("../../scenarios/kv_bound.toml")),
        "chat_8b_h100" => from_shipped(
            "chat_8b_h100",
            include_str!("../../scenarios/chat_8b_h100.toml"),
        ),
        _ => return None,
    })
}

/// The multi-bin paper's capacity setting (Guldogan et al. 2024, Sec. 4): a saturated
/// backlog, one worker, full batches of exactly B = 8 only, each request's service time
/// uniform on [1, 2] s (output tokens uniform on [5000, 10000] at 0.2 ms each: the rounding
/// to whole tokens moves E[max] by under 1e-4 relative, and every request lands in the
/// core's top token bucket, so FIFO order is admission order), and a batch taking its
/// slowest request's time. Closed form for K = 1 bin: 144/34 = 4.23529 requests/s.
///
/// For the `multi_bin` strategy the batch size is pinned to 8 (`b_min = b_max = 8`, memory
/// ample) and `max_tokens_limit = 10000`: its bins start equal-width over [1, 10000] and a
/// saturated backlog is binned on admission, before any statistics, so every request falls
/// in the upper half of the bins and `bins = 2K` gives K equal-mass bins over [5000, 10000].
fn multibin_paper() -> Scenario {
    const HUGE_MS: f64 = 1e12;
    Scenario {
        name: "multibin_paper".into(),
        description:
            "Multi-bin paper check: saturated, B = 8 full batches, service U[1, 2] s, max-of-batch."
                .into(),
        requests: 64_000,
        sla_ms: default_sla_ms(),
        workload: Workload {
            arrivals: Arrivals::Saturated,
            prompt_tokens: LengthDist::Fixed { value: 0.0 },
            output_tokens: LengthDist::Uniform {
                min: 5_000.0,
                max: 10_000.0,
            },
            priority: PriorityMix::ALL_NORMAL,
            prediction_error_sigma: 0.0,
        },
        engine: EngineSettings {
            workers: Some(1),
            max_batch_size: Some(8),
            min_batch_size: Some(8),
            max_batch_tokens: Some(u32::MAX),
            token_bucketing: Some(false),
            dispatch_when_idle: Some(false),
            max_wait_ms: Some(HUGE_MS),
            min_wait_ms: Some(HUGE_MS),
            queue_capacity: Some(1_000_000),
            request_timeout_ms: Some(HUGE_MS),
            batch_timeout_ms: Some(HUGE_MS),
            priority_max_wait_ms: Some([HUGE_MS; 4]),
            max_tokens_limit: Some(10_000),
            dynamic: Some(DynamicConfig {
                b_min: 8,
                b_max: 8,
                m_max_gb: 1e6,
                ..DynamicConfig::default()
            }),
            ..Default::default()
        },
        latency: LatencyModel::MaxOfBatch {
            base_ms: 0.0,
            prefill_ms_per_token: 0.0,
            decode_ms_per_token: 0.2,
        },
        ttft_target_ms: default_ttft_target_ms(),
        tpot_target_ms: default_tpot_target_ms(),
        routing: None,
    }
}

/// The closed loop of the adaptive-batching issue: 8 clients thinking 0.1 ms, one worker
/// whose batch of n takes 10 + 2n ms (the linear model, every request 1 prompt + 1 output
/// token at 1 ms each, no noise), max batch 32. The best possible throughput is everyone in
/// one batch: 8 / (10 + 16 + 0.1) ms = 306.5 requests/s. Work-conserving dispatch splits the
/// clients into groups that alternate; a strategy that waits for the answered clients to
/// come back does not.
fn closed_loop() -> Scenario {
    Scenario {
        name: "closed_loop".into(),
        description:
            "Closed loop: 8 clients, one worker, batch of n takes 10 + 2n ms; best 306.5 requests/s."
                .into(),
        requests: 20_000,
        sla_ms: default_sla_ms(),
        workload: Workload {
            arrivals: Arrivals::Closed {
                clients: 8,
                think_ms: 0.1,
                think_jitter: 0.5,
            },
            prompt_tokens: LengthDist::Fixed { value: 1.0 },
            output_tokens: LengthDist::Fixed { value: 1.0 },
            priority: PriorityMix::ALL_NORMAL,
            prediction_error_sigma: 0.0,
        },
        engine: EngineSettings {
            workers: Some(1),
            max_batch_size: Some(32),
            ..Default::default()
        },
        latency: LatencyModel::Linear {
            base_ms: 10.0,
            per_token_ms: 1.0,
            variance: 0.0,
        },
        ttft_target_ms: default_ttft_target_ms(),
        tpot_target_ms: default_tpot_target_ms(),
        routing: None,
    }
}

/// Name of the scenario `abe simulate --trace FILE` runs when no `--scenario` is given.
pub const TRACE_SCENARIO: &str = "trace";

impl Scenario {
    /// The base `abe simulate --trace FILE` replays `path` with: every row of the trace
    /// (`--requests` takes the first N), arrivals `replay`, and `chat_8b_h100`'s engine and
    /// latency model (Llama-3.1-8B on an H100 roofline, one replica) without its batching
    /// mode (`--mode continuous` for iteration-level batching).
    pub fn replay(path: &Path) -> Scenario {
        let mut s = builtin("chat_8b_h100").expect("chat_8b_h100 is built in");
        s.name = TRACE_SCENARIO.into();
        s.description = format!("Replay of {}.", path.display());
        // Every row: the largest count `abe simulate` accepts.
        s.requests = u64::from(u32::MAX) - 1;
        s.engine.mode = None;
        s.with_trace(path)
    }

    /// This scenario with its arrivals and request shapes replayed from the trace at `path`
    /// (engine, latency model and targets kept).
    pub fn with_trace(mut self, path: &Path) -> Scenario {
        self.workload.arrivals = Arrivals::Replay {
            path: path.to_path_buf(),
            format: None,
            rate_scale: 1.0,
        };
        self
    }

    /// Parses a scenario from TOML text; `origin` names the source in errors and its folder
    /// anchors a relative replay path.
    pub fn from_toml(origin: &Path, text: &str) -> Result<Scenario, SimError> {
        let mut s: Scenario = toml::from_str(text).map_err(|e| SimError::Parse {
            path: origin.display().to_string(),
            why: e.to_string(),
        })?;
        if let Arrivals::Replay { path, .. } = &mut s.workload.arrivals {
            if path.is_relative() {
                if let Some(dir) = origin.parent() {
                    *path = dir.join(&*path);
                }
            }
        }
        Ok(s)
    }

    /// Reads a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Scenario::from_toml(path, &text)
    }

    /// A built-in scenario by name, else the scenario file at that path.
    pub fn resolve(name_or_path: &str) -> Result<Scenario, SimError> {
        if let Some(s) = builtin(name_or_path) {
            return Ok(s);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            return Scenario::load(path);
        }
        Err(SimError::UnknownScenario {
            name: name_or_path.into(),
            valid: BUILTIN_NAMES.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_listed_and_generates() {
        for name in BUILTIN_NAMES {
            let s = builtin(name).unwrap();
            assert_eq!(s.name, name);
            assert_eq!(s.workload.generate(100, 1).unwrap().len(), 100);
        }
        assert!(builtin("nope").is_none());
        let e = Scenario::resolve("nope").unwrap_err();
        assert!(e.to_string().contains("steady_state, ramp_up"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused_with_the_origin() {
        let text = "name = \"x\"\nrequest = 5\n[workload.arrivals]\nprocess = \"saturated\"\n";
        let e = Scenario::from_toml(Path::new("my.toml"), text).unwrap_err();
        assert!(e.to_string().starts_with("my.toml: "), "{e}");
        assert!(e.to_string().contains("request"), "{e}");
    }
}
