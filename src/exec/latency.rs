//! Latency models: how long a batch (or a continuous-batching step) takes on simulated
//! hardware. The one list of models, used by both drivers: the live `sim` executor sleeps
//! that long, the simulator advances virtual time by it, and config (`workers.latency_model`)
//! and scenarios (`[latency]`) name them.
//!
//! Pure functions of the batch shape and a caller-provided RNG. Pricing a batch never
//! allocates once the caller's scratch buffer has grown to the largest batch. What must
//! never happen here: reading a clock, sleeping, or changing the order of a model's float
//! sums (the simulator's report is byte-identical for a seed, and these sums are in it).

use super::roofline::presets::{Gpu, Llm};
use super::roofline::Roofline;
use crate::core::continuous::StepShape;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A latency model's name, without its parameters: what `workers.latency_model`,
/// `--latency-model` and a scenario's `[latency] model` choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatencyKind {
    None,
    Linear,
    Calibrated,
    MaxOfBatch,
    AffineStep,
    Roofline,
    /// Live config only (`workers.latency_model = "auto"`, the default): `linear` in
    /// request-level mode (the Go spec's), `roofline` on its default presets in continuous
    /// mode (a real model on a real GPU). Not in [`LatencyKind::ALL`]: a scenario or a
    /// simulation names its model.
    Auto,
}

impl LatencyKind {
    /// Every model, in the order they are listed to users.
    pub const ALL: [LatencyKind; 6] = [
        LatencyKind::None,
        LatencyKind::Linear,
        LatencyKind::Calibrated,
        LatencyKind::MaxOfBatch,
        LatencyKind::AffineStep,
        LatencyKind::Roofline,
    ];

    /// Config and scenario name.
    pub const fn as_str(self) -> &'static str {
        match self {
            LatencyKind::None => "none",
            LatencyKind::Linear => "linear",
            LatencyKind::Calibrated => "calibrated",
            LatencyKind::MaxOfBatch => "max_of_batch",
            LatencyKind::AffineStep => "affine_step",
            LatencyKind::Roofline => "roofline",
            LatencyKind::Auto => "auto",
        }
    }

    /// The model's parameter keys (as a scenario's `[latency]` table and `--latency` name
    /// them), in the order of [`LatencyModel::params`].
    pub const fn keys(self) -> &'static [&'static str] {
        match self {
            LatencyKind::None => &[],
            LatencyKind::Linear => &["base_ms", "per_token_ms", "variance"],
            LatencyKind::Calibrated => &["prefill_ms_per_token", "beta_ms", "gamma"],
            LatencyKind::MaxOfBatch => &["base_ms", "prefill_ms_per_token", "decode_ms_per_token"],
            LatencyKind::AffineStep => &["prefill_ms_per_token", "a_ms", "c_ms"],
            LatencyKind::Roofline => &["tp", "flops_efficiency", "bandwidth_efficiency"],
            LatencyKind::Auto => &[],
        }
    }

    /// The model's named (non-numeric) keys: roofline's model and GPU presets.
    pub const fn name_keys(self) -> &'static [&'static str] {
        match self {
            LatencyKind::Roofline => &["llm", "gpu"],
            _ => &[],
        }
    }

    /// The model with its default parameters.
    pub const fn default_model(self) -> LatencyModel {
        match self {
            LatencyKind::None => LatencyModel::None,
            LatencyKind::Linear => LatencyModel::LINEAR_DEFAULT,
            LatencyKind::Calibrated => LatencyModel::CALIBRATED_DEFAULT,
            LatencyKind::MaxOfBatch => LatencyModel::MAX_OF_BATCH_DEFAULT,
            LatencyKind::AffineStep => LatencyModel::AFFINE_STEP_DEFAULT,
            LatencyKind::Roofline => LatencyModel::Roofline(Roofline::DEFAULT),
            // As a model of its own `auto` is request-level mode's choice.
            LatencyKind::Auto => LatencyModel::LINEAR_DEFAULT,
        }
    }

    /// Comma-separated list of valid names, for error messages.
    pub fn valid_names() -> String {
        Self::ALL.map(|k| k.as_str()).join(", ")
    }
}

