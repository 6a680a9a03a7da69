//! Affinity: where a request would rather go, beside what it needs. Its prompt's KV block
//! names for `prefix_aware` (send it where the longest prefix is cached, unless that
//! backend is overloaded), its session key for `session` (the same backend for the same
//! session, by rendezvous hashing).
//!
//! The decisions are pure functions of the candidates and numbers passed in
//! ([`pick_prefix`], [`pick_session`]); the router fills the numbers (how many leading
//! blocks each candidate holds, from a [`CacheView`] or its approximate
//! [`PrefixIndex`](super::prefix_index::PrefixIndex) per backend). Nothing here allocates,
//! reads a clock or takes a lock.
//!
//! # The balance rule and its thresholds (`[routing.prefix]`)
//!
//! SGLang's router (sgl-router, now sgl-model-gateway, `cache_aware` policy) has the same
//! three knobs; its command-line defaults are `cache_threshold = 0.3`,
//! `balance_abs_threshold = 64`, `balance_rel_threshold = 1.5` (the library's `Default` has
//! 0.5 / 32 / 1.1). Load there and here is requests in flight on a backend as the router
//! counts them (`pending_batches`; in continuous mode one routed request is one); abe adds
//! work in flight (below). abe's rule also differs in one place: SGLang falls back to the least loaded worker whenever *any*
//! two workers are that far apart; abe does only when the backend the cache points at is
//! that far above the least loaded candidate, so a hot cold backend does not stop affinity
//! elsewhere. Below the cache threshold SGLang picks the worker with the smallest tree; abe
//! the least loaded.
//!
//! - `cache_threshold_pct` (default [`CACHE_THRESHOLD_PCT_DEFAULT`] = 30): the best match
//!   must cover more than this share of the prompt's full blocks for affinity to count.
//!   What it guards against: a prefix every request shares (a system prompt) would pull
//!   all traffic to one backend, though every backend caches it after one request each.
//!   It must sit above the share of a prompt such common prefixes take and below the share
//!   a returning conversation or document reuses. Measure both on the traffic (the
//!   simulator's per-request hit fractions under the one-big-cache reference): the
//!   default is SGLang's, which sits between the two on chat traffic with short system
//!   prompts; sweep 10..70 in the simulator and keep the knee of hit rate against TTFT.
//! - `balance_abs_threshold` (default [`BALANCE_ABS_THRESHOLD_DEFAULT`] = 64 requests): the
//!   cached backend is overloaded only when it has more than this many requests in flight
//!   above the least loaded one. Derivation: while that difference stays below the number
//!   of sequences a backend runs at once, the request starts at once on the cached backend
//!   too (it only shares steps with more neighbours), and the hit saves its prefill; past
//!   it, the request queues for a slot there and not on the least loaded one, and one slot
//!   turnover (a whole decode, seconds) costs more than any prefill saved (a 2k-token
//!   prefill is tens of milliseconds on one GPU). So the default is one backend's
//!   concurrent sequences: abe's default continuous backend runs 4 replicas
//!   (`max_concurrent_batches`) of 16 slots (`continuous.max_slots`) = 64, which is also
//!   SGLang's default. For a vLLM backend set it near its running batch under load
//!   (`vllm:num_requests_running` at saturation, at most `max_num_seqs`).
//! - `balance_rel_threshold_pct` (default [`BALANCE_REL_THRESHOLD_PCT_DEFAULT`] = 150): and
//!   only when its load is more than this percentage of the least loaded one's. Derivation:
//!   when every backend is busy what matters is busy time, not request counts. A request
//!   that hits a fraction `f` of its prompt spends a fraction `f * p` less time on the GPU
//!   (`p`: the prefill share of its service time), so the cached backend carries
//!   `1 / (1 - f * p)` times the requests for the same busy time. With `f * p = 1/3` (half
//!   the prompt cached, prefill two thirds of the work: long-prompt, short-answer traffic
//!   such as the Mooncake trace) that is 1.5. Measure `p` from the backend's TTFT against
//!   e2e latency and `f` from its hit rate, and set `100 / (1 - f * p)`. The same ratio
//!   bounds work (below).
//! - Work ([`RequestWork`]): a request's prompt tokens not cached on the backend plus
//!   `decode_token_work` (default [`DECODE_TOKEN_WORK_DEFAULT`] = 0) per expected output
//!   token; a backend's work in flight is the sum over its requests, fed by the caller
//!   (`Registry::work_started` / `work_finished`, with [`Decision::work`](super::Decision)).
//!   The fallback is the candidate with the least work in flight (ties: fewer requests),
//!   and the cached backend is also overloaded when its work, this request's counted on
//!   each, is more than `balance_abs_work_tokens` (default
//!   [`BALANCE_ABS_WORK_TOKENS_DEFAULT`] = 32,768) above the fallback's and more than
//!   `balance_rel_threshold_pct` % of it. Why: at realistic loads a replica holds 1 to 3
//!   requests, so counts cannot see that one replica's requests are long uncached prompts.
//!   Both defaults are measured: the simulator sweep in docs/routing.md (8 H100 replicas,
//!   the Mooncake trace) keeps imbalance <= 1.2 with 95 % of the reference hit rate there;
//!   a positive `decode_token_work` lost hit rate for no balance.
//!
//! # Session affinity
//!
//! `session` sends a request with a session key (the `X-Session-Id` header, else the
//! OpenAI `user` field, hashed to `u64` by the caller) to the candidate with the highest
//! rendezvous score `mix(key ^ backend key)`, the backend key a hash of the backend's
//! name. When a backend leaves (unhealthy, open circuit) only its sessions move, each to
//! its second choice; the others stay; when it returns they come back. Two routers with the
//! same backend names agree. No key: least loaded.

