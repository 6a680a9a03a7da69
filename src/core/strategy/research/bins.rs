//! Algorithms 4-6 of the multi-bin research strategy: bin boundaries over predicted output
//! length from a bounded sample (the paper's equal-mass quantiles, and the rule `multi_bin`
//! uses: least second moment of batch length, see
//! [`BinBoundaries::recompute_min_second_moment`]), the partition of a request into a bin,
//! the choice of which bin forms the next batch, and the output-length predictor that
//! supplies the key.
//!
//! Sources: Guldogan, Kunde, Lee, Pedarsani, arXiv 2412.04504 (P1), as implemented by
//! TravisLeeTS/llm-scheduler-sim `config.py::compute_equal_mass_boundaries` and
//! `schedulers.py::MultiBinScheduler`.
//!
//! Everything is sized in `new` (at most [`BIN_COUNT_MAX`] bins, a scratch buffer for the
//! quantiles, the boundary programme's tables); recomputing boundaries, partitioning,
//! choosing and predicting never allocate.
//! No clock reads.

use std::fmt;
use std::str::FromStr;

use crate::core::request::{bucket_for_tokens, RequestMeta, BUCKET_COUNT};

/// Most bins a [`BinBoundaries`] holds.
pub const BIN_COUNT_MAX: usize = 64;

/// `K` bins over output length: bin `i` is `[edges[i], edges[i + 1])`.
#[derive(Debug)]
pub struct BinBoundaries {
    /// Invariant: `edges[..=bin_count]` non-decreasing, `edges[bin_count] ==
    /// max_tokens_limit`; entries past `bin_count` unused.
    edges: [u32; BIN_COUNT_MAX + 1],
    /// `K`. Invariant: `1..=BIN_COUNT_MAX`.
    bin_count: usize,
    /// Upper edge of the last bin, tokens (the reference's 10000 sentinel).
    max_tokens_limit: u32,
    /// Sort buffer for quantiles; its length (fixed in `new`) bounds the samples used.
    scratch: Box<[u32]>,
    /// Cut positions into the sorted sample considered by [`Self::recompute_min_second_moment`]:
    /// `BOUNDARY_CUTS + 1` slots.
    cuts: Box<[u32]>,
    /// Its dynamic programme: `cost[k][j]` (row-major, `BOUNDARY_CUTS + 1` per row,
    /// `bin_count + 1` rows) is the least cost of the first `j` cut segments in `k` bins,
    /// `from[k][j]` the cut that starts its last bin.
    cost: Box<[u128]>,
    from: Box<[u16]>,
}

/// Cut positions [`BinBoundaries::recompute_min_second_moment`] chooses among (about 1/256 of the
/// sample apart): enough to place an edge within half a percent of the sample, few enough
/// that the programme (at most `K x 256^2 / 2` steps) stays under a millisecond every
/// `recompute_every` completions: measured (rustc -O, 4,096 bimodal samples, 2 vCPU
/// shared, 2026-11-24) 60 us for K = 4 and 0.82 ms for K = 64, against 21 us and 0.18 ms
/// for the equal-mass quantiles.
pub const BOUNDARY_CUTS: usize = 256;
const _: () = assert!(BOUNDARY_CUTS < u16::MAX as usize);

impl BinBoundaries {
    /// `bin_count` equal-width bins over `[1, max_tokens_limit]` (the uniform case
    /// `l_i = l_min + (i / K)(l_max - l_min)`, used until statistics exist), and room to
    /// sort `sample_capacity` samples.
    pub fn new(bin_count: usize, max_tokens_limit: u32, sample_capacity: usize) -> Self {
        assert!(
            (1..=BIN_COUNT_MAX).contains(&bin_count),
            "bin count must be in 1..={BIN_COUNT_MAX}, got {bin_count}"
        );
        assert!(max_tokens_limit > 0, "max_tokens_limit must be at least 1");
        let mut b = BinBoundaries {
            edges: [0; BIN_COUNT_MAX + 1],
            bin_count,
            max_tokens_limit,
            scratch: vec![0; sample_capacity].into_boxed_slice(),
            cuts: vec![0; BOUNDARY_CUTS + 1].into_boxed_slice(),
            cost: vec![0; (bin_count + 1) * (BOUNDARY_CUTS + 1)].into_boxed_slice(),
            from: vec![0; (bin_count + 1) * (BOUNDARY_CUTS + 1)].into_boxed_slice(),
        };
        b.reset_equal_width();
        b
    }

