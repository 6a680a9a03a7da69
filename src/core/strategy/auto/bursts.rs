//! `auto`'s burst model: how many more requests the burst now arriving will bring.
//!
//! Batch clients and agents send requests in bursts: a handful within microseconds, then
//! nothing for a while. Such arrivals do not answer completions, so the echo model
//! ([`super::arrivals`]) does not see them; yet dispatching the first request of a burst
//! alone makes the rest wait a whole batch.
//!
//! A burst is a run of arrivals whose gaps are all shorter than [`BURST_GAP_FRACTION`] of
//! the mean gap. The model learns the distribution of burst sizes and the mean gap inside a
//! burst; while a burst is open (the last arrival is recent), the requests still to come are
//! `E[B - s | B >= s]` for the `s` already seen, arriving one mean gap apart. A Poisson stream
//! has bursts in this sense too, but short: each gap is below an eighth of the mean with
//! probability `1 - e^(-1/8) = 0.12`, so about 0.13 more are expected, and the caller
//! ignores expectations under half a request ([`FOLLOWERS_MIN`]).
//!
//! Known defect (issue 25; BENCHMARKS.md, "tenth round"): the mean of all gaps is a moving
//! average, and it falls while a long burst runs, whose gaps are the short ones. Once an
//! eighth of it is below the gap inside the burst, the rest of the burst counts as bursts
//! of one: bursts of 32 a tenth of a millisecond apart, 42 ms between them, read as a mean
//! burst of 3-6. Continuing a burst also while the gap is under twice the mean gap inside
//! bursts reads them whole (`tools/experiments/burst_cut_and_queueing*.patch`). It is held
//! back: the split rule acting on the longer bursts measured no better on the property
//! harness.
//!
//! Fixed-size arrays only; nothing here allocates or reads a clock.

use super::shares::Shares;
use crate::core::request::Nanos;

/// A gap shorter than this fraction of the mean gap continues a burst. At 1/16 bursts are
/// cut short and both property harnesses lose (123 of 200 open cases met instead of 126,
/// the lowest closed ratio 0.923 instead of 0.943); 1/4 measures the same as 1/8
/// (BENCHMARKS.md, issue 25's thirteenth round).
pub const BURST_GAP_FRACTION: f64 = 1.0 / 8.0;
/// Burst sizes tracked one by one; larger bursts count as this size.
pub const BURST_SIZE_MAX: usize = 64;
/// Fewest expected followers worth acting on (a Poisson stream gives about 0.13).
pub const FOLLOWERS_MIN: f64 = 0.5;
/// Weight of a new burst in the size distribution and of a new gap in the averages.
/// Halved and doubled, the property harnesses (closed and open loops) move within their
/// spread (BENCHMARKS.md, issue 25's thirteenth round); the gaps' weight at 1/32 takes
/// the lowest closed ratio from 0.943 to 0.906.
const BURST_ALPHA: f64 = 1.0 / 32.0;
const GAP_ALPHA: f64 = 1.0 / 64.0;

/// The learned burst structure and the burst now open.
#[derive(Clone, Debug)]
pub struct BurstModel {
    /// Category `s - 1`: share of bursts of size `s` (the last: `BURST_SIZE_MAX` or more).
    sizes: Shares<BURST_SIZE_MAX>,
    /// The same moving average of `s - 1`: `E[B - 1]`, the followers a burst's first
    /// arrival expects, kept in O(1) (a lone arrival is the common case: in a stream every
    /// arrival opens a burst, and the core asks at each one while workers are free).
    mean_followers_of_first: f64,
    /// Moving averages of every gap and of the gaps inside bursts, ns.
    mean_gap_ns: f64,
    intra_gap_ns: f64,
    last_arrival_ns: Option<Nanos>,
    /// Arrivals in the burst now open (0 before the first arrival).
    open_size: usize,
    /// `E[B - s | B >= s]` for the burst now open, once a decision asked (`None`: an
    /// arrival came since; it changes only then). Decisions at completions and at a hold's
    /// deadline reuse it; in a closed loop most decisions follow an arrival and miss it
    /// (`core/closed_loop_auto`: ~650 instructions of a ~4,600 decision are this sum).
    /// Suffix sums kept per open burst would make every miss O(1) too.
    followers_cached: Option<f64>,
}

impl Default for BurstModel {
    fn default() -> Self {
        BurstModel {
            sizes: Shares::new(BURST_ALPHA),
            mean_followers_of_first: 0.0,
            mean_gap_ns: 0.0,
            intra_gap_ns: 0.0,
            last_arrival_ns: None,
            open_size: 0,
            followers_cached: None,
        }
    }
}

impl BurstModel {
    /// A request arrived.
    pub fn observe_arrival(&mut self, now: Nanos) {
        self.followers_cached = None;
        let Some(last) = self.last_arrival_ns.replace(now) else {
            self.open_size = 1;
            return;
        };
        let gap = now.saturating_sub(last) as f64;
        let continues = self.mean_gap_ns > 0.0 && gap < BURST_GAP_FRACTION * self.mean_gap_ns;
        if self.mean_gap_ns == 0.0 {
            self.mean_gap_ns = gap;
        } else {
            self.mean_gap_ns += GAP_ALPHA * (gap - self.mean_gap_ns);
        }
        if continues {
            self.open_size += 1;
            if self.intra_gap_ns == 0.0 {
                self.intra_gap_ns = gap;
            } else {
                self.intra_gap_ns += GAP_ALPHA * (gap - self.intra_gap_ns);
            }
        } else {
            self.close_burst();
            self.open_size = 1;
        }
    }

