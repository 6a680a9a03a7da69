//! A model replica's state: its slots ([`Slot`], idle -> prefilling -> generating), their
//! KV blocks with prefix caching ([`SlotBlocks`]), the finish wheel that finds sequences
//! reaching their last token, and the counters kept so a step costs O(active slots).
//!
//! What must never happen here: a counter out of step with the slots (`counters_hold`
//! checks them in debug builds), or an allocation after the replica is built: these run on
//! the engine's step path.

use super::block_size::BlockSize;
use super::blocks::BlockCache;
use super::step::{EntryResult, StepEntry};
use crate::core::lora::LoraSlots;
use crate::core::prefix::{PrefixStats, PromptBlocks};
use crate::core::request::Ticket;
use crate::core::table::NIL;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotPhase {
    Idle,
    Prefilling,
    Generating,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) phase: SlotPhase,
    pub(super) ticket: Ticket,
    pub(super) prompt_tokens: u32,
    pub(super) prefilled: u32,
    /// While generating, the output tokens so far are `replica.clock + gen_off` (wrapping):
    /// a decode step advances the replica's clock, not every sequence (0 otherwise: a
    /// prefilling sequence has generated nothing). See [`Replica::generated`].
    pub(super) gen_off: u32,
    /// While generating, the clock value at which `generated` reaches `watch` (the
    /// sequence sits in the finish wheel's bucket for it).
    pub(super) due: u32,
    pub(super) max_tokens: u32,
    /// Admission order on this replica (youngest = largest), for preemption.
    pub(super) admitted_seq: u64,
    pub(super) fresh: bool,
    /// The replica's LoRA slot this request holds ([`NO_LORA_SLOT`]: base model).
    pub(super) lora_slot: u8,
    /// Its adapter was loaded for it: the next step it is in pays the load.
    pub(super) lora_load: bool,
}

impl Slot {
    /// `generated` at which a decode step needs more than counting: its last token
    /// (`max_tokens`, at least 1 from admission). With prefix caching too: a decode token that starts a KV
    /// block is counted per replica ([`Replica::cross`]), so a sequence is visited only when
    /// it ends (and, in a step short of blank blocks, when its token starts one).
    #[inline]
    fn watch(&self) -> u32 {
        self.max_tokens
    }
}

/// Fewest buckets of a replica's finish wheel (more for many slots): a sequence whose
/// `due` is further ahead than the wheel is long is passed over once a turn.
pub(super) const WHEEL_MIN: usize = 256;

/// [`Slot::lora_slot`] of a base-model request.
pub(super) const NO_LORA_SLOT: u8 = u8::MAX;

pub(super) const IDLE_SLOT: Slot = Slot {
    phase: SlotPhase::Idle,
    ticket: Ticket {
        index: u32::MAX,
        generation: 0,
    },
    prompt_tokens: 0,
    prefilled: 0,
    gen_off: 0,
    due: 0,
    max_tokens: 0,
    admitted_seq: 0,
    fresh: false,
    lora_slot: NO_LORA_SLOT,
    lora_load: false,
};

/// A slot's KV blocks with prefix caching (all zero / `NIL` without it; stale while the
/// slot is idle: admission writes them whole and nothing reads an idle slot's). Kept apart
/// from [`Slot`], which every step reads: these are touched only when a sequence prefills,
/// names a block, or leaves (its blocks that will carry no name are counted, not chained:
/// [`BlockCache::reserve`], [`Replica::cross`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotBlocks {
    /// KV blocks held by chain: the cached prefix's, then the ones its prefill allocated to
    /// name. It also holds `ceil(context / block_tokens) - held` blank blocks by count
    /// ([`BlockCache::reserve`]): the rest of its prompt's and its output's.
    pub(super) held: u32,
    /// Leading blocks found cached at admission (shared, held by reference).
    pub(super) hit_blocks: u32,
    /// The last of those (`NIL`: none); the rest are reached through parent links.
    pub(super) last_hit: u32,
    /// The last block this slot allocated (`NIL`: none); earlier ones by chain links.
    pub(super) tail: u32,
    /// Full prompt blocks with a name ([`PromptBlocks::block_count`], capped by the prompt).
    pub(super) named: u32,
    /// Leading blocks in the name index (hits, then blocks this slot computed and named).
    /// Naming stops at the first block whose name another sequence indexed first (`named`
    /// drops to `registered` then). Blocks from position `registered` on are blank.
    pub(super) registered: u32,
    /// The block at position `registered` if allocated (`NIL` otherwise): the first blank
    /// one; and the one before it (`NIL` for none).
    pub(super) reg_block: u32,
    pub(super) reg_parent: u32,
    /// While it generates, its residue in [`Replica::cross`] (kept so leaving or being
    /// skipped does not divide).
    pub(super) residue: u32,
}

