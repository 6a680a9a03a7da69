//! Iteration-level (continuous) batching: slots per replica, one step per tick mixing decode
//! tokens and prefill chunks under a token budget, KV-capacity admission and preemption.
//!
//! Like [`crate::core::Core`] this is sans-IO: the driver passes time in, carries out the
//! [`StepAction`]s, and reports each finished step with [`Continuous::complete_step`]. A tick's
//! work is proportional to the replica's slots; nothing here allocates after `new`, reads a
//! clock or blocks.
//!
//! Where the work lives, one job a file (`Continuous`'s as `impl Continuous` blocks):
//! `config` (settings, KV capacity, refusals), `step` (what a step is: entries, results,
//! shape), `step_view` (the running step as the driver reads it), `replica` (slots, their
//! KV blocks, a replica's finish wheel and counters), `blocks` (the prefix-caching block
//! table), `admission` (queueing a request, and waiting requests into free slots),
//! `preempt` (the KV check before a step, and preemption), `completion` (a finished step
//! back), `expiry` (requests that leave without finishing: timeout, abort, failed replica),
//! `lora` (adapter slots at admission), `inspect` (what drivers and metrics read). This file
//! holds the scheduler's struct, [`Continuous::new`] and the tick that builds each step.

mod admission;
mod block_size;
mod blocks;
mod completion;
mod config;
mod expiry;
mod inspect;
mod lora;
mod preempt;
mod replica;
mod step;
mod step_view;

use super::lora::LoraSlots;
use super::prefix::{PrefixStats, PromptBlocks};
use super::request::Priority;
use super::table::{Fifo, RequestTable, NIL};
use block_size::BlockSize;
use blocks::BlockCache;
use config::kv_blocks;
pub use config::{kv_capacity_tokens, ContinuousConfig, ContinuousReject};
use replica::{generated_at, Replica, SlotPhase, IDLE_SLOT, NO_BLOCKS, WHEEL_MIN};
pub use step::{EntryResult, StepEntry, StepShape, StepWork};
pub use step_view::{StepAction, StepEntries};

/// Table tag of a request that was preempted: it has started, so the waiting timeout no
/// longer applies to it (tags start at 0 on admission).
const TAG_PREEMPTED: u32 = 1;

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
                block_size: BlockSize::new(cfg.block_tokens),
                crossing: u32::from(cfg.block_tokens > 1),
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

#[cfg(test)]
mod tests;