impl fmt::Display for LatencyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LatencyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == LatencyKind::Auto.as_str() {
            return Ok(LatencyKind::Auto);
        }
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown latency model '{s}': valid models are {}",
                    Self::valid_names()
                )
            })
    }
}

crate::core::names::serde_by_name!(LatencyKind);

/// Which model prices a batch, with its parameters (all in ms or plain factors).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "LatencyKeys", into = "LatencyKeys")]
pub enum LatencyModel {
    /// Zero latency: measures abe's own overhead.
    None,
    /// The Go spec's model: `base + per_token x batch tokens + N(0, base x variance)` in ms.
    Linear {
        base_ms: f64,
        per_token_ms: f64,
        variance: f64,
    },
    /// Prefill at a per-token cost, then decode steps at `beta x (1 + gamma (b-1)/b)` ms,
    /// `b` being the requests still generating at that step (the multi-bin spec's
    /// calibration: beta 5.74 ms, gamma 0.316).
    Calibrated {
        prefill_ms_per_token: f64,
        beta_ms: f64,
        gamma: f64,
    },
    /// The multi-bin paper's: each request alone takes `base + prefill x prompt + decode x
    /// output`; the batch takes the longest of these.
    MaxOfBatch {
        base_ms: f64,
        prefill_ms_per_token: f64,
        decode_ms_per_token: f64,
    },
    /// Pang et al.'s per-decode-step cost `tau(b) = a b + c`: prefill per prompt token, then
    /// decode steps of `a x b + c` for the `b` requests still generating at that step.
    AffineStep {
        prefill_ms_per_token: f64,
        a_ms: f64,
        c_ms: f64,
    },
    /// A model preset on a GPU preset (`exec::roofline`): prefill against peak FLOP/s,
    /// decode against memory bandwidth, tensor parallelism, KV capacity from memory.
    Roofline(Roofline),
}

impl LatencyModel {
    /// The Go spec's defaults: 10 ms, 0.5 ms per token, variance 0.1.
    pub const LINEAR_DEFAULT: LatencyModel = LatencyModel::Linear {
        base_ms: 10.0,
        per_token_ms: 0.5,
        variance: 0.1,
    };
    /// The multi-bin spec's calibration, with 0.02 ms per prompt token for prefill.
    pub const CALIBRATED_DEFAULT: LatencyModel = LatencyModel::Calibrated {
        prefill_ms_per_token: 0.02,
        beta_ms: 5.74,
        gamma: 0.316,
    };
    /// No per-batch base; prefill as `calibrated`'s; a decode token at `calibrated`'s
    /// single-request step (beta).
    pub const MAX_OF_BATCH_DEFAULT: LatencyModel = LatencyModel::MaxOfBatch {
        base_ms: 0.0,
        prefill_ms_per_token: 0.02,
        decode_ms_per_token: 5.74,
    };
    /// Not from Pang et al. (no calibrated a, c could be found): chosen so `tau(1) = 5.7 ms`
    /// and `tau(8) = 7.1 ms`, close to the calibrated model's `beta h(b)` (5.74 and 7.33 ms),
    /// while growing linearly in `b` as the paper's model does.
    pub const AFFINE_STEP_DEFAULT: LatencyModel = LatencyModel::AffineStep {
        prefill_ms_per_token: 0.02,
        a_ms: 0.2,
        c_ms: 5.5,
    };

    /// The model's name.
    pub const fn kind(&self) -> LatencyKind {
        match self {
            LatencyModel::None => LatencyKind::None,
            LatencyModel::Linear { .. } => LatencyKind::Linear,
            LatencyModel::Calibrated { .. } => LatencyKind::Calibrated,
            LatencyModel::MaxOfBatch { .. } => LatencyKind::MaxOfBatch,
            LatencyModel::AffineStep { .. } => LatencyKind::AffineStep,
            LatencyModel::Roofline(_) => LatencyKind::Roofline,
        }
    }