    /// Back to equal-width bins over `[1, max_tokens_limit]`:
    /// `edges[i] = 1 + floor(i (limit - 1) / K)`. With `limit < K` some bins are empty.
    pub fn reset_equal_width(&mut self) {
        let k = self.bin_count as u64;
        let width = u64::from(self.max_tokens_limit - 1);
        for i in 0..=self.bin_count {
            // i (limit - 1) / K <= limit - 1, so the sum fits u32.
            self.edges[i] = 1 + (i as u64 * width / k) as u32;
        }
    }

    /// Algorithm 6: equal-mass boundaries, `edges[i]` = the `i / K` quantile of `samples`
    /// (linear interpolation between order statistics, numpy's default, truncated to an
    /// integer like the reference's `int()`), clamped to `max_tokens_limit`; the last edge
    /// is `max_tokens_limit`. Computed in exact integer arithmetic, so a quantile that is a
    /// whole number is never truncated one below it by float rounding.
    ///
    /// Uses at most the scratch capacity's worth of `samples` (the first ones). Returns
    /// false, keeping the boundaries, when `samples` is empty. Repeated values give empty
    /// bins `[a, a)`, as in the reference. Runs periodically, not per request: it sorts.
    pub fn recompute_equal_mass(&mut self, samples: &[u32]) -> bool {
        let n = samples.len().min(self.scratch.len());
        if n == 0 {
            return false;
        }
        let sorted = &mut self.scratch[..n];
        sorted.copy_from_slice(&samples[..n]);
        sorted.sort_unstable(); // in place: no allocation
        let k = self.bin_count as u64;
        for i in 0..self.bin_count {
            // Position h = (n - 1) i / K = lo + rem / K.
            let scaled = (n as u64 - 1) * i as u64;
            let lo = (scaled / k) as usize;
            let rem = scaled % k;
            let base = sorted[lo];
            let q = if rem == 0 {
                base
            } else {
                // rem > 0 implies lo < n - 1; base + rem/K x gap <= sorted[lo + 1].
                let gap = u64::from(sorted[lo + 1] - base);
                base + (rem * gap / k) as u32
            };
            self.edges[i] = q.min(self.max_tokens_limit);
        }
        self.edges[self.bin_count] = self.max_tokens_limit;
        true
    }

