//! `auto`: hold a partial batch only while waiting pays, with no knob to tune.
//!
//! It learns the executor's batch cost `S(n) = a + b n (+ c tokens)` from completed batches
//! ([`cost`]) and the arrivals to expect in the next milliseconds ([`arrivals`]), and at
//! every poll where a worker is free and a group is not otherwise due (full, critical, max
//! wait, drain) it decides: dispatch now, or hold until a deadline it computes.
//!
//! # The rule
//!
//! `q` requests wait, one worker is free (and dispatching would leave none free), and `k`
//! more requests are expected within `w`. Two effects decide.
//!
//! This round. Compare the completion times of everyone involved (their arrival times are
//! the same either way, so they cancel):
//! - dispatch now: the `q` finish at `S(q) = a + b q`; the `k`, arriving while that batch
//!   runs (`w < a <= S(q)`), wait for it and then run as their own batch, finishing at
//!   `S(q) + a + b k`. Total: `q (a + b q) + k (2a + b q + b k)`.
//! - hold until `w`: all `q + k` finish at `w + a + b (q + k)`. Total:
//!   `(q + k)(w + a + b q + b k)`.
//!
//! Holding minus dispatching is `(q + k) w + q b k - k a`: this round gains
//! `k (a - q b) - (q + k) w`. When `K` joiners are expected in all and the hold ends once
//! `j < K` are in, the other `K - j` run as their own batch either way (now `b (K - j)`
//! shorter than it would have been) and start `w` later, so this round gains
//! `j (a - q b + b (K - j)) - (q + K) w`: a long burst is cut where a batch stops paying.
//!
//! The rounds after. Dispatching now spends one more fixed cost `a` of worker time (when the
//! `k` come, probability about `min(k, 1)`); holding idles the worker for `w`. The worker
//! is free `min(k, 1) a - w` earlier by holding, and every request that will queue behind
//! it gains that much. How many will: each completed request brings `e` arrivals within
//! the next service (the arrival model's echo fraction within `a`), they bring `e` each
//! in turn, so `(q + k)(e + e^2 + ...) = (q + k) e / (1 - e)` requests. In a closed loop
//! `e ~ 1 - a / T_c`: the saving repeats every cycle (and `e` is capped at [`ECHO_CAP`] so
//! the weight stays finite); in an open loop the arrivals do not answer completions,
//! `e ~ 0` and `k ~ 0` (see [`arrivals`]): `auto` is work-conserving there, which the
//! simulator shows is the best in hindsight (a fixed window never beats it by 1 %).
//!
//! ```text
//!     benefit(w) = j (a - q b + b (K - j)) - (q + K) w  +  (q + K) e/(1-e) (s a - w)
//! ```
//!
//! with `j` the joiners expected by `w`, and `s = min(1, j / K) min(1, K)` the chance that
//! no second batch is needed (worker time is saved only then).
//!
//! `auto` evaluates `benefit` at the edges of the arrival model's bins up to a horizon and
//! holds until the best `w` when the best benefit is positive; any arrival, completion or
//! the deadline itself triggers a fresh decision, with the model conditioned on what came.
//! Every hold is charged [`HOLD_OVERHEAD_NS`] on top of its length (the engine's wake-up),
//! so slivers of expected arrivals do not buy holds the engine cannot honour cheaply.
//! Consequences, each a test:
//! - nothing expected (one client, whose only request is the one waiting; or no
//!   completion seen yet), or a batch without a fixed cost (`a = 0`): dispatch at once,
//!   work-conserving;
//! - never past `w = a`: beyond it both terms are negative whatever `k`; and never past the
//!   group's priority max wait or the request deadline (the caller's `latest`);
//! - another worker free after this dispatch: the `k` would not wait for this batch, and
//!   holding only delays the `q`, so the caller dispatches.
//!
//! This is a one-step look-ahead of the classic result for batch service queues: Deb and
//! Serfozo (1973) show the optimal policy for a server with a setup cost dispatches when
//! the queue reaches a threshold that grows with the setup cost and the arrival rate.
//! `auto` does not fix the threshold: it is where `benefit` turns negative for the cost and
//! arrivals it has learned. The hand-tuned alternatives it replaces hold a fixed time
//! counted from the oldest request (Triton's `max_queue_delay_microseconds`, TF-Serving's
//! `batch_timeout_micros`), or adapt a batch size on latency feedback (Clipper's AIMD);
//! neither can see that a closed loop's clients are about to come back.
//!
//! Nothing here allocates, reads a clock or blocks; the core passes `now` in.

