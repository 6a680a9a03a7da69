//! Length distributions for prompt and output token counts.
//!
//! [`LengthDist`] is plain data (serde, so a scenario file can name one); [`LengthDist::sampler`]
//! validates it once and precomputes what drawing needs (cumulative weights), so drawing is
//! O(1) or O(log n) and never allocates. Samples are rounded to the nearest whole token and
//! clamped to `0..=MAX_SAMPLE_TOKENS`. Nothing here keeps state between draws or reads a
//! clock: the same RNG state always gives the same length.

use super::SimError;
use crate::exec::latency::standard_normal;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Largest token count a draw is clamped to (keeps the core's u32 token sums far from overflow).
pub const MAX_SAMPLE_TOKENS: u32 = 10_000_000;

/// A distribution of token counts. Every variant's keys are listed in `abe simulate --help`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthDist {
    /// Always `value`.
    Fixed { value: f64 },
    /// Continuous uniform on `[min, max]`, then rounded.
    Uniform { min: f64, max: f64 },
    /// Normal, clamped to `[min, max]` (defaults 0 and unbounded).
    Normal {
        mean: f64,
        std_dev: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    /// Log-normal with the given median (`exp(mu)`) and log-space `sigma`, clamped to `max`.
    Lognormal {
        median: f64,
        sigma: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    /// Exponential with the given mean, clamped to `max`.
    Exponential {
        mean: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    /// Mixture: `first` with probability `weight`, else `second`.
    Bimodal {
        weight: f64,
        first: Box<LengthDist>,
        second: Box<LengthDist>,
    },
    /// One of `values`, with probabilities proportional to `weights` (equal when absent).
    Empirical {
        values: Vec<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weights: Option<Vec<f64>>,
    },
}

/// A validated [`LengthDist`], ready to draw from.
#[derive(Clone, Debug)]
pub enum LengthSampler {
    Fixed(f64),
    Uniform(f64, f64),
    Normal {
        mean: f64,
        std_dev: f64,
        min: f64,
        max: f64,
    },
    Lognormal {
        mu: f64,
        sigma: f64,
        max: f64,
    },
    Exponential {
        mean: f64,
        max: f64,
    },
    Bimodal(f64, Box<LengthSampler>, Box<LengthSampler>),
    /// `cumulative` is strictly increasing in its last element (the total) and has the same
    /// length as `values`.
    Empirical {
        values: Vec<f64>,
        cumulative: Vec<f64>,
    },
}

fn finite_non_negative(what: &str, key: &str, v: f64) -> Result<f64, SimError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(SimError::invalid(
            format!("{what}.{key}"),
            format!("{v} must be a finite number >= 0"),
        ))
    }
}

fn upper(what: &str, max: Option<f64>) -> Result<f64, SimError> {
    match max {
        None => Ok(f64::from(MAX_SAMPLE_TOKENS)),
        Some(m) => finite_non_negative(what, "max", m),
    }
}

impl LengthDist {
    /// Checks the parameters (`what` names the distribution in errors, e.g.
    /// `workload.output_tokens`) and precomputes the sampler.
    pub fn sampler(&self, what: &str) -> Result<LengthSampler, SimError> {
        Ok(match self {
            LengthDist::Fixed { value } => {
                LengthSampler::Fixed(finite_non_negative(what, "value", *value)?)
            }
            LengthDist::Uniform { min, max } => {
                let lo = finite_non_negative(what, "min", *min)?;
                let hi = finite_non_negative(what, "max", *max)?;
                if lo > hi {
                    return Err(SimError::invalid(
                        format!("{what}.min"),
                        format!("{lo} exceeds max {hi}"),
                    ));
                }
                LengthSampler::Uniform(lo, hi)
            }
            LengthDist::Normal {
                mean,
                std_dev,
                min,
                max,
            } => LengthSampler::Normal {
                mean: finite_non_negative(what, "mean", *mean)?,
                std_dev: finite_non_negative(what, "std_dev", *std_dev)?,
                min: finite_non_negative(what, "min", min.unwrap_or(0.0))?,
                max: upper(what, *max)?,
            },
            LengthDist::Lognormal { median, sigma, max } => {
                let median = finite_non_negative(what, "median", *median)?;
                if median == 0.0 {
                    return Err(SimError::invalid(format!("{what}.median"), "must be > 0"));
                }
                LengthSampler::Lognormal {
                    mu: median.ln(),
                    sigma: finite_non_negative(what, "sigma", *sigma)?,
                    max: upper(what, *max)?,
                }
            }
            LengthDist::Exponential { mean, max } => LengthSampler::Exponential {
                mean: finite_non_negative(what, "mean", *mean)?,
                max: upper(what, *max)?,
            },
            LengthDist::Bimodal {
                weight,
                first,
                second,
            } => {
                if !(0.0..=1.0).contains(weight) {
                    return Err(SimError::invalid(
                        format!("{what}.weight"),
                        format!("{weight} must be in [0, 1]"),
                    ));
                }
                LengthSampler::Bimodal(
                    *weight,
                    Box::new(first.sampler(&format!("{what}.first"))?),
                    Box::new(second.sampler(&format!("{what}.second"))?),
                )
            }
            LengthDist::Empirical { values, weights } => {
                if values.is_empty() {
                    return Err(SimError::invalid(
                        format!("{what}.values"),
                        "needs at least one value",
                    ));
                }
                for v in values {
                    finite_non_negative(what, "values", *v)?;
                }
                let weights = match weights {
                    Some(w) if w.len() != values.len() => {
                        return Err(SimError::invalid(
                            format!("{what}.weights"),
                            format!("has {} entries, values has {}", w.len(), values.len()),
                        ))
                    }
                    Some(w) => w.clone(),
                    None => vec![1.0; values.len()],
                };
                let mut total = 0.0;
                let mut cumulative = Vec::with_capacity(weights.len());
                for w in weights {
                    total += finite_non_negative(what, "weights", w)?;
                    cumulative.push(total);
                }
                if total <= 0.0 {
                    return Err(SimError::invalid(
                        format!("{what}.weights"),
                        "must not all be 0",
                    ));
                }
                LengthSampler::Empirical {
                    values: values.clone(),
                    cumulative,
                }
            }
        })
    }

    /// The distribution's mean before rounding and clamping (used in docs and sanity tests).
    pub fn nominal_mean(&self) -> f64 {
        match self {
            LengthDist::Fixed { value } => *value,
            LengthDist::Uniform { min, max } => (min + max) / 2.0,
            LengthDist::Normal { mean, .. } => *mean,
            LengthDist::Lognormal { median, sigma, .. } => median * (sigma * sigma / 2.0).exp(),
            LengthDist::Exponential { mean, .. } => *mean,
            LengthDist::Bimodal {
                weight,
                first,
                second,
            } => weight * first.nominal_mean() + (1.0 - weight) * second.nominal_mean(),
            LengthDist::Empirical { values, weights } => {
                let w: Vec<f64> = weights.clone().unwrap_or_else(|| vec![1.0; values.len()]);
                let total: f64 = w.iter().sum();
                values.iter().zip(&w).map(|(v, w)| v * w).sum::<f64>() / total
            }
        }
    }
}

impl LengthSampler {
    /// One draw before rounding.
    fn draw(&self, rng: &mut impl Rng) -> f64 {
        match self {
            LengthSampler::Fixed(v) => *v,
            LengthSampler::Uniform(lo, hi) => {
                if lo == hi {
                    *lo
                } else {
                    rng.gen_range(*lo..=*hi)
                }
            }
            LengthSampler::Normal {
                mean,
                std_dev,
                min,
                max,
            } => (mean + std_dev * standard_normal(rng)).clamp(*min, min.max(*max)),
            LengthSampler::Lognormal { mu, sigma, max } => {
                (mu + sigma * standard_normal(rng)).exp().min(*max)
            }
            LengthSampler::Exponential { mean, max } => {
                // Inverse CDF; 1 - u is in (0, 1], so the log is finite.
                let u: f64 = rng.gen();
                (-(1.0 - u).ln() * mean).min(*max)
            }
            LengthSampler::Bimodal(weight, first, second) => {
                if rng.gen::<f64>() < *weight {
                    first.draw(rng)
                } else {
                    second.draw(rng)
                }
            }
            LengthSampler::Empirical { values, cumulative } => {
                let total = *cumulative.last().expect("validated non-empty");
                let x = rng.gen::<f64>() * total;
                // First index whose cumulative weight exceeds x (zero weights are skipped).
                let i = cumulative.partition_point(|&c| c <= x);
                values[i.min(values.len() - 1)]
            }
        }
    }

    /// One token count: a draw rounded to the nearest integer, clamped to
    /// `0..=MAX_SAMPLE_TOKENS`.
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        let x = self.draw(rng);
        if x.is_nan() || x <= 0.0 {
            0
        } else {
            x.round().min(f64::from(MAX_SAMPLE_TOKENS)) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn mean_of(d: &LengthDist, n: usize) -> f64 {
        let s = d.sampler("t").unwrap();
        let mut rng = SmallRng::seed_from_u64(11);
        (0..n).map(|_| f64::from(s.sample(&mut rng))).sum::<f64>() / n as f64
    }

    #[test]
    fn sample_means_match_nominal_means() {
        // Fixed seed: deterministic, tolerances are several standard errors wide.
        let cases = [
            LengthDist::Fixed { value: 42.0 },
            LengthDist::Uniform {
                min: 100.0,
                max: 200.0,
            },
            LengthDist::Normal {
                mean: 500.0,
                std_dev: 50.0,
                min: None,
                max: None,
            },
            LengthDist::Lognormal {
                median: 100.0,
                sigma: 0.5,
                max: None,
            },
            LengthDist::Exponential {
                mean: 300.0,
                max: None,
            },
            LengthDist::Bimodal {
                weight: 0.7,
                first: Box::new(LengthDist::Fixed { value: 50.0 }),
                second: Box::new(LengthDist::Fixed { value: 1000.0 }),
            },
            LengthDist::Empirical {
                values: vec![10.0, 20.0, 30.0],
                weights: Some(vec![1.0, 0.0, 3.0]),
            },
        ];
        for d in &cases {
            let m = mean_of(d, 100_000);
            let want = d.nominal_mean();
            assert!(
                (m - want).abs() <= 0.02 * want + 0.5,
                "{d:?}: mean {m}, want {want}"
            );
        }
    }

    #[test]
    fn empirical_zero_weight_values_never_drawn_and_bad_params_are_refused() {
        let d = LengthDist::Empirical {
            values: vec![1.0, 2.0, 3.0],
            weights: Some(vec![0.0, 1.0, 0.0]),
        };
        let s = d.sampler("t").unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        assert!((0..1000).all(|_| s.sample(&mut rng) == 2));
        let bad = LengthDist::Uniform { min: 5.0, max: 1.0 };
        let e = bad.sampler("workload.prompt_tokens").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid workload.prompt_tokens.min: 5 exceeds max 1"
        );
        assert!(LengthDist::Empirical {
            values: vec![],
            weights: None
        }
        .sampler("t")
        .is_err());
        assert!(LengthDist::Bimodal {
            weight: 1.5,
            first: Box::new(LengthDist::Fixed { value: 1.0 }),
            second: Box::new(LengthDist::Fixed { value: 1.0 }),
        }
        .sampler("t")
        .is_err());
    }

    #[test]
    fn toml_form_round_trips_and_rejects_unknown_keys() {
        let text = r#"
dist = "bimodal"
weight = 0.7
first = { dist = "normal", mean = 64.0, std_dev = 16.0 }
second = { dist = "lognormal", median = 1024.0, sigma = 0.3, max = 4096.0 }
"#;
        let d: LengthDist = toml::from_str(text).unwrap();
        let back: LengthDist = toml::from_str(&toml::to_string(&d).unwrap()).unwrap();
        assert_eq!(d, back);
        let bad = toml::from_str::<LengthDist>("dist = \"fixed\"\nvalue = 1.0\nvalu = 2.0\n");
        assert!(bad.is_err());
    }
}