    /// Config and scenario name.
    pub const fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// Parameter values in [`LatencyKind::keys`] order (the first `keys().len()` are
    /// meaningful, the rest 0).
    pub const fn params(&self) -> [f64; 3] {
        match *self {
            LatencyModel::None => [0.0; 3],
            LatencyModel::Linear {
                base_ms,
                per_token_ms,
                variance,
            } => [base_ms, per_token_ms, variance],
            LatencyModel::Calibrated {
                prefill_ms_per_token,
                beta_ms,
                gamma,
            } => [prefill_ms_per_token, beta_ms, gamma],
            LatencyModel::MaxOfBatch {
                base_ms,
                prefill_ms_per_token,
                decode_ms_per_token,
            } => [base_ms, prefill_ms_per_token, decode_ms_per_token],
            LatencyModel::AffineStep {
                prefill_ms_per_token,
                a_ms,
                c_ms,
            } => [prefill_ms_per_token, a_ms, c_ms],
            LatencyModel::Roofline(r) => [r.tp as f64, r.flops_efficiency, r.bandwidth_efficiency],
        }
    }

    /// The model `kind` with parameters `p` in [`LatencyKind::keys`] order (roofline: on
    /// the default model and GPU presets).
    pub const fn from_params(kind: LatencyKind, p: [f64; 3]) -> LatencyModel {
        let [x, y, z] = p;
        match kind {
            LatencyKind::None => LatencyModel::None,
            LatencyKind::Linear => LatencyModel::Linear {
                base_ms: x,
                per_token_ms: y,
                variance: z,
            },
            LatencyKind::Calibrated => LatencyModel::Calibrated {
                prefill_ms_per_token: x,
                beta_ms: y,
                gamma: z,
            },
            LatencyKind::MaxOfBatch => LatencyModel::MaxOfBatch {
                base_ms: x,
                prefill_ms_per_token: y,
                decode_ms_per_token: z,
            },
            LatencyKind::AffineStep => LatencyModel::AffineStep {
                prefill_ms_per_token: x,
                a_ms: y,
                c_ms: z,
            },
            LatencyKind::Roofline => LatencyModel::Roofline(Roofline {
                tp: x as u32,
                flops_efficiency: y,
                bandwidth_efficiency: z,
                ..Roofline::DEFAULT
            }),
            LatencyKind::Auto => LatencyModel::LINEAR_DEFAULT,
        }
    }

    /// This model with `key=value` overrides, numeric or named (`llm`, `gpu`): what a
    /// scenario's `[latency]` keys and `--latency` do. Errors name the key.
    pub fn with_overrides(&self, overrides: &[(String, String)]) -> Result<Self, String> {
        let mut k = LatencyKeys::from(*self);
        for (key, v) in overrides {
            k.set(key, v)?;
        }
        LatencyModel::try_from(k)
    }

    /// The KV cache a replica holds, in tokens, when the model knows it (roofline: from the
    /// GPU's memory less the weights); `None` for the others.
    pub fn kv_capacity_tokens(&self) -> Option<u64> {
        match self {
            LatencyModel::Roofline(r) => Some(r.kv_capacity_tokens()),
            _ => None,
        }
    }

    /// The model `kind` with `key=value` overrides of its default parameters. Errors name
    /// the key: one the model does not take, or a value that is not a finite number >= 0.
    pub fn with_params(kind: LatencyKind, params: &[(String, f64)]) -> Result<Self, String> {
        let mut k = LatencyKeys {
            model: kind.as_str().to_string(),
            ..Default::default()
        };
        for (key, v) in params {
            *k.slot(key)
                .ok_or_else(|| format!("unknown latency key '{key}'"))? = Some(*v);
        }
        LatencyModel::try_from(k)
    }

    /// This model with `key=value` overrides of its parameters (same model).
    pub fn overridden(&self, params: &[(String, f64)]) -> Result<Self, String> {
        let mut k = LatencyKeys::from(*self);
        for (key, v) in params {
            *k.slot(key)
                .ok_or_else(|| format!("unknown latency key '{key}'"))? = Some(*v);
        }
        LatencyModel::try_from(k)
    }

