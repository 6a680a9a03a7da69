//! The approximate prefix index of one backend: the KV block names the router sent there,
//! the most recently sent first, at most a fixed number of them.
//!
//! An upstream backend (vLLM, SGLang, another abe) does not tell the router what its prefix
//! cache holds, so `prefix_aware` routing guesses from what it sent: every prompt routed to
//! the backend leaves its block names here ([`PrefixIndex::insert_prompt`]), and a new
//! prompt's match there is the longest run of its leading names found
//! ([`PrefixIndex::cached_prefix_blocks`]). SGLang's router keeps a radix tree of prompt
//! text per worker for the same purpose; block names (chained hashes, `core::prefix`) make a
//! flat set enough, because a name stands for its whole prefix.
//!
//! Memory is fixed at construction: `capacity` slots of 16 bytes (name, LRU links) and a
//! hash table of 12-byte entries (the name again, so a probe reads one place, and the slot
//! number) with a power-of-two length of at least twice the capacity (load factor <= 1/2):
//! 40 bytes a tracked block when the capacity is a power of two, never more than 64
//! ([`PrefixIndex::bytes`] says exactly). When full, inserting a new name
//! evicts the least recently inserted or touched one, reusing its slot. Nothing here
//! allocates after [`PrefixIndex::new`].
//!
//! # Invariant: prefix-closed
//!
//! A prompt's names are touched from the last to the first, so a block's ancestors are
//! always more recent than it and LRU eviction takes descendants first: if block `i` of a
//! prompt is tracked, so are blocks `0..i` (up to 64-bit hash collisions, which can only
//! make a match look one run longer or shorter). That makes "is block `i` tracked"
//! monotone along a prompt, and the longest match is found by binary search: block 0 first
//! (most prompts miss there), then about `log2(n)` probes for `n` names instead of `n`.
//! [`PrefixSearch`] runs that search one probe at a time, so a router can advance the
//! searches of all its candidates in lockstep: their probes are independent loads the CPU
//! overlaps, instead of one chain of dependent cache misses per backend.
//!
//! # How far it drifts from the backend's real cache
//!
//! It records what was sent, not what the backend kept: the backend's own evictions (its KV
//! is smaller than what was sent, or other traffic pushed blocks out), other routers or
//! clients in front of the same backend, and backend restarts all leave names here that the
//! backend no longer holds, so a match is optimistic. It never misses a block the router
//! sent and the index still tracks. Size the index near the backend's KV capacity in blocks
//! (larger only adds optimism), and call [`PrefixIndex::clear`] when a backend restarts.

use crate::core::prefix::BlockHash;

/// "No slot" in the table and the LRU links.
const NIL: u32 = u32::MAX;

/// Largest `max_tracked_blocks` per backend: slot numbers are `u32` below [`NIL`], and
/// 2^24 blocks (16 M; 256 M tokens at 16 a block) take 640 MiB, already more than any
/// backend's KV holds.
pub const MAX_TRACKED_BLOCKS_MAX: u32 = 1 << 24;

/// Names looked up ahead of touching them, per chunk of an insert (a stack buffer).
const INSERT_CHUNK: usize = 32;

/// One tracked block: its name and its place in the recency list.
#[derive(Clone, Copy, Debug)]
struct Slot {
    name: BlockHash,
    /// More recent neighbour, or [`NIL`] at the head.
    newer: u32,
    /// Less recent neighbour, or [`NIL`] at the tail.
    older: u32,
}

// SAFETY: every field is an integer, for which all-zero bytes are a valid value.
unsafe impl bytemuck::Zeroable for Slot {}

/// One table entry: a tracked name and its slot, or empty (slot [`NIL`]). The name is split
/// in two `u32` halves so an entry takes 12 bytes, not 16. The slot is stored inverted, so
/// an empty entry is all zero bytes: the table is allocated zeroed, and its pages cost no
/// memory until an entry on them is used (an idle backend's index holds none).
#[derive(Clone, Copy, Debug)]
struct Entry {
    name_lo: u32,
    name_hi: u32,
    /// `!slot`.
    not_slot: u32,
}

// SAFETY: every field is an integer, for which all-zero bytes are a valid value.
unsafe impl bytemuck::Zeroable for Entry {}

impl Entry {
    const EMPTY: Entry = Entry {
        name_lo: 0,
        name_hi: 0,
        not_slot: !NIL,
    };

    /// The slot this entry names, [`NIL`] when empty.
    #[inline]
    fn slot(self) -> u32 {
        !self.not_slot
    }

