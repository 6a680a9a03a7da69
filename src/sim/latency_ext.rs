//! Latency models for the simulator: the three of `exec::latency` plus `max_of_batch` (the
//! multi-bin paper's: a batch takes as long as its slowest request) and `affine_step` (Pang
//! et al.'s per-decode-step cost `tau(b) = a b + c`).
//!
//! [`LatencySpec`] is the serde form (`[latency]` in a scenario, `--latency-model` and
//! `--latency key=value` on the command line). Pricing a batch never allocates: the caller
//! lends a scratch buffer. Randomness (the linear model's noise) comes from the caller's RNG.
//! This file must not change `exec::latency`'s models; it delegates to them.

use super::SimError;
use crate::exec::latency::{decode_step_ms, LatencyModel};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Which model prices a batch, with its parameters (all in ms or plain factors).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "LatencyKeys", into = "LatencyKeys")]
pub enum LatencySpec {
    /// Zero service time.
    None,
    /// `base + per_token x batch tokens + N(0, base x variance)`.
    Linear {
        base_ms: f64,
        per_token_ms: f64,
        variance: f64,
    },
    /// Prefill per prompt token, then decode steps of `beta (1 + gamma (b-1)/b)`.
    Calibrated {
        prefill_ms_per_token: f64,
        beta_ms: f64,
        gamma: f64,
    },
    /// Each request alone takes `base + prefill x prompt + decode x output`; the batch takes
    /// the longest of these.
    MaxOfBatch {
        base_ms: f64,
        prefill_ms_per_token: f64,
        decode_ms_per_token: f64,
    },
    /// Prefill per prompt token, then decode steps of `a x b + c` for the `b` requests still
    /// generating at that step.
    AffineStep {
        prefill_ms_per_token: f64,
        a_ms: f64,
        c_ms: f64,
    },
}

/// Every model's keys with their defaults, in the order `--help` lists them.
///
/// `affine_step`'s defaults are not from Pang et al. (no calibrated a, c could be found);
/// they are chosen so `tau(1) = 5.7 ms` and `tau(8) = 7.1 ms`, close to the calibrated
/// model's `beta h(b)` (5.74 and 7.33 ms), while growing linearly in `b` as the paper's model does.
pub const MODEL_KEYS: [(&str, &[(&str, f64)]); 5] = [
    ("none", &[]),
    (
        "linear",
        &[("base_ms", 10.0), ("per_token_ms", 0.5), ("variance", 0.1)],
    ),
    (
        "calibrated",
        &[
            ("prefill_ms_per_token", 0.02),
            ("beta_ms", 5.74),
            ("gamma", 0.316),
        ],
    ),
    (
        "max_of_batch",
        &[
            ("base_ms", 0.0),
            ("prefill_ms_per_token", 0.02),
            ("decode_ms_per_token", 5.74),
        ],
    ),
    (
        "affine_step",
        &[("prefill_ms_per_token", 0.02), ("a_ms", 0.2), ("c_ms", 5.5)],
    ),
];

/// The flat serde form: `model` plus whichever keys that model takes.
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
}

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
            _ => return None,
        })
    }
}

fn model_names() -> String {
    MODEL_KEYS.map(|(m, _)| m).join(", ")
}

