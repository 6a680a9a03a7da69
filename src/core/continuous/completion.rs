//! Completion: a replica's step comes back. The clock advances (every decode entry's
//! sequence has one more token, by count), the sequences due now or whose entry ended are
//! settled in slot order, then the prefill entries; with prefix caching, new tokens take
//! KV blocks and full prompt blocks are named.
//!
//! What must never happen here: an allocation or a visit of every decode entry when all go
//! on (this is the engine's step path), or a request that leaves its slot without
//! `finished` hearing of it exactly once.

use super::replica::{grow_prefill, SlotPhase};
use super::{Continuous, EntryResult, StepWork};
use crate::core::prefix::PromptBlocks;
use crate::core::request::Ticket;
use crate::core::table::NIL;

impl Continuous {
    /// [`Self::complete_step_with`] when no prompt has named blocks.
    pub fn complete_step(
        &mut self,
        replica: usize,
        results: &[EntryResult],
        finished: &mut impl FnMut(Ticket, EntryResult),
    ) {
        self.complete_step_with(
            replica,
            &crate::core::prefix::NoPromptBlocks,
            results,
            finished,
        )
    }

    /// The step on `replica` finished; `results[i]` answers entry `i` of that step (its
    /// [`StepEntries`](super::StepEntries) order: decode entries, then prefill ones). Calls
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
        let rep = &mut self.replicas[replica];
        let block_tokens = rep.block_size.tokens();
        rep.clock = rep.clock.wrapping_add(1);
        // The residue of the decode entries whose token starts a new KV block (context 1
        // modulo `block_tokens`): every generating context moved on by one, so it moves
        // back by one.
        let crossing_residue = if CACHING {
            rep.crossing = match rep.crossing {
                0 => block_tokens - 1,
                r => r - 1,
            };
            rep.crossing
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
            let n_crossing = rep.cross[r] - skipped_crossing;
            if n_crossing > 0 {
                let cache = rep.cache.as_mut().expect("caching");
                if cache.blank_free() >= n_crossing {
                    cache.reserve_blank(n_crossing);
                } else {
                    cross_one_by_one = true;
                    for w in 0..rep.step_bits.len() {
                        let mut bits = rep.step_bits[w] & rep.generating[w];
                        while bits != 0 {
                            let i = w * 64 + bits.trailing_zeros() as usize;
                            bits &= bits - 1;
                            if rep.slot_blocks[i].residue as usize == r {
                                rep.due_bits[w] |= 1u64 << (i % 64);
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
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let result = if ended >> (i % 64) & 1 == 1 {
                    rep.end_result[i]
                } else {
                    EntryResult::Continue
                };
                // Every slot here decoded in the step (a skipped one's due moved on with it):
                // taken one by one, the ones on the crossing residue take their block.
                debug_assert!((rep.step_bits[w] & rep.generating[w]) >> (i % 64) & 1 == 1);
                if CACHING && cross_one_by_one && rep.slot_blocks[i].residue == crossing_residue {
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
                    let bs = rep.block_size;
                    grow_prefill(cache, slot, generated, tokens, sb, blocks, bs);
                }
            }
            if last {
                rep.wheel_file(i);
                if CACHING {
                    // Its context: the prompt and its first output token.
                    let r = rep.residue_at(rep.slots[i].prefilled + 1);
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
}
