//! Shares of a few categories as an exponentially weighted moving average, updated in O(1)
//! per observation: what `auto` keeps of the token buckets' shares of the arrivals
//! ([`super::arrivals`]) and of the burst sizes ([`super::bursts`]).
//!
//! The textbook update moves every share: `share_i += alpha (hit_i - share_i)`, a pass over
//! all `N` categories per observation (64 burst sizes at every closed burst, and in a stream
//! whose gaps are even every arrival closes one). Here the shares are stored unscaled,
//! `share_i = weight_i x scale`: an observation of `k` scales every share by `1 - alpha`
//! through `scale` alone and adds `alpha` to `k`'s weight, divided by the new scale. The
//! weights are folded back into the scale (one pass) when it falls below [`RESCALE_BELOW`],
//! once per ~10,900 observations at `alpha = 1/32`. The shares equal the textbook ones up to
//! rounding.
//!
//! Fixed-size arrays only; nothing here allocates.

/// Below this, `scale` is folded into the weights (far above `f64`'s smallest normal, so
/// neither a weight nor a share loses precision).
const RESCALE_BELOW: f64 = 1e-150;

/// Moving-average shares of `N` categories.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shares<const N: usize> {
    /// `share_i = weight[i] * scale` (all 0 before the first observation).
    weight: [f64; N],
    /// In `(RESCALE_BELOW (1 - alpha), 1]`.
    scale: f64,
    /// Weight of a new observation.
    alpha: f64,
    observed: u64,
}

impl<const N: usize> Shares<N> {
    /// No observation yet; each new one weighs `alpha`.
    pub const fn new(alpha: f64) -> Self {
        Shares {
            weight: [0.0; N],
            scale: 1.0,
            alpha,
            observed: 0,
        }
    }

    /// Category `k` was observed. The first observation takes the whole share.
    pub fn observe(&mut self, k: usize) {
        self.observed += 1;
        if self.observed == 1 {
            self.weight[k] = 1.0;
            return;
        }
        self.scale *= 1.0 - self.alpha;
        self.weight[k] += self.alpha / self.scale;
        if self.scale < RESCALE_BELOW {
            for w in &mut self.weight {
                *w *= self.scale;
            }
            self.scale = 1.0;
        }
    }

    /// Observations so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// Share of category `k` (they sum to 1 once anything was observed).
    pub fn share(&self, k: usize) -> f64 {
        self.weight[k] * self.scale
    }

    /// The unscaled weights: proportional to the shares, for ratios of sums of them (the
    /// common scale cancels).
    pub fn weights(&self) -> &[f64; N] {
        &self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_the_textbook_average() {
        let alpha = 1.0 / 32.0;
        let mut fast = Shares::<8>::new(alpha);
        let mut slow = [0.0f64; 8];
        let mut x = 12345u64;
        // Past two rescales (every ~10,900 observations).
        for i in 0..25_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = ((x >> 33) % 8) as usize;
            let k = if i % 3 == 0 { 2 } else { k };
            fast.observe(k);
            if i == 0 {
                slow[k] = 1.0;
            } else {
                for (j, s) in slow.iter_mut().enumerate() {
                    let hit = if j == k { 1.0 } else { 0.0 };
                    *s += alpha * (hit - *s);
                }
            }
            if i % 997 == 0 || i > 24_990 {
                for (j, &s) in slow.iter().enumerate() {
                    assert!(
                        (fast.share(j) - s).abs() < 1e-9,
                        "{i} {j}: {} {s}",
                        fast.share(j)
                    );
                }
            }
        }
        let sum: f64 = (0..8).map(|j| fast.share(j)).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{sum}");
        assert!(
            fast.share(2) > 0.35,
            "a third of the draws plus an eighth of the rest"
        );
    }
}