pub(super) const NO_BLOCKS: SlotBlocks = SlotBlocks {
    held: 0,
    hit_blocks: 0,
    last_hit: NIL,
    tail: NIL,
    named: 0,
    registered: 0,
    reg_block: NIL,
    reg_parent: NIL,
    residue: 0,
};

pub(super) struct Replica {
    pub(super) slots: Vec<Slot>,
    /// Per slot, its KV blocks (prefix caching only).
    pub(super) slot_blocks: Vec<SlotBlocks>,
    /// A step is running; no tick until it completes.
    pub(super) busy: bool,
    /// Prefill entries of the step in flight (capacity `max_slots`). Its decode entries are
    /// not stored: they are the slots in `step_bits`, read through
    /// [`StepEntries`](super::StepEntries).
    pub(super) entries: Vec<StepEntry>,
    /// Decode entries of the step in flight (they lead the step's entries).
    pub(super) step_decodes: u32,
    /// One bit per slot decoding in the step in flight: a copy of `generating` when the
    /// budget covers every generating slot, else its first `n_batch` bits.
    pub(super) step_bits: Vec<u64>,
    /// Decode steps completed (wrapping): a generating slot's output count is derived from
    /// it ([`Slot::gen_off`]), so a decode step does not touch the sequences that go on.
    pub(super) clock: u32,
    /// The finish wheel: per bucket (`due % wheel.len()`), the first generating slot whose
    /// `due` falls in it (`NIL`: none), linked through `wheel_links`. Completing a step
    /// visits only the bucket of the new clock value: sequences reaching `watch`.
    pub(super) wheel: Vec<u32>,
    /// Per slot, (previous, next) in its wheel bucket (`NIL`: none).
    pub(super) wheel_links: Vec<(u32, u32)>,
    /// Scratch of one completion: one bit per decode slot that needs more than counting
    /// (due now, or its entry ended), and of those the ended ones with their result in
    /// `end_result` (per slot). Bits, so they are settled in slot order without a sort.
    pub(super) due_bits: Vec<u64>,
    pub(super) ended_bits: Vec<u64>,
    pub(super) end_result: Vec<EntryResult>,
    pub(super) admitted_seq: u64,
    /// Slots not idle. Invariant: the count of `slots` whose phase is not `Idle`.
    pub(super) active: usize,
    /// Slots prefilling. Invariant: the count of `slots` whose phase is `Prefilling`. The
    /// rest of `active` generate, and a generating slot takes at most one block a step.
    pub(super) prefilling: usize,
    /// One bit per slot, set while the slot is not idle (bit `i % 64` of word `i / 64`), so
    /// a step is built in O(active slots) however they are spread over `slots`.
    pub(super) live: Vec<u64>,
    /// One bit per slot, set while the slot generates (a subset of `live`; the rest of
    /// `live` prefill), so a step's decode and prefill entries are each found from bits.
    pub(super) generating: Vec<u64>,
    /// Context of the generating slots: `prefilled + generated` summed over them. A decode
    /// step adds one per sequence, so a step where every generating slot decodes is priced
    /// from this total ([`StepShape`](super::StepShape)), not from a walk over its entries.
    pub(super) gen_context: u64,
    /// KV tokens in use. Invariant: `prefilled + generated` summed over active slots.
    /// Kept so a tick costs O(active slots), not O(max_slots), when few slots are busy.
    pub(super) kv_used: u64,
    /// The KV blocks, with prefix caching (`None`: KV is counted in tokens only).
    pub(super) cache: Option<BlockCache>,
    /// Tokens a KV block holds (`block_tokens`, at least 1).
    pub(super) block_size: BlockSize,
    /// With prefix caching, the residue in [`Replica::cross`] of the generating slots whose
    /// last token started a KV block (context 1 modulo `block_tokens`). A decode step moves
    /// every context on by one, so it moves back by one, modulo `block_tokens` (kept apart
    /// from the clock so `block_tokens` need not divide 2^32).
    pub(super) crossing: u32,
    /// With prefix caching (else empty), per residue `r` below `block_tokens`: the
    /// generating slots whose context is `r + 1 - crossing` modulo `block_tokens`. As
    /// `crossing` moves with every context, the sequences whose token starts a new block
    /// after a step are one count, read in O(1): a sequence is not visited when it needs a
    /// block ([`BlockCache::reserve`]).
    pub(super) cross: Vec<u32>,
    /// Prefix-cache lookups on this replica (evictions are the cache's).
    pub(super) prefix: PrefixStats,
    /// LoRA adapters resident on this replica and their running requests.
    pub(super) lora: LoraSlots,
}