use super::prefix_index::{PrefixIndex, MAX_TRACKED_BLOCKS_MAX};
use super::registry::BackendId;
use super::strategy::Candidate;
use super::RouterConfigError;
use crate::core::prefix::BlockHash;
use serde::{Deserialize, Serialize};
use std::fmt;

/// `cache_threshold_pct` when `[routing.prefix]` does not set it; see the module doc.
pub const CACHE_THRESHOLD_PCT_DEFAULT: u32 = 30;
/// `balance_abs_threshold` default (requests in flight); see the module doc.
pub const BALANCE_ABS_THRESHOLD_DEFAULT: u32 = 64;
/// `balance_rel_threshold_pct` default; see the module doc.
pub const BALANCE_REL_THRESHOLD_PCT_DEFAULT: u32 = 150;
/// `balance_abs_work_tokens` default (prompt-token equivalents); see the module doc.
pub const BALANCE_ABS_WORK_TOKENS_DEFAULT: u32 = 32_768;
/// `decode_token_work` default (prompt tokens an output token weighs); see the module doc.
pub const DECODE_TOKEN_WORK_DEFAULT: u32 = 0;
/// `max_tracked_blocks` default, per backend: 32,768 blocks of 16 tokens = 512 Ki tokens,
/// about one H100's KV cache for Llama-3.1-8B (80 GB less 16 GB of weights, at 128 KiB of
/// K and V a token: ~490 Ki tokens). 1.25 MiB of index a backend.
pub const MAX_TRACKED_BLOCKS_DEFAULT: u32 = 32_768;

/// The `[routing.prefix]` table: `prefix_aware`'s thresholds and the approximate index's
/// bound. See the module doc for each default's derivation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixConfig {
    /// Affinity counts when the best match covers more than this percentage of the
    /// prompt's full blocks (0..=100).
    pub cache_threshold_pct: u32,
    /// The cached backend is overloaded when it has more than this many requests in flight
    /// above the fallback (the candidate with the least work in flight) ...
    pub balance_abs_threshold: u32,
    /// ... and more than this percentage of its load (>= 100); the same ratio applies to
    /// work.
    pub balance_rel_threshold_pct: u32,
    /// Or: the cached backend's work in flight, this request's included, is more than this
    /// many prompt-token equivalents above the fallback's (and more than
    /// `balance_rel_threshold_pct` % of it). Counts only where the caller feeds work
    /// ([`Registry::work_started`](super::Registry::work_started)).
    pub balance_abs_work_tokens: u32,
    /// Work of one expected output token, in prompt tokens (a request's work is its
    /// uncached prompt tokens plus this per output token).
    pub decode_token_work: u32,
    /// Block names tracked per backend whose cache the router cannot ask
    /// (1..=16,777,216); 40 bytes each at a power of two, at most 64.
    pub max_tracked_blocks: u32,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            cache_threshold_pct: CACHE_THRESHOLD_PCT_DEFAULT,
            balance_abs_threshold: BALANCE_ABS_THRESHOLD_DEFAULT,
            balance_rel_threshold_pct: BALANCE_REL_THRESHOLD_PCT_DEFAULT,
            balance_abs_work_tokens: BALANCE_ABS_WORK_TOKENS_DEFAULT,
            decode_token_work: DECODE_TOKEN_WORK_DEFAULT,
            max_tracked_blocks: MAX_TRACKED_BLOCKS_DEFAULT,
        }
    }
}