    /// Service time in ms of a batch whose requests have these (prompt tokens, output
    /// tokens) shapes. Never negative. `scratch` is reused for sorting the shapes by output
    /// length; it grows at most to the largest batch.
    pub fn batch_ms(
        &self,
        shapes: &[(u32, u32)],
        scratch: &mut Vec<(u32, u32)>,
        rng: &mut impl Rng,
    ) -> f64 {
        match *self {
            LatencyModel::None => 0.0,
            LatencyModel::Linear {
                base_ms,
                per_token_ms,
                variance,
            } => {
                let tokens: u64 = shapes
                    .iter()
                    .map(|&(p, o)| u64::from(p) + u64::from(o))
                    .sum();
                let noise = standard_normal(rng) * base_ms * variance;
                (base_ms + per_token_ms * tokens as f64 + noise).max(0.0)
            }
            LatencyModel::Calibrated {
                prefill_ms_per_token,
                beta_ms,
                gamma,
            } => {
                prefill_ms(shapes, prefill_ms_per_token)
                    + decode_walk(shapes, scratch, |b| decode_step_ms(beta_ms, gamma, b))
            }
            LatencyModel::MaxOfBatch {
                base_ms,
                prefill_ms_per_token,
                decode_ms_per_token,
            } => shapes
                .iter()
                .map(|&(p, o)| {
                    base_ms
                        + prefill_ms_per_token * f64::from(p)
                        + decode_ms_per_token * f64::from(o)
                })
                .fold(0.0, f64::max),
            LatencyModel::AffineStep {
                prefill_ms_per_token,
                a_ms,
                c_ms,
            } => {
                prefill_ms(shapes, prefill_ms_per_token)
                    + decode_walk(shapes, scratch, |b| affine_step_ms(a_ms, c_ms, b))
            }
            LatencyModel::Roofline(r) => roofline_batch_ms(&r, shapes, scratch),
        }
    }

    /// Service time in ms of one continuous-batching step of this shape: `decode` decode
    /// tokens (one per generating slot) and `prefill` prompt tokens. `linear`: `per_token`
    /// for every token of the step (its per-batch base does not apply to steps); `roofline`:
    /// the step's FLOPs and bytes (`exec::roofline`, the only one that reads the context);
    /// the others: prefill at their per-token cost plus one decode step for `b = decode`
    /// slots (`calibrated`: `beta (1 + gamma (b-1)/b)`; `affine_step`: `a b + c`;
    /// `max_of_batch`: one decode token, the slots decoding in parallel; its per-batch base
    /// does not apply either); `none`: 0.
    pub fn step_ms(&self, shape: &StepShape) -> f64 {
        let (decode, prefill) = (shape.decode_tokens, shape.prefill_tokens);
        match *self {
            LatencyModel::Roofline(r) => r.step_ms(shape),
            LatencyModel::None => 0.0,
            LatencyModel::Linear { per_token_ms, .. } => per_token_ms * f64::from(decode + prefill),
            LatencyModel::Calibrated {
                prefill_ms_per_token,
                beta_ms,
                gamma,
            } => {
                prefill_ms_per_token * f64::from(prefill)
                    + decode_step_ms(beta_ms, gamma, f64::from(decode))
            }
            LatencyModel::MaxOfBatch {
                prefill_ms_per_token,
                decode_ms_per_token,
                ..
            } => {
                let decode_ms = if decode > 0 { decode_ms_per_token } else { 0.0 };
                prefill_ms_per_token * f64::from(prefill) + decode_ms
            }
            LatencyModel::AffineStep {
                prefill_ms_per_token,
                a_ms,
                c_ms,
            } => {
                prefill_ms_per_token * f64::from(prefill)
                    + affine_step_ms(a_ms, c_ms, f64::from(decode))
            }
        }
    }
}

impl fmt::Display for LatencyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn prefill_ms(shapes: &[(u32, u32)], per_token: f64) -> f64 {
    per_token * shapes.iter().map(|&(p, _)| u64::from(p)).sum::<u64>() as f64
}