    #[inline]
    fn name(self) -> BlockHash {
        u64::from(self.name_hi) << 32 | u64::from(self.name_lo)
    }
}

const _: () = assert!(std::mem::size_of::<Entry>() == 12);
const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// One backend's approximate prefix index; see the module doc.
#[derive(Clone, Debug)]
pub struct PrefixIndex {
    /// Open addressing with linear probing: a name and its slot, or [`Entry::EMPTY`].
    /// Length a power of two, at least `2 * slots.len()`; deletions shift back (no
    /// tombstones), so a probe ends at the first empty entry.
    table: Box<[Entry]>,
    /// `64 - log2(table.len())`: the home of a name is the top bits of its Fibonacci hash.
    shift: u32,
    /// Every slot, allocated at construction. `slots[..len]` are tracked, each exactly once
    /// in `table` and in the recency list.
    slots: Box<[Slot]>,
    /// Tracked blocks, `0..=slots.len()`.
    len: u32,
    /// Most recently touched slot, or [`NIL`] when empty.
    newest: u32,
    /// Least recently touched slot (the next evicted), or [`NIL`] when empty.
    oldest: u32,
}

impl PrefixIndex {
    /// An empty index tracking at most `capacity` blocks (`1..=MAX_TRACKED_BLOCKS_MAX`).
    pub fn new(capacity: u32) -> PrefixIndex {
        assert!(
            (1..=MAX_TRACKED_BLOCKS_MAX).contains(&capacity),
            "capacity {capacity} out of 1..={MAX_TRACKED_BLOCKS_MAX}"
        );
        let table_len = (2 * capacity as usize).next_power_of_two();
        PrefixIndex {
            // Zeroed allocations: the pages are mapped as used (see `Entry`); a slot is
            // written before it is read (`touch`), so its zero contents are never seen.
            table: bytemuck::allocation::zeroed_slice_box(table_len),
            shift: 64 - table_len.trailing_zeros(),
            slots: bytemuck::allocation::zeroed_slice_box(capacity as usize),
            len: 0,
            newest: NIL,
            oldest: NIL,
        }
    }