impl PrefixConfig {
    /// Checks each key's range.
    pub fn validate(&self) -> Result<(), RouterConfigError> {
        let bad = |key, value: u32, why| {
            Err(RouterConfigError::Prefix {
                key,
                value: u64::from(value),
                why,
            })
        };
        if self.cache_threshold_pct > 100 {
            return bad(
                "cache_threshold_pct",
                self.cache_threshold_pct,
                "must be at most 100 (a share of the prompt's blocks)",
            );
        }
        if self.balance_rel_threshold_pct < 100 {
            return bad(
                "balance_rel_threshold_pct",
                self.balance_rel_threshold_pct,
                "must be at least 100 (the cached backend's load as a percentage of the \
                 least loaded one's)",
            );
        }
        if !(1..=MAX_TRACKED_BLOCKS_MAX).contains(&self.max_tracked_blocks) {
            return bad(
                "max_tracked_blocks",
                self.max_tracked_blocks,
                "must be in 1..=16777216 (blocks tracked per backend, 40 to 64 bytes each)",
            );
        }
        Ok(())
    }

    /// Whether the backend the cache points at (`cached`) is overloaded against the
    /// fallback: by requests in flight (more than `balance_abs_threshold` above it and more
    /// than `balance_rel_threshold_pct` % of it), or by work with this request counted on
    /// each (more than `balance_abs_work_tokens` above it and more than
    /// `balance_rel_threshold_pct` % of it).
    #[inline]
    pub fn overloaded(&self, cached: BalanceLoad, fallback: BalanceLoad) -> bool {
        let rel = u128::from(self.balance_rel_threshold_pct);
        let by_requests = cached.requests.saturating_sub(fallback.requests)
            > self.balance_abs_threshold
            && u128::from(cached.requests) * 100 > u128::from(fallback.requests) * rel;
        let by_work = cached.work.saturating_sub(fallback.work)
            > u64::from(self.balance_abs_work_tokens)
            && u128::from(cached.work) * 100 > u128::from(fallback.work) * rel;
        by_requests || by_work
    }

    /// Whether `matched` of `prompt` blocks is enough for affinity: strictly more than the
    /// threshold's share, so nothing matched never counts.
    #[inline]
    pub fn enough(&self, matched: u32, prompt: u32) -> bool {
        u64::from(matched) * 100 > u64::from(prompt) * u64::from(self.cache_threshold_pct)
    }
}

/// A backend's load as the balance rule weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalanceLoad {
    /// Requests (batches) in flight.
    pub requests: u32,
    /// Work in flight plus the request's own work there, prompt-token equivalents.
    pub work: u64,
}

/// What a cache that can be asked says about a backend. The engine's own continuous
/// replicas answer exactly from their block tables; for a backend it does not know it says
/// `None` and the router asks its approximate [`PrefixIndex`] instead.
pub trait CacheView {
    /// How many leading names of `blocks` the cache of `backend` holds now (`blocks[..k]`
    /// cached, `blocks[k]` not), or `None` if this view does not know `backend`. Called
    /// once per candidate per decision: must not allocate or block.
    fn cached_prefix_blocks(&self, backend: BackendId, blocks: &[BlockHash]) -> Option<u32>;

    /// Does `backend` hold LoRA adapter `adapter` resident now (loaded in a slot)? `None`
    /// if this view does not know. Must not allocate or block.
    fn adapter_resident(
        &self,
        _backend: BackendId,
        _adapter: crate::core::lora::AdapterId,
    ) -> Option<bool> {
        None
    }
}