/// Sum over decode steps of `step(b)`, `b` the requests still generating: with output
/// lengths sorted ascending, `b` is constant between consecutive lengths.
fn decode_walk(
    shapes: &[(u32, u32)],
    scratch: &mut Vec<(u32, u32)>,
    step: impl Fn(f64) -> f64,
) -> f64 {
    sort_by_output(shapes, scratch);
    let n = scratch.len();
    let mut done = 0u32;
    let mut ms = 0.0;
    for (i, &(_, len)) in scratch.iter().enumerate() {
        if len > done {
            ms += f64::from(len - done) * step((n - i) as f64);
            done = len;
        }
    }
    ms
}

fn sort_by_output(shapes: &[(u32, u32)], scratch: &mut Vec<(u32, u32)>) {
    scratch.clear();
    scratch.extend_from_slice(shapes);
    scratch.sort_unstable_by_key(|&(p, o)| (o, p));
}

/// A request-level batch on the roofline: one prefill step of every prompt, then one decode
/// step per output token for the requests still generating, each over its growing context.
/// O(longest output) steps; `scratch` holds the shapes sorted by output length.
fn roofline_batch_ms(r: &Roofline, shapes: &[(u32, u32)], scratch: &mut Vec<(u32, u32)>) -> f64 {
    let mut prefill = StepShape::default();
    for &(p, _) in shapes {
        prefill.push(0, p, false);
    }
    let mut ms = r.step_ms(&prefill);
    sort_by_output(shapes, scratch);
    let mut active = scratch.len();
    let mut prompt_sum: u64 = scratch.iter().map(|&(p, _)| u64::from(p)).sum();
    let mut first = 0; // scratch[first..] are still generating
    let longest = scratch.last().map_or(0, |&(_, o)| o);
    for step in 0..longest {
        while first < scratch.len() && scratch[first].1 <= step {
            prompt_sum -= u64::from(scratch[first].0);
            active -= 1;
            first += 1;
        }
        let b = active as u64;
        let context = prompt_sum + b * u64::from(step);
        let shape = StepShape {
            decode_tokens: active as u32,
            prefill_tokens: 0,
            kv_read_tokens: context,
            attention_pairs: context + b,
            lora_loads: 0,
        };
        ms += r.step_ms(&shape);
    }
    ms
}

/// One decode step with `b` active requests: `beta x (1 + gamma (b-1)/b)`.
pub fn decode_step_ms(beta_ms: f64, gamma: f64, b: f64) -> f64 {
    if b <= 0.0 {
        return 0.0;
    }
    beta_ms * (1.0 + gamma * (b - 1.0) / b)
}

/// One decode step of `affine_step` with `b` active requests: `a b + c`.
fn affine_step_ms(a_ms: f64, c_ms: f64, b: f64) -> f64 {
    if b > 0.0 {
        a_ms * b + c_ms
    } else {
        0.0
    }
}

/// A standard normal sample (Box-Muller), from any RNG.
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The flat serde form of a [`LatencyModel`] (a scenario's `[latency]` table, the report's
/// `latency`): `model` plus whichever keys that model takes; absent keys take the model's
/// defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyKeys {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_token_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variance: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_ms_per_token: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_ms_per_token: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Llm>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Gpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_efficiency: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_efficiency: Option<f64>,
}

/// Every named (non-numeric) key of any model.
pub const NAME_KEYS: [&str; 2] = ["llm", "gpu"];

/// Every numeric parameter key of any model (every key of [`LatencyKeys`] but `model` and
/// the [`NAME_KEYS`]).
pub const PARAM_KEYS: [&str; 12] = [
    "base_ms",
    "per_token_ms",
    "variance",
    "prefill_ms_per_token",
    "beta_ms",
    "gamma",
    "decode_ms_per_token",
    "a_ms",
    "c_ms",
    "tp",
    "flops_efficiency",
    "bandwidth_efficiency",
];

impl LatencyKeys {
    fn slot(&mut self, key: &str) -> Option<&mut Option<f64>> {
        Some(match key {
            "base_ms" => &mut self.base_ms,
            "per_token_ms" => &mut self.per_token_ms,
            "variance" => &mut self.variance,
            "prefill_ms_per_token" => &mut self.prefill_ms_per_token,
            "beta_ms" => &mut self.beta_ms,
            "gamma" => &mut self.gamma,
            "decode_ms_per_token" => &mut self.decode_ms_per_token,
            "a_ms" => &mut self.a_ms,
            "c_ms" => &mut self.c_ms,
            "tp" => &mut self.tp,
            "flops_efficiency" => &mut self.flops_efficiency,
            "bandwidth_efficiency" => &mut self.bandwidth_efficiency,
            _ => return None,
        })
    }

