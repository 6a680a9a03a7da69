//! One replica's KV cache in blocks, for prefix caching: the block table (names, reference
//! counts, links), the name index, the stack of blank blocks and the queue of cached ones
//! in eviction order.
//!
//! A block is *referenced* while a running sequence holds it, *cached* while it is free but
//! keeps a name in the index (a finished prompt's block, found again by a later prompt with
//! the same prefix), and *blank* while free with no name. Allocation takes a blank block
//! first (the most recently freed), else evicts the least recently freed cached one (vLLM's
//! policy); referenced blocks are never evicted. A sequence's blank blocks are held by it
//! alone (nothing can look a blank block up), so when it ends they go back to the blank
//! stack in one splice along its chain: ending a sequence costs its named blocks, not all
//! of them (a decode-heavy request's blocks are mostly blank).
//!
//! A sequence's blocks that will never carry a name (its output's, and its prompt's past
//! the full blocks it names) are *reserved*, not taken: every `block_tokens` tokens it
//! needs one more blank block, and all blank blocks are alike (nothing names or looks them
//! up), so the cache only counts them
//! ([`BlockCache::reserve`]): `reserved` blocks of the blank stack belong to sequences. A
//! reservation evicts exactly when taking a block would (no unreserved blank block left);
//! with the caller reserving in the order it used to take blocks when that can evict
//! (`Continuous::complete_entries`: one by one, in slot order with the step's frees), the
//! cached set, the hits and the evictions are those of taking blocks one by one. What it
//! saves is a sequence touching its block chain every `block_tokens` tokens.
//!
//! Invariants (checked by [`BlockCache::check`] in debug builds and tests):
//! - Every block is on exactly one of: the blank stack (no name; linked by `chain_next`;
//!   its `refs` is stale and never read), the cached queue (a name, `refs == 0`), or held
//!   (`refs > 0`). `blank_len` counts the first; `reserved <= blank_len` of them are held
//!   by count; `free_len` is the rest of the blank stack plus the cached queue.
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

/// One entry of the block table: everything an operation on a block reads or writes, in
/// one 32-byte record (half a cache line), so touching a block costs one miss, not seven.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// Its name while indexed, else `ROOT`.
    name: BlockHash,
    /// Running sequences holding it.
    refs: u32,
    /// The indexed block of its parent name (`NIL`: first block, or not indexed).
    parent: u32,
    /// The previous and next block of the sequence that allocated it (its private chain:
    /// walked backwards when the sequence frees it, forwards as it names its blocks).
    chain_prev: u32,
    chain_next: u32,
    /// Free-queue links (valid while `refs == 0`).
    q_prev: u32,
    q_next: u32,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);

const BLANK: Block = Block {
    name: ROOT,
    refs: 0,
    parent: NIL,
    chain_prev: NIL,
    chain_next: NIL,
    q_prev: NIL,
    q_next: NIL,
};