    /// Most blocks tracked.
    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Blocks tracked now.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held (table and slots), fixed at construction.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.table) + std::mem::size_of_val(&*self.slots)
    }

    /// Forgets every block (the backend restarted, or its cache was dropped).
    pub fn clear(&mut self) {
        if self.len == 0 {
            // Already all empty: filling would map every page of an index never used.
            return;
        }
        self.table.fill(Entry::EMPTY);
        self.len = 0;
        self.newest = NIL;
        self.oldest = NIL;
    }

    /// Whether `name` is tracked.
    #[inline]
    pub fn contains(&self, name: BlockHash) -> bool {
        self.find(name).is_some()
    }

    /// How many leading names of `blocks` are tracked: `k` such that `blocks[..k]` are and
    /// `blocks[k]` is not (by the prefix-closed invariant, a binary search).
    #[inline]
    pub fn cached_prefix_blocks(&self, blocks: &[BlockHash]) -> u32 {
        let mut search = PrefixSearch::new(blocks);
        while !search.step(self, blocks) {}
        search.found()
    }

    /// Records that a prompt with these block names was sent to the backend: each name
    /// becomes the most recent, the first name most recent of all (see the module doc), and
    /// the least recent names are evicted past the capacity. A prompt longer than the
    /// capacity leaves its first `capacity` names.
    ///
    /// In chunks of [`INSERT_CHUNK`] names, last chunk first: every name of a chunk is looked
    /// up first (independent loads the CPU overlaps, the slot read too), then the chunk is
    /// touched from its last name to its first. A slot found in the first pass may have
    /// been evicted and reused by the second before its turn; its name says so, and the
    /// name is then looked up again.
    pub fn insert_prompt(&mut self, blocks: &[BlockHash]) {
        let kept = &blocks[..blocks.len().min(self.slots.len())];
        let mut found = [NIL; INSERT_CHUNK];
        let mut end = kept.len();
        while end > 0 {
            let start = end.saturating_sub(INSERT_CHUNK);
            let chunk = &kept[start..end];
            // Pass 1: look every name up; reading each found slot's link brings it into cache.
            let mut touched_links = 0u32;
            for (f, &name) in found.iter_mut().zip(chunk) {
                *f = self.find(name).unwrap_or(NIL);
                if *f != NIL {
                    touched_links ^= self.slots[*f as usize].newer;
                }
            }
            std::hint::black_box(touched_links);
            // Pass 2: touch from the last to the first. A run of names already tracked and
            // already linked in prompt order (each the next newer of the one after it: what
            // an earlier insert of the same prefix left) moves to the head in one splice.
            let mut k = chunk.len();
            while k > 0 {
                k -= 1;
                let oldest_of_run = found[k];
                if oldest_of_run == NIL || self.slots[oldest_of_run as usize].name != chunk[k] {
                    self.touch(chunk[k]);
                    continue;
                }
                let mut newest_of_run = oldest_of_run;
                while k > 0 {
                    let s = found[k - 1];
                    if s == NIL
                        || self.slots[s as usize].name != chunk[k - 1]
                        || self.slots[s as usize].older != newest_of_run
                    {
                        break;
                    }
                    newest_of_run = s;
                    k -= 1;
                }
                self.splice_newest(newest_of_run, oldest_of_run);
            }
            end = start;
        }
        debug_assert!(kept.is_empty() || self.newest_name() == Some(blocks[0]));
    }

    /// The most recently touched name.
    pub fn newest_name(&self) -> Option<BlockHash> {
        (self.newest != NIL).then(|| self.slots[self.newest as usize].name)
    }

    /// Makes `name` the most recent, inserting it (and evicting the least recent when full)
    /// if it is not tracked.
    fn touch(&mut self, name: BlockHash) {
        if let Some(s) = self.find(name) {
            self.unlink(s);
            self.link_newest(s);
            return;
        }
        let s = if (self.len as usize) < self.slots.len() {
            self.len += 1;
            self.len - 1
        } else {
            let s = self.oldest;
            debug_assert_ne!(s, NIL, "a full index has an oldest slot");
            let at = self.find_entry(self.slots[s as usize].name);
            self.table_remove(at.expect("a tracked slot is in the table"));
            self.unlink(s);
            s
        };
        self.slots[s as usize].name = name;
        self.table_insert(s);
        self.link_newest(s);
    }

    /// Where `name`'s probe sequence starts.
    #[inline]
    fn home(&self, name: BlockHash) -> usize {
        (name.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    /// The slot tracking `name`.
    #[inline]
    fn find(&self, name: BlockHash) -> Option<u32> {
        self.find_entry(name).map(|at| self.table[at].slot())
    }

    /// The table entry holding `name`'s slot.
    #[inline]
    fn find_entry(&self, name: BlockHash) -> Option<usize> {
        let mask = self.mask();
        let mut at = self.home(name);
        loop {
            let e = self.table[at];
            if e.slot() == NIL {
                return None;
            }
            if e.name() == name {
                return Some(at);
            }
            at = (at + 1) & mask;
        }
    }

    /// Puts slot `s` (whose name is not in the table) at its name's first empty entry.
    fn table_insert(&mut self, s: u32) {
        let mask = self.mask();
        let name = self.slots[s as usize].name;
        let mut at = self.home(name);
        while self.table[at].slot() != NIL {
            at = (at + 1) & mask;
        }
        self.table[at] = Entry {
            name_lo: name as u32,
            name_hi: (name >> 32) as u32,
            not_slot: !s,
        };
    }

    /// Empties entry `hole` and shifts back the entries after it whose probe sequence
    /// passes through it, so every tracked name stays reachable from its home.
    fn table_remove(&mut self, mut hole: usize) {
        let mask = self.mask();
        self.table[hole] = Entry::EMPTY;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let e = self.table[at];
            if e.slot() == NIL {
                return;
            }
            let home = self.home(e.name());
            // The entry may fill the hole when the hole lies on its probe path (home..=at,
            // cyclically): its distance from home is at least the hole's distance from it.
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.table[hole] = e;
                self.table[at] = Entry::EMPTY;
                hole = at;
            }
        }
    }

    /// Moves the run of slots from `newest_of_run` to `oldest_of_run` (linked through
    /// `older`, in that order) to the head of the recency list, keeping its order.
    fn splice_newest(&mut self, newest_of_run: u32, oldest_of_run: u32) {
        debug_assert!(newest_of_run < self.len && oldest_of_run < self.len);
        if newest_of_run == self.newest {
            return;
        }
        let before = self.slots[newest_of_run as usize].newer;
        let after = self.slots[oldest_of_run as usize].older;
        debug_assert_ne!(before, NIL, "a run not at the head has a newer neighbour");
        self.slots[before as usize].older = after;
        if after == NIL {
            self.oldest = before;
        } else {
            self.slots[after as usize].newer = before;
        }
        let old_newest = self.newest;
        self.slots[old_newest as usize].newer = oldest_of_run;
        self.slots[oldest_of_run as usize].older = old_newest;
        self.slots[newest_of_run as usize].newer = NIL;
        self.newest = newest_of_run;
    }

    fn unlink(&mut self, s: u32) {
        let Slot { newer, older, .. } = self.slots[s as usize];
        if newer == NIL {
            self.newest = older;
        } else {
            self.slots[newer as usize].older = older;
        }
        if older == NIL {
            self.oldest = newer;
        } else {
            self.slots[older as usize].newer = newer;
        }
    }

    fn link_newest(&mut self, s: u32) {
        let old_newest = self.newest;
        self.slots[s as usize].newer = NIL;
        self.slots[s as usize].older = old_newest;
        if old_newest == NIL {
            self.oldest = s;
        } else {
            self.slots[old_newest as usize].newer = s;
        }
        self.newest = s;
    }

    /// Checks every invariant (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let live = self.table.iter().filter(|e| e.slot() != NIL).count();
        assert_eq!(
            live, self.len as usize,
            "each tracked slot once in the table"
        );
        for s in 0..self.len {
            assert_eq!(self.find(self.slots[s as usize].name), Some(s));
        }
        for e in self.table.iter().filter(|e| e.slot() != NIL) {
            assert_eq!(e.name(), self.slots[e.slot() as usize].name);
        }
        let (mut n, mut s, mut prev) = (0, self.newest, NIL);
        while s != NIL {
            assert!(s < self.len);
            assert_eq!(self.slots[s as usize].newer, prev);
            prev = s;
            s = self.slots[s as usize].older;
            n += 1;
            assert!(n <= self.len, "the recency list has no cycle");
        }
        assert_eq!(n, self.len, "the recency list holds every tracked slot");
        assert_eq!(self.oldest, prev);
    }
}