impl Replica {
    /// Output tokens slot `s` has generated (0 unless it generates).
    #[inline]
    pub(super) fn generated(&self, s: usize) -> u32 {
        generated_at(&self.slots[s], self.clock)
    }

    /// Generating slot `s`'s residue in [`Replica::cross`]: `context - 1 + crossing` modulo
    /// `block_tokens` (a generating slot's context is at least its first output token).
    #[inline]
    pub(super) fn residue(&self, s: usize) -> usize {
        self.residue_at(self.slots[s].prefilled + self.generated(s))
    }

    /// The residue in [`Replica::cross`] of a generating slot whose context is `context`
    /// (at least 1).
    #[inline]
    pub(super) fn residue_at(&self, context: u32) -> usize {
        debug_assert!(context >= 1, "a generating slot has its first output token");
        let bs = self.block_size;
        let last = bs.offset(context - 1);
        // Both below `block_tokens`: one subtraction instead of a remainder.
        match last + self.crossing {
            r if r >= bs.tokens() => (r - bs.tokens()) as usize,
            r => r as usize,
        }
    }

    /// Puts generating slot `s` into the wheel bucket of its `due`.
    #[inline]
    fn wheel_insert(&mut self, s: usize) {
        let b = self.slots[s].due as usize & (self.wheel.len() - 1);
        let head = self.wheel[b];
        self.wheel_links[s] = (NIL, head);
        if head != NIL {
            self.wheel_links[head as usize].0 = s as u32;
        }
        self.wheel[b] = s as u32;
    }

    /// Takes generating slot `s` out of its wheel bucket.
    #[inline]
    pub(super) fn wheel_remove(&mut self, s: usize) {
        let (prev, next) = self.wheel_links[s];
        if prev == NIL {
            let b = self.slots[s].due as usize & (self.wheel.len() - 1);
            debug_assert_eq!(self.wheel[b], s as u32);
            self.wheel[b] = next;
        } else {
            self.wheel_links[prev as usize].1 = next;
        }
        if next != NIL {
            self.wheel_links[next as usize].0 = prev;
        }
        self.wheel_links[s] = (NIL, NIL);
    }

    /// Sets generating slot `s`'s `due` from its `watch` and files it in the wheel.
    #[inline]
    pub(super) fn wheel_file(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        slot.due = slot.watch().wrapping_sub(slot.gen_off);
        self.wheel_insert(s);
    }

    /// Frees slot `s` (not idle), keeping the counters; returns its ticket.
    pub(super) fn free(&mut self, s: usize) -> Ticket {
        let generated = self.generated(s);
        if self.slots[s].phase == SlotPhase::Generating {
            self.wheel_remove(s);
        }
        let slot = &mut self.slots[s];
        debug_assert!(slot.phase != SlotPhase::Idle);
        self.active -= 1;
        self.prefilling -= usize::from(slot.phase == SlotPhase::Prefilling);
        self.live[s / 64] &= !(1u64 << (s % 64));
        self.generating[s / 64] &= !(1u64 << (s % 64));
        let context = u64::from(slot.prefilled) + u64::from(generated);
        self.kv_used -= context;
        if slot.phase == SlotPhase::Generating {
            self.gen_context -= context;
        }
        let generating = self.slots[s].phase == SlotPhase::Generating;
        if let Some(cache) = &mut self.cache {
            let sb = &self.slot_blocks[s];
            // The blocks its context takes past the ones it holds by chain: by count.
            let blocks = self.block_size.needed(context as u32);
            debug_assert!(blocks >= sb.held);
            cache.unreserve(blocks - sb.held);
            if generating {
                self.cross[sb.residue as usize] -= 1;
            }
            // An idle slot's blocks are never read: admission writes them whole. None held
            // by chain (a prompt without names or hits): nothing to give back one by one.
            if sb.held > 0 {
                release_blocks(cache, sb);
            }
        }
        let slot = &mut self.slots[s];
        let ticket = slot.ticket;
        if slot.lora_slot != NO_LORA_SLOT {
            self.lora.release(slot.lora_slot);
        }
        *slot = IDLE_SLOT;
        ticket
    }