/// The block table of one replica.
pub(super) struct BlockCache {
    /// Per block id, its record.
    table: Vec<Block>,
    /// Top of the blank stack (`NIL`: empty), linked through `chain_next`. Allocation pops it
    /// first.
    blank_top: u32,
    /// Cached queue, from least to most recently freed (linked through `q_prev`/`q_next`).
    /// Allocation evicts its head when no blank block is left.
    q_head: u32,
    q_tail: u32,
    /// Blocks on the blank stack or the cached queue, less `reserved`: what allocation can
    /// take.
    free_len: u32,
    /// Blocks on the blank stack.
    blank_len: u32,
    /// Blank blocks held by count: sequences' blocks that will never carry a name (their
    /// output's, their prompt's past the full blocks they name; [`Self::reserve`]). Never
    /// more than `blank_len`.
    reserved: u32,
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
            table: vec![BLANK; n],
            blank_top: NIL,
            q_head: NIL,
            q_tail: NIL,
            free_len: 0,
            blank_len: 0,
            reserved: 0,
            index: vec![NIL; index_len],
            index_mask: index_len - 1,
            evicted: 0,
        };
        // Block 0 on top: allocation takes blocks in id order at first.
        for b in (0..blocks).rev() {
            c.push_blank(b);
        }
        c
    }

    /// Blocks in all.
    pub fn blocks(&self) -> u32 {
        self.table.len() as u32
    }

    /// Blocks no running sequence holds (blank or cached): what allocation can take.
    pub fn free(&self) -> u32 {
        self.free_len
    }

    /// Blocks held by running sequences.
    pub fn used(&self) -> u32 {
        self.blocks() - self.free_len
    }

    /// Is indexed block `block` free (so taking a reference on it uses up a free block)?
    pub fn is_free(&self, block: u32) -> bool {
        debug_assert_ne!(self.table[block as usize].name, ROOT);
        self.table[block as usize].refs == 0
    }

    /// The indexed block named `name`, if any.
    #[inline]
    pub fn lookup(&self, name: BlockHash) -> Option<u32> {
        debug_assert_ne!(name, ROOT);
        let mut at = self.home(name);
        loop {
            let b = self.index[at];
            if b == NIL {
                return None;
            }
            if self.table[b as usize].name == name {
                return Some(b);
            }
            at = (at + 1) & self.index_mask;
        }
    }

    /// The indexed parent of indexed block `block` (`NIL` for a first block).
    pub fn parent(&self, block: u32) -> u32 {
        self.table[block as usize].parent
    }

    /// Takes a reference on `block` (found by [`Self::lookup`]); a free block leaves the
    /// cached queue.
    #[inline]
    pub fn hold(&mut self, block: u32) {
        debug_assert_ne!(self.table[block as usize].name, ROOT);
        if self.table[block as usize].refs == 0 {
            self.unlink(block);
        }
        self.table[block as usize].refs += 1;
    }

    /// Drops a reference on `block`; at zero it is free: at the tail of the cached queue if
    /// it is indexed (most recently freed), on the blank stack if not (taken first).
    #[inline]
    pub fn release(&mut self, block: u32) {
        let b = &mut self.table[block as usize];
        debug_assert!(b.refs > 0, "release of free block {block}");
        b.refs -= 1;
        if b.refs == 0 {
            if b.name == ROOT {
                self.push_blank(block);
            } else {
                self.push_tail(block);
            }
        }
    }

    /// The block before `block` in the chain of the sequence that allocated it.
    pub fn chain_prev(&self, block: u32) -> u32 {
        self.table[block as usize].chain_prev
    }

    /// The block after `block` in the chain of the sequence that allocated it.
    pub fn chain_next(&self, block: u32) -> u32 {
        self.table[block as usize].chain_next
    }

    /// Frees a run of blank blocks all at once: `count` blocks from `first` to `last` along
    /// their `chain_next` links, each held once by the sequence that allocated them (so by
    /// it alone: a blank block cannot be looked up). O(1): they keep their order on the
    /// blank stack, `first` on top, as if released one by one from `last` back to `first`.
    #[inline]
    pub fn release_blank_run(&mut self, first: u32, last: u32, count: u32) {
        debug_assert!(count > 0 && first != NIL && last != NIL);
        debug_assert!({
            let (mut b, mut n) = (first, 1);
            while b != last {
                let blk = &self.table[b as usize];
                assert!(
                    blk.name == ROOT && blk.refs == 1,
                    "block {b} is not a held blank"
                );
                b = blk.chain_next;
                n += 1;
            }
            n == count && self.table[last as usize].chain_next == NIL
        });
        self.table[last as usize].chain_next = self.blank_top;
        self.blank_top = first;
        self.free_len += count;
        self.blank_len += count;
    }

    /// Blank blocks no sequence holds (by chain or by count): what a reservation or an
    /// allocation takes without evicting.
    #[inline]
    pub fn blank_free(&self) -> u32 {
        self.blank_len - self.reserved
    }

    /// Holds `n` blank blocks by count for sequences (blocks that will never carry a name),
    /// as `n` calls of [`Self::allocate`] would take them: an unreserved blank
    /// block first, else the least recently freed cached block is evicted (unindexed and
    /// put on the blank stack). The caller checked that `n` blocks are free (`ensure_kv`).
    #[inline]
    pub fn reserve(&mut self, n: u32) {
        debug_assert!(self.free_len >= n, "reserve past the free blocks");
        let short = n.saturating_sub(self.blank_free());
        for _ in 0..short {
            let block = self.q_head;
            debug_assert_ne!(block, NIL);
            self.unlink(block);
            self.unindex(block);
            self.evicted += 1;
            self.push_blank(block);
        }
        self.reserved += n;
        self.free_len -= n;
    }

    /// [`Self::reserve`] of `n` blocks the blank ones cover (`n <= blank_free()`): nothing
    /// is evicted, so it is two counts.
    #[inline(always)]
    pub fn reserve_blank(&mut self, n: u32) {
        debug_assert!(n <= self.blank_free());
        self.reserved += n;
        self.free_len -= n;
    }

    /// Blank blocks held by count ([`Self::reserve`]).
    pub fn reserved(&self) -> u32 {
        self.reserved
    }

    /// Gives back `n` blocks held by count ([`Self::reserve`]): a sequence that ends or is
    /// preempted, or a counted prompt block that filled up and is taken by chain to be
    /// named (the blank block it frees is the one the chain then takes).
    #[inline]
    pub fn unreserve(&mut self, n: u32) {
        debug_assert!(self.reserved >= n);
        self.reserved -= n;
        self.free_len += n;
    }

    /// Takes a free block for a sequence whose last allocated block is `prev` (`NIL` for
    /// none): blank first, else the least recently freed cached block, which is evicted
    /// (unindexed). Returns it held once, or `None` when every block is held.
    #[inline]
    pub fn allocate(&mut self, prev: u32) -> Option<u32> {
        let block = if self.blank_len > self.reserved {
            let block = self.blank_top;
            self.blank_top = self.table[block as usize].chain_next;
            self.free_len -= 1;
            self.blank_len -= 1;
            block
        } else if self.q_head != NIL {
            let block = self.q_head;
            self.unlink(block);
            self.unindex(block);
            self.evicted += 1;
            block
        } else {
            return None;
        };
        let b = &mut self.table[block as usize];
        b.refs = 1;
        b.parent = NIL;
        b.chain_prev = prev;
        b.chain_next = NIL;
        if prev != NIL {
            self.table[prev as usize].chain_next = block;
        }
        Some(block)
    }

    /// Takes `n > 0` free blocks as `n` calls of [`Self::allocate`] would, chained one after
    /// the other after `prev`, and returns the first and the last; `None` (nothing taken)
    /// if fewer than `n` are free. One call for a prefill chunk's blocks.
    pub fn allocate_run(&mut self, prev: u32, n: u32) -> Option<(u32, u32)> {
        debug_assert!(n > 0);
        if self.free_len < n {
            return None;
        }
        let (mut first, mut last) = (NIL, prev);
        // Blank blocks first, as `allocate` would pop them one by one, in one walk down the
        // stack: its `chain_next` links already chain them in the order they are taken.
        let mut left = n;
        // Reserved blank blocks are held by count: any `blank_free` of the stack are free.
        let blank = n.min(self.blank_free());
        if blank > 0 {
            first = self.blank_top;
            let mut b = first;
            loop {
                let blk = &mut self.table[b as usize];
                blk.refs = 1;
                blk.parent = NIL;
                blk.chain_prev = last;
                last = b;
                left -= 1;
                let next = blk.chain_next;
                if n - left == blank {
                    blk.chain_next = NIL;
                    self.blank_top = next;
                    break;
                }
                b = next;
            }
            self.free_len -= blank;
            self.blank_len -= blank;
            if prev != NIL {
                self.table[prev as usize].chain_next = first;
            }
        }
        for _ in 0..left {
            let b = self.allocate(last).expect("free_len counted the blocks");
            if first == NIL {
                first = b;
            }
            last = b;
        }
        Some((first, last))
    }

    /// Names held block `block` and indexes it under `name` with indexed parent `parent`
    /// (`NIL`: a first block). Returns false, leaving the block blank, if `name` is already
    /// indexed (another sequence computed the same block first).
    pub fn register(&mut self, block: u32, name: BlockHash, parent: u32) -> bool {
        debug_assert_ne!(name, ROOT);
        debug_assert!(self.table[block as usize].refs > 0);
        debug_assert_eq!(self.table[block as usize].name, ROOT);
        debug_assert!(parent == NIL || self.table[parent as usize].name != ROOT);
        let mut at = self.home(name);
        loop {
            let b = self.index[at];
            if b == NIL {
                break;
            }
            if self.table[b as usize].name == name {
                return false;
            }
            at = (at + 1) & self.index_mask;
        }
        self.index[at] = block;
        let b = &mut self.table[block as usize];
        b.name = name;
        b.parent = parent;
        true
    }

    fn home(&self, name: BlockHash) -> usize {
        // Names are already well mixed (core::prefix::chain).
        (name as usize) & self.index_mask
    }

    /// Removes indexed `block` from the index (backward-shift deletion: later entries of the
    /// probe run move up, so lookups never need tombstones).
    fn unindex(&mut self, block: u32) {
        let name = self.table[block as usize].name;
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
            let home = self.home(self.table[b as usize].name);
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
        let b = &mut self.table[block as usize];
        b.name = ROOT;
        b.parent = NIL;
    }

    #[inline]
    fn push_tail(&mut self, block: u32) {
        let tail = self.q_tail;
        let b = &mut self.table[block as usize];
        b.q_prev = tail;
        b.q_next = NIL;
        if tail == NIL {
            self.q_head = block;
        } else {
            self.table[tail as usize].q_next = block;
        }
        self.q_tail = block;
        self.free_len += 1;
    }

    #[inline]
    fn push_blank(&mut self, block: u32) {
        self.table[block as usize].chain_next = self.blank_top;
        self.blank_top = block;
        self.free_len += 1;
        self.blank_len += 1;
    }

    #[inline]
    fn unlink(&mut self, block: u32) {
        let b = &mut self.table[block as usize];
        let (p, n) = (b.q_prev, b.q_next);
        b.q_prev = NIL;
        b.q_next = NIL;
        if p == NIL {
            self.q_head = n;
        } else {
            self.table[p as usize].q_next = n;
        }
        if n == NIL {
            self.q_tail = p;
        } else {
            self.table[n as usize].q_prev = p;
        }
        self.free_len -= 1;
    }

    /// Recomputes the invariants in the module doc (tests; O(blocks)).
    #[cfg(test)]
    pub fn check(&self) -> bool {
        let n = self.blocks() as usize;
        // Where each block is: 0 held, 1 on the blank stack, 2 in the cached queue.
        let mut on = vec![0u8; n];
        let mut blank = 0u32;
        let mut at = self.blank_top;
        while at != NIL {
            let i = at as usize;
            if on[i] != 0 || self.table[i].name != ROOT {
                return false;
            }
            on[i] = 1;
            blank += 1;
            at = self.table[i].chain_next;
        }
        if blank != self.blank_len || self.reserved > blank {
            return false;
        }
        let mut free = blank - self.reserved;
        let (mut at, mut prev) = (self.q_head, NIL);
        while at != NIL {
            let i = at as usize;
            let b = &self.table[i];
            if on[i] != 0 || b.refs != 0 || b.name == ROOT || b.q_prev != prev {
                return false;
            }
            on[i] = 2;
            free += 1;
            prev = at;
            at = b.q_next;
        }
        let indexed = self.index.iter().filter(|&&b| b != NIL).count();
        let named = self.table.iter().filter(|b| b.name != ROOT).count();
        prev == self.q_tail
            && free == self.free_len
            && indexed == named
            && (0..n).all(|i| {
                let b = &self.table[i];
                (on[i] != 0 || b.refs > 0)
                    && (b.name == ROOT
                        || (self.lookup(b.name) == Some(i as u32)
                            && (b.parent == NIL || self.table[b.parent as usize].name != ROOT)))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::prefix::chain;

    /// A run taken in one walk down the blank stack (and past it, by eviction) is the run
    /// `n` single allocations take: the same blocks in the same order, chained the same way.
    #[test]
    fn a_run_takes_what_single_allocations_take() {
        let (mut run, mut one) = (BlockCache::new(40), BlockCache::new(40));
        // Named blocks cached at the back, blank runs freed in between, so later runs
        // cross from the blank stack into eviction.
        let mut held: Vec<(u32, u32, u32)> = vec![];
        for (k, n) in [3u32, 5, 1, 7, 4, 6, 2, 9, 8, 12, 3]
            .into_iter()
            .enumerate()
        {
            let got = run.allocate_run(NIL, n);
            if one.free() < n {
                assert_eq!(got, None, "run {k} of {n}: too few free");
                continue;
            }
            let (mut first, mut last) = (NIL, NIL);
            for _ in 0..n {
                let b = one.allocate(last).unwrap();
                first = if first == NIL { b } else { first };
                last = b;
            }
            assert_eq!(got, Some((first, last)), "run {k} of {n}");
            let mut b = first;
            for c in [&run, &one] {
                assert_eq!(c.chain_prev(first), NIL);
                assert_eq!(c.chain_next(last), NIL);
            }
            while b != last {
                assert_eq!(run.chain_next(b), one.chain_next(b));
                assert_eq!(run.chain_prev(run.chain_next(b)), b);
                b = run.chain_next(b);
            }
            if k % 2 == 0 {
                // Name the first block and free the run: one cached, the rest blank.
                let name = chain(ROOT, k as u64);
                for c in [&mut run, &mut one] {
                    assert!(c.register(first, name, NIL));
                    if first != last {
                        c.release_blank_run(c.chain_next(first), last, n - 1);
                    }
                    c.release(first);
                }
            } else {
                held.push((first, last, n));
            }
            assert!(run.check() && one.check());
            assert_eq!((run.free(), run.evicted), (one.free(), one.evicted));
        }
        assert!(run.evicted > 0, "some run evicted cached blocks");
    }

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
    fn a_blank_run_comes_back_in_one_splice_in_the_order_of_single_releases() {
        // Two caches, the same sequence of four blank blocks: one releases them one by one
        // (newest first), the other in one splice; later allocations take the same blocks.
        let (mut one, mut run) = (BlockCache::new(6), BlockCache::new(6));
        let mut held = Vec::new();
        for c in [&mut one, &mut run] {
            let mut prev = NIL;
            held.clear();
            for _ in 0..4 {
                prev = c.allocate(prev).unwrap();
                held.push(prev);
            }
        }
        for &b in held.iter().rev() {
            one.release(b);
        }
        run.release_blank_run(held[0], held[3], 4);
        assert_eq!(one.free(), 6);
        assert_eq!(run.free(), 6);
        assert!(one.check() && run.check());
        let takes =
            |c: &mut BlockCache| (0..6).map(|_| c.allocate(NIL).unwrap()).collect::<Vec<_>>();
        assert_eq!(takes(&mut one), takes(&mut run));
        assert!(run.allocate(NIL).is_none());
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