/// A longest-prefix search in one [`PrefixIndex`], one probe a [`step`](Self::step): block 0
/// first, then bisection (the prefix-closed invariant makes "tracked" monotone). Plain data
/// the caller keeps between steps, so many indexes can be searched in lockstep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixSearch {
    /// Leading blocks known tracked.
    known: u32,
    /// The first block known untracked, or the prompt's length; `known <= limit`.
    limit: u32,
}

impl PrefixSearch {
    /// A search over `blocks` (saturating at `u32::MAX` blocks).
    pub fn new(blocks: &[BlockHash]) -> PrefixSearch {
        PrefixSearch {
            known: 0,
            limit: u32::try_from(blocks.len()).unwrap_or(u32::MAX),
        }
    }

    /// A search already answered (`found` leading blocks), for a backend answered elsewhere.
    pub fn answered(found: u32) -> PrefixSearch {
        PrefixSearch {
            known: found,
            limit: found,
        }
    }

    /// Whether the answer is known.
    #[inline]
    pub fn done(&self) -> bool {
        self.known == self.limit
    }

    /// The most leading blocks the answer can still be (the first block known untracked,
    /// or the prompt's length).
    #[inline]
    pub fn bound(&self) -> u32 {
        self.limit
    }

    /// Leading blocks found tracked (the answer once [`done`](Self::done)).
    #[inline]
    pub fn found(&self) -> u32 {
        self.known
    }