pub mod arrivals;
pub mod bursts;
pub mod cost;

use crate::core::request::Nanos;
use arrivals::ArrivalModel;
use bursts::BurstModel;
use cost::{Cost, CostModel};

/// Most hold lengths evaluated per source (the arrival model has fewer bins; a burst is
/// followed this many arrivals ahead at most).
const CANDIDATES_MAX: usize = 80;

/// What a hold costs beyond its length, ns: the engine parks and is woken for it (a park and
/// an unpark take 5-60 us on Linux, more on a loaded machine) and polls again. Charged as
/// extra wait to everyone held, it makes a hold that saves less than that worthless: with a
/// batch cost of a few microseconds (latency model `none`), or a sliver of an expected
/// joiner, `auto` dispatches at once instead of renewing tiny holds up to the max wait.
pub const HOLD_OVERHEAD_NS: f64 = 20_000.0;

/// Largest echo mass used in the downstream weight `e / (1 - e)` (weight 19): a closed loop
/// measures `e ~ 1`, and the weight must stay finite.
pub const ECHO_CAP: f64 = 0.95;

/// What `auto` decided for a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Dispatch now: waiting cannot pay.
    Go,
    /// Hold the group until this instant (or until an arrival or completion changes the
    /// picture).
    HoldUntil(Nanos),
}

/// The group a decision is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Requests waiting in it.
    pub queued: usize,
    /// Their estimated tokens.
    pub tokens: u64,
    /// Room left in a batch (`max_batch_size - queued`).
    pub room: usize,
    /// Its token bucket (for the arrival share), or `None` when groups span every bucket.
    pub bucket: Option<usize>,
    /// The latest instant it may be held to (priority max wait, request deadline).
    pub latest: Nanos,
}

/// Counters and the last decision, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AutoSnapshot {
    pub cost: Cost,
    /// Arrivals per second, all classes.
    pub arrival_rate_per_s: f64,
    /// Squared coefficient of variation of the inter-arrival gaps, rate-weighted over the
    /// classes (1: Poisson; above: bursty).
    pub arrival_burstiness: f64,
    /// Share of the arrivals that answer a completion within one fixed cost `a` (about
    /// `1 - a / T_c` in a closed loop, `T_c` the time between completions; near 0 in an open
    /// one): the `e` of the rule.
    pub echo_fraction: f64,
    /// Decisions to dispatch at once / to hold.
    pub dispatched_now: u64,
    pub held: u64,
    /// The wait chosen by the last hold, ns.
    pub last_wait_ns: Nanos,
    /// Arrivals it expected by the end of that wait.
    pub last_expected_arrivals: f64,
}

/// `auto`'s learned state (one per core: per backend lane).
#[derive(Clone, Debug, Default)]
pub struct Auto {
    cost: CostModel,
    arrivals: ArrivalModel,
    bursts: BurstModel,
    dispatched_now: u64,
    held: u64,
    last_wait_ns: Nanos,
    last_expected_arrivals: f64,
}

impl Auto {
    /// A request of `class` in token `bucket` was admitted.
    pub fn observe_arrival(&mut self, now: Nanos, class: usize, bucket: usize) {
        self.arrivals.observe_arrival(now, class, bucket);
        self.bursts.observe_arrival(now);
    }

    /// A batch was answered (its clients have their answers now). `service_ns` is `None`
    /// when the batch failed: the clients still come back, but its time is not a cost sample.
    pub fn observe_completion(
        &mut self,
        now: Nanos,
        requests: usize,
        tokens: u64,
        service_ns: Option<Nanos>,
    ) {
        if let Some(s) = service_ns {
            self.cost.observe(requests, tokens, s);
        }
        self.arrivals.observe_completion(now, requests);
    }

    /// Dispatch `group` now, or hold it? Call only when a worker is free for it and
    /// dispatching would leave no other worker free.
    pub fn decide(&mut self, now: Nanos, group: &Group) -> Decision {
        let decision = self.evaluate(now, group);
        match decision {
            Decision::Go => self.dispatched_now += 1,
            Decision::HoldUntil(t) => {
                self.held += 1;
                self.last_wait_ns = t - now;
            }
        }
        decision
    }

