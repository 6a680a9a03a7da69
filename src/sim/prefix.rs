//! Prompt block names in the simulator: a trace's prefix block ids (Mooncake's `hash_ids`,
//! one per 512-token trace block) turned into the names of the scheduler's KV blocks.
//!
//! A [`PrefixArena`] holds, per trace block of every request of one sequence, the chained
//! name of the prompt up to the end of that trace block; a simulated request points at its run
//! of them with a [`PrefixSpan`] (`SimRequest::prefix`). KV block `i` of `block_tokens` tokens is named from the
//! chain at the trace block holding its last token and its position `i`, so equal trace ids
//! give equal names and nothing else does, and a name costs O(1) to compute: no per-block
//! table, whatever the trace's length. Nothing here reads a clock or allocates after the
//! arena is built.

use crate::core::prefix::{chain, BlockHash, ROOT};

/// Tokens per block of the published Mooncake traces' `hash_ids`.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// Where a request's trace-block chain sits in its sequence's [`PrefixArena`]; `len == 0`:
/// the request has no named blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefixSpan {
    pub start: u32,
    pub len: u32,
}

/// The chained trace-block names of one request sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixArena {
    /// Per trace block, the chained name of the prompt up to its end.
    pub chains: Vec<BlockHash>,
    /// Tokens per trace block (512 in the Mooncake traces).
    pub trace_block_tokens: u32,
}

impl PrefixArena {
    /// An empty arena for trace blocks of `trace_block_tokens` tokens.
    pub fn new(trace_block_tokens: u32) -> PrefixArena {
        assert!(trace_block_tokens > 0, "trace blocks need tokens");
        PrefixArena {
            chains: Vec::new(),
            trace_block_tokens,
        }
    }

    /// Appends a request's trace block ids (in prompt order), chained, and returns its span.
    pub fn push(&mut self, hash_ids: &[u64]) -> PrefixSpan {
        let start = u32::try_from(self.chains.len()).expect("prefix arena over 4G blocks");
        let mut parent = ROOT;
        for &id in hash_ids {
            parent = chain(parent, id);
            self.chains.push(parent);
        }
        PrefixSpan {
            start,
            len: hash_ids.len() as u32,
        }
    }

    /// Full KV blocks of `block_tokens` tokens with a name, for a prompt of `prompt_tokens`
    /// tokens whose trace blocks are `span`: the blocks wholly inside both the prompt and
    /// the named trace blocks.
    pub fn block_count(&self, span: PrefixSpan, prompt_tokens: u32, block_tokens: u32) -> u32 {
        let named = u64::from(span.len) * u64::from(self.trace_block_tokens);
        let tokens = named.min(u64::from(prompt_tokens));
        (tokens / u64::from(block_tokens.max(1))) as u32
    }

    /// [`Self::block_hash`] for a request run with LoRA adapter `adapter`: keyed by adapter
    /// as the live path's names are (a chain from [`crate::core::prefix::root_for`]), so
    /// adapters share no block; the base model's names are the trace chain's own.
    pub fn block_hash_for(
        &self,
        span: PrefixSpan,
        block_tokens: u32,
        i: u32,
        adapter: crate::core::lora::AdapterId,
    ) -> BlockHash {
        let name = self.block_hash(span, block_tokens, i);
        match crate::core::prefix::root_for(adapter) {
            ROOT => name,
            root => chain(root, name),
        }
    }

    /// The name of KV block `i` (of `block_tokens` tokens) of the request at `span`.
    pub fn block_hash(&self, span: PrefixSpan, block_tokens: u32, i: u32) -> BlockHash {
        let last_token = (u64::from(i) + 1) * u64::from(block_tokens) - 1;
        let trace_block = (last_token / u64::from(self.trace_block_tokens)) as u32;
        debug_assert!(
            trace_block < span.len,
            "block {i} outside the request's trace blocks"
        );
        chain(
            self.chains[(span.start + trace_block) as usize],
            u64::from(i),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_trace_ids_share_kv_block_names_up_to_the_first_difference() {
        let mut a = PrefixArena::new(512);
        let x = a.push(&[7, 8, 9]);
        let y = a.push(&[7, 8, 10]);
        let z = a.push(&[1, 8, 9]);
        assert_eq!(a.block_count(x, 1500, 16), 93);
        assert_eq!(
            a.block_count(x, 5000, 16),
            96,
            "only named trace blocks count"
        );
        for i in 0..64 {
            assert_eq!(a.block_hash(x, 16, i), a.block_hash(y, 16, i));
            assert_ne!(a.block_hash(x, 16, i), a.block_hash(z, 16, i));
        }
        for i in 64..96 {
            assert_ne!(a.block_hash(x, 16, i), a.block_hash(y, 16, i));
        }
        assert_ne!(a.block_hash(x, 16, 0), a.block_hash(x, 16, 1));
    }
}