    /// Boundaries that minimise `sum over bins of n_i x max_i^2` (`n_i` samples in bin `i`,
    /// the longest of them `max_i`): the second moment of the time a request spends in its
    /// batch, if every request ran as long as the longest of its bin, which is what a batch
    /// does. The first edge is the shortest sample and the last `max_tokens_limit`, as in
    /// [`Self::recompute_equal_mass`]; edges are clamped to `max_tokens_limit`.
    ///
    /// Why not equal mass (Algorithm 6): equal-mass edges are quantiles of the count, blind
    /// to the lengths between them. On a bimodal workload (`long_tail`: 70 % ~64 tokens,
    /// 30 % ~1,024) with K = 4 three edges fall in the short mode and one at the foot of
    /// the long one, so bin 2 spans 73..750 tokens (short answers rode 700-token batches)
    /// and bin 3 750..4,096 (a 1,600-token answer waited for a 3,000-token one): those
    /// requests made `multi_bin`'s p99 1.04x `fixed`'s, whose token buckets happen to split
    /// the long mode (measured with a per-request trace of the simulator, seed 7).
    ///
    /// Why the square: the first moment (padded work, `n_i x max_i`) already keeps short
    /// and long apart, but spends its bins where most requests are and leaves the rare
    /// longest ones (the top 2 %, 1,600..3,500 tokens) in one bin, where they set the p99
    /// (0.96-1.005x `fixed`'s over seeds 1, 2, 3, 7). Weighting by the square, as a queue's
    /// waiting time weights service times (Pollaczek-Khinchine: mean wait grows with
    /// `E[S^2]`), gives the long tail bins of its own: p99 0.95-0.99x `fixed`'s on seeds 1-9
    /// (equal mass: 1.03-1.08x), p50 0.87-1.00x (BENCHMARKS.md). It ignores how full a
    /// rare bin's batches get: with K = 6 or 8 it spends bins on the long tail, batches of
    /// long answers shrink and the p99 is worse than equal mass's (19.1 and 21.5 s against
    /// 18.2 and 18.9). Neither rule is equal width on uniform lengths, so the paper's `C_K`
    /// check (`multibin_paper`) bins its backlog on admission, before any recompute.
    ///
    /// An exact dynamic programme over cut positions about `n / BOUNDARY_CUTS` apart,
    /// moved forward to the next change of value so that equal lengths never straddle an
    /// edge (what [`Self::bin_of`] assumes). Uses at most the scratch capacity's worth of
    /// `samples`; returns false, keeping the boundaries, when `samples` is empty. Fewer
    /// distinct cut positions than bins leave the lowest bins empty (`[a, a)`). Runs
    /// periodically, not per request; never allocates.
    pub fn recompute_min_second_moment(&mut self, samples: &[u32]) -> bool {
        let n = samples.len().min(self.scratch.len());
        if n == 0 {
            return false;
        }
        let sorted = &mut self.scratch[..n];
        sorted.copy_from_slice(&samples[..n]);
        sorted.sort_unstable(); // in place: no allocation
        let sorted = &self.scratch[..n];
        // Cut positions 0 = c_0 < c_1 < ... < c_m = n, each at a change of value.
        let mut m = 0usize;
        self.cuts[0] = 0;
        for j in 1..=BOUNDARY_CUTS {
            let mut p = j * n / BOUNDARY_CUTS;
            while p > 0 && p < n && sorted[p] == sorted[p - 1] {
                p += 1;
            }
            if p > self.cuts[m] as usize {
                m += 1;
                // p <= n, and a sample that large would not fit in memory as u32 indices.
                self.cuts[m] = u32::try_from(p).expect("sample length fits u32");
            }
        }
        let cuts = &self.cuts;
        debug_assert_eq!(cuts[m] as usize, n, "the last cut closes the sample");
        // Cost of the segment [c_a, c_b): its count times its longest sample squared
        // (< 2^12 x 2^64 with the default sample; u128 holds any sample that fits memory).
        let seg = |a: usize, b: usize| -> u128 {
            let (lo, hi) = (cuts[a] as usize, cuts[b] as usize);
            let longest = u128::from(sorted[hi - 1]);
            (hi - lo) as u128 * longest * longest
        };
        let bins = self.bin_count.min(m);
        let row = BOUNDARY_CUTS + 1;
        for b in 1..=m {
            self.cost[row + b] = seg(0, b);
            self.from[row + b] = 0;
        }
        for k in 2..=bins {
            for b in k..=m {
                let mut best = (u128::MAX, 0usize);
                for a in (k - 1)..b {
                    let c = self.cost[(k - 1) * row + a] + seg(a, b);
                    if c < best.0 {
                        best = (c, a);
                    }
                }
                self.cost[k * row + b] = best.0;
                // a < b <= BOUNDARY_CUTS < u16::MAX (asserted at compile time).
                self.from[k * row + b] = best.1 as u16;
            }
        }
        // Walk the cuts back: bin `first + k - 1` starts at cut `from[k][b]`.
        let first = self.bin_count - bins;
        let mut b = m;
        for k in (1..=bins).rev() {
            let a = self.from[k * row + b] as usize;
            let start = sorted[cuts[a] as usize];
            self.edges[first + k - 1] = start.min(self.max_tokens_limit);
            b = a;
        }
        for i in 0..first {
            self.edges[i] = self.edges[first];
        }
        self.edges[self.bin_count] = self.max_tokens_limit;
        true
    }

