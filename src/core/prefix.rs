//! Prefix caching's vocabulary: what names a KV block (a chained hash of its parent's name
//! and its own tokens), and where the continuous scheduler reads a prompt's block names.
//!
//! A prompt's full blocks of `block_tokens` tokens are named in order: block `i`'s name is
//! `chain(name(i - 1), content(i))`, with [`ROOT`] as the parent of block 0. So two prompts
//! give block `i` the same name exactly when their first `i + 1` blocks hold the same tokens
//! (up to 64-bit hash collisions), and the scheduler may share KV by name. A partial last
//! block has no name and is never shared (vLLM's rule). A prompt run with a LoRA adapter
//! starts its chain at the adapter's own root ([`root_for`]), so equal prompts under
//! different adapters, or under an adapter and the base model, share no block (vLLM mixes
//! the LoRA id into the block hash); the base model's root is [`ROOT`], so names, and every
//! report of a run without adapters, are what they were.
//!
//! The scheduler never sees tokens: the driver names the blocks (live: from the prompt text
//! on the io thread, [`text_block_hashes`]; simulated: from a trace's block ids) and lends
//! them through [`PromptBlocks`]. Nothing here allocates except [`text_block_hashes`], which
//! runs off the engine thread.

use super::lora::{AdapterId, BASE_MODEL};
use super::request::Ticket;

/// The name of one full KV block: a chained hash.
pub type BlockHash = u64;

/// The parent of a prompt's first block.
pub const ROOT: BlockHash = 0;

/// Default tokens per KV block (vLLM's default).
pub const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// Bytes of prompt text per token: abe's tokenizer (`api::tokenize`) packs 4 bytes a token.
pub const TOKEN_BYTES: usize = 4;

/// A 64-bit finaliser (splitmix64's): every input bit affects every output bit.
#[inline]
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The name of a block whose parent is `parent` and whose own content hashes to `content`.
/// Never [`ROOT`], so a name is never mistaken for "no parent".
#[inline]
pub const fn chain(parent: BlockHash, content: u64) -> BlockHash {
    let h = mix(parent.rotate_left(17) ^ mix(content ^ 0x9e37_79b9_7f4a_7c15));
    if h == ROOT {
        1
    } else {
        h
    }
}

/// The parent of the first block of a prompt run with LoRA adapter `adapter`: [`ROOT`] for
/// the base model, else a name of the adapter's own (never [`ROOT`]).
#[inline]
pub const fn root_for(adapter: AdapterId) -> BlockHash {
    if adapter == BASE_MODEL {
        ROOT
    } else {
        // 'LoRA' in the high bits keeps these roots apart from block contents' hashes.
        chain(ROOT, 0x4c6f_5241_0000_0000 | adapter as u64)
    }
}

/// [`root_for`] of the `load`-th adapter to hold id `adapter` (0: the id's first, whose root
/// is [`root_for`]'s, as in the simulator, which never reloads): an adapter loaded under a
/// freed id starts a chain of its own, so it never hits KV its id's earlier adapter left.
#[inline]
pub const fn root_for_load(adapter: AdapterId, load: u32) -> BlockHash {
    if load == 0 || adapter == BASE_MODEL {
        root_for(adapter)
    } else {
        // 'LoRAload' keeps these apart from block contents' hashes, as above.
        chain(root_for(adapter), 0x4c6f_5241_6c6f_0000 | load as u64)
    }
}

/// The content hash of one block of prompt bytes (8 bytes at a time, the length last).
pub fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = mix(h ^ v);
    }
    let rest = words.remainder();
    let mut tail = [0u8; 8];
    tail[..rest.len()].copy_from_slice(rest);
    mix(h ^ u64::from_le_bytes(tail) ^ ((bytes.len() as u64) << 56))
}

/// Appends to `out` the names of `text`'s full blocks of `block_tokens` tokens (4 bytes a
/// token, as abe counts prompt tokens), in order, for the base model. Runs on io threads;
/// allocates in `out`.
pub fn text_block_hashes(text: &str, block_tokens: u32, out: &mut Vec<BlockHash>) {
    adapter_text_block_hashes(text, block_tokens, BASE_MODEL, 0, out);
}

