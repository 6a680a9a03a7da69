//! Worker selection: `round_robin`, `least_loaded`, `power_of_two`.
//!
//! A balancer picks among workers that can take a batch now (the caller filters by capacity
//! and circuit state). Randomness comes from the RNG the core was seeded with. No allocation.

use rand::rngs::SmallRng;
use rand::Rng;
use std::fmt;
use std::str::FromStr;

/// Load-balancing policy across workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BalancerKind {
    /// Next eligible worker after the last one chosen.
    RoundRobin,
    /// Fewest pending batches; ties go to the lowest id.
    #[default]
    LeastLoaded,
    /// Two random eligible workers, the one with fewer pending batches.
    PowerOfTwo,
}

impl BalancerKind {
    /// Every balancer.
    pub const ALL: [BalancerKind; 3] = [
        BalancerKind::RoundRobin,
        BalancerKind::LeastLoaded,
        BalancerKind::PowerOfTwo,
    ];

    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BalancerKind::RoundRobin => "round_robin",
            BalancerKind::LeastLoaded => "least_loaded",
            BalancerKind::PowerOfTwo => "power_of_two",
        }
    }
}

impl fmt::Display for BalancerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BalancerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown balancer '{s}': valid balancers are round_robin, least_loaded, power_of_two")
            })
    }
}

crate::core::names::serde_by_name!(BalancerKind);

/// Balancer state (the round-robin cursor).
#[derive(Clone, Copy, Debug, Default)]
pub struct Balancer {
    pub kind: BalancerKind,
    cursor: usize,
}

impl Balancer {
    /// A balancer of `kind`.
    pub fn new(kind: BalancerKind) -> Self {
        Balancer { kind, cursor: 0 }
    }

    /// Picks one worker among `0..n` for which `eligible(i)` is true, using `pending(i)` as
    /// the load. Returns `None` when no worker is eligible.
    pub fn pick(
        &mut self,
        n: usize,
        rng: &mut SmallRng,
        mut eligible: impl FnMut(usize) -> bool,
        pending: impl Fn(usize) -> u32,
    ) -> Option<usize> {
        if n == 0 {
            return None;
        }
        match self.kind {
            BalancerKind::RoundRobin => {
                for k in 0..n {
                    let i = (self.cursor + k) % n;
                    if eligible(i) {
                        self.cursor = (i + 1) % n;
                        return Some(i);
                    }
                }
                None
            }
            BalancerKind::LeastLoaded => {
                let mut best: Option<(usize, u32)> = None;
                for i in 0..n {
                    if eligible(i) {
                        let p = pending(i);
                        if p == 0 {
                            // Nothing is below 0, and ties go to the lowest id: this one.
                            // (An `upstream` backend has 64 workers, most of them idle.)
                            return Some(i);
                        }
                        if best.is_none_or(|(_, bp)| p < bp) {
                            best = Some((i, p));
                        }
                    }
                }
                best.map(|(i, _)| i)
            }
            BalancerKind::PowerOfTwo => {
                let count = (0..n).filter(|&i| eligible(i)).count();
                if count == 0 {
                    return None;
                }
                let nth = |k: usize, eligible: &mut dyn FnMut(usize) -> bool| {
                    (0..n).filter(|&i| eligible(i)).nth(k).unwrap_or(0)
                };
                let a = nth(rng.gen_range(0..count), &mut eligible);
                let b = nth(rng.gen_range(0..count), &mut eligible);
                Some(if pending(b) < pending(a) { b } else { a })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn round_robin_is_exactly_even_and_skips_ineligible_workers() {
        let mut b = Balancer::new(BalancerKind::RoundRobin);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = [0; 4];
        for _ in 0..400 {
            let i = b.pick(4, &mut rng, |_| true, |_| 0).unwrap();
            counts[i] += 1;
        }
        assert_eq!(counts, [100; 4]);
        let picks: Vec<usize> = (0..4)
            .map(|_| b.pick(4, &mut rng, |i| i != 1, |_| 0).unwrap())
            .collect();
        assert!(!picks.contains(&1));
        assert!(b.pick(4, &mut rng, |_| false, |_| 0).is_none());
    }

    #[test]
    fn least_loaded_picks_the_minimum_with_lowest_id_on_ties() {
        let mut b = Balancer::new(BalancerKind::LeastLoaded);
        let mut rng = SmallRng::seed_from_u64(1);
        let load = [3, 1, 1, 0];
        assert_eq!(b.pick(4, &mut rng, |_| true, |i| load[i]), Some(3));
        assert_eq!(b.pick(4, &mut rng, |i| i != 3, |i| load[i]), Some(1));
        // An idle worker ends the search: the first eligible one.
        let load = [2, 0, 0, 1];
        assert_eq!(b.pick(4, &mut rng, |_| true, |i| load[i]), Some(1));
        assert_eq!(b.pick(4, &mut rng, |i| i != 1, |i| load[i]), Some(2));
    }

    #[test]
    fn power_of_two_never_picks_the_heavier_of_its_two_samples_and_is_seeded() {
        let load = [10, 0, 10, 10];
        let run = |seed| {
            let mut b = Balancer::new(BalancerKind::PowerOfTwo);
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..100)
                .map(|_| b.pick(4, &mut rng, |_| true, |i| load[i]).unwrap())
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7), "same seed, same choices");
        // Worker 1 is chosen whenever it is sampled: about 1 - (3/4)^2 = 44 % of the time.
        let ones = a.iter().filter(|&&i| i == 1).count();
        assert!(ones > 20 && ones < 70, "{ones}");
    }
}
