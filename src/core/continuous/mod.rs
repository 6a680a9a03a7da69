//! Iteration-level (continuous) batching: slots per replica, one step per tick mixing decode
//! tokens and prefill chunks under a token budget, KV-capacity admission and preemption.
//!
//! Like [`crate::core::Core`] this is sans-IO: the driver passes time in, carries out the
//! [`StepAction`]s, and reports each finished step with [`Continuous::complete_step`]. A tick's
//! work is proportional to the replica's slots; nothing here allocates after `new`, reads a
//! clock or blocks.

use super::lora::{Acquired, LoraSlots, BASE_MODEL};
use super::prefix::{BlockHash, PrefixStats, PromptBlocks};
use super::request::{Priority, RequestMeta, Ticket};
use super::table::{Fifo, RequestTable, NIL};
use blocks::BlockCache;

mod blocks;

/// Table tag of a request that was preempted: it has started, so the waiting timeout no
/// longer applies to it (tags start at 0 on admission).
const TAG_PREEMPTED: u32 = 1;

/// Settings of the continuous scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct ContinuousConfig {
    /// Model replicas (one worker each).
    pub replicas: usize,
    /// Slots per replica (`max_slots`, default 16).
    pub max_slots: usize,
    /// Most prompt tokens one slot prefills in one step (`prefill_chunk`, default 512).
    pub prefill_chunk: u32,
    /// Token budget of one step: decode tokens plus prefill tokens (`n_batch`, default 2048).
    pub n_batch: u32,
    /// KV cache capacity per replica in tokens (after the safety buffer).
    pub kv_capacity_tokens: u64,
    /// Requests waiting for a slot, at most (`max_queue`); more are refused.
    pub max_queue: usize,
    /// Keep the KV blocks of finished prompts and start a new prompt's prefill after its
    /// longest cached prefix (`prefix_caching`, default on). Off: KV is counted in tokens
    /// and nothing is shared, exactly as before prefix caching existed.
    pub prefix_caching: bool,
    /// Tokens per KV block when `prefix_caching` is on (`kv_block_tokens`, default 16).
    pub block_tokens: u32,
    /// LoRA adapter slots per replica: distinct adapters among its running requests
    /// (`[lora] max_loras`, default 1 as vLLM's; `1..=core::lora::MAX_LORAS_MOST`).
    pub max_loras: usize,
}

impl Default for ContinuousConfig {
    fn default() -> Self {
        // The multi-bin spec's memory model: (12 GB - 4 GB) / 1.875e-4 GB per token, less a
        // 10 % safety buffer.
        let m = super::strategy::research::memory::MemoryModel::default();
        ContinuousConfig {
            replicas: 1,
            max_slots: 16,
            prefill_chunk: 512,
            n_batch: 2048,
            kv_capacity_tokens: kv_capacity_tokens(
                m.m_max_gb,
                m.m_model_gb,
                m.kv_gb_per_token,
                m.safety_fraction,
            ),
            max_queue: 1024,
            prefix_caching: true,
            block_tokens: super::prefix::DEFAULT_BLOCK_TOKENS,
            max_loras: 1,
        }
    }
}

/// KV blocks per replica with prefix caching: whole blocks of the token capacity.
fn kv_blocks(cfg: &ContinuousConfig) -> u32 {
    let blocks = cfg.kv_capacity_tokens / u64::from(cfg.block_tokens.max(1));
    u32::try_from(blocks).expect("KV cache over 4G blocks: raise kv_block_tokens")
}

/// A replica's KV capacity in tokens: `(m_max - m_model) / kv_per_token`, less `safety`.
pub fn kv_capacity_tokens(
    m_max_gb: f64,
    m_model_gb: f64,
    kv_gb_per_token: f64,
    safety: f64,
) -> u64 {
    if kv_gb_per_token <= 0.0 || m_max_gb <= m_model_gb {
        return 0;
    }
    let eta = (m_max_gb - m_model_gb) / kv_gb_per_token;
    (eta * (1.0 - safety.clamp(0.0, 1.0))).floor() as u64
}

/// Why a request was refused by the continuous scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContinuousReject {
    #[error("the wait queue is full ({max_queue} requests waiting for a slot); retry later")]
    QueueFull { max_queue: usize },
    #[error("the request needs {needed} KV tokens but a replica holds at most {capacity}")]
    TooLarge { needed: u64, capacity: u64 },
    #[error("the server is shutting down and no longer accepts requests")]
    ShuttingDown,
}

/// What a slot of a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepWork {
    /// Generate one token.
    Decode,
    /// Process `tokens` prompt tokens starting at `offset`; `last` means the prompt is then
    /// complete and the step also samples the first output token.
    Prefill {
        offset: u32,
        tokens: u32,
        last: bool,
    },
}

/// One slot's part in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepEntry {
    pub slot: u32,
    pub ticket: Ticket,
    pub work: StepWork,
    /// Output tokens generated before this step (the index of the token this step samples).
    pub generated: u32,
    /// First time this request runs in this slot (the worker sets up its state).
    pub admitted: bool,
    /// Tokens of this request before this step (prompt prefilled + output generated): the
    /// context its new tokens attend to.
    pub context: u32,
    /// This request's LoRA adapter was loaded into a slot for this step (the step pays
    /// `lora_load_ms` once per such entry).
    pub lora_load: bool,
}

impl StepEntry {
    /// Does this entry sample a token in this step?
    pub fn samples(&self) -> bool {
        matches!(
            self.work,
            StepWork::Decode | StepWork::Prefill { last: true, .. }
        )
    }
}

/// What the driver must do after `tick`.
#[derive(Debug)]
pub enum StepAction<'a> {
    /// Run one forward pass on `replica` with these entries (decode entries first).
    Step {
        replica: usize,
        entries: StepEntries<'a>,
        /// The entries' tokens and attention context (what a latency model prices).
        shape: StepShape,
    },
    /// This request was preempted (KV exhausted) and re-queued at the front; the worker
    /// drops its state, the request will be prefilled again.
    Preempted {
        replica: usize,
        slot: u32,
        ticket: Ticket,
    },
}