    /// `K`.
    pub fn bin_count(&self) -> usize {
        self.bin_count
    }

    /// The `K + 1` edges.
    pub fn edges(&self) -> &[u32] {
        &self.edges[..=self.bin_count]
    }

    /// Bin `bin` as `[lo, hi)` tokens.
    pub fn bounds(&self, bin: usize) -> (u32, u32) {
        assert!(
            bin < self.bin_count,
            "bin {bin} out of 0..{}",
            self.bin_count
        );
        (self.edges[bin], self.edges[bin + 1])
    }

    /// Algorithm 4: the bin `i` with `edges[i] <= predicted_len < edges[i + 1]`; a length at
    /// or above the last edge goes to the last bin, one below the first edge to bin 0.
    /// (The reference sends a length below bin 0's lower edge to the last bin too; a short
    /// request belongs with the short ones.) With empty bins `[a, a)`, `a` goes to the
    /// first non-empty bin starting at `a`.
    pub fn bin_of(&self, predicted_len: u32) -> usize {
        // Number of inner edges <= predicted_len; binary search, no allocation.
        self.edges[1..self.bin_count].partition_point(|&e| e <= predicted_len)
    }
}

/// How the next batch's bin is chosen (Algorithm 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BinPolicy {
    /// The bin whose head has waited longest (across bins, arrival order of the heads),
    /// any head past the age bound first: see [`choose_age_aware`]. Cannot starve a bin.
    #[default]
    AgeAware,
    /// The bin whose head has waited longest relative to its bin's expected batch service
    /// time (highest response ratio `(wait + S_bin) / S_bin`), any head past the age bound
    /// first. Cannot starve a bin; favours short bins more than `age_aware` (lower p50,
    /// higher p99: see BENCHMARKS.md).
    ResponseRatio,
    /// The next non-empty bin after the one served last (the reference's default).
    RoundRobin,
    /// The bin with the most queued requests; ties go to the lowest index. Can starve a
    /// bin that stays short.
    LongestQueue,
}

impl BinPolicy {
    /// Every policy, in the order listed to users.
    pub const ALL: [BinPolicy; 4] = [
        BinPolicy::AgeAware,
        BinPolicy::ResponseRatio,
        BinPolicy::RoundRobin,
        BinPolicy::LongestQueue,
    ];

    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BinPolicy::AgeAware => "age_aware",
            BinPolicy::ResponseRatio => "response_ratio",
            BinPolicy::RoundRobin => "round_robin",
            BinPolicy::LongestQueue => "longest_queue",
        }
    }
}

impl fmt::Display for BinPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the listed choices (bin policy or length predictor). Unlike
/// the reference, which silently falls back to round robin, a typo is an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{name}': valid values are {valid}")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
    pub valid: &'static str,
}

impl FromStr for BinPolicy {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "bin policy",
                name: s.to_string(),
                valid: "age_aware, response_ratio, round_robin, longest_queue",
            })
    }
}

crate::core::names::serde_by_name!(BinPolicy);

/// The `round_robin` bin choice (the reference's default): the next non-empty bin after
/// the one served last. A batch always comes from a single bin.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundRobin {
    /// Where the next scan starts. Reduced modulo the bin count on use.
    next_bin: usize,
}