    /// Arrivals stop reaching the model for a while (the core runs another strategy): the
    /// open burst is closed, and the next arrival opens one instead of reading the time away
    /// as one long gap.
    pub fn suspend(&mut self) {
        self.close_burst();
        self.open_size = 0;
        self.last_arrival_ns = None;
        self.followers_cached = None;
    }

    fn close_burst(&mut self) {
        if self.open_size == 0 {
            return;
        }
        let k = self.open_size.min(BURST_SIZE_MAX) - 1;
        self.sizes.observe(k);
        if self.sizes.observed() == 1 {
            self.mean_followers_of_first = k as f64;
        } else {
            self.mean_followers_of_first += BURST_ALPHA * (k as f64 - self.mean_followers_of_first);
        }
    }

    /// Mean burst size, `E[B]` (1 before any burst closed; about 1.13 for a Poisson stream).
    pub fn mean_size(&self) -> f64 {
        1.0 + self.mean_followers_of_first
    }

    /// When the last request arrived.
    pub fn last_arrival_ns(&self) -> Option<Nanos> {
        self.last_arrival_ns
    }

    /// Requests the open burst is still expected to bring, and the mean gap between them
    /// (ns); `None` when no burst is open at `now` or too few are expected.
    pub fn followers(&mut self, now: Nanos) -> Option<(f64, f64)> {
        let last = self.last_arrival_ns?;
        if self.sizes.observed() == 0 || self.intra_gap_ns <= 0.0 {
            return None;
        }
        let since = now.saturating_sub(last) as f64;
        if since >= BURST_GAP_FRACTION * self.mean_gap_ns {
            return None;
        }
        let expected = match self.followers_cached {
            Some(expected) => expected,
            None => {
                let expected = self.expected_followers();
                self.followers_cached = Some(expected);
                expected
            }
        };
        (expected >= FOLLOWERS_MIN).then_some((expected, self.intra_gap_ns))
    }

    /// `E[B - s | B >= s]` for the `s` arrivals of the open burst: the burst may already be
    /// complete (B = s). A ratio of two sums of shares, so of the unscaled weights (0 when
    /// no burst so large was seen).
    fn expected_followers(&self) -> f64 {
        let seen = self.open_size.clamp(1, BURST_SIZE_MAX);
        if seen == 1 {
            // Every burst has at least one arrival: the condition holds, and the sum below
            // is the mean of `B - 1`.
            return self.mean_followers_of_first;
        }
        let weights = self.sizes.weights();
        let mut remaining = 0.0;
        for (i, &weight) in weights.iter().enumerate().skip(seen) {
            remaining += weight * (i + 1 - seen) as f64;
        }
        let at_least: f64 = weights.iter().skip(seen - 1).sum();
        if at_least <= 0.0 {
            0.0
        } else {
            remaining / at_least
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Bursts of `size` requests `intra` ns apart, every `period` ns.
    fn bursty(m: &mut BurstModel, bursts: u64, size: u64, intra: Nanos, period: Nanos) -> Nanos {
        bursty_from(m, 0, bursts, size, intra, period)
    }

    /// [`bursty`] from `start`.
    fn bursty_from(
        m: &mut BurstModel,
        start: Nanos,
        bursts: u64,
        size: u64,
        intra: Nanos,
        period: Nanos,
    ) -> Nanos {
        for b in 0..bursts {
            for i in 0..size {
                m.observe_arrival(start + b * period + i * intra);
            }
        }
        start + (bursts + 1) * period
    }

    #[test]
    fn expects_the_rest_of_a_burst_and_nothing_after_it() {
        let mut m = BurstModel::default();
        let next = bursty(&mut m, 100, 16, 20_000, 200_000_000);
        m.observe_arrival(next);
        let (k, gap) = m.followers(next + 1_000).expect("a burst has begun");
        assert!((14.0..=15.0).contains(&k), "{k}");
        assert!((19_000.0..21_000.0).contains(&gap), "{gap}");
        for i in 1..16 {
            m.observe_arrival(next + i * 20_000);
        }
        assert_eq!(
            m.followers(next + 15 * 20_000 + 1_000),
            None,
            "the burst is complete"
        );
        assert_eq!(m.followers(next + 100_000_000), None, "no burst is open");
    }

    #[test]
    fn a_first_arrival_expects_the_mean_burst_less_one() {
        let mut m = BurstModel::default();
        let next = bursty(&mut m, 50, 4, 20_000, 200_000_000);
        let next = bursty_from(&mut m, next, 50, 12, 20_000, 200_000_000);
        m.observe_arrival(next);
        let fast = m.expected_followers();
        m.open_size = 1;
        let weights = m.sizes.weights();
        let total: f64 = weights.iter().sum();
        let slow: f64 = weights
            .iter()
            .enumerate()
            .map(|(i, w)| w * i as f64)
            .sum::<f64>()
            / total;
        assert!((fast - slow).abs() < 1e-9, "{fast} {slow}");
        assert!(fast > 3.0 && fast < 11.0, "{fast}");
    }

    #[test]
    fn a_poisson_stream_has_no_bursts_worth_waiting_for() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut m = BurstModel::default();
        let mut t = 0.0f64;
        let mut offered = 0;
        for _ in 0..20_000 {
            t += -(1.0 - rng.gen::<f64>()).ln() * 1e6;
            m.observe_arrival(t as Nanos);
            if m.followers(t as Nanos + 1).is_some() {
                offered += 1;
            }
        }
        assert!(offered < 200, "{offered} of 20000 arrivals saw a burst");
    }
}
