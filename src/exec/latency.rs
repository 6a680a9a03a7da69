//! Latency models: how long a batch takes on simulated hardware.
//!
//! Pure functions of the batch shape and a caller-provided RNG, shared by the live `sim`
//! executor (which sleeps that long) and the simulator (which advances virtual time).

use rand::Rng;
use std::fmt;
use std::str::FromStr;

/// Which model prices a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
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

    /// Config name.
    pub const fn name(&self) -> &'static str {
        match self {
            LatencyModel::None => "none",
            LatencyModel::Linear { .. } => "linear",
            LatencyModel::Calibrated { .. } => "calibrated",
        }
    }

    /// Service time in ms of a batch whose requests have these (prompt tokens, output
    /// tokens) shapes. Never negative.
    pub fn batch_ms(&self, shapes: &[(u32, u32)], rng: &mut impl Rng) -> f64 {
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
                let prompt: u64 = shapes.iter().map(|&(p, _)| u64::from(p)).sum();
                let mut ms = prefill_ms_per_token * prompt as f64;
                // Decode: every step costs beta (1 + gamma (b-1)/b) for the b requests still
                // generating. Walk output lengths in ascending order: between consecutive
                // lengths the active count is constant.
                let mut outs: smallvec::SmallVec<[u32; 64]> =
                    shapes.iter().map(|&(_, o)| o).collect();
                outs.sort_unstable();
                let n = outs.len();
                let mut done_steps = 0u32;
                for (i, &len) in outs.iter().enumerate() {
                    let steps = len.saturating_sub(done_steps);
                    if steps > 0 {
                        let b = (n - i) as f64;
                        ms += f64::from(steps) * decode_step_ms(beta_ms, gamma, b);
                        done_steps = len;
                    }
                }
                ms
            }
        }
    }
}

impl LatencyModel {
    /// Service time in ms of one continuous-batching step with `decode` decode tokens (one
    /// per generating slot) and `prefill` prompt tokens. `calibrated`: prefill at its
    /// per-token cost plus one decode step `beta (1 + gamma (b-1)/b)` for `b = decode`;
    /// `linear`: `per_token` for every token of the step (its per-batch base does not apply
    /// to steps); `none`: 0.
    pub fn step_ms(&self, decode: u32, prefill: u32) -> f64 {
        match *self {
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
        }
    }
}

/// One decode step with `b` active requests: `beta x (1 + gamma (b-1)/b)`.
pub fn decode_step_ms(beta_ms: f64, gamma: f64, b: f64) -> f64 {
    if b <= 0.0 {
        return 0.0;
    }
    beta_ms * (1.0 + gamma * (b - 1.0) / b)
}

/// A standard normal sample (Box-Muller), from any RNG.
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl fmt::Display for LatencyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LatencyModel {
    type Err = String;
    /// Parses a model name with its default parameters.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(LatencyModel::None),
            "linear" => Ok(LatencyModel::LINEAR_DEFAULT),
            "calibrated" => Ok(LatencyModel::CALIBRATED_DEFAULT),
            _ => Err(format!(
                "unknown latency model '{s}': valid models are none, linear, calibrated"
            )),
        }
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
        // 2 requests x (100 + 50) tokens = 300 tokens: 10 + 150 = 160 ms mean, sd 1 ms.
        let n = 20_000;
        let samples: Vec<f64> = (0..n)
            .map(|_| m.batch_ms(&[(100, 50), (100, 50)], &mut rng))
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
        // One request of 10 tokens: 10 steps at b = 1 -> 57.4 ms.
        assert!((m.batch_ms(&[(0, 10)], &mut rng) - 57.4).abs() < 1e-9);
        // Two requests of 10: 10 steps at b = 2 -> 10 x 5.74 x 1.158.
        let two = m.batch_ms(&[(0, 10), (0, 10)], &mut rng);
        assert!((two - 10.0 * 5.74 * 1.158).abs() < 1e-9);
        // Lengths 4 and 10: 4 steps at b = 2, 6 at b = 1.
        let mixed = m.batch_ms(&[(0, 10), (0, 4)], &mut rng);
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
        assert_eq!(m.batch_ms(&[(10, 0), (30, 0)], &mut rng), 20.0);
        assert_eq!(LatencyModel::None.batch_ms(&[(1000, 1000)], &mut rng), 0.0);
    }
}