/// The approximate indexes, one per backend by `BackendId`, answer for every backend: the
/// default view.
impl CacheView for Vec<PrefixIndex> {
    fn cached_prefix_blocks(&self, backend: BackendId, blocks: &[BlockHash]) -> Option<u32> {
        self.get(backend.index())
            .map(|ix| ix.cached_prefix_blocks(blocks))
    }
}

/// Where a request would rather go: borrowed from the request for one decision, never
/// stored.
#[derive(Clone, Copy)]
pub struct Affinity<'a> {
    /// The names of the prompt's full KV blocks in order (`core::prefix`); empty when the
    /// caller has none (then `prefix_aware` routes by load).
    pub blocks: &'a [BlockHash],
    /// The session key (a hash of `X-Session-Id` or the OpenAI `user` field), if any.
    pub session: Option<u64>,
    /// A cache that can be asked exactly (the engine's replicas); backends it does not
    /// know are judged by the router's approximate index.
    pub exact: Option<&'a dyn CacheView>,
    /// Output tokens expected (predicted, else `max_tokens`; 0 unknown): with the prompt's
    /// estimated tokens, the request's [`RequestWork`].
    pub output_tokens: u32,
}

impl Affinity<'_> {
    /// No affinity: every strategy behaves as without one.
    pub const NONE: Affinity<'static> = Affinity {
        blocks: &[],
        session: None,
        exact: None,
        output_tokens: 0,
    };
}

impl<'a> Affinity<'a> {
    /// Prompt block names only.
    pub fn prefix(blocks: &'a [BlockHash]) -> Affinity<'a> {
        Affinity {
            blocks,
            ..Affinity::NONE
        }
    }

    /// A session key only.
    pub fn session(key: u64) -> Affinity<'static> {
        Affinity {
            session: Some(key),
            ..Affinity::NONE
        }
    }
}

impl Default for Affinity<'_> {
    fn default() -> Self {
        Affinity::NONE
    }
}

impl fmt::Debug for Affinity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Affinity")
            .field("blocks", &self.blocks.len())
            .field("session", &self.session)
            .field("exact", &self.exact.is_some())
            .field("output_tokens", &self.output_tokens)
            .finish()
    }
}

/// Index of the first candidate with the fewest requests in flight.
#[inline]
pub fn least_loaded(candidates: &[Candidate]) -> usize {
    let mut best = 0;
    for (i, c) in candidates.iter().enumerate().skip(1) {
        if c.pending_batches < candidates[best].pending_batches {
            best = i;
        }
    }
    best
}

/// Index of the first candidate with the least work in flight, ties to the fewer requests
/// in flight: `prefix_aware`'s fallback. Where nobody feeds work it is [`least_loaded`].
#[inline]
pub fn least_work(candidates: &[Candidate]) -> usize {
    let key = |c: &Candidate| (c.pending_work, c.pending_batches);
    let mut best = 0;
    for (i, c) in candidates.iter().enumerate().skip(1) {
        if key(c) < key(&candidates[best]) {
            best = i;
        }
    }
    best
}

/// The request being routed, as `prefix_aware` costs it: what it will add to a backend's
/// work in flight, in prompt-token equivalents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestWork {
    /// Prompt tokens (the request's estimate).
    pub prompt_tokens: u32,
    /// Output tokens expected (the prediction, else `max_tokens`; 0 when unknown).
    pub output_tokens: u32,
}

impl RequestWork {
    /// Work on a backend holding `matched` of the prompt's `prompt_blocks` full blocks: the
    /// prompt tokens it must compute (the cached share taken off) plus
    /// `decode_token_work` per output token.
    #[inline]
    pub fn on(&self, matched: u32, prompt_blocks: u32, cfg: &PrefixConfig) -> u64 {
        let prompt = u64::from(self.prompt_tokens);
        let cached = if prompt_blocks == 0 {
            0
        } else {
            prompt * u64::from(matched.min(prompt_blocks)) / u64::from(prompt_blocks)
        };
        prompt - cached + u64::from(cfg.decode_token_work) * u64::from(self.output_tokens)
    }
}

