//! One replica's KV cache in blocks, for prefix caching: the block table (names, reference
//! counts, links), the name index, and the free queue in eviction order.
//!
//! A block is *referenced* while a running sequence holds it, *cached* while it is free but
//! keeps a name in the index (a finished prompt's block, found again by a later prompt with
//! the same prefix), and *blank* while free with no name. Allocation takes a blank block
//! first, else evicts the least recently freed cached one (vLLM's policy); referenced blocks
//! are never evicted.
//!
//! Invariants (checked by [`BlockCache::check`] in debug builds and tests):
//! - `free_len` is the number of blocks with `refs == 0`, and exactly those are queued.
//! - A block is in the index iff it has a name (`name != ROOT`); names in the index are
//!   unique.
//! - An indexed block's `parent` is the indexed block of its parent name (or `NIL` for a
//!   first block), and every holder of a block also holds its parent, so a cached child is
//!   always queued ahead of its cached parent: a parent is never evicted before its child,
//!   and walking `parent` links from any indexed block meets only indexed blocks.
//!
//! Sized once in [`BlockCache::new`]; nothing here allocates, reads a clock or blocks after
//! that. Every operation is O(1) or O(blocks it touches).

use crate::core::prefix::{BlockHash, ROOT};
use crate::core::table::NIL;

/// The block table of one replica.
pub(super) struct BlockCache {
    /// Per block: its name while indexed, else `ROOT`.
    name: Vec<BlockHash>,
    /// Per block: running sequences holding it.
    refs: Vec<u32>,
    /// Per block: the indexed block of its parent name (`NIL`: first block, or not indexed).
    parent: Vec<u32>,
    /// Per block: the previous and next block of the sequence that allocated it (its
    /// private chain: walked backwards when the sequence frees it, forwards as it names
    /// its blocks).
    chain_prev: Vec<u32>,
    chain_next: Vec<u32>,
    /// Per block: free-queue links (valid while `refs == 0`).
    q_prev: Vec<u32>,
    q_next: Vec<u32>,
    /// Free queue: blank blocks at the head, then cached ones from least to most recently
    /// freed. Allocation pops the head.
    q_head: u32,
    q_tail: u32,
    /// Blocks with `refs == 0`.
    free_len: u32,
    /// Open-addressing index, linear probing: block ids (`NIL` empty); length a power of two
    /// at least twice the blocks, so probes stay short.
    index: Vec<u32>,
    index_mask: usize,
    /// Cached blocks evicted so far.
    pub evicted: u64,
}

impl BlockCache {
    /// A cache of `blocks` blank blocks.
    pub fn new(blocks: u32) -> BlockCache {
        let n = blocks as usize;
        let index_len = (2 * n).next_power_of_two().max(2);
        let mut c = BlockCache {
            name: vec![ROOT; n],
            refs: vec![0; n],
            parent: vec![NIL; n],
            chain_prev: vec![NIL; n],
            chain_next: vec![NIL; n],
            q_prev: vec![NIL; n],
            q_next: vec![NIL; n],
            q_head: NIL,
            q_tail: NIL,
            free_len: 0,
            index: vec![NIL; index_len],
            index_mask: index_len - 1,
            evicted: 0,
        };
        for b in 0..blocks {
            c.push_tail(b);
        }
        c
    }

    /// Blocks in all.
    pub fn blocks(&self) -> u32 {
        self.name.len() as u32
    }

    /// Blocks no running sequence holds (blank or cached): what allocation can take.
    pub fn free(&self) -> u32 {
        self.free_len
    }

    /// Blocks held by running sequences.
    pub fn used(&self) -> u32 {
        self.blocks() - self.free_len
    }

    /// Is `block` free (so taking a reference on it uses up a free block)?
    pub fn is_free(&self, block: u32) -> bool {
        self.refs[block as usize] == 0
    }

    /// The indexed block named `name`, if any.
    pub fn lookup(&self, name: BlockHash) -> Option<u32> {
        debug_assert_ne!(name, ROOT);
        let mut at = self.home(name);
        loop {
            let b = self.index[at];
            if b == NIL {
                return None;
            }
            if self.name[b as usize] == name {
                return Some(b);
            }
            at = (at + 1) & self.index_mask;
        }
    }

    /// The indexed parent of indexed block `block` (`NIL` for a first block).
    pub fn parent(&self, block: u32) -> u32 {
        self.parent[block as usize]
    }

