//! Admission: a request into a group's wait queue (`admit_to`, refused with a
//! [`ContinuousReject`]), back out while it waits (`cancel_waiting`), the door closed
//! (`begin_drain`); and on each tick, waiting requests into a replica's free slots, highest
//! priority first and FIFO within, while their KV fits (counted in tokens, or in blocks
//! after the longest cached prefix with prefix caching).
//!
//! What must never happen here: an allocation (a request takes a slot of the table built in
//! `new`), a smaller request jumping the head of its queue for KV, or a refusal that leaves
//! anything queued or counted as admitted.

use super::replica::{Slot, SlotBlocks, SlotPhase};
use super::{Continuous, ContinuousReject, TAG_PREEMPTED};
use crate::core::prefix::PromptBlocks;
use crate::core::request::{Priority, RequestMeta, Ticket};
use crate::core::table::NIL;

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

impl Continuous {
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

    /// Stop admitting new requests; queued and active ones still run to completion.
    pub fn begin_drain(&mut self) {
        self.draining = true;
    }

    /// Removes a request that is still waiting (client went away). Active requests are
    /// cancelled through their step result instead.
    pub fn cancel_waiting(&mut self, ticket: Ticket) -> bool {
        if !self.table.is_live(ticket)
            || self.table.state(ticket.index) != crate::core::table::SlotState::Queued
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

    /// Takes waiting request `index` (of group `g`, priority `p`) off its queue for a slot.
    fn take_waiting(&mut self, g: usize, p: Priority, index: u32) {
        self.waiting[g][p.index()].unlink(&mut self.table, index);
        self.waiting_len -= 1;
        self.group_waiting[g] -= 1;
        self.table.set_dispatched(index);
    }

    /// Admits waiting requests (highest priority first, FIFO within) into free slots while
    /// their prompt + max_tokens fit in the replica's free KV.
    pub(super) fn admit_into_slots(&mut self, r: usize, blocks: &impl PromptBlocks) {
        let g = self.replica_group[r];
        // Nothing waits, or no slot is free (most ticks of a busy replica).
        if self.group_waiting[g] == 0 || self.replicas[r].active == self.cfg.max_slots {
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

    /// [`Self::admit_into_slots`] with prefix caching: a request is looked up before it is
    /// placed; it needs free blocks for what its prompt and output add past its cached prefix,
    /// plus the cached blocks it takes off the free queue.
    fn admit_into_slots_cached(&mut self, r: usize, g: usize, blocks: &impl PromptBlocks) {
        let bs = self.replicas[r].block_size;
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
                let named = blocks.block_count(ticket).min(bs.whole(prompt));
                // At least one prompt token is computed, so the step has logits to sample.
                let hit_most = named.min(bs.whole(prompt.saturating_sub(1)));
                let (mut hits, mut last, mut free_hits) = (0u32, NIL, 0u64);
                while hits < hit_most {
                    let Some(b) = cache.lookup(blocks.block_hash(ticket, hits)) else {
                        break;
                    };
                    free_hits += u64::from(cache.is_free(b));
                    last = b;
                    hits += 1;
                }
                let adds = u64::from(bs.needed(meta.tokens_estimated) - hits);
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
                let cached = hits * bs.tokens();
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
}
