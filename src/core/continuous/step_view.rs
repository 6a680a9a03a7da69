//! The running step as the driver sees it: [`StepAction`] (what `tick` asks the driver to
//! do) and [`StepEntries`], a borrowed view of a replica's step in flight whose decode
//! entries are made from the slots as they are read.
//!
//! Read-only: nothing here changes a replica, and nothing here allocates except
//! [`StepEntries::to_vec`] (tests and debugging).

use super::replica::{generated_at, Replica};
use super::step::{StepEntry, StepShape, StepWork};
use crate::core::request::Ticket;

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

/// The entries of one step: its decode entries (the slots of the replica's step bits, in
/// slot order, each made when read from the slot and the replica's clock) then its prefill
/// entries (stored). Valid while the step runs and its slots keep their requests; what a
/// driver hands to a worker is [`Self::iter`]'s copies.
#[derive(Clone, Copy)]
pub struct StepEntries<'a> {
    pub(super) rep: &'a Replica,
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