    /// Takes a reference on `block` (found by [`Self::lookup`]); a free block leaves the
    /// free queue.
    pub fn hold(&mut self, block: u32) {
        let b = block as usize;
        if self.refs[b] == 0 {
            self.unlink(block);
        }
        self.refs[b] += 1;
    }

    /// Drops a reference on `block`; at zero it joins the free queue: at the tail if it is
    /// indexed (cached, most recently freed), at the head if blank (taken first).
    pub fn release(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(self.refs[b] > 0, "release of free block {block}");
        self.refs[b] -= 1;
        if self.refs[b] == 0 {
            if self.name[b] == ROOT {
                self.push_head(block);
            } else {
                self.push_tail(block);
            }
        }
    }

    /// The block before `block` in the chain of the sequence that allocated it.
    pub fn chain_prev(&self, block: u32) -> u32 {
        self.chain_prev[block as usize]
    }

    /// The block after `block` in the chain of the sequence that allocated it.
    pub fn chain_next(&self, block: u32) -> u32 {
        self.chain_next[block as usize]
    }

    /// Takes a free block for a sequence whose last allocated block is `prev` (`NIL` for
    /// none): blank first, else the least recently freed cached block, which is evicted
    /// (unindexed). Returns it held once, or `None` when every block is held.
    pub fn allocate(&mut self, prev: u32) -> Option<u32> {
        let block = self.q_head;
        if block == NIL {
            return None;
        }
        self.unlink(block);
        let b = block as usize;
        if self.name[b] != ROOT {
            self.unindex(block);
            self.evicted += 1;
        }
        self.refs[b] = 1;
        self.parent[b] = NIL;
        self.chain_prev[b] = prev;
        self.chain_next[b] = NIL;
        if prev != NIL {
            self.chain_next[prev as usize] = block;
        }
        Some(block)
    }

    /// Names held block `block` and indexes it under `name` with indexed parent `parent`
    /// (`NIL`: a first block). Returns false, leaving the block blank, if `name` is already
    /// indexed (another sequence computed the same block first).
    pub fn register(&mut self, block: u32, name: BlockHash, parent: u32) -> bool {
        debug_assert_ne!(name, ROOT);
        debug_assert!(self.refs[block as usize] > 0);
        debug_assert_eq!(self.name[block as usize], ROOT);
        debug_assert!(parent == NIL || self.name[parent as usize] != ROOT);
        let mut at = self.home(name);
        loop {
            let b = self.index[at];
            if b == NIL {
                break;
            }
            if self.name[b as usize] == name {
                return false;
            }
            at = (at + 1) & self.index_mask;
        }
        self.index[at] = block;
        self.name[block as usize] = name;
        self.parent[block as usize] = parent;
        true
    }

    fn home(&self, name: BlockHash) -> usize {
        // Names are already well mixed (core::prefix::chain).
        (name as usize) & self.index_mask
    }

    /// Removes indexed `block` from the index (backward-shift deletion: later entries of the
    /// probe run move up, so lookups never need tombstones).
    fn unindex(&mut self, block: u32) {
        let name = self.name[block as usize];
        let mut hole = self.home(name);
        while self.index[hole] != block {
            debug_assert_ne!(self.index[hole], NIL, "indexed block {block} not found");
            hole = (hole + 1) & self.index_mask;
        }
        let mut at = hole;
        loop {
            at = (at + 1) & self.index_mask;
            let b = self.index[at];
            if b == NIL {
                break;
            }
            let home = self.home(self.name[b as usize]);
            // Move `b` into the hole unless its home lies cyclically in (hole, at].
            let stays = if hole <= at {
                hole < home && home <= at
            } else {
                hole < home || home <= at
            };
            if !stays {
                self.index[hole] = b;
                hole = at;
            }
        }
        self.index[hole] = NIL;
        self.name[block as usize] = ROOT;
        self.parent[block as usize] = NIL;
    }

    fn push_tail(&mut self, block: u32) {
        let b = block as usize;
        self.q_prev[b] = self.q_tail;
        self.q_next[b] = NIL;
        if self.q_tail == NIL {
            self.q_head = block;
        } else {
            self.q_next[self.q_tail as usize] = block;
        }
        self.q_tail = block;
        self.free_len += 1;
    }

    fn push_head(&mut self, block: u32) {
        let b = block as usize;
        self.q_next[b] = self.q_head;
        self.q_prev[b] = NIL;
        if self.q_head == NIL {
            self.q_tail = block;
        } else {
            self.q_prev[self.q_head as usize] = block;
        }
        self.q_head = block;
        self.free_len += 1;
    }