    fn evaluate(&mut self, now: Nanos, group: &Group) -> Decision {
        let cost = self.cost.cost();
        if group.queued == 0 || group.room == 0 || cost.samples == 0 {
            return Decision::Go;
        }
        let q = group.queued as f64;
        let a = cost.a_ns;
        let per_request_ns = cost.b_ns + cost.c_ns_per_token * group.tokens as f64 / q;
        let gain_per_joiner_ns = a - q * per_request_ns;
        // Past w = a no number of joiners pays for the wait (see the module docs).
        let w_max = (a as Nanos).min(group.latest.saturating_sub(now));
        let e = self.arrivals.echo_within(a as Nanos).clamp(0.0, ECHO_CAP);
        let downstream = e / (1.0 - e);
        let share = group.bucket.map_or(1.0, |b| self.arrivals.bucket_share(b));
        let room = group.room as f64;
        let b = per_request_ns;
        // Holding until `j` of the `total` expected joiners are in (see the module docs).
        let benefit = |j: f64, total: f64, w: f64| {
            let w = w + HOLD_OVERHEAD_NS;
            let this_round = j * (gain_per_joiner_ns + b * (total - j)) - (q + total) * w;
            // Worker time saved only if no second batch is needed.
            let collected = (j / total).min(1.0) * total.min(1.0);
            this_round + (q + total) * downstream * (collected * a - w)
        };
        let mut best: Option<(Nanos, f64, f64)> = None;
        let mut consider = |candidates: &[(Nanos, f64)]| {
            // The most expected at any candidate (echoes net of the stream can fall again).
            let most = candidates.iter().fold(0.0f64, |m, &(_, k)| m.max(k));
            let total = (most * share).min(room);
            for &(w, expected) in candidates {
                let j = (expected * share).min(room);
                let value = benefit(j, total, w as f64);
                if value > 0.0 && best.is_none_or(|(_, v, _)| value > v) {
                    best = Some((w, value, j));
                }
            }
        };
        // Echoes of the last completion (a closed loop's clients coming back).
        let mut candidates = [(0, 0.0); CANDIDATES_MAX];
        let mut n = 0;
        self.arrivals.for_each_wait(now, w_max, |w, k| {
            if n < CANDIDATES_MAX {
                candidates[n] = (w, k);
                n += 1;
            }
        });
        consider(&candidates[..n]);
        // The rest of a burst now arriving, one learned gap apart.
        n = 0;
        if let (Some((followers, gap_ns)), Some(last)) =
            (self.bursts.followers(now), self.bursts.last_arrival_ns())
        {
            let mut j = 1.0;
            while j < followers + 1.0 && n < CANDIDATES_MAX {
                let due = last as f64 + j * gap_ns;
                let w = (due - now as f64).max(0.0).ceil() as Nanos;
                if w > w_max {
                    break;
                }
                if w > 0 {
                    candidates[n] = (w, j.min(followers));
                    n += 1;
                }
                j += 1.0;
            }
        }
        consider(&candidates[..n]);
        match best {
            Some((w, _, k)) if w > 0 => {
                self.last_expected_arrivals = k;
                Decision::HoldUntil(now + w)
            }
            _ => Decision::Go,
        }
    }

    /// The learned state, for metrics.
    pub fn snapshot(&self) -> AutoSnapshot {
        AutoSnapshot {
            cost: self.cost.cost(),
            arrival_rate_per_s: self.arrivals.rate_per_s(),
            arrival_burstiness: self.arrivals.burstiness(),
            echo_fraction: self
                .arrivals
                .echo_within(self.cost.cost().a_ns as Nanos)
                .clamp(0.0, 1.0),
            dispatched_now: self.dispatched_now,
            held: self.held,
            last_wait_ns: self.last_wait_ns,
            last_expected_arrivals: self.last_expected_arrivals,
        }
    }

    /// The arrival model (rates and burstiness per class).
    pub fn arrivals(&self) -> &ArrivalModel {
        &self.arrivals
    }
}

#[cfg(test)]
pub(crate) mod tests;
