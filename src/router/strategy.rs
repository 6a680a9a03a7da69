//! Routing strategies: how one backend is picked among the candidates that passed every
//! filter. `smart` (weighted score of priority, load and latency), `round_robin`,
//! `least_loaded`, `power_of_two`, `priority_only`, `random`; and the two that read a
//! request's affinity, `prefix_aware` and `session`, decided in [`super::affinity`] (without
//! an affinity, [`pick`] routes them as `least_loaded`).
//!
//! A strategy is a pure function of a candidate slice, a cursor and an RNG passed in: it
//! reads no clock, takes no lock and never allocates. Ties always go to the candidate
//! listed first (the backend listed first in `[[backends]]`), so decisions are
//! reproducible from the seed.

use super::error::RouterConfigError;
use super::registry::BackendId;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How to pick among eligible backends (`[routing] strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Highest [`score`]; ties to the first.
    #[default]
    Smart,
    /// Each model's candidates in turn.
    RoundRobin,
    /// Fewest pending batches; ties to the first.
    LeastLoaded,
    /// Two distinct random candidates, the one with fewer pending batches (the earlier one
    /// on a tie).
    PowerOfTwo,
    /// Lowest priority number; ties to the first.
    PriorityOnly,
    /// Uniformly random.
    Random,
    /// The longest cached prefix of the prompt, unless that backend is overloaded against
    /// the least loaded one; else least loaded ([`super::affinity::pick_prefix`]).
    PrefixAware,
    /// Rendezvous hashing on the session key; without one, least loaded
    /// ([`super::affinity::pick_session`]).
    Session,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 8] = [
        Strategy::Smart,
        Strategy::RoundRobin,
        Strategy::LeastLoaded,
        Strategy::PowerOfTwo,
        Strategy::PriorityOnly,
        Strategy::Random,
        Strategy::PrefixAware,
        Strategy::Session,
    ];

    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::Smart => "smart",
            Strategy::RoundRobin => "round_robin",
            Strategy::LeastLoaded => "least_loaded",
            Strategy::PowerOfTwo => "power_of_two",
            Strategy::PriorityOnly => "priority_only",
            Strategy::Random => "random",
            Strategy::PrefixAware => "prefix_aware",
            Strategy::Session => "session",
        }
    }

    /// Parses a config name (ASCII case-insensitive). An unknown name gives `Smart` and a
    /// warning for the caller to log; it is not an error (the spec's rule).
    pub fn from_name(name: &str) -> (Strategy, Option<UnknownStrategy>) {
        match Strategy::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(name.trim()))
        {
            Some(s) => (s, None),
            None => (
                Strategy::Smart,
                Some(UnknownStrategy {
                    given: name.to_string(),
                }),
            ),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A warning: `[routing] strategy` named no strategy, so `smart` is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownStrategy {
    pub given: String,
}

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "routing.strategy = \"{}\" is not a strategy; using \"smart\" (valid: smart, \
             round_robin, least_loaded, power_of_two, priority_only, random, prefix_aware, \
             session)",
            self.given
        )
    }
}

/// Weights of the smart score's three parts (`[routing.weights]`); must sum to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    pub priority: u32,
    pub load: u32,
    pub latency: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            priority: 50,
            load: 30,
            latency: 20,
        }
    }
}

impl Weights {
    /// The weights sum to exactly 100 (which also bounds each by 100, so [`score`] cannot
    /// overflow and stays in `0..=100`).
    pub fn validate(&self) -> Result<(), RouterConfigError> {
        let sum = u64::from(self.priority) + u64::from(self.load) + u64::from(self.latency);
        if sum == 100 {
            Ok(())
        } else {
            Err(RouterConfigError::Weights {
                priority: self.priority,
                load: self.load,
                latency: self.latency,
                sum,
            })
        }
    }
}

/// One eligible backend as the strategies see it: a copy of the few numbers they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub backend: BackendId,
    /// Lower is preferred.
    pub priority: u32,
    /// Batches in flight on the backend.
    pub pending_batches: u32,
    /// Work in flight on the backend, prompt-token equivalents
    /// ([`BackendState::pending_work`](super::BackendState::pending_work)).
    pub pending_work: u64,
    /// Latency EMA, whole milliseconds; 0 while unmeasured.
    pub latency_ms: u32,
}

/// The smart score, `0..=100`, higher is better:
/// `((100 - min(priority, 100)) * w_p + (100 - min(pending, 100)) * w_l
///   + (100 - min(latency_ms / 10, 100)) * w_lat) / 100`, in integers.
///
/// `weights` must have passed [`Weights::validate`].
#[inline]
pub fn score(c: &Candidate, weights: &Weights) -> u32 {
    debug_assert!(weights.validate().is_ok());
    let priority = 100 - c.priority.min(100);
    let load = 100 - c.pending_batches.min(100);
    let latency = 100 - (c.latency_ms / 10).min(100);
    (priority * weights.priority + load * weights.load + latency * weights.latency) / 100
}

/// Picks one of `candidates` (non-empty) and returns its index.
///
/// `cursor` is the round-robin position of the model being routed (advanced only by
/// `RoundRobin`); `rng` is used only by `PowerOfTwo` and `Random`. `PrefixAware` and
/// `Session` are picked here only without an affinity (no block names, no session key):
/// as `LeastLoaded`.
#[inline]
pub fn pick(
    strategy: Strategy,
    candidates: &[Candidate],
    weights: &Weights,
    cursor: &mut u64,
    rng: &mut SmallRng,
) -> usize {
    assert!(!candidates.is_empty(), "pick needs a candidate");
    let n = candidates.len();
    if n == 1 {
        if strategy == Strategy::RoundRobin {
            *cursor = cursor.wrapping_add(1);
        }
        return 0;
    }
    match strategy {
        Strategy::Smart => first_max_by_key(candidates, |c| score(c, weights)),
        Strategy::RoundRobin => {
            let i = (*cursor % n as u64) as usize;
            *cursor = cursor.wrapping_add(1);
            i
        }
        Strategy::LeastLoaded | Strategy::PrefixAware | Strategy::Session => {
            first_max_by_key(candidates, |c| u32::MAX - c.pending_batches)
        }
        Strategy::PriorityOnly => first_max_by_key(candidates, |c| u32::MAX - c.priority),
        Strategy::PowerOfTwo => {
            let a = rng.gen_range(0..n);
            let mut b = rng.gen_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            let (first, second) = if a < b { (a, b) } else { (b, a) };
            if candidates[second].pending_batches < candidates[first].pending_batches {
                second
            } else {
                first
            }
        }
        Strategy::Random => rng.gen_range(0..n),
    }
}

/// Index of the first candidate with the largest key.
#[inline]
fn first_max_by_key(candidates: &[Candidate], key: impl Fn(&Candidate) -> u32) -> usize {
    let mut best = 0;
    let mut best_key = key(&candidates[0]);
    for (i, c) in candidates.iter().enumerate().skip(1) {
        let k = key(c);
        if k > best_key {
            best = i;
            best_key = k;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn cand(i: u32, priority: u32, pending: u32, latency_ms: u32) -> Candidate {
        Candidate {
            backend: BackendId(i),
            priority,
            pending_batches: pending,
            pending_work: 0,
            latency_ms,
        }
    }

    #[test]
    fn names_round_trip_and_unknown_is_smart_with_warning() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::from_name(s.as_str()), (s, None));
        }
        assert_eq!(
            Strategy::from_name("Round_Robin"),
            (Strategy::RoundRobin, None)
        );
        let (s, w) = Strategy::from_name("fastest");
        assert_eq!(s, Strategy::Smart);
        let w = w.expect("a warning");
        assert!(w.to_string().contains("\"fastest\""), "{w}");
        assert!(w.to_string().contains("using \"smart\""), "{w}");
    }

    #[test]
    fn weights_must_sum_to_100() {
        assert!(Weights::default().validate().is_ok());
        let e = Weights {
            priority: 50,
            load: 30,
            latency: 30,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("routing.weights") && e.contains("110"), "{e}");
        let huge = Weights {
            priority: u32::MAX,
            load: u32::MAX,
            latency: 2,
        };
        assert!(huge.validate().is_err(), "no overflow to 100");
    }

    #[test]
    fn score_examples_and_clamping() {
        let w = Weights::default();
        assert_eq!(score(&cand(0, 0, 0, 0), &w), 100, "perfect");
        assert_eq!(score(&cand(0, 100, 100, 1000), &w), 0, "worst");
        assert_eq!(
            score(&cand(0, 500, 5000, 99_999), &w),
            0,
            "clamped above 100"
        );
        // priority 10 -> 90*50, 20 pending -> 80*30, 150 ms -> 85*20: (4500+2400+1700)/100
        assert_eq!(score(&cand(0, 10, 20, 150), &w), 86);
        let only_latency = Weights {
            priority: 0,
            load: 0,
            latency: 100,
        };
        assert_eq!(score(&cand(0, 0, 0, 50), &only_latency), 95);
        assert_eq!(score(&cand(0, 0, 0, 200), &only_latency), 80);
    }

    #[test]
    fn deterministic_strategies_break_ties_to_the_first() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut cur = 0;
        let w = Weights::default();
        let same = [cand(0, 5, 5, 5), cand(1, 5, 5, 5), cand(2, 5, 5, 5)];
        for s in [
            Strategy::Smart,
            Strategy::LeastLoaded,
            Strategy::PriorityOnly,
        ] {
            assert_eq!(pick(s, &same, &w, &mut cur, &mut rng), 0, "{s}");
        }
        let c = [cand(0, 2, 9, 0), cand(1, 1, 9, 0), cand(2, 1, 3, 0)];
        assert_eq!(pick(Strategy::PriorityOnly, &c, &w, &mut cur, &mut rng), 1);
        assert_eq!(pick(Strategy::LeastLoaded, &c, &w, &mut cur, &mut rng), 2);
        assert_eq!(cur, 0, "only round_robin moves the cursor");
    }

    #[test]
    fn round_robin_cycles_in_order() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut cur = 0;
        let w = Weights::default();
        let c = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let got: Vec<usize> = (0..7)
            .map(|_| pick(Strategy::RoundRobin, &c, &w, &mut cur, &mut rng))
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn power_of_two_never_picks_the_most_loaded_of_three_distinct() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut cur = 0;
        let w = Weights::default();
        let c = [cand(0, 0, 5, 0), cand(1, 0, 50, 0), cand(2, 0, 1, 0)];
        let mut counts = [0u32; 3];
        for _ in 0..3000 {
            counts[pick(Strategy::PowerOfTwo, &c, &w, &mut cur, &mut rng)] += 1;
        }
        assert_eq!(
            counts[1], 0,
            "two distinct draws: the heaviest always loses"
        );
        // Candidate 2 wins every pair it is in (2 of 3 pairs).
        assert!(counts[2] > 1800 && counts[0] > 800, "{counts:?}");
    }

    #[test]
    fn single_candidate_is_always_picked() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut cur = 0;
        for s in Strategy::ALL {
            let c = [cand(4, 99, 99, 99)];
            assert_eq!(pick(s, &c, &Weights::default(), &mut cur, &mut rng), 0);
        }
    }
}