    fn unlink(&mut self, block: u32) {
        let b = block as usize;
        let (p, n) = (self.q_prev[b], self.q_next[b]);
        if p == NIL {
            self.q_head = n;
        } else {
            self.q_next[p as usize] = n;
        }
        if n == NIL {
            self.q_tail = p;
        } else {
            self.q_prev[n as usize] = p;
        }
        self.q_prev[b] = NIL;
        self.q_next[b] = NIL;
        self.free_len -= 1;
    }

    /// Recomputes the invariants in the module doc (tests; O(blocks)).
    #[cfg(test)]
    pub fn check(&self) -> bool {
        let n = self.blocks() as usize;
        let mut queued = 0u32;
        let mut at = self.q_head;
        let mut seen_cached = false;
        while at != NIL {
            let b = at as usize;
            if self.refs[b] != 0 {
                return false;
            }
            // Blank blocks come before cached ones... except blanks released after cached
            // ones were queued go to the head, so the order still holds.
            if self.name[b] == ROOT && seen_cached {
                return false;
            }
            seen_cached |= self.name[b] != ROOT;
            queued += 1;
            at = self.q_next[b];
        }
        let zero = self.refs.iter().filter(|&&r| r == 0).count() as u32;
        let indexed = self.index.iter().filter(|&&b| b != NIL).count();
        let named = self.name.iter().filter(|&&h| h != ROOT).count();
        queued == self.free_len
            && zero == self.free_len
            && indexed == named
            && (0..n).all(|b| {
                self.name[b] == ROOT
                    || (self.lookup(self.name[b]) == Some(b as u32)
                        && (self.parent[b] == NIL || self.name[self.parent[b] as usize] != ROOT))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::prefix::chain;

    #[test]
    fn allocation_takes_blank_blocks_first_then_evicts_the_least_recently_freed() {
        let mut c = BlockCache::new(4);
        let a = c.allocate(NIL).unwrap();
        let b = c.allocate(a).unwrap();
        let (na, nb) = (chain(ROOT, 1), chain(chain(ROOT, 1), 2));
        assert!(c.register(a, na, NIL));
        assert!(c.register(b, nb, a));
        // Freed in reverse order: b ahead of a in the queue.
        c.release(b);
        c.release(a);
        assert_eq!(c.free(), 4);
        assert!(c.check());
        // Two blanks are left; they go first, and the cache survives.
        let x = c.allocate(NIL).unwrap();
        let y = c.allocate(x).unwrap();
        assert!(x != a && x != b && y != a && y != b);
        assert_eq!(c.lookup(na), Some(a));
        // Next: b (the child) is evicted before a (its parent).
        let z = c.allocate(y).unwrap();
        assert_eq!(z, b);
        assert_eq!(c.lookup(nb), None);
        assert_eq!(c.lookup(na), Some(a));
        assert_eq!(c.evicted, 1);
        assert!(c.allocate(z).is_some());
        assert!(c.allocate(NIL).is_none(), "every block is held");
        assert!(c.check());
    }

    #[test]
    fn a_held_cached_block_is_never_evicted_and_a_duplicate_name_is_refused() {
        let mut c = BlockCache::new(2);
        let a = c.allocate(NIL).unwrap();
        assert!(c.register(a, 42, NIL));
        c.release(a);
        let found = c.lookup(42).unwrap();
        c.hold(found);
        let other = c.allocate(NIL).unwrap();
        assert!(!c.register(other, 42, NIL), "the name is taken");
        assert!(c.allocate(NIL).is_none());
        assert_eq!(c.lookup(42), Some(a));
        assert!(c.check());
    }

    #[test]
    fn the_index_survives_many_inserts_and_evictions() {
        // Small table, many names: exercises probe runs that wrap and backward shifts.
        let mut c = BlockCache::new(8);
        let mut names = Vec::new();
        for round in 0..500u64 {
            let b = c.allocate(NIL).unwrap();
            let name = chain(ROOT, round);
            assert!(c.register(b, name, NIL));
            c.release(b);
            names.push(name);
            assert!(c.check(), "round {round}");
            // The 8 most recent names are cached, older ones are gone.
            let from = names.len().saturating_sub(8);
            for (i, &n) in names.iter().enumerate() {
                assert_eq!(c.lookup(n).is_some(), i >= from, "round {round} name {i}");
            }
        }
    }
}