impl TryFrom<LatencyKeys> for LatencySpec {
    type Error = String;
    fn try_from(mut k: LatencyKeys) -> Result<Self, String> {
        let Some((model, keys)) = MODEL_KEYS.iter().find(|(m, _)| *m == k.model) else {
            return Err(format!(
                "unknown latency model '{}': valid models are {}",
                k.model,
                model_names()
            ));
        };
        let mut values = [0.0f64; 3];
        for (i, (key, default)) in keys.iter().enumerate() {
            let v = k.slot(key).and_then(|s| s.take()).unwrap_or(*default);
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("latency.{key} = {v}: must be a finite number >= 0"));
            }
            values[i] = v;
        }
        // Anything still set belongs to another model.
        let all = [
            "base_ms",
            "per_token_ms",
            "variance",
            "prefill_ms_per_token",
            "beta_ms",
            "gamma",
            "decode_ms_per_token",
            "a_ms",
            "c_ms",
        ];
        for key in all {
            if k.slot(key).is_some_and(|s| s.is_some()) {
                let valid: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
                return Err(format!(
                    "latency key '{key}' does not apply to model {model} (its keys: {})",
                    if valid.is_empty() {
                        "none".to_string()
                    } else {
                        valid.join(", ")
                    }
                ));
            }
        }
        let [x, y, z] = values;
        Ok(match *model {
            "none" => LatencySpec::None,
            "linear" => LatencySpec::Linear {
                base_ms: x,
                per_token_ms: y,
                variance: z,
            },
            "calibrated" => LatencySpec::Calibrated {
                prefill_ms_per_token: x,
                beta_ms: y,
                gamma: z,
            },
            "max_of_batch" => LatencySpec::MaxOfBatch {
                base_ms: x,
                prefill_ms_per_token: y,
                decode_ms_per_token: z,
            },
            _ => LatencySpec::AffineStep {
                prefill_ms_per_token: x,
                a_ms: y,
                c_ms: z,
            },
        })
    }
}

impl From<LatencySpec> for LatencyKeys {
    fn from(s: LatencySpec) -> LatencyKeys {
        let mut k = LatencyKeys {
            model: s.name().to_string(),
            ..Default::default()
        };
        let (_, keys) = MODEL_KEYS
            .iter()
            .find(|(m, _)| *m == s.name())
            .expect("every model is listed");
        for ((key, _), v) in keys.iter().zip(s.values()) {
            *k.slot(key).expect("listed keys exist") = Some(v);
        }
        k
    }
}

impl Default for LatencySpec {
    fn default() -> Self {
        LatencySpec::named("calibrated").expect("calibrated exists")
    }
}

impl LatencySpec {
    /// The model `name` with its default parameters.
    pub fn named(name: &str) -> Result<LatencySpec, SimError> {
        Self::with_params(name, &[])
    }

    /// The model `name` with `key=value` overrides of its parameters.
    pub fn with_params(name: &str, params: &[(String, f64)]) -> Result<LatencySpec, SimError> {
        let mut k = LatencyKeys {
            model: name.to_string(),
            ..Default::default()
        };
        for (key, v) in params {
            let slot = k.slot(key).ok_or_else(|| {
                SimError::invalid(
                    "--latency",
                    format!("unknown latency key '{key}'; see `abe simulate --help`"),
                )
            })?;
            *slot = Some(*v);
        }
        LatencySpec::try_from(k).map_err(|why| SimError::invalid("latency model", why))
    }

    /// This spec with `key=value` overrides applied (same model).
    pub fn overridden(&self, params: &[(String, f64)]) -> Result<LatencySpec, SimError> {
        let mut all: Vec<(String, f64)> = MODEL_KEYS
            .iter()
            .find(|(m, _)| *m == self.name())
            .map(|(_, keys)| {
                keys.iter()
                    .map(|(k, _)| k.to_string())
                    .zip(self.values())
                    .collect()
            })
            .unwrap_or_default();
        all.extend(params.iter().cloned());
        Self::with_params(self.name(), &all)
    }