impl RoundRobin {
    /// The bin to serve given each bin's queue length, or `None` when all are empty (then
    /// nothing changes); the next scan starts after the chosen bin.
    pub fn choose(&mut self, bin_lens: &[usize]) -> Option<usize> {
        let k = bin_lens.len();
        let start = if k == 0 { 0 } else { self.next_bin % k };
        let i = (start..k).chain(0..start).find(|&i| bin_lens[i] > 0)?;
        self.next_bin = if i + 1 == k { 0 } else { i + 1 };
        Some(i)
    }
}

/// The `longest_queue` bin choice: the bin with the most queued requests, ties to the
/// lowest index; `None` when all are empty. Can starve a bin that stays short.
pub fn longest_queue(bin_lens: &[usize]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, &len) in bin_lens.iter().enumerate() {
        if len > 0 && best.is_none_or(|(_, l)| len > l) {
            best = Some((i, len));
        }
    }
    best.map(|(i, _)| i)
}

/// Algorithm 5's bin choice made age-aware: among bins whose head has waited
/// `head_wait_ns[i] = Some(w)` (`None`: empty bin), any head at or past `age_bound_ns` goes
/// first (the oldest such); otherwise the bin with the highest response ratio
/// `(w + S_i) / S_i`, where `S_i = expected_service_ns[i] > 0` is the bin's expected batch
/// service time. Ties go to the lowest index.
///
/// Equal `S_i` (the `age_aware` policy) orders bins by their heads' ages: the oldest head
/// first, so no head waits behind a younger one of another bin.
///
/// Why not round robin: it gives every bin the same number of batches whatever their
/// lengths and loads, so a bin served less than it receives falls behind. Dividing the
/// wait by the bin's batch time (`response_ratio`) lets a short bin go ahead after waiting
/// about one of its own short batches, while a long bin's ratio keeps growing as its head
/// waits, so it is served before any newer arrival's ratio can overtake it: no bin starves
/// (the highest-response-ratio-next argument). Measured on `long_tail` (20,000 requests,
/// equal-mass bins): `response_ratio` halved `fixed`'s p50 but its p99 was 1.12x `fixed`'s,
/// `age_aware`'s 1.04x with p50 0.9x; on `steady_state` and `mixed_priority` `age_aware`
/// beat `fixed` at p50 and p99. (With the boundaries of `recompute_min_second_moment`,
/// `age_aware` is at or below `fixed` at both: BENCHMARKS.md.) Weighting the age by the
/// bin's batch time the other way (serving the largest wait + batch time first, which
/// favours long bins) lowers the p99 by 1-2 % but raises the p50 by 40-100 %: not taken.
/// The age bound caps any wait outright.
pub fn choose_age_aware(
    head_wait_ns: &[Option<u64>],
    expected_service_ns: &[f64],
    age_bound_ns: u64,
) -> Option<usize> {
    debug_assert_eq!(head_wait_ns.len(), expected_service_ns.len());
    let mut oldest_past_bound: Option<(usize, u64)> = None;
    let mut best: Option<(usize, f64)> = None;
    for (i, (wait, &service)) in head_wait_ns.iter().zip(expected_service_ns).enumerate() {
        let Some(wait) = *wait else { continue };
        if wait >= age_bound_ns {
            if oldest_past_bound.is_none_or(|(_, w)| wait > w) {
                oldest_past_bound = Some((i, wait));
            }
            continue;
        }
        debug_assert!(
            service > 0.0,
            "expected service must be positive, got {service}"
        );
        let ratio = (wait as f64 + service) / service;
        if best.is_none_or(|(_, r)| ratio > r) {
            best = Some((i, ratio));
        }
    }
    oldest_past_bound.map(|(i, _)| i).or(best.map(|(i, _)| i))
}

/// Where a request's predicted output length comes from when it carries no hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PredictorKind {
    /// Predict `max_tokens` (an upper bound: no statistics needed).
    #[default]
    MaxTokens,
    /// EMA of observed output lengths per prompt-length token bucket
    /// ([`bucket_for_tokens`]); `max_tokens` for a bucket with no observation yet.
    EmaByPromptBucket,
}