/// `prefix_aware`'s choice among `candidates` (non-empty), given how many leading blocks
/// of a `prompt_blocks`-block prompt each holds (`matched[i]` for `candidates[i]`) and the
/// request's cost `work`: the longest match (ties to the less loaded, then the first) when
/// it covers enough of the prompt and its backend is not overloaded against the fallback;
/// else the fallback, the candidate with the least work in flight ([`least_work`]; without
/// work fed, the least loaded; ties to the first). See [`PrefixConfig::overloaded`].
#[inline]
pub fn pick_prefix(
    candidates: &[Candidate],
    matched: &[u32],
    prompt_blocks: u32,
    work: &RequestWork,
    cfg: &PrefixConfig,
) -> usize {
    assert!(!candidates.is_empty(), "pick needs a candidate");
    assert_eq!(candidates.len(), matched.len(), "one match per candidate");
    let fallback = least_work(candidates);
    let mut best = 0;
    for i in 1..candidates.len() {
        let longer = matched[i] > matched[best];
        let lighter = matched[i] == matched[best]
            && candidates[i].pending_batches < candidates[best].pending_batches;
        if longer || lighter {
            best = i;
        }
    }
    if best == fallback || !cfg.enough(matched[best], prompt_blocks) {
        return fallback;
    }
    let at = |i: usize| BalanceLoad {
        requests: candidates[i].pending_batches,
        work: candidates[i]
            .pending_work
            .saturating_add(work.on(matched[i], prompt_blocks, cfg)),
    };
    if cfg.overloaded(at(best), at(fallback)) {
        fallback
    } else {
        best
    }
}

