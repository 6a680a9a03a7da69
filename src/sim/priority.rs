//! The priority mix of a workload: relative weights for low, normal, high and critical.
//!
//! Weights need not sum to 1; a missing key is 0, a missing `[workload.priority]` table means
//! every request is `normal`. Drawing is one uniform number per request and never allocates.

use super::SimError;
use crate::core::Priority;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Relative weights of the four priorities.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityMix {
    #[serde(default)]
    pub low: f64,
    #[serde(default)]
    pub normal: f64,
    #[serde(default)]
    pub high: f64,
    #[serde(default)]
    pub critical: f64,
}

impl Default for PriorityMix {
    fn default() -> Self {
        PriorityMix::ALL_NORMAL
    }
}

impl PriorityMix {
    /// Every request `normal`.
    pub const ALL_NORMAL: PriorityMix = PriorityMix {
        low: 0.0,
        normal: 1.0,
        high: 0.0,
        critical: 0.0,
    };

    /// Weights indexed by [`Priority::index`].
    pub fn weights(&self) -> [f64; Priority::COUNT] {
        [self.low, self.normal, self.high, self.critical]
    }

    /// Checks the weights and returns the cumulative distribution used by [`Self::draw`].
    pub fn cumulative(&self) -> Result<[f64; Priority::COUNT], SimError> {
        let mut acc = 0.0;
        let mut out = [0.0; Priority::COUNT];
        for (i, w) in self.weights().into_iter().enumerate() {
            if !(w.is_finite() && w >= 0.0) {
                return Err(SimError::invalid(
                    format!("workload.priority.{}", Priority::from_index(i)),
                    format!("{w} must be a finite weight >= 0"),
                ));
            }
            acc += w;
            out[i] = acc;
        }
        if acc <= 0.0 {
            return Err(SimError::invalid(
                "workload.priority",
                "at least one weight must be > 0",
            ));
        }
        Ok(out)
    }

    /// Draws a priority given the cumulative weights from [`Self::cumulative`].
    pub fn draw(cumulative: &[f64; Priority::COUNT], rng: &mut impl Rng) -> Priority {
        let x = rng.gen::<f64>() * cumulative[Priority::COUNT - 1];
        let i = cumulative.partition_point(|&c| c <= x);
        Priority::from_index(i.min(Priority::COUNT - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn draws_follow_the_weights_and_zero_weights_never_appear() {
        let mix = PriorityMix {
            low: 0.0,
            normal: 0.8,
            high: 0.15,
            critical: 0.05,
        };
        let c = mix.cumulative().unwrap();
        let mut rng = SmallRng::seed_from_u64(5);
        let mut counts = [0u32; 4];
        let n = 100_000;
        for _ in 0..n {
            counts[PriorityMix::draw(&c, &mut rng).index()] += 1;
        }
        assert_eq!(counts[0], 0);
        for (i, want) in [(1, 0.8), (2, 0.15), (3, 0.05)] {
            let got = f64::from(counts[i]) / f64::from(n);
            assert!((got - want).abs() < 0.01, "priority {i}: {got}");
        }
        let zero = PriorityMix {
            normal: 0.0,
            ..PriorityMix::ALL_NORMAL
        };
        assert!(zero.cumulative().is_err());
    }
}