    /// Sets `key` from text: a preset name for `llm` and `gpu`, a number for the others.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        match key {
            "llm" => self.llm = Some(value.parse()?),
            "gpu" => self.gpu = Some(value.parse()?),
            _ => {
                let v: f64 = value
                    .parse()
                    .map_err(|_| format!("latency.{key}: '{value}' is not a number"))?;
                *self.slot(key).ok_or_else(|| {
                    format!(
                        "unknown latency key '{key}' (keys: {}, {})",
                        PARAM_KEYS.join(", "),
                        NAME_KEYS.join(", ")
                    )
                })? = Some(v);
            }
        }
        Ok(())
    }
}

impl TryFrom<LatencyKeys> for LatencyModel {
    type Error = String;
    fn try_from(mut k: LatencyKeys) -> Result<Self, String> {
        let kind: LatencyKind = k.model.parse()?;
        if kind == LatencyKind::Auto {
            return Err(format!(
                "latency model 'auto' is a choice of the live config ([workers] in \
                 config.toml: linear in request mode, roofline in continuous mode); name a \
                 model here: {}",
                LatencyKind::valid_names()
            ));
        }
        let mut values = kind.default_model().params();
        for (i, key) in kind.keys().iter().enumerate() {
            let v = k.slot(key).and_then(|s| s.take()).unwrap_or(values[i]);
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("latency.{key} = {v}: must be a finite number >= 0"));
            }
            values[i] = v;
        }
        let (llm, gpu) = (k.llm.take(), k.gpu.take());
        if kind != LatencyKind::Roofline {
            if let Some(key) = [(llm.is_some(), "llm"), (gpu.is_some(), "gpu")]
                .iter()
                .find(|(set, _)| *set)
                .map(|(_, key)| *key)
            {
                return Err(format!(
                    "latency key '{key}' does not apply to model {kind} (only roofline takes \
                     llm and gpu)"
                ));
            }
        }
        // Anything still set belongs to another model.
        for key in PARAM_KEYS {
            if k.slot(key).is_some_and(|s| s.is_some()) {
                let valid = kind.keys();
                return Err(format!(
                    "latency key '{key}' does not apply to model {kind} (its keys: {})",
                    if valid.is_empty() {
                        "none".to_string()
                    } else {
                        valid.join(", ")
                    }
                ));
            }
        }
        let mut model = LatencyModel::from_params(kind, values);
        if let LatencyModel::Roofline(r) = &mut model {
            let tp = values[0];
            if tp.fract() != 0.0 || tp < 1.0 {
                return Err(format!("latency.tp = {tp}: must be a whole number >= 1"));
            }
            r.llm = llm.unwrap_or(r.llm);
            r.gpu = gpu.unwrap_or(r.gpu);
            r.check()?;
        }
        Ok(model)
    }
}

