//! A trace's ideal prefix reuse, computed independently of any scheduler: the hit rate a
//! single replica with an unbounded KV cache would reach, so the simulator's prefix cache can
//! be checked against it and a router's hit rate bounded by it.
//!
//! Requests are taken in arrival order; each looks up its leading full blocks by name in the
//! set of every name seen before, stopping at the first miss, and then all of its named full
//! blocks join the set. As in vLLM, at most `(prompt_tokens - 1) / block_tokens` blocks can
//! hit: at least one prompt token is always computed, so there are logits to sample. Block
//! names are the ones the scheduler reads ([`PrefixArena::block_hash`]). Nothing here
//! depends on timing: a request's blocks count as cached the moment it arrives after them.

use super::prefix::PrefixArena;
use super::workload::SimRequest;
use crate::core::prefix::{BlockHash, PrefixStats};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Prompt tokens looked up and found, in vLLM's units, for `requests` (in arrival order,
/// their spans pointing into `arena`) on one replica with an unbounded cache of blocks of
/// `block_tokens` tokens. `evicted_blocks` is 0: nothing is ever evicted.
pub fn ideal_prefix_reuse(
    requests: &[SimRequest],
    arena: &PrefixArena,
    block_tokens: u32,
) -> PrefixStats {
    assert!(block_tokens > 0, "blocks need tokens");
    debug_assert!(
        requests
            .windows(2)
            .all(|w| w[0].arrival_ns <= w[1].arrival_ns),
        "requests in arrival order"
    );
    let mut seen: HashSet<BlockHash> = HashSet::new();
    let mut stats = PrefixStats::default();
    for r in requests {
        stats.query_tokens += u64::from(r.prompt_tokens);
        if r.prefix.len == 0 {
            continue;
        }
        let named = arena.block_count(r.prefix, r.prompt_tokens, block_tokens);
        let can_hit = named.min(r.prompt_tokens.saturating_sub(1) / block_tokens);
        let hits = (0..can_hit)
            .take_while(|&i| seen.contains(&arena.block_hash(r.prefix, block_tokens, i)))
            .count() as u64;
        stats.hit_tokens += hits * u64::from(block_tokens);
        for i in 0..named {
            seen.insert(arena.block_hash(r.prefix, block_tokens, i));
        }
    }
    stats
}