/// A backend's rendezvous key: a hash of its name (FNV-1a, then mixed), so it does not
/// depend on the order of `[[backends]]` and two routers agree.
pub fn backend_key(name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// A session key from the client's session id (the `X-Session-Id` header, else the OpenAI
/// `user` field), for [`Affinity::session`]: the same hash as [`backend_key`], so any
/// router hashing the same id agrees. Runs on io threads; allocates nothing.
pub fn session_key(id: &str) -> u64 {
    backend_key(id)
}

/// splitmix64's finaliser.
#[inline]
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `session`'s choice among `candidates` (non-empty): with a key, the highest rendezvous
/// score `mix(key ^ backend_keys[backend])` (ties to the first); without, the least loaded.
#[inline]
pub fn pick_session(candidates: &[Candidate], key: Option<u64>, backend_keys: &[u64]) -> usize {
    assert!(!candidates.is_empty(), "pick needs a candidate");
    let Some(key) = key else {
        return least_loaded(candidates);
    };
    let score = |c: &Candidate| mix(key ^ backend_keys[c.backend.index()]);
    let mut best = 0;
    let mut best_score = score(&candidates[0]);
    for (i, c) in candidates.iter().enumerate().skip(1) {
        let s = score(c);
        if s > best_score {
            best = i;
            best_score = s;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(i: u32, pending: u32) -> Candidate {
        Candidate {
            backend: BackendId(i),
            priority: 0,
            pending_batches: pending,
            pending_work: 0,
            latency_ms: 0,
        }
    }

    #[test]
    fn longest_match_wins_when_balanced() {
        let cfg = PrefixConfig::default();
        let c = [cand(0, 3), cand(1, 5), cand(2, 1)];
        assert_eq!(
            pick_prefix(&c, &[10, 100, 0], 128, &RequestWork::default(), &cfg),
            1
        );
        // Equal matches: the less loaded of them.
        assert_eq!(
            pick_prefix(&c, &[100, 100, 0], 128, &RequestWork::default(), &cfg),
            0
        );
    }

    #[test]
    fn below_the_cache_threshold_is_least_loaded() {
        let cfg = PrefixConfig::default(); // 30 %
        let c = [cand(0, 3), cand(1, 5), cand(2, 1)];
        // 38 of 128 blocks = 29.7 %: not enough; 39 = 30.5 %: enough.
        assert_eq!(
            pick_prefix(&c, &[0, 38, 0], 128, &RequestWork::default(), &cfg),
            2
        );
        assert_eq!(
            pick_prefix(&c, &[0, 39, 0], 128, &RequestWork::default(), &cfg),
            1
        );
        // Nothing matched anywhere, even with a zero threshold: least loaded.
        let zero = PrefixConfig {
            cache_threshold_pct: 0,
            ..cfg
        };
        assert_eq!(
            pick_prefix(&c, &[0, 0, 0], 128, &RequestWork::default(), &zero),
            2
        );
        assert_eq!(
            pick_prefix(&c, &[0, 1, 0], 128, &RequestWork::default(), &zero),
            1
        );
        // A prompt with no full block never has affinity.
        assert_eq!(
            pick_prefix(&c, &[0, 0, 0], 0, &RequestWork::default(), &zero),
            2
        );
    }

    #[test]
    fn the_balance_rule_needs_both_thresholds() {
        let cfg = PrefixConfig {
            balance_abs_threshold: 64,
            balance_rel_threshold_pct: 150,
            ..PrefixConfig::default()
        };
        let m = [128, 0];
        // Backend 0 holds the prompt's 128 blocks, backend 1 none: which one takes it.
        let pick = |c: &[Candidate]| pick_prefix(c, &m, 128, &RequestWork::default(), &cfg);
        // abs: 64 above is not over 64; 65 is (and 165 is over 150 % of 100).
        assert_eq!(pick(&[cand(0, 164), cand(1, 100)]), 0);
        assert_eq!(pick(&[cand(0, 165), cand(1, 100)]), 1);
        // rel: 65 above but only 1.30x (280 against 215): stays.
        assert_eq!(pick(&[cand(0, 280), cand(1, 215)]), 0);
        // rel boundary: 150 % exactly is not over; 151 % is (abs far exceeded).
        assert_eq!(pick(&[cand(0, 300), cand(1, 200)]), 0);
        assert_eq!(pick(&[cand(0, 302), cand(1, 200)]), 1);
        // An idle least loaded backend: the abs threshold decides.
        assert_eq!(pick(&[cand(0, 64), cand(1, 0)]), 0);
        assert_eq!(pick(&[cand(0, 65), cand(1, 0)]), 1);
    }

    #[test]
    fn overloaded_is_judged_against_the_least_loaded_candidate_only() {
        let cfg = PrefixConfig::default();
        // Backend 2 is far above the others, but the cache points at 0, which is not.
        let c = [cand(0, 10), cand(1, 5), cand(2, 500)];
        assert_eq!(
            pick_prefix(&c, &[100, 0, 0], 128, &RequestWork::default(), &cfg),
            0
        );
    }

    #[test]
    fn validate_names_the_key() {
        assert!(PrefixConfig::default().validate().is_ok());
        for (cfg, key) in [
            (
                PrefixConfig {
                    cache_threshold_pct: 101,
                    ..Default::default()
                },
                "cache_threshold_pct",
            ),
            (
                PrefixConfig {
                    balance_rel_threshold_pct: 99,
                    ..Default::default()
                },
                "balance_rel_threshold_pct",
            ),
            (
                PrefixConfig {
                    max_tracked_blocks: 0,
                    ..Default::default()
                },
                "max_tracked_blocks",
            ),
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("routing.prefix.{key}")), "{e}");
        }
    }

    #[test]
    fn session_is_sticky_and_moves_only_the_keys_of_a_leaving_backend() {
        let names = ["a", "b", "c", "d", "e"];
        let keys: Vec<u64> = names.iter().map(|n| backend_key(n)).collect();
        let all: Vec<Candidate> = (0..5).map(|i| cand(i, 0)).collect();
        let without_c: Vec<Candidate> = all.iter().copied().filter(|c| c.backend.0 != 2).collect();
        let mut per_backend = [0u32; 5];
        for k in 0..10_000u64 {
            let key = mix(k);
            let home = all[pick_session(&all, Some(key), &keys)].backend;
            per_backend[home.index()] += 1;
            // Sticky: the same key, the same backend, whatever the load.
            let loaded: Vec<Candidate> = (0..5).map(|i| cand(i, 100 - i * 7)).collect();
            assert_eq!(
                loaded[pick_session(&loaded, Some(key), &keys)].backend,
                home
            );
            let moved = without_c[pick_session(&without_c, Some(key), &keys)].backend;
            if home.0 != 2 {
                assert_eq!(moved, home, "a key not on the leaving backend stays");
            }
        }
        // Spread: each of 5 backends gets 20 % +- 2.
        for n in per_backend {
            assert!((1800..2200).contains(&n), "{per_backend:?}");
        }
        // No key: least loaded.
        let c = [cand(0, 3), cand(1, 1)];
        assert_eq!(pick_session(&c, None, &keys), 1);
    }
}