/// How one entry of a finished step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryResult {
    /// Still going (prefill chunk done, or a token generated and more to come).
    Continue,
    /// The request finished in this step (max_tokens, stop sequence or EOS).
    Finished,
    /// The client went away: free the slot.
    Cancelled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotPhase {
    Idle,
    Prefilling,
    Generating,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    phase: SlotPhase,
    ticket: Ticket,
    prompt_tokens: u32,
    prefilled: u32,
    /// While generating, the output tokens so far are `replica.clock + gen_off` (wrapping):
    /// a decode step advances the replica's clock, not every sequence (0 otherwise: a
    /// prefilling sequence has generated nothing). See [`Replica::generated`].
    gen_off: u32,
    /// While generating, the clock value at which `generated` reaches `watch` (the
    /// sequence sits in the finish wheel's bucket for it).
    due: u32,
    max_tokens: u32,
    /// Admission order on this replica (youngest = largest), for preemption.
    admitted_seq: u64,
    fresh: bool,
    /// The replica's LoRA slot this request holds ([`NO_LORA_SLOT`]: base model).
    lora_slot: u8,
    /// Its adapter was loaded for it: the next step it is in pays the load.
    lora_load: bool,
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
const WHEEL_MIN: usize = 256;

/// [`Slot::lora_slot`] of a base-model request.
const NO_LORA_SLOT: u8 = u8::MAX;

const IDLE_SLOT: Slot = Slot {
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

/// A slot's KV blocks with prefix caching (all zero / `NIL` without it). Kept apart from
/// [`Slot`], which every step reads: these are touched only when a sequence prefills, names
/// a block, or leaves (its blocks past the prompt are counted, not chained:
/// [`Replica::cross`]).
#[derive(Clone, Copy, Debug)]
struct SlotBlocks {
    /// KV blocks held by chain: the cached prefix's, then the ones its prefill allocated.
    /// While it generates it also holds `ceil(context / block_tokens) - held` blank blocks
    /// by count ([`BlockCache::reserve`]).
    held: u32,
    /// Leading blocks found cached at admission (shared, held by reference).
    hit_blocks: u32,
    /// The last of those (`NIL`: none); the rest are reached through parent links.
    last_hit: u32,
    /// The last block this slot allocated (`NIL`: none); earlier ones by chain links.
    tail: u32,
    /// Full prompt blocks with a name ([`PromptBlocks::block_count`], capped by the prompt).
    named: u32,
    /// Leading blocks in the name index (hits, then blocks this slot computed and named).
    /// Naming stops at the first block whose name another sequence indexed first (`named`
    /// drops to `registered` then). Blocks from position `registered` on are blank.
    registered: u32,
    /// The block at position `registered` if allocated (`NIL` otherwise): the first blank
    /// one; and the one before it (`NIL` for none).
    reg_block: u32,
    reg_parent: u32,
    /// While it generates, its residue in [`Replica::cross`] (kept so leaving or being
    /// skipped does not divide).
    residue: u32,
}

const NO_BLOCKS: SlotBlocks = SlotBlocks {
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

struct Replica {
    slots: Vec<Slot>,
    /// Per slot, its KV blocks (prefix caching only).
    slot_blocks: Vec<SlotBlocks>,
    /// A step is running; no tick until it completes.
    busy: bool,
    /// Prefill entries of the step in flight (capacity `max_slots`). Its decode entries are
    /// not stored: they are the slots in `step_bits`, read through [`StepEntries`].
    entries: Vec<StepEntry>,
    /// Decode entries of the step in flight (they lead the step's entries).
    step_decodes: u32,
    /// One bit per slot decoding in the step in flight: a copy of `generating` when the
    /// budget covers every generating slot, else its first `n_batch` bits.
    step_bits: Vec<u64>,
    /// Decode steps completed (wrapping): a generating slot's output count is derived from
    /// it ([`Slot::gen_off`]), so a decode step does not touch the sequences that go on.
    clock: u32,
    /// The finish wheel: per bucket (`due % wheel.len()`), the first generating slot whose
    /// `due` falls in it (`NIL`: none), linked through `wheel_links`. Completing a step
    /// visits only the bucket of the new clock value: sequences reaching `watch`.
    wheel: Vec<u32>,
    /// Per slot, (previous, next) in its wheel bucket (`NIL`: none).
    wheel_links: Vec<(u32, u32)>,
    /// Scratch of one completion: one bit per decode slot that needs more than counting
    /// (due now, or its entry ended), and of those the ended ones with their result in
    /// `end_result` (per slot). Bits, so they are settled in slot order without a sort.
    due_bits: Vec<u64>,
    ended_bits: Vec<u64>,
    /// With `due_bits`, when a step's new blocks are taken one by one: the slots whose token
    /// starts a block.
    cross_bits: Vec<u64>,
    end_result: Vec<EntryResult>,
    admitted_seq: u64,
    /// Slots not idle. Invariant: the count of `slots` whose phase is not `Idle`.
    active: usize,
    /// Slots prefilling. Invariant: the count of `slots` whose phase is `Prefilling`. The
    /// rest of `active` generate, and a generating slot takes at most one block a step.
    prefilling: usize,
    /// One bit per slot, set while the slot is not idle (bit `i % 64` of word `i / 64`), so
    /// a step is built in O(active slots) however they are spread over `slots`.
    live: Vec<u64>,
    /// One bit per slot, set while the slot generates (a subset of `live`; the rest of
    /// `live` prefill), so a step's decode and prefill entries are each found from bits.
    generating: Vec<u64>,
    /// Context of the generating slots: `prefilled + generated` summed over them. A decode
    /// step adds one per sequence, so a step where every generating slot decodes is priced
    /// from this total ([`StepShape`]), not from a walk over its entries.
    gen_context: u64,
    /// KV tokens in use. Invariant: `prefilled + generated` summed over active slots.
    /// Kept so a tick costs O(active slots), not O(max_slots), when few slots are busy.
    kv_used: u64,
    /// The KV blocks, with prefix caching (`None`: KV is counted in tokens only).
    cache: Option<BlockCache>,
    /// Tokens a KV block holds (`block_tokens`, at least 1).
    block_tokens: u32,
    /// With prefix caching, the decode steps completed modulo `block_tokens` (the clock's
    /// residue, kept apart from it so `block_tokens` need not divide 2^32).
    phase: u32,
    /// With prefix caching (else empty), per residue `r` below `block_tokens`: the
    /// generating slots whose context is `phase + r` modulo `block_tokens`. A decode step
    /// moves every context and the phase on by one, so the sequences whose token starts a
    /// new block (context 1 modulo `block_tokens`) are one count, read in O(1): a sequence
    /// is not visited when it needs a block ([`BlockCache::reserve`]).
    cross: Vec<u32>,
    /// Prefix-cache lookups on this replica (evictions are the cache's).
    prefix: PrefixStats,
    /// LoRA adapters resident on this replica and their running requests.
    lora: LoraSlots,
}

impl Replica {
    /// Output tokens slot `s` has generated (0 unless it generates).
    #[inline]
    fn generated(&self, s: usize) -> u32 {
        generated_at(&self.slots[s], self.clock)
    }

    /// Generating slot `s`'s residue in [`Replica::cross`]: its context less the phase,
    /// modulo `block_tokens`.
    #[inline]
    fn residue(&self, s: usize) -> usize {
        let bt = self.block_tokens;
        let slot = &self.slots[s];
        let context = (slot.prefilled % bt + self.generated(s) % bt) % bt;
        ((context + bt - self.phase) % bt) as usize
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
    fn wheel_remove(&mut self, s: usize) {
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
    fn wheel_file(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        slot.due = slot.watch().wrapping_sub(slot.gen_off);
        self.wheel_insert(s);
    }

    /// Frees slot `s` (not idle), keeping the counters; returns its ticket.
    fn free(&mut self, s: usize) -> Ticket {
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
            if generating {
                // The blocks its output took past the ones it holds by chain: by count.
                let blocks = (context as u32).div_ceil(self.block_tokens);
                debug_assert!(blocks >= sb.held);
                cache.unreserve(blocks - sb.held);
                self.cross[sb.residue as usize] -= 1;
            }
            release_blocks(cache, &self.slot_blocks[s]);
            self.slot_blocks[s] = NO_BLOCKS;
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
    fn counters_hold(&self) -> bool {
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
        // With caching: each generating slot in the residue count of its context, and the
        // blocks held by count those its output took past its chain.
        // (Counted on the stack, residues folded into 64 bins: the engine's thread must
        // not allocate, debug checks included.)
        let blocks_hold = self.cache.as_ref().is_none_or(|cache| {
            let bt = self.block_tokens;
            let mut cross = [0u32; 64];
            let mut reserved = 0u32;
            for (i, s) in self.slots.iter().enumerate() {
                if s.phase == SlotPhase::Generating {
                    let r = self.residue(i);
                    if r != self.slot_blocks[i].residue as usize {
                        return false;
                    }
                    cross[r % 64] += 1;
                    let context = s.prefilled + generated_at(s, clock);
                    reserved += context.div_ceil(bt) - self.slot_blocks[i].held;
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
fn generated_at(slot: &Slot, clock: u32) -> u32 {
    if slot.phase == SlotPhase::Generating {
        clock.wrapping_add(slot.gen_off)
    } else {
        0
    }
}

/// Drops every block `slot` holds, newest first, so a sequence's later blocks are evicted
/// before its earlier ones (a cached parent is never evicted before its child): its blank
/// blocks in one splice (O(1)), then the ones it named back along its chain, then its cached
/// prefix back along parent links.
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

/// After a prefill chunk (and the first output token when it ended the prompt): gives `s`
/// the blocks its tokens now fill, then names the prompt blocks that are now full, in
/// order, while each one's name is not indexed yet (another sequence that computed the same
/// block first keeps the name; this one's copy stays blank, and so do its later blocks, so
/// an indexed block's parent is always indexed).
#[inline(never)]
fn grow_prefill(
    cache: &mut BlockCache,
    slot: &mut Slot,
    generated: u32,
    s: &mut SlotBlocks,
    blocks: &impl PromptBlocks,
    bt: u32,
) {
    let need = (slot.prefilled + generated).saturating_sub(s.held * bt);
    let n = need.div_ceil(bt);
    if n > 0 {
        let (first, last) = cache
            .allocate_run(s.tail, n)
            .expect("the step's KV blocks were checked before it ran (ensure_kv)");
        if s.held == s.registered {
            s.reg_block = first;
        }
        s.tail = last;
        s.held += n;
    }
    debug_assert!({
        let context = slot.prefilled + generated;
        s.held * bt >= context && s.held * bt - context < bt
    });
    let full = (slot.prefilled / bt).min(s.named);
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

/// The first slot at or after `from` whose bit in `live` is clear, below `slots`.
fn first_idle(live: &[u64], from: usize, slots: usize) -> Option<usize> {
    let mut w = from / 64;
    let mut idle = !*live.get(w)? & (u64::MAX << (from % 64));
    loop {
        if idle != 0 {
            let i = w * 64 + idle.trailing_zeros() as usize;
            return (i < slots).then_some(i);
        }
        w += 1;
        idle = !*live.get(w)?;
    }
}

/// What [`Continuous::next_admission`] found.
enum NextAdmission {
    /// Place waiting request `index` in idle slot `free`, if it fits.
    Place { free: usize, index: u32 },
    /// This priority's queue is empty.
    NextPriority,
    /// No idle slot.
    Full,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContinuousStats {
    pub admitted: u64,
    pub rejected_full: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub decode_tokens: u64,
    pub prefill_tokens: u64,
    /// LoRA adapters loaded into a slot (each a step that paid `lora_load_ms`).
    pub lora_loads: u64,
}

impl ContinuousStats {
    /// Counts a request that left its slot with `result`; what `finished` is told.
    #[inline]
    fn count_end(&mut self, result: EntryResult) -> EntryResult {
        if result == EntryResult::Cancelled {
            self.cancelled += 1;
            EntryResult::Cancelled
        } else {
            self.completed += 1;
            EntryResult::Finished
        }
    }
}

/// The continuous-batching scheduler.
///
/// Replicas form groups (one per backend the runtime routes to; one group by default): a
/// request is admitted into a group's wait queue and runs only on that group's replicas.
pub struct Continuous {
    cfg: ContinuousConfig,
    table: RequestTable,
    /// Per group, waiting requests by priority (index: [`Priority::index`]).
    waiting: Vec<[Fifo; Priority::COUNT]>,
    /// Requests waiting, over all groups. Invariant: the sum of `group_waiting`.
    waiting_len: usize,
    /// Per group, requests waiting.
    group_waiting: Vec<usize>,
    /// Per replica, its group.
    replica_group: Vec<usize>,
    /// Per request-table index, the group its request was admitted into.
    request_group: Vec<u16>,
    replicas: Vec<Replica>,
    /// KV blocks per replica with prefix caching ([`kv_blocks`]; 0 without).
    blocks_per_replica: u32,
    /// Most new blocks one slot can take in a step: a prefill chunk's blocks and one more
    /// for the token sampled after it (prefix caching; computed once, not per tick).
    step_blocks_most: u32,
    stats: ContinuousStats,
    draining: bool,
    /// Per request-table index: waiting requests of other adapters that took a slot while
    /// this one's adapter could not get one (see [`Self::lora_pick`]).
    lora_overtaken: Vec<u32>,
}

/// Most waiting requests admission looks past a request whose LoRA adapter cannot get a
/// slot (so a tick stays O(this) however long the queue is).
const LORA_SCAN_MOST: usize = 256;

impl Continuous {
    /// A scheduler with every buffer it needs: one group of all `cfg.replicas` replicas.
    pub fn new(cfg: ContinuousConfig) -> Continuous {
        let replicas = cfg.replicas;
        Continuous::with_groups(cfg, &[replicas])
    }

    /// A scheduler whose replicas form groups: `groups[g]` replicas in group `g`, in order
    /// (group 0 holds replicas `0..groups[0]`, and so on); they must add up to
    /// `cfg.replicas`. Requests are admitted into a group ([`Self::admit_to`]).
    pub fn with_groups(cfg: ContinuousConfig, groups: &[usize]) -> Continuous {
        assert!(
            cfg.replicas > 0 && cfg.max_slots > 0,
            "need replicas and slots"
        );
        assert!(
            !groups.is_empty()
                && groups.len() <= usize::from(u16::MAX)
                && groups.iter().all(|&n| n > 0)
                && groups.iter().sum::<usize>() == cfg.replicas,
            "groups {groups:?} must be non-empty and add up to {} replicas",
            cfg.replicas
        );
        let capacity = cfg.max_queue + cfg.replicas * cfg.max_slots;
        let blocks_per_replica = if cfg.prefix_caching {
            kv_blocks(&cfg)
        } else {
            0
        };
        let step_blocks_most = cfg.prefill_chunk.max(1).div_ceil(cfg.block_tokens.max(1)) + 1;
        let replica_group = groups
            .iter()
            .enumerate()
            .flat_map(|(g, &n)| std::iter::repeat_n(g, n))
            .collect();
        let replicas = (0..cfg.replicas)
            .map(|_| Replica {
                slots: vec![IDLE_SLOT; cfg.max_slots],
                slot_blocks: vec![NO_BLOCKS; cfg.max_slots],
                busy: false,
                entries: Vec::with_capacity(cfg.max_slots),
                step_decodes: 0,
                step_bits: vec![0; cfg.max_slots.div_ceil(64)],
                clock: 0,
                wheel: vec![NIL; (cfg.max_slots * 2).next_power_of_two().max(WHEEL_MIN)],
                wheel_links: vec![(NIL, NIL); cfg.max_slots],
                due_bits: vec![0; cfg.max_slots.div_ceil(64)],
                ended_bits: vec![0; cfg.max_slots.div_ceil(64)],
                cross_bits: vec![0; cfg.max_slots.div_ceil(64)],
                end_result: vec![EntryResult::Continue; cfg.max_slots],
                admitted_seq: 0,
                active: 0,
                prefilling: 0,
                live: vec![0; cfg.max_slots.div_ceil(64)],
                generating: vec![0; cfg.max_slots.div_ceil(64)],
                gen_context: 0,
                kv_used: 0,
                cache: cfg
                    .prefix_caching
                    .then(|| BlockCache::new(blocks_per_replica)),
                block_tokens: cfg.block_tokens.max(1),
                phase: 0,
                cross: if cfg.prefix_caching {
                    vec![0; cfg.block_tokens.max(1) as usize]
                } else {
                    Vec::new()
                },
                prefix: PrefixStats::default(),
                lora: LoraSlots::new(cfg.max_loras),
            })
            .collect();
        let table = RequestTable::new(capacity);
        Continuous {
            request_group: vec![0; table.capacity()],
            lora_overtaken: vec![0; table.capacity()],
            table,
            waiting: vec![[Fifo::default(); Priority::COUNT]; groups.len()],
            waiting_len: 0,
            group_waiting: vec![0; groups.len()],
            replica_group,
            replicas,
            blocks_per_replica,
            step_blocks_most,
            stats: ContinuousStats::default(),
            draining: false,
            cfg,
        }
    }

    /// Settings.
    pub fn config(&self) -> &ContinuousConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &ContinuousStats {
        &self.stats
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting_len
    }

    /// Replica groups.
    pub fn groups(&self) -> usize {
        self.group_waiting.len()
    }

    /// The group `replica` belongs to.
    pub fn group_of(&self, replica: usize) -> usize {
        self.replica_group[replica]
    }

    /// The entries of the step running on `replica` (empty when none is): valid from the
    /// [`StepAction::Step`] that started it until [`Self::complete_step_with`].
    pub fn step_entries(&self, replica: usize) -> StepEntries<'_> {
        StepEntries {
            rep: &self.replicas[replica],
        }
    }

    /// Slots in use on `replica`.
    pub fn active_slots(&self, replica: usize) -> usize {
        self.replicas[replica].active
    }

    /// KV tokens in use on `replica`: prompt prefilled + generated over active slots; with
    /// prefix caching, the blocks running sequences hold (shared ones once) times their
    /// size. Cached blocks no sequence holds are free: they are evicted when needed.
    pub fn kv_used(&self, replica: usize) -> u64 {
        let rep = &self.replicas[replica];
        match &rep.cache {
            Some(c) => u64::from(c.used()) * u64::from(self.cfg.block_tokens),
            None => rep.kv_used,
        }
    }

    /// Prefix-cache counters of `replica` (all zero without prefix caching).
    pub fn prefix_stats_of(&self, replica: usize) -> PrefixStats {
        let rep = &self.replicas[replica];
        PrefixStats {
            evicted_blocks: rep.cache.as_ref().map_or(0, |c| c.evicted),
            ..rep.prefix
        }
    }

    /// Prefix-cache counters over every replica.
    pub fn prefix_stats(&self) -> PrefixStats {
        let mut s = PrefixStats::default();
        for r in 0..self.replicas.len() {
            s.add(&self.prefix_stats_of(r));
        }
        s
    }

    /// How many leading names of `names` are cached on `replica` now (held by a running
    /// sequence or free but still named); 0 without prefix caching. O(hits); no side effect
    /// (the router asks this of every candidate, nothing is held or refreshed).
    pub fn cached_prefix_blocks(&self, replica: usize, names: &[BlockHash]) -> u32 {
        let Some(cache) = &self.replicas[replica].cache else {
            return 0;
        };
        names
            .iter()
            .take_while(|&&name| cache.lookup(name).is_some())
            .count() as u32
    }

    /// [`Self::cached_prefix_blocks`], the most over the replicas of `group`.
    pub fn group_cached_prefix_blocks(&self, group: usize, names: &[BlockHash]) -> u32 {
        (0..self.replicas.len())
            .filter(|&r| self.replica_group[r] == group)
            .map(|r| self.cached_prefix_blocks(r, names))
            .max()
            .unwrap_or(0)
    }

    /// Does some replica of `group` hold `adapter` resident (running or cached)?
    pub fn group_adapter_resident(&self, group: usize, adapter: u16) -> bool {
        (0..self.replicas.len())
            .any(|r| self.replica_group[r] == group && self.adapter_resident(r, adapter))
    }

    /// KV blocks of `replica` with prefix caching (0 without).
    pub fn kv_blocks(&self, replica: usize) -> u64 {
        self.replicas[replica]
            .cache
            .as_ref()
            .map_or(0, |c| u64::from(c.blocks()))
    }

    /// Stop admitting new requests; queued and active ones still run to completion.
    pub fn begin_drain(&mut self) {
        self.draining = true;
    }

    /// True once `begin_drain` (or `abort_all`) was called.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Capacity of the request table (waiting + active), for the driver's own tables.
    pub fn table_capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Nothing waiting, nothing active, no step out.
    pub fn is_idle(&self) -> bool {
        self.waiting_len == 0 && self.replicas.iter().all(|r| !r.busy && r.active == 0)
    }

    /// Queues a request for group 0 (see [`Self::admit_to`]).
    pub fn admit(&mut self, meta: RequestMeta) -> Result<Ticket, ContinuousReject> {
        self.admit_to(0, meta)
    }

    /// Queues a request for the replicas of `group`. `meta.tokens_estimated -
    /// meta.max_tokens` is its prompt length. `max_queue` bounds the waiting requests of
    /// all groups together.
    pub fn admit_to(
        &mut self,
        group: usize,
        meta: RequestMeta,
    ) -> Result<Ticket, ContinuousReject> {
        assert!(group < self.groups(), "group {group} out of range");
        if self.draining {
            return Err(ContinuousReject::ShuttingDown);
        }
        let needed = u64::from(meta.tokens_estimated);
        let (too_large, capacity) = if self.cfg.prefix_caching {
            // Whole blocks: a sequence's last block may be partly used, so it fits iff
            // ceil(needed / bt) <= blocks, i.e. needed <= blocks x bt.
            let bt = u64::from(self.cfg.block_tokens.max(1));
            let capacity = u64::from(self.blocks_per_replica) * bt;
            (needed > capacity, capacity)
        } else {
            (
                needed > self.cfg.kv_capacity_tokens,
                self.cfg.kv_capacity_tokens,
            )
        };
        if too_large {
            return Err(ContinuousReject::TooLarge { needed, capacity });
        }
        if self.waiting_len >= self.cfg.max_queue {
            self.stats.rejected_full += 1;
            return Err(ContinuousReject::QueueFull {
                max_queue: self.cfg.max_queue,
            });
        }
        let Some(ticket) = self.table.insert(meta) else {
            self.stats.rejected_full += 1;
            return Err(ContinuousReject::QueueFull {
                max_queue: self.cfg.max_queue,
            });
        };
        self.request_group[ticket.index as usize] = group as u16;
        self.lora_overtaken[ticket.index as usize] = 0;
        self.waiting[group][meta.priority.index()].push_back(&mut self.table, ticket.index);
        self.waiting_len += 1;
        self.group_waiting[group] += 1;
        self.stats.admitted += 1;
        Ok(ticket)
    }

    /// The ticket of table slot `index` while it holds a request.
    pub fn ticket_of(&self, index: u32) -> Option<Ticket> {
        self.table.ticket_if_live(index)
    }

    /// Removes a request that is still waiting (client went away). Active requests are
    /// cancelled through their step result instead.
    pub fn cancel_waiting(&mut self, ticket: Ticket) -> bool {
        if !self.table.is_live(ticket)
            || self.table.state(ticket.index) != super::table::SlotState::Queued
        {
            return false;
        }
        let p = self.table.meta(ticket.index).priority.index();
        let g = usize::from(self.request_group[ticket.index as usize]);
        self.waiting[g][p].unlink(&mut self.table, ticket.index);
        self.waiting_len -= 1;
        self.group_waiting[g] -= 1;
        self.table.remove(ticket);
        self.stats.cancelled += 1;
        true
    }

    /// Runs a tick on every idle replica that has work: admit into free slots, then build
    /// and emit one step. Returns true if any step was emitted.
    /// No prompt has named blocks here: nothing is found in or added to the prefix cache
    /// (see [`Self::tick_replicas`]).
    pub fn tick(&mut self, out: &mut impl FnMut(StepAction<'_>)) -> bool {
        self.tick_replicas(&super::prefix::NoPromptBlocks, &mut |_| true, out)
    }

    /// [`Self::tick`] on the idle replicas `allow` accepts (the driver's circuit breakers:
    /// a replica whose circuit is open takes no new requests and runs no step). `allow` is
    /// asked only about idle replicas, once per tick. With prefix caching, a request taking a
    /// slot starts after its longest cached prefix, named by `blocks`: its first step's
    /// prefill `offset` is the tokens found cached (always at least one token is left to
    /// compute, so the step has logits to sample).
    pub fn tick_replicas(
        &mut self,
        blocks: &impl PromptBlocks,
        allow: &mut impl FnMut(usize) -> bool,
        out: &mut impl FnMut(StepAction<'_>),
    ) -> bool {
        let mut any = false;
        for r in 0..self.replicas.len() {
            if self.replicas[r].busy || !allow(r) {
                continue;
            }
            self.admit_into_slots(r, blocks);
            self.ensure_kv(r, out);
            if let Some(shape) = self.build_step(r) {
                debug_assert_eq!(shape, StepShape::of(self.step_entries(r).iter()));
                self.replicas[r].busy = true;
                self.stats.steps += 1;
                self.stats.decode_tokens += u64::from(shape.decode_tokens);
                self.stats.prefill_tokens += u64::from(shape.prefill_tokens);
                out(StepAction::Step {
                    replica: r,
                    entries: StepEntries {
                        rep: &self.replicas[r],
                    },
                    shape,
                });
                any = true;
            }
        }
        any
    }

    /// [`Self::complete_step_with`] when no prompt has named blocks.
    pub fn complete_step(
        &mut self,
        replica: usize,
        results: &[EntryResult],
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        self.complete_step_with(replica, &super::prefix::NoPromptBlocks, results, finished)
    }

    /// The step on `replica` finished; `results[i]` answers entry `i` of that step (its
    /// [`StepEntries`] order: decode entries, then prefill ones). Calls
    /// `finished(ticket, result)` for every request that left its slot. With prefix caching,
    /// the sequences' new tokens take KV blocks, and prompt blocks now full are named (by
    /// `blocks`, as at admission) so later prompts find them. O(entries) for the results;
    /// [`Self::complete_step_continuing`] when every result is `Continue`.
    pub fn complete_step_with(
        &mut self,
        replica: usize,
        blocks: &impl PromptBlocks,
        results: &[EntryResult],
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        self.complete(replica, blocks, Some(results), finished);
    }

    /// [`Self::complete_step_with`] for a step whose every entry goes on (no stop sequence,
    /// end of sequence or cancellation: the simulator's steps). Touches only the sequences
    /// that reach their `watch` (their last token) and the step's prefill entries, not every
    /// decode entry.
    pub fn complete_step_continuing(
        &mut self,
        replica: usize,
        blocks: &impl PromptBlocks,
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        self.complete(replica, blocks, None, finished);
    }

    fn complete(
        &mut self,
        replica: usize,
        blocks: &impl PromptBlocks,
        results: Option<&[EntryResult]>,
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        let rep = &mut self.replicas[replica];
        assert!(
            rep.busy,
            "complete_step for replica {replica} without a step out"
        );
        rep.busy = false;
        debug_assert!(
            results.is_none_or(|r| r.len() == rep.step_decodes as usize + rep.entries.len())
        );
        // Two copies of the loop, so the one without caching has no trace of it and the
        // one with it tests nothing per entry to know.
        if rep.cache.is_some() {
            self.complete_entries::<true>(replica, blocks, results, finished);
        } else {
            self.complete_entries::<false>(replica, blocks, results, finished);
        }
        let rep = &mut self.replicas[replica];
        rep.entries.clear();
        rep.step_bits.fill(0);
        rep.step_decodes = 0;
        debug_assert!(rep.counters_hold());
        // The block table's invariants (`BlockCache::check`, O(blocks)) are checked by the
        // tests after every step, not here: a debug simulation runs millions of steps.
    }

    /// [`Self::complete`]'s work: the clock advances (every decode entry's sequence has one
    /// more token), the sequences due now and those whose entry ended are settled in slot
    /// order, then the prefill entries in order. `CACHING` says the replica has a block
    /// cache.
    #[inline(always)]
    fn complete_entries<const CACHING: bool>(
        &mut self,
        replica: usize,
        blocks: &impl PromptBlocks,
        results: Option<&[EntryResult]>,
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        let block_tokens = self.cfg.block_tokens.max(1);
        let rep = &mut self.replicas[replica];
        rep.clock = rep.clock.wrapping_add(1);
        if CACHING {
            // Every generating slot's context moved on with the clock: so does the phase.
            rep.phase += 1;
            if rep.phase == block_tokens {
                rep.phase = 0;
            }
        }
        // The residue of the decode entries whose token starts a new KV block (context 1
        // modulo `block_tokens`): r + phase = 1 modulo block_tokens (0 for blocks of one
        // token), without dividing.
        let crossing_residue = if CACHING {
            match u32::from(block_tokens > 1) + block_tokens - rep.phase {
                r if r >= block_tokens => r - block_tokens,
                r => r,
            }
        } else {
            0
        };
        // Skipped slots that land on that residue: their context (1 modulo block_tokens)
        // did not move, and its block was taken when it was made.
        let mut skipped_crossing = 0u32;
        // Decode entries whose slot was freed while the step ran (their token is not
        // counted), and generating slots the budget left out of the step (their count
        // stays: one less offset, one later due).
        let mut freed = 0u32;
        for w in 0..rep.step_bits.len() {
            let (step, gen) = (rep.step_bits[w], rep.generating[w]);
            freed += (step & !gen).count_ones();
            let mut skipped = gen & !step;
            while skipped != 0 {
                let i = w * 64 + skipped.trailing_zeros() as usize;
                skipped &= skipped - 1;
                rep.wheel_remove(i);
                let slot = &mut rep.slots[i];
                slot.gen_off = slot.gen_off.wrapping_sub(1);
                rep.wheel_file(i);
                if CACHING {
                    // Its context stayed: one residue back.
                    let sb = &mut rep.slot_blocks[i];
                    rep.cross[sb.residue as usize] -= 1;
                    sb.residue = if sb.residue == 0 {
                        block_tokens - 1
                    } else {
                        sb.residue - 1
                    };
                    rep.cross[sb.residue as usize] += 1;
                    skipped_crossing += u32::from(sb.residue == crossing_residue);
                }
            }
        }
        // The decode entries whose token starts a new KV block (context 1 modulo
        // `block_tokens`) each take one, by count. With enough blank blocks for all of
        // them no order can evict, so they are taken at once; else in slot order with the
        // frees below, as taking them one by one would (a block a finished sequence frees
        // is there for the next one).
        let mut cross_one_by_one = false;
        if CACHING {
            let r = crossing_residue as usize;
            let crossing = rep.cross[r] - skipped_crossing;
            if crossing > 0 {
                let cache = rep.cache.as_mut().expect("caching");
                if cache.blank_free() >= crossing {
                    cache.reserve(crossing);
                } else {
                    cross_one_by_one = true;
                    for w in 0..rep.step_bits.len() {
                        let mut bits = rep.step_bits[w] & rep.generating[w];
                        while bits != 0 {
                            let i = w * 64 + bits.trailing_zeros() as usize;
                            bits &= bits - 1;
                            if rep.slot_blocks[i].residue as usize == r {
                                rep.due_bits[w] |= 1u64 << (i % 64);
                                rep.cross_bits[w] |= 1u64 << (i % 64);
                            }
                        }
                    }
                }
            }
        }
        // Every decode entry adds a token to the KV in use and to the generating context.
        let decodes = u64::from(rep.step_decodes - freed);
        rep.kv_used += decodes;
        rep.gen_context += decodes;
        // The sequences that need more than counting: due now, or their entry ended.
        let mut s = rep.wheel[rep.clock as usize & (rep.wheel.len() - 1)];
        while s != NIL {
            if rep.slots[s as usize].due == rep.clock {
                rep.due_bits[s as usize / 64] |= 1u64 << (s % 64);
            }
            s = rep.wheel_links[s as usize].1;
        }
        let step_decodes = rep.step_decodes as usize;
        if let Some(results) = results {
            let mut k = 0;
            for w in 0..rep.step_bits.len() {
                let mut bits = rep.step_bits[w];
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let r = results[k];
                    k += 1;
                    if r != EntryResult::Continue && rep.slots[i].phase == SlotPhase::Generating {
                        rep.due_bits[w] |= 1u64 << (i % 64);
                        rep.ended_bits[w] |= 1u64 << (i % 64);
                        rep.end_result[i] = r;
                    }
                }
            }
        }
        // In slot order, as the entries; an ended entry's result over its due mark.
        for w in 0..rep.due_bits.len() {
            let mut bits = std::mem::take(&mut rep.due_bits[w]);
            let ended = std::mem::take(&mut rep.ended_bits[w]);
            let cross = if CACHING && cross_one_by_one {
                std::mem::take(&mut rep.cross_bits[w])
            } else {
                0
            };
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let result = if ended >> (i % 64) & 1 == 1 {
                    rep.end_result[i]
                } else {
                    EntryResult::Continue
                };
                if CACHING && cross >> (i % 64) & 1 == 1 {
                    rep.cache.as_mut().expect("caching").reserve(1);
                }
                let generated = rep.generated(i);
                let slot = &rep.slots[i];
                let ended = result != EntryResult::Continue;
                if ended || generated >= slot.max_tokens {
                    let ticket = rep.free(i);
                    self.table.remove(ticket);
                    finished(ticket, self.stats.count_end(result));
                } else {
                    rep.wheel_remove(i);
                    rep.wheel_file(i);
                }
            }
        }
        for k in 0..rep.entries.len() {
            let entry = rep.entries[k];
            let result = results.map_or(EntryResult::Continue, |r| r[step_decodes + k]);
            let i = entry.slot as usize;
            let slot = &mut rep.slots[i];
            if slot.phase == SlotPhase::Idle || slot.ticket != entry.ticket {
                continue; // freed while the step ran
            }
            let StepWork::Prefill { tokens, last, .. } = entry.work else {
                unreachable!("stored entries are prefills");
            };
            slot.prefilled += tokens;
            let generated = u32::from(last);
            if last {
                slot.phase = SlotPhase::Generating;
                slot.gen_off = 1u32.wrapping_sub(rep.clock);
                rep.prefilling -= 1;
                rep.generating[i / 64] |= 1u64 << (i % 64);
                rep.gen_context += u64::from(slot.prefilled + 1);
            }
            rep.kv_used += u64::from(tokens + generated);
            if CACHING {
                if let Some(cache) = &mut rep.cache {
                    let sb = &mut rep.slot_blocks[i];
                    grow_prefill(cache, slot, generated, sb, blocks, block_tokens);
                }
            }
            if last {
                rep.wheel_file(i);
                if CACHING {
                    let r = rep.residue(i);
                    rep.slot_blocks[i].residue = r as u32;
                    rep.cross[r] += 1;
                }
            }
            let slot = &rep.slots[i];
            if result != EntryResult::Continue || (last && generated >= slot.max_tokens) {
                let ticket = rep.free(i);
                self.table.remove(ticket);
                finished(ticket, self.stats.count_end(result));
            }
        }
    }

    /// Drops every waiting request that arrived more than `timeout_ns` before `now` (no slot
    /// freed up in time), handing each to `out`. Oldest first; O(expired + preempted) per
    /// call. A preempted request is never dropped: it has started (its client may hold
    /// streamed tokens), and the timeout is for waiting to start, as in vLLM, which has
    /// none. Preempted requests sit at the front of their queue, the rest in arrival order.
    pub fn expire_waiting(
        &mut self,
        now: super::request::Nanos,
        timeout_ns: super::request::Nanos,
        out: &mut impl FnMut(Ticket),
    ) {
        for g in 0..self.groups() {
            for p in 0..Priority::COUNT {
                let mut at = self.waiting[g][p].front().unwrap_or(NIL);
                while at != NIL {
                    let index = at;
                    at = self.table.next_in_fifo(index);
                    if self.table.tag(index) == TAG_PREEMPTED {
                        continue;
                    }
                    if now.saturating_sub(self.table.meta(index).arrival_ns) < timeout_ns {
                        break;
                    }
                    self.waiting[g][p].unlink(&mut self.table, index);
                    self.waiting_len -= 1;
                    self.group_waiting[g] -= 1;
                    let ticket = self.table.ticket_at(index);
                    self.table.remove(ticket);
                    out(ticket);
                }
            }
        }
    }

    /// When [`Continuous::expire_waiting`] with `timeout_ns` next fails a request: the
    /// earliest deadline among the oldest waiting request of each queue that was never
    /// preempted (the ones it looks at); `None` when none waits. O(groups x priorities +
    /// preempted).
    pub fn next_expiry(&self, timeout_ns: super::request::Nanos) -> Option<super::request::Nanos> {
        let mut next: Option<super::request::Nanos> = None;
        for g in 0..self.groups() {
            for p in 0..Priority::COUNT {
                // Preempted requests (at the front) never expire: the first other one.
                let mut index = self.waiting[g][p].front().unwrap_or(NIL);
                while index != NIL && self.table.tag(index) == TAG_PREEMPTED {
                    index = self.table.next_in_fifo(index);
                }
                if index != NIL {
                    let at = self.table.meta(index).arrival_ns.saturating_add(timeout_ns);
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        next
    }

    /// Fails everything: every waiting request and every active slot is freed and handed to
    /// `out` (shutdown deadline passed). Steps still out come back through
    /// `complete_step`, which then finds their slots idle and ignores them.
    pub fn abort_all(&mut self, out: &mut impl FnMut(Ticket)) {
        self.draining = true;
        for g in 0..self.groups() {
            self.drop_waiting_in_group(g, out);
        }
        for r in 0..self.replicas.len() {
            for s in 0..self.replicas[r].slots.len() {
                if self.replicas[r].slots[s].phase != SlotPhase::Idle {
                    let ticket = self.replicas[r].free(s);
                    self.table.remove(ticket);
                    out(ticket);
                }
            }
        }
    }

    /// Requests waiting in group `group` (its queues, preempted ones included).
    pub fn waiting_in_group(&self, group: usize) -> usize {
        self.group_waiting[group]
    }

    /// Drops every request waiting in group `group`, handing each to `out` (the driver
    /// answers them): every replica of the group has an open circuit, so they would wait
    /// for a probe step. Preempted ones too: their backend cannot resume them either.
    /// O(waiting in the group).
    pub fn drop_waiting_in_group(&mut self, group: usize, out: &mut impl FnMut(Ticket)) {
        for p in 0..Priority::COUNT {
            while let Some(index) = self.waiting[group][p].pop_front(&mut self.table) {
                self.waiting_len -= 1;
                self.group_waiting[group] -= 1;
                let ticket = self.table.ticket_at(index);
                self.table.remove(ticket);
                out(ticket);
            }
        }
    }

    /// The step out on `replica` will not be waited for (it hung past the step timeout):
    /// every request active on the replica is freed and handed to `out`, to be failed. The
    /// replica stays busy until the step comes back through `complete_step`, which then
    /// finds its slots idle and ignores it. O(slots).
    pub fn fail_replica(&mut self, replica: usize, out: &mut impl FnMut(Ticket)) {
        let rep = &mut self.replicas[replica];
        for s in 0..rep.slots.len() {
            if rep.slots[s].phase != SlotPhase::Idle {
                let ticket = rep.free(s);
                self.table.remove(ticket);
                out(ticket);
            }
        }
    }

    /// Is a step running on `replica`?
    pub fn is_busy(&self, replica: usize) -> bool {
        self.replicas[replica].busy
    }

    /// Total slots over all replicas.
    pub fn slots_total(&self) -> usize {
        self.replicas.len() * self.cfg.max_slots
    }

    /// The next admission `admit_into_slots*` tries on replica `r`: the first idle slot at
    /// or after `from` (moved there: every slot before it is taken) and the head of group
    /// `g`'s queue of priority `p`.
    fn next_admission(&self, r: usize, g: usize, p: Priority, from: &mut usize) -> NextAdmission {
        if self.replicas[r].active == self.cfg.max_slots {
            return NextAdmission::Full;
        }
        let Some(free) = first_idle(&self.replicas[r].live, *from, self.cfg.max_slots) else {
            return NextAdmission::Full;
        };
        *from = free;
        match self.waiting[g][p.index()].front() {
            Some(index) => NextAdmission::Place { free, index },
            None => NextAdmission::NextPriority,
        }
    }

    /// The LoRA rule of admission: from `head` on (a queue of replica `r`'s group), the first
    /// waiting request `r` may admit now: a base-model request, or one whose adapter is
    /// resident or has a slot to load into (at most `max_loras` distinct adapters run at
    /// once). A request whose adapter cannot get a slot waits, and those behind it go on (no
    /// head-of-line blocking), each such pass counted against it. Once it has been passed
    /// `max_slots` times it fences the queue: no adapter request behind it is admitted (base
    /// requests still are) until its adapter gets a slot, which happens as soon as one
    /// adapter's running requests finish; so its wait is bounded by `max_slots` admissions
    /// and the longest running request. Looks at most [`LORA_SCAN_MOST`] requests.
    fn lora_pick(&mut self, r: usize, head: u32) -> Option<u32> {
        let lora = &self.replicas[r].lora;
        let fence = self.cfg.max_slots as u32;
        let (mut i, mut fenced, mut looked) = (head, false, 0);
        while i != NIL && looked < LORA_SCAN_MOST {
            let a = self.table.meta(i).adapter;
            if a == BASE_MODEL || (!fenced && lora.can_take(a)) {
                break;
            }
            fenced |= self.lora_overtaken[i as usize] >= fence;
            i = self.table.next_in_fifo(i);
            looked += 1;
        }
        if i == NIL || looked == LORA_SCAN_MOST {
            return None;
        }
        let mut j = head;
        while j != i {
            let passed = &mut self.lora_overtaken[j as usize];
            *passed = passed.saturating_add(1);
            j = self.table.next_in_fifo(j);
        }
        Some(i)
    }

    /// Takes replica `r`'s LoRA slot for a request of `adapter` that [`Self::lora_pick`]
    /// chose: the slot (or [`NO_LORA_SLOT`]) and whether the adapter was loaded for it.
    fn lora_acquire(&mut self, r: usize, adapter: u16) -> (u8, bool) {
        let acquired = self.replicas[r]
            .lora
            .acquire(adapter)
            .expect("lora_pick admits only requests whose adapter can get a slot");
        let loaded = matches!(acquired, Acquired::Loaded(_));
        self.stats.lora_loads += u64::from(loaded);
        (acquired.slot().unwrap_or(NO_LORA_SLOT), loaded)
    }

    /// Adds the adapters of running requests (every replica) to `running` and of waiting
    /// ones (every group) to `waiting`. O(waiting requests): for a snapshot, not per step.
    pub fn lora_adapters(
        &self,
        running: &mut super::lora::AdapterSet,
        waiting: &mut super::lora::AdapterSet,
    ) {
        for r in 0..self.replicas.len() {
            self.running_adapters(r).for_each(|a| running.insert(a));
        }
        for g in 0..self.groups() {
            self.waiting_adapters(g).for_each(|a| waiting.insert(a));
        }
    }

    /// Adapters with a running request on replica `r`.
    pub fn running_adapters(&self, r: usize) -> impl Iterator<Item = u16> + '_ {
        self.replicas[r].lora.running()
    }

    /// Is `adapter` resident on replica `r` (running or cached)?
    pub fn adapter_resident(&self, r: usize, adapter: u16) -> bool {
        self.replicas[r].lora.is_resident(adapter)
    }

    /// Forgets LoRA adapter `adapter` on every replica (unloaded, or its id handed to a new
    /// adapter): a slot empties once nothing runs there (`LoraSlots::forget`).
    pub fn forget_adapter(&mut self, adapter: u16) {
        self.replicas
            .iter_mut()
            .for_each(|r| r.lora.forget(adapter));
    }

    /// Adapters of the requests waiting in group `g` (repeats included), for metrics.
    pub fn waiting_adapters(&self, g: usize) -> impl Iterator<Item = u16> + '_ {
        self.waiting[g].iter().flat_map(move |q| {
            let mut i = q.front().unwrap_or(NIL);
            std::iter::from_fn(move || {
                (i != NIL).then(|| {
                    let a = self.table.meta(i).adapter;
                    i = self.table.next_in_fifo(i);
                    a
                })
            })
        })
    }

    /// Takes waiting request `index` (of group `g`, priority `p`) off its queue for a slot.
    fn take_waiting(&mut self, g: usize, p: Priority, index: u32) {
        self.waiting[g][p.index()].unlink(&mut self.table, index);
        self.waiting_len -= 1;
        self.group_waiting[g] -= 1;
        self.table.set_dispatched(index);
    }

    /// Admits waiting requests (highest priority first, FIFO within) into free slots while
    /// their prompt + max_tokens fit in the replica's free KV.
    fn admit_into_slots(&mut self, r: usize, blocks: &impl PromptBlocks) {
        let g = self.replica_group[r];
        if self.group_waiting[g] == 0 {
            return;
        }
        if self.replicas[r].cache.is_some() {
            return self.admit_into_slots_cached(r, g, blocks);
        }
        let capacity = self.cfg.kv_capacity_tokens;
        let mut used = self.kv_used(r);
        // Free slots are searched from here on: every slot before it is taken.
        let mut from = 0;
        for p in Priority::HIGHEST_FIRST {
            loop {
                let (free, head) = match self.next_admission(r, g, p, &mut from) {
                    NextAdmission::Place { free, index } => (free, index),
                    NextAdmission::NextPriority => break,
                    NextAdmission::Full => return,
                };
                let Some(index) = self.lora_pick(r, head) else {
                    break;
                };
                let meta = *self.table.meta(index);
                let need = u64::from(meta.tokens_estimated);
                if used + need > capacity {
                    return; // FIFO: do not let a smaller request jump the head
                }
                self.take_waiting(g, p, index);
                let (lora_slot, lora_load) = self.lora_acquire(r, meta.adapter);
                let rep = &mut self.replicas[r];
                rep.admitted_seq += 1;
                rep.live[free / 64] |= 1u64 << (free % 64);
                rep.slots[free] = Slot {
                    phase: SlotPhase::Prefilling,
                    ticket: self.table.ticket_at(index),
                    prompt_tokens: meta.tokens_estimated - meta.max_tokens,
                    prefilled: 0,
                    gen_off: 0,
                    due: 0,
                    max_tokens: meta.max_tokens.max(1),
                    admitted_seq: rep.admitted_seq,
                    fresh: true,
                    lora_slot,
                    lora_load,
                };
                rep.active += 1;
                rep.prefilling += 1;
                used += need;
            }
        }
    }

    /// Preempts the youngest slots while the next step would not fit in KV: each generating
    /// slot grows by one token and each prefilling slot by its chunk.
    fn ensure_kv(&mut self, r: usize, out: &mut impl FnMut(StepAction<'_>)) {
        let capacity = self.cfg.kv_capacity_tokens;
        loop {
            let rep = &self.replicas[r];
            if let Some(cache) = &rep.cache {
                if self.next_step_fits_blocks(rep, cache) {
                    return;
                }
            } else {
                // Quick bound: every active slot grows by at most a chunk.
                let most =
                    rep.kv_used + rep.active as u64 * u64::from(self.cfg.prefill_chunk.max(1));
                if most <= capacity {
                    return;
                }
                let used: u64 = rep
                    .slots
                    .iter()
                    .filter(|s| s.phase != SlotPhase::Idle)
                    .map(|s| {
                        let grow = match s.phase {
                            SlotPhase::Generating => 1,
                            _ => (s.prompt_tokens - s.prefilled).min(self.cfg.prefill_chunk),
                        };
                        u64::from(s.prefilled)
                            + u64::from(generated_at(s, rep.clock))
                            + u64::from(grow)
                    })
                    .sum();
                if used <= capacity {
                    return;
                }
            }
            let Some((victim, _)) = rep
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.phase != SlotPhase::Idle)
                .max_by_key(|(_, s)| s.admitted_seq)
            else {
                return;
            };
            let ticket = self.replicas[r].free(victim);
            let p = self.table.meta(ticket.index).priority.index();
            let g = self.replica_group[r];
            self.table.set_tag(ticket.index, TAG_PREEMPTED);
            self.waiting[g][p].push_front(&mut self.table, ticket.index);
            self.waiting_len += 1;
            self.group_waiting[g] += 1;
            self.stats.preemptions += 1;
            out(StepAction::Preempted {
                replica: r,
                slot: victim as u32,
                ticket,
            });
        }
    }

    /// With prefix caching: do the free blocks cover what the next step can add? Each
    /// generating slot grows by a token, each prefilling one by at most a chunk (and its first
    /// token when the chunk ends the prompt).
    #[inline]
    fn next_step_fits_blocks(&self, rep: &Replica, cache: &BlockCache) -> bool {
        let free = u64::from(cache.free());
        // Quick bound: a generating slot takes at most one new block in a step, a prefilling
        // one at most `step_blocks_most`.
        let generating = (rep.active - rep.prefilling) as u64;
        free >= generating + rep.prefilling as u64 * u64::from(self.step_blocks_most)
            || self.next_step_needs_at_most(rep, free)
    }

    /// [`Self::next_step_fits_blocks`] past its quick bound: the blocks each slot's growth
    /// needs, summed, against `free`.
    #[cold]
    #[inline(never)]
    fn next_step_needs_at_most(&self, rep: &Replica, free: u64) -> bool {
        let bt = self.cfg.block_tokens.max(1);
        let chunk = self.cfg.prefill_chunk.max(1);
        let needed: u64 = rep
            .slots
            .iter()
            .zip(&rep.slot_blocks)
            .filter(|(s, _)| s.phase != SlotPhase::Idle)
            .map(|(s, b)| {
                let grow = match s.phase {
                    SlotPhase::Generating => 1,
                    _ => {
                        let rest = s.prompt_tokens - s.prefilled;
                        rest.min(chunk) + u32::from(rest <= chunk)
                    }
                };
                // Room in its last block: a generating slot holds blocks for its context
                // (by chain and by count), a prefilling one by chain.
                let context = s.prefilled + generated_at(s, rep.clock);
                let room = match s.phase {
                    SlotPhase::Generating => (bt - context % bt) % bt,
                    _ => b.held * bt - context,
                };
                u64::from(grow.saturating_sub(room).div_ceil(bt))
            })
            .sum();
        needed <= free
    }

    /// [`Self::admit_into_slots`] with prefix caching: a request is looked up before it is
    /// placed; it needs free blocks for what its prompt and output add past its cached prefix,
    /// plus the cached blocks it takes off the free queue.
    fn admit_into_slots_cached(&mut self, r: usize, g: usize, blocks: &impl PromptBlocks) {
        let bt = self.cfg.block_tokens.max(1);
        // Blocks promised to the requests admitted in this call, not allocated yet.
        let mut promised = 0u64;
        let mut from = 0;
        for p in Priority::HIGHEST_FIRST {
            loop {
                let (free, head) = match self.next_admission(r, g, p, &mut from) {
                    NextAdmission::Place { free, index } => (free, index),
                    NextAdmission::NextPriority => break,
                    NextAdmission::Full => return,
                };
                let Some(index) = self.lora_pick(r, head) else {
                    break;
                };
                let meta = *self.table.meta(index);
                let ticket = self.table.ticket_at(index);
                let prompt = meta.tokens_estimated - meta.max_tokens;
                let rep = &mut self.replicas[r];
                let cache = rep.cache.as_mut().expect("prefix caching is on");
                let named = blocks.block_count(ticket).min(prompt / bt);
                // At least one prompt token is computed, so the step has logits to sample.
                let hit_most = named.min(prompt.saturating_sub(1) / bt);
                let (mut hits, mut last, mut free_hits) = (0u32, NIL, 0u64);
                while hits < hit_most {
                    let Some(b) = cache.lookup(blocks.block_hash(ticket, hits)) else {
                        break;
                    };
                    free_hits += u64::from(cache.is_free(b));
                    last = b;
                    hits += 1;
                }
                let adds =
                    u64::from(meta.tokens_estimated).div_ceil(u64::from(bt)) - u64::from(hits);
                if u64::from(cache.used()) + free_hits + promised + adds > u64::from(cache.blocks())
                {
                    return; // FIFO: do not let a smaller request jump the head
                }
                promised += adds;
                let (lora_slot, lora_load) = self.lora_acquire(r, meta.adapter);
                let rep = &mut self.replicas[r];
                let cache = rep.cache.as_mut().expect("prefix caching is on");
                let mut b = last;
                for _ in 0..hits {
                    cache.hold(b);
                    b = cache.parent(b);
                }
                debug_assert!(
                    b == NIL,
                    "a cached prefix's parent links end at its first block"
                );
                let cached = hits * bt;
                // A preempted request coming back finds its own blocks: not counted, as vLLM
                // keeps such lookups out of `prefix_cache_queries` / `hits`.
                if self.table.tag(index) != TAG_PREEMPTED {
                    rep.prefix.query_tokens += u64::from(prompt);
                    rep.prefix.hit_tokens += u64::from(cached);
                }
                rep.admitted_seq += 1;
                rep.live[free / 64] |= 1u64 << (free % 64);
                rep.slots[free] = Slot {
                    phase: SlotPhase::Prefilling,
                    ticket,
                    prompt_tokens: prompt,
                    prefilled: cached,
                    gen_off: 0,
                    due: 0,
                    max_tokens: meta.max_tokens.max(1),
                    admitted_seq: rep.admitted_seq,
                    fresh: true,
                    lora_slot,
                    lora_load,
                };
                rep.slot_blocks[free] = SlotBlocks {
                    held: hits,
                    hit_blocks: hits,
                    last_hit: last,
                    tail: NIL,
                    named,
                    registered: hits,
                    reg_block: NIL,
                    reg_parent: last,
                    residue: 0,
                };
                rep.active += 1;
                rep.prefilling += 1;
                rep.kv_used += u64::from(cached);
                self.take_waiting(g, p, index);
            }
        }
    }

    /// Sets up the replica's step: decode for every generating slot first (as bits: the
    /// decode entries are not written), then prefill chunks, never past `n_batch` tokens,
    /// and returns the step's shape (`None` if there is nothing to run). When every
    /// generating slot decodes (the budget covers them), their part of the shape is the
    /// running context total and the step's decode set is the generating bits: O(words).
    fn build_step(&mut self, r: usize) -> Option<StepShape> {
        let chunk = self.cfg.prefill_chunk.max(1);
        let mut budget = self.cfg.n_batch.max(1);
        let rep = &mut self.replicas[r];
        rep.entries.clear();
        let mut shape = StepShape::default();
        // Decode entries, in slot order, over the generating slots only. A generating slot
        // ran its prefill, so its setup and adapter load were taken with that entry.
        let generating = (rep.active - rep.prefilling) as u32;
        if generating <= budget {
            rep.step_bits.copy_from_slice(&rep.generating);
            shape.decode_tokens = generating;
            shape.kv_read_tokens = rep.gen_context;
            shape.attention_pairs = rep.gen_context + u64::from(generating);
            rep.step_decodes = generating;
            budget -= generating;
        } else {
            // Only the first `budget` in slot order: each priced from its own context.
            rep.step_bits.fill(0);
            'decode: for w in 0..rep.generating.len() {
                let mut bits = rep.generating[w];
                while bits != 0 {
                    if budget == 0 {
                        break 'decode;
                    }
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    rep.step_bits[w] |= 1u64 << (i % 64);
                    let s = &rep.slots[i];
                    debug_assert!(s.phase == SlotPhase::Generating && !s.fresh && !s.lora_load);
                    shape.push(s.prefilled + generated_at(s, rep.clock), 1, true);
                    budget -= 1;
                }
            }
            rep.step_decodes = shape.decode_tokens;
        }
        // Then prefill chunks, in slot order: the live slots that do not generate.
        if rep.prefilling > 0 {
            'prefill: for w in 0..rep.live.len() {
                let mut bits = rep.live[w] & !rep.generating[w];
                while bits != 0 {
                    if budget == 0 {
                        break 'prefill;
                    }
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let s = &mut rep.slots[i];
                    debug_assert!(s.phase == SlotPhase::Prefilling);
                    let remaining = s.prompt_tokens - s.prefilled;
                    let tokens = remaining.min(chunk).min(budget);
                    // A prefilling sequence has generated nothing yet.
                    let entry = StepEntry {
                        slot: i as u32,
                        ticket: s.ticket,
                        work: StepWork::Prefill {
                            offset: s.prefilled,
                            tokens,
                            last: tokens == remaining,
                        },
                        generated: 0,
                        admitted: std::mem::take(&mut s.fresh),
                        context: s.prefilled,
                        lora_load: std::mem::take(&mut s.lora_load),
                    };
                    shape.push(entry.context, tokens, false);
                    shape.lora_loads += u32::from(entry.lora_load);
                    rep.entries.push(entry);
                    budget -= tokens;
                }
            }
        }
        (rep.step_decodes > 0 || !rep.entries.is_empty()).then_some(shape)
    }
}

/// The entries of one step: its decode entries (the slots of the replica's step bits, in
/// slot order, each made when read from the slot and the replica's clock) then its prefill
/// entries (stored). Valid while the step runs and its slots keep their requests; what a
/// driver hands to a worker is [`Self::iter`]'s copies.
#[derive(Clone, Copy)]
pub struct StepEntries<'a> {
    rep: &'a Replica,
}

impl<'a> StepEntries<'a> {
    /// Entries in the step: decode then prefill.
    pub fn len(&self) -> usize {
        self.rep.step_decodes as usize + self.rep.entries.len()
    }

    /// No step is running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decode entries (they lead the step).
    pub fn decodes(&self) -> usize {
        self.rep.step_decodes as usize
    }

    /// The prefill entries, after the decode ones (the only ones that can be `admitted`).
    pub fn prefills(&self) -> &'a [StepEntry] {
        &self.rep.entries
    }

    /// Every entry, decode first, in the order `complete_step`'s results answer them.
    pub fn iter(&self) -> impl Iterator<Item = StepEntry> + 'a {
        let rep = self.rep;
        let decodes = rep
            .step_bits
            .iter()
            .enumerate()
            .flat_map(move |(w, &word)| {
                std::iter::successors((word != 0).then_some(word), |&b| {
                    let b = b & (b - 1);
                    (b != 0).then_some(b)
                })
                .map(move |b| w * 64 + b.trailing_zeros() as usize)
            });
        let decodes = decodes.take(rep.step_decodes as usize).map(move |i| {
            let s = &rep.slots[i];
            let generated = generated_at(s, rep.clock);
            StepEntry {
                slot: i as u32,
                ticket: s.ticket,
                work: StepWork::Decode,
                generated,
                admitted: false,
                context: s.prefilled + generated,
                lora_load: false,
            }
        });
        decodes.chain(rep.entries.iter().copied())
    }

    /// Calls `f(ticket, generated)` for every decode entry, in entry order.
    #[inline]
    pub fn for_each_decode(&self, mut f: impl FnMut(Ticket, u32)) {
        let rep = self.rep;
        let mut left = rep.step_decodes;
        for (w, &word) in rep.step_bits.iter().enumerate() {
            let mut bits = word;
            while bits != 0 && left > 0 {
                let s = &rep.slots[w * 64 + bits.trailing_zeros() as usize];
                bits &= bits - 1;
                left -= 1;
                f(s.ticket, generated_at(s, rep.clock));
            }
        }
    }

    /// Does the step leave out generating sequences (the token budget covered fewer than
    /// the replica generates)? Read it when the step starts (a completion frees slots).
    pub fn skips(&self) -> bool {
        (self.rep.step_decodes as usize) < self.rep.active - self.rep.prefilling
    }

    /// Calls `f(ticket, generated)` for every generating sequence the step leaves out
    /// ([`Self::skips`]), in slot order. O(words of the slot bitmap) plus one call each.
    pub fn for_each_skipped(&self, mut f: impl FnMut(Ticket, u32)) {
        let rep = self.rep;
        for (w, (&gen, &step)) in rep.generating.iter().zip(&rep.step_bits).enumerate() {
            let mut bits = gen & !step;
            while bits != 0 {
                let s = &rep.slots[w * 64 + bits.trailing_zeros() as usize];
                bits &= bits - 1;
                f(s.ticket, generated_at(s, rep.clock));
            }
        }
    }

    /// The entries copied out (tests and debugging; allocates).
    pub fn to_vec(&self) -> Vec<StepEntry> {
        self.iter().collect()
    }
}

impl std::fmt::Debug for StepEntries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// What a latency model needs to know of a step: its tokens and the context they attend to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    /// One per generating sequence.
    pub decode_tokens: u32,
    /// Prompt tokens of the prefill chunks.
    pub prefill_tokens: u32,
    /// KV-cache tokens the step reads: per sequence its context plus half its new tokens
    /// (a chunk's later tokens attend to its earlier ones as they are written).
    pub kv_read_tokens: u64,
    /// (query, key) pairs of the step's attention: per sequence with `n` new tokens after
    /// `c` of context, `n c + n (n + 1) / 2` (causal).
    pub attention_pairs: u64,
    /// LoRA adapters loaded for this step (each costs `lora_load_ms`).
    pub lora_loads: u32,
}

impl StepShape {
    /// Adds a sequence with `new` tokens in this step after `context` tokens.
    #[inline]
    pub fn push(&mut self, context: u32, new: u32, decode: bool) {
        if decode {
            self.decode_tokens += new;
        } else {
            self.prefill_tokens += new;
        }
        let (c, n) = (u64::from(context), u64::from(new));
        self.kv_read_tokens += c + n / 2;
        self.attention_pairs += n * c + n * (n + 1) / 2;
    }

    /// The shape of a step with these entries.
    pub fn of<E: std::borrow::Borrow<StepEntry>>(
        entries: impl IntoIterator<Item = E>,
    ) -> StepShape {
        let mut s = StepShape::default();
        for e in entries {
            let e = e.borrow();
            s.lora_loads += u32::from(e.lora_load);
            match e.work {
                StepWork::Decode => s.push(e.context, 1, true),
                StepWork::Prefill { tokens, .. } => s.push(e.context, tokens, false),
            }
        }
        s
    }
}

#[cfg(test)]
mod tests;