impl PredictorKind {
    /// Every predictor, in the order listed to users.
    pub const ALL: [PredictorKind; 2] =
        [PredictorKind::MaxTokens, PredictorKind::EmaByPromptBucket];

    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            PredictorKind::MaxTokens => "max_tokens",
            PredictorKind::EmaByPromptBucket => "ema_by_prompt_bucket",
        }
    }
}

impl fmt::Display for PredictorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PredictorKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "length predictor",
                name: s.to_string(),
                valid: "max_tokens, ema_by_prompt_bucket",
            })
    }
}

crate::core::names::serde_by_name!(PredictorKind);

/// EMA weight of the newest observed output length.
pub const PREDICTOR_EMA_WEIGHT: f64 = 0.2;

/// Predicts a request's output length, the key multi-bin batching partitions on.
#[derive(Clone, Copy, Debug)]
pub struct LengthPredictor {
    kind: PredictorKind,
    /// EMA of observed output tokens per prompt bucket; seeded by the bucket's first
    /// observation, meaningless while `observed[b] == 0`.
    output_tokens_ema: [f64; BUCKET_COUNT],
    /// Observations per prompt bucket (saturating).
    observed: [u64; BUCKET_COUNT],
}

impl LengthPredictor {
    pub fn new(kind: PredictorKind) -> Self {
        LengthPredictor {
            kind,
            output_tokens_ema: [0.0; BUCKET_COUNT],
            observed: [0; BUCKET_COUNT],
        }
    }

    /// The predictor in force.
    pub fn kind(&self) -> PredictorKind {
        self.kind
    }

    /// Switches predictor; observations are kept (both kinds record them).
    pub fn set_kind(&mut self, kind: PredictorKind) {
        self.kind = kind;
    }

    /// Predicted output tokens: the hint when `hint_tokens > 0`, else the policy's value
    /// (the bucket EMA rounded to the nearest token); always capped at `max_tokens`, since
    /// a request never generates more (so an embedding, `max_tokens = 0`, predicts 0).
    pub fn predict(&self, prompt_tokens: u32, max_tokens: u32, hint_tokens: u32) -> u32 {
        let raw = if hint_tokens > 0 {
            hint_tokens
        } else {
            match self.kind {
                PredictorKind::MaxTokens => max_tokens,
                PredictorKind::EmaByPromptBucket => self
                    .bucket_ema(bucket_for_tokens(prompt_tokens))
                    // `as` saturates; the EMA of u32 values fits anyway.
                    .map_or(max_tokens, |ema| ema.round() as u32),
            }
        };
        raw.min(max_tokens)
    }

    /// [`LengthPredictor::predict`] for a request: prompt tokens are its estimate minus
    /// `max_tokens`, the hint is `predicted_output_tokens`.
    pub fn predict_for(&self, meta: &RequestMeta) -> u32 {
        let prompt = meta.tokens_estimated.saturating_sub(meta.max_tokens);
        self.predict(prompt, meta.max_tokens, meta.predicted_output_tokens)
    }

    /// Feeds back a finished request's true output length.
    pub fn observe(&mut self, prompt_tokens: u32, output_tokens: u32) {
        let b = bucket_for_tokens(prompt_tokens);
        let x = f64::from(output_tokens);
        self.output_tokens_ema[b] = if self.observed[b] == 0 {
            x
        } else {
            PREDICTOR_EMA_WEIGHT * x + (1.0 - PREDICTOR_EMA_WEIGHT) * self.output_tokens_ema[b]
        };
        self.observed[b] = self.observed[b].saturating_add(1);
    }

    /// The EMA of output tokens for prompt bucket `bucket`; `None` before its first
    /// observation.
    pub fn bucket_ema(&self, bucket: usize) -> Option<f64> {
        (self.observed[bucket] > 0).then_some(self.output_tokens_ema[bucket])
    }
}