    /// Recomputes the counters from the slots (debug checks of the invariants).
    pub(super) fn counters_hold(&self) -> bool {
        let clock = self.clock;
        let live = self.slots.iter().filter(|s| s.phase != SlotPhase::Idle);
        let kv: u64 = live
            .clone()
            .map(|s| u64::from(s.prefilled) + u64::from(generated_at(s, clock)))
            .sum();
        let prefilling = self
            .slots
            .iter()
            .filter(|s| s.phase == SlotPhase::Prefilling)
            .count();
        let gen_context: u64 = self
            .slots
            .iter()
            .filter(|s| s.phase == SlotPhase::Generating)
            .map(|s| u64::from(s.prefilled) + u64::from(generated_at(s, clock)))
            .sum();
        let bit = |bits: &[u64], i: usize| bits[i / 64] >> (i % 64) & 1 == 1;
        let bits_hold = self.slots.iter().enumerate().all(|(i, s)| {
            (s.phase != SlotPhase::Idle) == bit(&self.live, i)
                && (s.phase == SlotPhase::Generating) == bit(&self.generating, i)
        });
        // With caching: each generating slot in the residue count of its context; every
        // active slot holds by chain at least the prompt blocks it named (all it chained,
        // unless a name was taken first) and at most its context's blocks, and by count the
        // rest of its context's blocks, which sum to the cache's reserved blocks.
        // (Counted on the stack, residues folded into 64 bins: the engine's thread must
        // not allocate, debug checks included.)
        let blocks_hold = self.cache.as_ref().is_none_or(|cache| {
            let bt = self.block_size.tokens();
            let mut cross = [0u32; 64];
            let mut reserved = 0u32;
            for (i, s) in self.slots.iter().enumerate() {
                if s.phase == SlotPhase::Generating {
                    let r = self.residue(i);
                    if r != self.slot_blocks[i].residue as usize {
                        return false;
                    }
                    cross[r % 64] += 1;
                }
                if s.phase != SlotPhase::Idle {
                    let context = s.prefilled + generated_at(s, clock);
                    let b = &self.slot_blocks[i];
                    let full = (s.prefilled / bt).min(b.named);
                    if b.held < full
                        || b.held > context.div_ceil(bt)
                        || (b.registered != b.held && b.named != b.registered)
                    {
                        return false;
                    }
                    reserved += context.div_ceil(bt) - b.held;
                }
            }
            let mut weighted = 0u64;
            for (r, &n) in self.cross.iter().enumerate() {
                cross[r % 64] = cross[r % 64].wrapping_sub(n);
                weighted += r as u64 * u64::from(n);
            }
            // Past 64 residues the bins fold: the residue-weighted sum tells them apart.
            let recomputed: u64 = (0..self.slots.len())
                .filter(|&i| self.slots[i].phase == SlotPhase::Generating)
                .map(|i| self.residue(i) as u64)
                .sum();
            cross.iter().all(|&n| n == 0) && weighted == recomputed && reserved == cache.reserved()
        });
        live.count() == self.active
            && blocks_hold
            && kv == self.kv_used
            && self.wheel_holds()
            && prefilling == self.prefilling
            && gen_context == self.gen_context
            && bits_hold
    }
}

