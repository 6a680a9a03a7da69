//! Before a step is built: does what it can add fit in the replica's KV (tokens, or free
//! blocks with prefix caching)? While it does not, the youngest sequence is preempted and
//! re-queued at the front of its queue, to be prefilled again.
//!
//! What must never happen here: an allocation (this runs on every tick), or a preempted
//! request lost (it is queued again before the driver hears of it).

use super::blocks::BlockCache;
use super::replica::{generated_at, Replica, SlotPhase};
use super::{Continuous, StepAction, TAG_PREEMPTED};

impl Continuous {
    /// Preempts the youngest slots while the next step would not fit in KV: each generating
    /// slot grows by one token and each prefilling slot by its chunk.
    pub(super) fn ensure_kv(&mut self, r: usize, out: &mut impl FnMut(StepAction<'_>)) {
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
            debug_assert!(self.replicas[r].counters_hold());
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
        let bs = rep.block_size;
        let chunk = self.cfg.prefill_chunk.max(1);
        let needed: u64 = rep
            .slots
            .iter()
            .filter(|s| s.phase != SlotPhase::Idle)
            .map(|s| {
                let grow = match s.phase {
                    SlotPhase::Generating => 1,
                    _ => {
                        let rest = s.prompt_tokens - s.prefilled;
                        rest.min(chunk) + u32::from(rest <= chunk)
                    }
                };
                // Room in its last block: a slot holds blocks for its context (by chain
                // and by count).
                let context = s.prefilled + generated_at(s, rep.clock);
                let room = bs.needed(context) * bs.tokens() - context;
                u64::from(bs.needed(grow.saturating_sub(room)))
            })
            .sum();
        needed <= free
    }
}