/// As [`text_block_hashes`], for a prompt run with the `load`-th LoRA adapter of id
/// `adapter` (its chain starts at [`root_for_load`]`(adapter, load)`).
pub fn adapter_text_block_hashes(
    text: &str,
    block_tokens: u32,
    adapter: AdapterId,
    load: u32,
    out: &mut Vec<BlockHash>,
) {
    let block_bytes = (block_tokens.max(1) as usize) * TOKEN_BYTES;
    let mut parent = root_for_load(adapter, load);
    for block in text.as_bytes().chunks_exact(block_bytes) {
        parent = chain(parent, content_hash(block));
        out.push(parent);
    }
}

/// Where the continuous scheduler reads the names of a queued or running request's full
/// prompt blocks. Asked in order (`i` from 0 up) at slot admission and as prefill completes;
/// must answer the same for a ticket for as long as the request lives.
pub trait PromptBlocks {
    /// Full prompt blocks of `ticket` that have a name (0: the request neither hits the
    /// cache nor leaves anything in it).
    fn block_count(&self, ticket: Ticket) -> u32;
    /// The name of block `i < block_count(ticket)`.
    fn block_hash(&self, ticket: Ticket, i: u32) -> BlockHash;
}

/// No request has named blocks: prefix caching finds nothing and keeps nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPromptBlocks;

impl PromptBlocks for NoPromptBlocks {
    fn block_count(&self, _: Ticket) -> u32 {
        0
    }
    fn block_hash(&self, _: Ticket, _: u32) -> BlockHash {
        ROOT
    }
}

/// Prefix-cache counters of one replica or a whole scheduler, in vLLM's units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up at slot admission (vLLM's `prefix_cache_queries`).
    pub query_tokens: u64,
    /// Of those, tokens found cached (vLLM's `prefix_cache_hits`).
    pub hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evicted_blocks: u64,
}

impl PrefixStats {
    /// `hit_tokens / query_tokens` (0 before any query).
    pub fn hit_rate(&self) -> f64 {
        if self.query_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.query_tokens as f64
        }
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &PrefixStats) {
        self.query_tokens += other.query_tokens;
        self.hit_tokens += other.hit_tokens;
        self.evicted_blocks += other.evicted_blocks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_give_equal_names_and_a_change_changes_every_later_one() {
        let a = "x".repeat(64 * 3 + 10);
        let mut b = a.clone();
        b.replace_range(70..71, "y"); // inside block 1
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        text_block_hashes(&a, 16, &mut ha);
        text_block_hashes(&b, 16, &mut hb);
        assert_eq!(
            ha.len(),
            3,
            "three full blocks of 64 bytes; the tail has no name"
        );
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(
            ha[2], hb[2],
            "names are chained: block 2 differs through its parent"
        );
        // Same content at another position has another name.
        assert_ne!(ha[0], ha[1]);
    }

    #[test]
    fn an_adapter_keys_every_block_and_the_base_model_keeps_its_names() {
        let text = "abcd".repeat(16 * 3);
        let names = |adapter| {
            let mut out = Vec::new();
            adapter_text_block_hashes(&text, 16, adapter, 0, &mut out);
            out
        };
        let mut base = Vec::new();
        text_block_hashes(&text, 16, &mut base);
        assert_eq!(
            names(BASE_MODEL),
            base,
            "the base model's names are unchanged"
        );
        // The base model's chain, written out: ROOT is its first parent, as before.
        let first = chain(ROOT, content_hash(&text.as_bytes()[..64]));
        assert_eq!(base[0], first);
        let (one, two) = (names(1), names(2));
        assert_eq!(one.len(), 3);
        for i in 0..3 {
            assert_ne!(one[i], base[i], "block {i}: adapter 1 and the base model");
            assert_ne!(one[i], two[i], "block {i}: adapters 1 and 2");
        }
        assert_eq!(one, names(1), "an adapter's names are stable");
        assert!((1..=4095).all(|a| root_for(a) != ROOT));
    }

    #[test]
    fn a_reloaded_id_starts_a_chain_of_its_own() {
        // The id's first load (and the simulator, which never reloads) keeps `root_for`.
        assert_eq!(root_for_load(3, 0), root_for(3));
        assert_eq!(
            root_for_load(BASE_MODEL, 7),
            ROOT,
            "the base model has no loads"
        );
        let roots: Vec<BlockHash> = (0..64).map(|l| root_for_load(3, l)).collect();
        let mut distinct = roots.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            roots.len(),
            "every load of an id has its own root"
        );
        assert!((1..64).all(|l| (1..=64).all(|a| root_for_load(3, l) != root_for(a))));
    }

    #[test]
    fn a_name_is_never_root() {
        for c in 0..10_000u64 {
            assert_ne!(chain(ROOT, c), ROOT);
        }
    }
}