/// [`ideal_prefix_reuse`] with a cache of at most `capacity_blocks` blocks, the least
/// recently used evicted first (a hit or an insertion uses a block): the one-big-cache
/// reference of a cluster ([`super::cluster`]) with the capacity of all its replicas. Still
/// timing-free, so no scheduling (no router, no replica count) can hit more of what it
/// keeps.
pub fn bounded_prefix_reuse(
    requests: &[SimRequest],
    arena: &PrefixArena,
    block_tokens: u32,
    capacity_blocks: u64,
) -> PrefixStats {
    assert!(block_tokens > 0, "blocks need tokens");
    // Block -> its last use; last use -> block (the eviction order). Same size always.
    let mut used: HashMap<BlockHash, u64> = HashMap::new();
    let mut order: BTreeMap<u64, BlockHash> = BTreeMap::new();
    let mut clock = 0u64;
    let mut touch = |name: BlockHash,
                     used: &mut HashMap<BlockHash, u64>,
                     order: &mut BTreeMap<u64, BlockHash>| {
        clock += 1;
        if let Some(old) = used.insert(name, clock) {
            order.remove(&old);
        }
        order.insert(clock, name);
        debug_assert_eq!(used.len(), order.len());
    };
    let mut stats = PrefixStats::default();
    for r in requests {
        stats.query_tokens += u64::from(r.prompt_tokens);
        if r.prefix.len == 0 {
            continue;
        }
        let named = arena.block_count(r.prefix, r.prompt_tokens, block_tokens);
        let can_hit = named.min(r.prompt_tokens.saturating_sub(1) / block_tokens);
        let hits = (0..can_hit)
            .take_while(|&i| used.contains_key(&arena.block_hash(r.prefix, block_tokens, i)))
            .count() as u64;
        stats.hit_tokens += hits * u64::from(block_tokens);
        for i in 0..named {
            touch(
                arena.block_hash(r.prefix, block_tokens, i),
                &mut used,
                &mut order,
            );
            while used.len() as u64 > capacity_blocks {
                let (_, victim) = order.pop_first().expect("non-empty when over capacity");
                used.remove(&victim);
                stats.evicted_blocks += 1;
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Priority;

    fn request(arena: &mut PrefixArena, t: u64, prompt_tokens: u32, ids: &[u64]) -> SimRequest {
        SimRequest {
            arrival_ns: t,
            prompt_tokens,
            output_tokens: 1,
            predicted_output_tokens: 1,
            priority: Priority::Normal,
            prefix: if ids.is_empty() {
                Default::default()
            } else {
                arena.push(ids)
            },
        }
    }

    #[test]
    fn leading_blocks_seen_before_hit_capped_one_token_short_of_the_prompt() {
        // Trace blocks of 4 tokens, KV blocks of 2: each trace block is two KV blocks.
        let mut a = PrefixArena::new(4);
        let reqs = vec![
            // 10 tokens, ids [1, 2, 3]: blocks 0..5 named (the third trace block is partial:
            // 8..10 is KV block 4). Nothing seen yet.
            request(&mut a, 0, 10, &[1, 2, 3]),
            // Same first two trace blocks, then another: KV blocks 0..4 hit (8 tokens).
            request(&mut a, 1, 12, &[1, 2, 9]),
            // The whole of request 0 again: 5 blocks are cached but only (10 - 1) / 2 = 4
            // may hit (one token is always computed).
            request(&mut a, 2, 10, &[1, 2, 3]),
            // A different first block: chained names differ everywhere, nothing hits.
            request(&mut a, 3, 8, &[7, 2]),
            // No ids: looked up, never hits, leaves nothing.
            request(&mut a, 4, 6, &[]),
            // Prompt shorter than a KV block: nothing named.
            request(&mut a, 5, 1, &[1]),
            // Only trace block 1 of [1] is named: 4 tokens = 2 KV blocks, both seen; cap
            // (5 - 1) / 2 = 2.
            request(&mut a, 6, 5, &[1]),
        ];
        let s = ideal_prefix_reuse(&reqs, &a, 2);
        assert_eq!(s.query_tokens, 10 + 12 + 10 + 8 + 6 + 1 + 5);
        assert_eq!(s.hit_tokens, 8 + 8 + 4);
        assert_eq!(s.evicted_blocks, 0);
        // At the trace's own granularity: request 1 hits [1, 2] (8 tokens), request 2 hits
        // [1, 2] (its third block is partial, so unnamed), request 6 hits its one named
        // block (4 tokens; its fifth token is computed).
        let s = ideal_prefix_reuse(&reqs, &a, 4);
        assert_eq!(s.hit_tokens, 8 + 8 + 4);
    }

    #[test]
    fn bounded_reuse_matches_the_unbounded_when_it_fits_and_evicts_the_least_recent() {
        let mut a = PrefixArena::new(4);
        let reqs = vec![
            request(&mut a, 0, 10, &[1, 2, 3]),
            request(&mut a, 1, 12, &[1, 2, 9]),
            request(&mut a, 2, 10, &[1, 2, 3]),
            request(&mut a, 3, 8, &[7, 2]),
        ];
        assert_eq!(
            bounded_prefix_reuse(&reqs, &a, 2, 1000),
            ideal_prefix_reuse(&reqs, &a, 2)
        );
        // Room for one request's 5 blocks: request 1 evicts request 0's tail (4 blocks
        // shared, its own 2 new), request 2 then finds its first 4 blocks only.
        let small = bounded_prefix_reuse(&reqs, &a, 2, 6);
        assert_eq!(small.hit_tokens, 8 + 8);
        assert!(small.evicted_blocks > 0);
        assert_eq!(bounded_prefix_reuse(&reqs, &a, 2, 0).hit_tokens, 0);
    }

    #[test]
    fn a_miss_stops_the_run_even_if_later_blocks_were_seen() {
        let mut a = PrefixArena::new(2);
        let reqs = vec![
            request(&mut a, 0, 7, &[1, 2, 3]),
            // Block 1 differs; block 2 has the same id as before but another chain.
            request(&mut a, 1, 7, &[1, 5, 3]),
        ];
        let s = ideal_prefix_reuse(&reqs, &a, 2);
        assert_eq!(s.hit_tokens, 2);
        assert_eq!(s.query_tokens, 14);
    }
}