impl Replica {
    /// The finish wheel holds exactly the generating slots, each once, in the bucket of its
    /// `due`, which is the clock value at which it reaches `watch`, still ahead of the clock
    /// (debug checks).
    fn wheel_holds(&self) -> bool {
        let mask = self.wheel.len() - 1;
        let mut seen = 0usize;
        for (b, &head) in self.wheel.iter().enumerate() {
            let (mut s, mut prev) = (head, NIL);
            while s != NIL {
                let slot = &self.slots[s as usize];
                let ahead = slot.watch() > generated_at(slot, self.clock);
                if slot.phase != SlotPhase::Generating
                    || slot.due as usize & mask != b
                    || slot.due != slot.watch().wrapping_sub(slot.gen_off)
                    || !ahead
                    || self.wheel_links[s as usize].0 != prev
                    || seen > self.slots.len()
                {
                    return false;
                }
                seen += 1;
                prev = s;
                s = self.wheel_links[s as usize].1;
            }
        }
        let generating = self
            .slots
            .iter()
            .filter(|s| s.phase == SlotPhase::Generating)
            .count();
        seen == generating
    }
}

/// Output tokens `slot` has generated when its replica's clock reads `clock`.
#[inline]
pub(super) fn generated_at(slot: &Slot, clock: u32) -> u32 {
    if slot.phase == SlotPhase::Generating {
        clock.wrapping_add(slot.gen_off)
    } else {
        0
    }
}

/// Drops every block `slot` holds by chain, newest first, so a sequence's later blocks are
/// evicted before its earlier ones (a cached parent is never evicted before its child): its
/// chained blank blocks (those after a name another sequence indexed first) in one splice
/// (O(1)), then the ones it named back along its chain, then its cached prefix back along
/// parent links. Its blocks held by count are the caller's to give back.
fn release_blocks(cache: &mut BlockCache, slot: &SlotBlocks) {
    if slot.held > slot.registered {
        cache.release_blank_run(slot.reg_block, slot.tail, slot.held - slot.registered);
    }
    if slot.registered > slot.hit_blocks {
        let mut b = slot.reg_parent;
        for _ in slot.hit_blocks..slot.registered {
            let prev = cache.chain_prev(b);
            cache.release(b);
            b = prev;
        }
        debug_assert!(b == NIL, "chain longer than the blocks named");
    }
    let mut b = slot.last_hit;
    for _ in 0..slot.hit_blocks {
        let parent = cache.parent(b);
        cache.release(b);
        b = parent;
    }
    debug_assert!(b == NIL, "cached prefix longer than its hits");
}

/// After a prefill chunk of `tokens` (and the first output token when it ended the prompt):
/// gives `s` the blocks its tokens now take, and names the prompt blocks that are now full,
/// in order, while each one's name is not indexed yet (another sequence that computed the
/// same block first keeps the name; this one's copy stays blank, and so do its later
/// blocks, so an indexed block's parent is always indexed).
///
/// Only blocks to be named are chained (the full prompt blocks up to `named`); the rest
/// (a prompt without names, its last partial block, its first output token's) are held by
/// count, as its output's are ([`BlockCache::reserve`]): nothing will name or look them up.
/// A counted block that fills up and gets a name is given back and taken by chain, which
/// takes the same blank block without evicting. Blocks taken and evicted are those
/// chaining every block would take: the KV in use and every report are the same.
#[inline(never)]
pub(super) fn grow_prefill(
    cache: &mut BlockCache,
    slot: &mut Slot,
    generated: u32,
    tokens: u32,
    s: &mut SlotBlocks,
    blocks: &impl PromptBlocks,
    bs: BlockSize,
) {
    let context = slot.prefilled + generated;
    // Blocks this chunk takes, and the ones of them (or of the counted ones before it) to
    // chain: the full prompt blocks with names not chained yet.
    let taken = bs.needed(context) - bs.needed(slot.prefilled - tokens);
    let full = bs.whole(slot.prefilled).min(s.named);
    let chain = full.saturating_sub(s.held);
    if chain < taken {
        cache.reserve(taken - chain);
    } else if chain > taken {
        cache.unreserve(chain - taken);
    }
    if chain > 0 {
        let (first, last) = cache
            .allocate_run(s.tail, chain)
            .expect("the step's KV blocks were checked before it ran (ensure_kv)");
        if s.held == s.registered {
            s.reg_block = first;
        }
        s.tail = last;
        s.held += chain;
    }
    debug_assert!(s.held >= full && s.held <= bs.needed(context));
    while s.registered < full && s.reg_block != NIL {
        let name = blocks.block_hash(slot.ticket, s.registered);
        if !cache.register(s.reg_block, name, s.reg_parent) {
            s.named = s.registered;
            break;
        }
        s.reg_parent = s.reg_block;
        s.reg_block = cache.chain_next(s.reg_block);
        s.registered += 1;
    }
}