    /// Model name as written in scenarios and on the command line.
    pub const fn name(&self) -> &'static str {
        match self {
            LatencySpec::None => "none",
            LatencySpec::Linear { .. } => "linear",
            LatencySpec::Calibrated { .. } => "calibrated",
            LatencySpec::MaxOfBatch { .. } => "max_of_batch",
            LatencySpec::AffineStep { .. } => "affine_step",
        }
    }

    /// Parameter values in [`MODEL_KEYS`] order.
    fn values(&self) -> Vec<f64> {
        match *self {
            LatencySpec::None => vec![],
            LatencySpec::Linear {
                base_ms,
                per_token_ms,
                variance,
            } => vec![base_ms, per_token_ms, variance],
            LatencySpec::Calibrated {
                prefill_ms_per_token,
                beta_ms,
                gamma,
            } => vec![prefill_ms_per_token, beta_ms, gamma],
            LatencySpec::MaxOfBatch {
                base_ms,
                prefill_ms_per_token,
                decode_ms_per_token,
            } => vec![base_ms, prefill_ms_per_token, decode_ms_per_token],
            LatencySpec::AffineStep {
                prefill_ms_per_token,
                a_ms,
                c_ms,
            } => vec![prefill_ms_per_token, a_ms, c_ms],
        }
    }

    /// Service time in ms of a batch of `(prompt tokens, output tokens)` shapes. `scratch`
    /// is reused for sorting output lengths; it grows at most to the largest batch.
    pub fn batch_ms(
        &self,
        shapes: &[(u32, u32)],
        scratch: &mut Vec<u32>,
        rng: &mut impl Rng,
    ) -> f64 {
        match *self {
            LatencySpec::None => 0.0,
            LatencySpec::Linear {
                base_ms,
                per_token_ms,
                variance,
            } => LatencyModel::Linear {
                base_ms,
                per_token_ms,
                variance,
            }
            .batch_ms(shapes, rng),
            LatencySpec::Calibrated {
                prefill_ms_per_token,
                beta_ms,
                gamma,
            } => {
                prefill_ms(shapes, prefill_ms_per_token)
                    + decode_walk(shapes, scratch, |b| decode_step_ms(beta_ms, gamma, b))
            }
            LatencySpec::MaxOfBatch {
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
            LatencySpec::AffineStep {
                prefill_ms_per_token,
                a_ms,
                c_ms,
            } => {
                prefill_ms(shapes, prefill_ms_per_token)
                    + decode_walk(
                        shapes,
                        scratch,
                        |b| if b > 0.0 { a_ms * b + c_ms } else { 0.0 },
                    )
            }
        }
    }
}

fn prefill_ms(shapes: &[(u32, u32)], per_token: f64) -> f64 {
    per_token * shapes.iter().map(|&(p, _)| u64::from(p)).sum::<u64>() as f64
}

/// Sum over decode steps of `step(b)`, `b` the requests still generating: with output
/// lengths sorted ascending, `b` is constant between consecutive lengths.
fn decode_walk(shapes: &[(u32, u32)], scratch: &mut Vec<u32>, step: impl Fn(f64) -> f64) -> f64 {
    scratch.clear();
    scratch.extend(shapes.iter().map(|&(_, o)| o));
    scratch.sort_unstable();
    let n = scratch.len();
    let mut done = 0u32;
    let mut ms = 0.0;
    for (i, &len) in scratch.iter().enumerate() {
        if len > done {
            ms += f64::from(len - done) * step((n - i) as f64);
            done = len;
        }
    }
    ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn calibrated_matches_the_exec_model_exactly() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut scratch = Vec::new();
        let shapes = [(100, 10), (30, 4), (7, 200), (0, 0)];
        let ours = LatencySpec::default().batch_ms(&shapes, &mut scratch, &mut rng);
        let theirs = LatencyModel::CALIBRATED_DEFAULT.batch_ms(&shapes, &mut rng);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn max_of_batch_is_the_slowest_request() {
        let m = LatencySpec::with_params(
            "max_of_batch",
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
        let m = LatencySpec::AffineStep {
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

    #[test]
    fn keys_parse_with_defaults_and_foreign_keys_are_named() {
        let m: LatencySpec = toml::from_str("model = \"affine_step\"\na_ms = 0.5\n").unwrap();
        assert_eq!(
            m,
            LatencySpec::AffineStep {
                prefill_ms_per_token: 0.02,
                a_ms: 0.5,
                c_ms: 5.5
            }
        );
        let e =
            toml::from_str::<LatencySpec>("model = \"max_of_batch\"\ngamma = 1.0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("'gamma' does not apply to model max_of_batch"),
            "{e}"
        );
        let e = LatencySpec::named("fast").unwrap_err();
        assert!(e
            .to_string()
            .contains("none, linear, calibrated, max_of_batch, affine_step"));
        let back: LatencySpec = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        let o = m.overridden(&[("c_ms".into(), 1.0)]).unwrap();
        assert_eq!(
            o,
            LatencySpec::AffineStep {
                prefill_ms_per_token: 0.02,
                a_ms: 0.5,
                c_ms: 1.0
            }
        );
    }
}