impl From<LatencyModel> for LatencyKeys {
    fn from(m: LatencyModel) -> LatencyKeys {
        let kind = m.kind();
        let mut k = LatencyKeys {
            model: kind.as_str().to_string(),
            ..Default::default()
        };
        for (key, v) in kind.keys().iter().zip(m.params()) {
            *k.slot(key).expect("listed keys exist") = Some(v);
        }
        if let LatencyModel::Roofline(r) = m {
            k.llm = Some(r.llm);
            k.gpu = Some(r.gpu);
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn linear_is_base_plus_per_token_with_ten_percent_noise_around_it() {
        let m = LatencyModel::LINEAR_DEFAULT;
        let mut rng = SmallRng::seed_from_u64(3);
        let mut s = Vec::new();
        // 2 requests x (100 + 50) tokens = 300 tokens: 10 + 150 = 160 ms mean, sd 1 ms.
        let n = 20_000;
        let samples: Vec<f64> = (0..n)
            .map(|_| m.batch_ms(&[(100, 50), (100, 50)], &mut s, &mut rng))
            .collect();
        let mean = samples.iter().sum::<f64>() / n as f64;
        let sd = (samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!((mean - 160.0).abs() < 0.05, "mean {mean}");
        assert!((sd - 1.0).abs() < 0.05, "sd {sd}");
    }

    #[test]
    fn calibrated_decode_steps_follow_beta_one_plus_gamma() {
        let m = LatencyModel::Calibrated {
            prefill_ms_per_token: 0.0,
            beta_ms: 5.74,
            gamma: 0.316,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Vec::new();
        // One request of 10 tokens: 10 steps at b = 1 -> 57.4 ms.
        assert!((m.batch_ms(&[(0, 10)], &mut s, &mut rng) - 57.4).abs() < 1e-9);
        // Two requests of 10: 10 steps at b = 2 -> 10 x 5.74 x 1.158.
        let two = m.batch_ms(&[(0, 10), (0, 10)], &mut s, &mut rng);
        assert!((two - 10.0 * 5.74 * 1.158).abs() < 1e-9);
        // Lengths 4 and 10: 4 steps at b = 2, 6 at b = 1.
        let mixed = m.batch_ms(&[(0, 10), (0, 4)], &mut s, &mut rng);
        assert!((mixed - (4.0 * 5.74 * 1.158 + 6.0 * 5.74)).abs() < 1e-9);
    }

    #[test]
    fn calibrated_prefill_is_per_prompt_token_and_none_is_zero() {
        let m = LatencyModel::Calibrated {
            prefill_ms_per_token: 0.5,
            beta_ms: 0.0,
            gamma: 0.0,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Vec::new();
        assert_eq!(m.batch_ms(&[(10, 0), (30, 0)], &mut s, &mut rng), 20.0);
        let none = LatencyModel::None;
        assert_eq!(none.batch_ms(&[(1000, 1000)], &mut s, &mut rng), 0.0);
    }

    #[test]
    fn max_of_batch_is_the_slowest_request() {
        let m = LatencyModel::with_params(
            LatencyKind::MaxOfBatch,
            &[
                ("prefill_ms_per_token".into(), 0.0),
                ("decode_ms_per_token".into(), 2.0),
            ],
        )
        .unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Vec::new();
        assert_eq!(
            m.batch_ms(&[(5, 10), (5, 30), (5, 20)], &mut s, &mut rng),
            60.0
        );
        assert_eq!(m.batch_ms(&[], &mut s, &mut rng), 0.0);
    }

    #[test]
    fn affine_step_sums_a_b_plus_c_as_requests_finish() {
        let m = LatencyModel::AffineStep {
            prefill_ms_per_token: 0.0,
            a_ms: 1.0,
            c_ms: 10.0,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Vec::new();
        // Lengths 2, 5: 2 steps at b = 2 (12 ms each), 3 steps at b = 1 (11 ms each).
        assert_eq!(
            m.batch_ms(&[(0, 5), (0, 2)], &mut s, &mut rng),
            2.0 * 12.0 + 3.0 * 11.0
        );
    }

    fn step(decode: u32, prefill: u32) -> StepShape {
        let mut s = StepShape::default();
        for _ in 0..decode {
            s.push(200, 1, true);
        }
        if prefill > 0 {
            s.push(0, prefill, false);
        }
        s
    }

    #[test]
    fn every_model_prices_a_step() {
        for kind in LatencyKind::ALL {
            let m = kind.default_model();
            assert_eq!(m.step_ms(&step(0, 0)), 0.0, "{kind}: an empty step is free");
            let step = m.step_ms(&step(4, 100));
            assert!(step.is_finite() && step >= 0.0, "{kind}: {step}");
            if kind != LatencyKind::None {
                assert!(step > 0.0, "{kind}");
            }
        }
        let affine = LatencyModel::AFFINE_STEP_DEFAULT;
        assert!((affine.step_ms(&step(8, 0)) - 7.1).abs() < 1e-9);
        let max = LatencyModel::MAX_OF_BATCH_DEFAULT;
        assert!((max.step_ms(&step(8, 50)) - (0.02 * 50.0 + 5.74)).abs() < 1e-9);
    }

    #[test]
    fn keys_parse_with_defaults_and_foreign_keys_are_named() {
        let m: LatencyModel = toml::from_str("model = \"affine_step\"\na_ms = 0.5\n").unwrap();
        assert_eq!(
            m,
            LatencyModel::AffineStep {
                prefill_ms_per_token: 0.02,
                a_ms: 0.5,
                c_ms: 5.5
            }
        );
        let e =
            toml::from_str::<LatencyModel>("model = \"max_of_batch\"\ngamma = 1.0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("'gamma' does not apply to model max_of_batch"),
            "{e}"
        );
        let e = "fast".parse::<LatencyKind>().unwrap_err();
        assert!(
            e.contains("none, linear, calibrated, max_of_batch, affine_step, roofline"),
            "{e}"
        );
        let back: LatencyModel = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        let o = m.overridden(&[("c_ms".into(), 1.0)]).unwrap();
        assert_eq!(
            o,
            LatencyModel::AffineStep {
                prefill_ms_per_token: 0.02,
                a_ms: 0.5,
                c_ms: 1.0
            }
        );
        for kind in LatencyKind::ALL {
            let m = kind.default_model();
            assert_eq!(m.kind(), kind);
            assert_eq!(LatencyModel::from_params(kind, m.params()), m);
        }
    }

    #[test]
    fn roofline_keys_name_presets_and_survive_a_round_trip() {
        let m: LatencyModel = toml::from_str(
            "model = \"roofline\"\nllm = \"llama-3.1-70b\"\ngpu = \"h100-sxm\"\ntp = 4\n",
        )
        .unwrap();
        let LatencyModel::Roofline(r) = m else {
            panic!("{m:?}")
        };
        assert_eq!(
            (r.llm.as_str(), r.gpu.as_str(), r.tp),
            ("llama-3.1-70b", "h100-sxm", 4)
        );
        assert_eq!(r.flops_efficiency, Roofline::DEFAULT.flops_efficiency);
        let back: LatencyModel = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        // Overrides keep the presets; `--latency gpu=h200` switches one.
        let o = m.with_overrides(&[("gpu".into(), "h200".into())]).unwrap();
        let LatencyModel::Roofline(o) = o else {
            panic!()
        };
        assert_eq!(
            (o.llm.as_str(), o.gpu.as_str(), o.tp),
            ("llama-3.1-70b", "h200", 4)
        );
        let e = m.with_overrides(&[("tp".into(), "1".into())]).unwrap_err();
        assert!(e.contains("raise tp"), "{e}");
        let e = toml::from_str::<LatencyModel>("model = \"linear\"\nllm = \"mistral-7b\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("only roofline"), "{e}");
        let e =
            toml::from_str::<LatencyModel>("model = \"roofline\"\ngpu = \"tpu\"\n").unwrap_err();
        assert!(e.to_string().contains("h100-sxm"), "{e}");
        let e = toml::from_str::<LatencyModel>("model = \"roofline\"\ntp = 1.5\n").unwrap_err();
        assert!(e.to_string().contains("whole number"), "{e}");
        assert_eq!(
            LatencyModel::Roofline(Roofline::DEFAULT).kv_capacity_tokens(),
            Some(Roofline::DEFAULT.kv_capacity_tokens())
        );
    }

    #[test]
    fn roofline_batch_is_a_prefill_then_shrinking_decode_steps() {
        let r = Roofline::DEFAULT;
        let m = LatencyModel::Roofline(r);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = Vec::new();
        let got = m.batch_ms(&[(100, 2), (50, 1)], &mut s, &mut rng);
        let mut prefill = StepShape::default();
        prefill.push(0, 100, false);
        prefill.push(0, 50, false);
        let mut first = StepShape::default();
        first.push(100, 1, true);
        first.push(50, 1, true);
        let mut second = StepShape::default();
        second.push(101, 1, true);
        let want = r.step_ms(&prefill) + r.step_ms(&first) + r.step_ms(&second);
        assert!((got - want).abs() < 1e-12, "{got} {want}");
    }
}