    /// One probe of `ix` (the same `blocks` as at [`new`](Self::new)); returns whether the
    /// search is done.
    #[inline]
    pub fn step(&mut self, ix: &PrefixIndex, blocks: &[BlockHash]) -> bool {
        debug_assert!(self.known <= self.limit && self.limit as usize <= blocks.len());
        if self.done() {
            return true;
        }
        if ix.is_empty() {
            self.limit = self.known;
            return true;
        }
        let mid = if self.known == 0 {
            0
        } else {
            self.known + (self.limit - self.known) / 2
        };
        if ix.contains(blocks[mid as usize]) {
            self.known = mid + 1;
        } else {
            self.limit = mid;
        }
        self.done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::prefix::{chain, ROOT};

    /// `n` chained names of a prompt whose blocks hold `contents`.
    fn prompt(contents: &[u64]) -> Vec<BlockHash> {
        let mut parent = ROOT;
        contents
            .iter()
            .map(|&c| {
                parent = chain(parent, c);
                parent
            })
            .collect()
    }

    #[test]
    fn longest_match_stops_at_the_first_divergent_block() {
        let mut ix = PrefixIndex::new(1024);
        let a = prompt(&(0..100).collect::<Vec<_>>());
        ix.insert_prompt(&a);
        ix.check();
        assert_eq!(ix.cached_prefix_blocks(&a), 100);
        for diverge in [0, 1, 37, 63, 99] {
            let mut c: Vec<u64> = (0..120).collect();
            c[diverge] = 1_000_000;
            assert_eq!(ix.cached_prefix_blocks(&prompt(&c)), diverge as u32);
        }
        // Longer than what was sent: the sent part matches.
        assert_eq!(
            ix.cached_prefix_blocks(&prompt(&(0..128).collect::<Vec<_>>())),
            100
        );
        assert_eq!(ix.cached_prefix_blocks(&[]), 0);
        assert_eq!(PrefixIndex::new(4).cached_prefix_blocks(&a), 0);
    }

    #[test]
    fn memory_is_fixed_and_stated() {
        let ix = PrefixIndex::new(32_768);
        assert_eq!(
            ix.bytes(),
            32_768 * 40,
            "40 bytes a block at a power of two"
        );
        let ix = PrefixIndex::new(6_250);
        assert!(
            ix.bytes() <= 6_250 * 64,
            "never more than 64: {}",
            ix.bytes()
        );
    }

    #[test]
    fn lru_eviction_keeps_the_bound_and_the_recent_prompts() {
        let mut ix = PrefixIndex::new(64);
        let old = prompt(&(0..40).collect::<Vec<_>>());
        let new = prompt(&(1000..1040).collect::<Vec<_>>());
        ix.insert_prompt(&old);
        ix.insert_prompt(&new);
        ix.check();
        assert_eq!(ix.len(), 64, "bounded");
        assert_eq!(ix.cached_prefix_blocks(&new), 40, "the recent prompt whole");
        // The old prompt lost its tail first: still prefix-closed.
        assert_eq!(ix.cached_prefix_blocks(&old), 24);
        for (i, &h) in old.iter().enumerate() {
            assert_eq!(ix.contains(h), i < 24, "block {i}");
        }
        // Touching the old prompt again makes it the most recent: the new one loses its tail.
        ix.insert_prompt(&old);
        ix.check();
        assert_eq!(ix.cached_prefix_blocks(&old), 40);
        assert_eq!(ix.cached_prefix_blocks(&new), 24);
    }

    #[test]
    fn a_prompt_longer_than_the_capacity_keeps_its_head() {
        let mut ix = PrefixIndex::new(16);
        let long = prompt(&(0..50).collect::<Vec<_>>());
        ix.insert_prompt(&long);
        ix.check();
        assert_eq!(ix.len(), 16);
        assert_eq!(ix.cached_prefix_blocks(&long), 16);
        assert_eq!(ix.newest_name(), Some(long[0]));
    }

    #[test]
    fn clear_forgets_everything_and_the_index_is_reusable() {
        let mut ix = PrefixIndex::new(8);
        let a = prompt(&[1, 2, 3]);
        ix.insert_prompt(&a);
        ix.clear();
        ix.check();
        assert_eq!(ix.cached_prefix_blocks(&a), 0);
        ix.insert_prompt(&a);
        ix.check();
        assert_eq!(ix.cached_prefix_blocks(&a), 3);
    }

    /// Inserting prompts that share prefixes in every order (runs spliced whole, runs
    /// broken by other prompts, evictions in between) keeps exact LRU order: the same
    /// recency as touching one name at a time.
    #[test]
    fn spliced_runs_keep_exact_lru_order() {
        let mut ix = PrefixIndex::new(48);
        let mut naive: Vec<BlockHash> = Vec::new(); // most recent first
        let mut rng = 0x9e37_79b9_u64;
        for _ in 0..400 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let conv = (rng >> 33) % 5;
            let len = 1 + (rng >> 40) % 40;
            let p = prompt(
                &(0..len)
                    .map(|i| if i < 4 { i } else { conv << 20 | i })
                    .collect::<Vec<_>>(),
            );
            ix.insert_prompt(&p);
            for &name in p.iter().take(48).rev() {
                naive.retain(|&n| n != name);
                naive.insert(0, name);
            }
            naive.truncate(48);
            ix.check();
            let (mut order, mut s) = (Vec::new(), ix.newest);
            while s != NIL {
                order.push(ix.slots[s as usize].name);
                s = ix.slots[s as usize].older;
            }
            assert_eq!(order, naive);
        }
    }

    #[test]
    fn colliding_homes_survive_backward_shift_deletion() {
        // A tiny table: every name collides with others; churn through many evictions.
        let mut ix = PrefixIndex::new(3);
        for round in 0..500u64 {
            ix.insert_prompt(&prompt(&[round, round + 1]));
            ix.check();
        }
    }
}
