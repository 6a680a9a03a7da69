//! The hand-off of routing tables (`router::tables`) from the control plane to the engine:
//! the control plane builds an [`EngineTables`] off the engine thread, [`offer`]s it (the
//! mailbox tags it with a new generation) and sends `Control::SwapTables`; the engine, on
//! any such message, [`answer`]s: it swaps in whatever hand-off waits (moves only), puts the
//! old tables in the `retired` queue for the control plane to drop, and publishes the
//! hand-off's own generation with "taken" or "refused" (a slot whose backend would change
//! still holds requests). The control plane waits for that answer before it shows the new
//! tables to the io threads, so an io thread never hands the engine an id its tables do not
//! have. A control plane that gives up waiting [`withdraw`]s the hand-off; if the engine
//! already took it, the answer is on its way and the control plane waits for it instead of
//! reporting a failure the engine did not have. Answering by the hand-off's generation, not
//! the message's, keeps a message left over from a withdrawn hand-off harmless: it answers
//! whatever waits, under that hand-off's own generation, or nothing.
//!
//! Generic over what is handed off so `loom-tests/` models the protocol with small values;
//! the runtime hands off [`EngineTables`].
//!
//! What must never happen here: the engine allocating or blocking (it pops and pushes
//! bounded lock-free queues and stores two atomics), or a second hand-off before the first
//! was answered or withdrawn (the control plane serialises them, and the queue of one
//! refuses it).
//!
//! [`offer`]: TablesMailbox::offer
//! [`answer`]: TablesMailbox::answer
//! [`withdraw`]: TablesMailbox::withdraw

use super::sync::{AtomicU64, Ordering};
use crate::router::{BackendKind, ModelId, RouteTables};
use crossbeam_queue::ArrayQueue;
use std::sync::Arc;

/// Everything the engine swaps at once: the router's tables and the engine's own tables
/// by model and by backend that follow from them.
#[derive(Debug)]
pub struct EngineTables {
    pub router: RouteTables,
    /// Served model names by `ModelId` (what `Work::model` carries).
    pub model_names: Vec<Arc<str>>,
    /// By backend: its executor reads `Work::model` (an upstream backend).
    pub wants_model: Vec<bool>,
}

impl EngineTables {
    /// The engine's tables for `router` (allocates: off the engine thread).
    pub fn new(router: RouteTables) -> EngineTables {
        let registry = router.registry();
        EngineTables {
            model_names: (0..registry.model_count())
                .map(|m| Arc::from(registry.model_name(ModelId::from_index(m))))
                .collect(),
            wants_model: registry
                .backends()
                .map(|(_, b)| matches!(b.kind(), BackendKind::Upstream { .. }))
                .collect(),
            router,
        }
    }
}

/// The engine's answer to one hand-off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TablesAnswer {
    Taken,
    /// Slot `0` (a `BackendId` index) still held requests; nothing changed.
    Refused(usize),
}

/// Where tables wait for the engine, and its answers. See the module doc.
#[derive(Debug)]
pub struct TablesMailbox<T = EngineTables> {
    /// At most one hand-off waiting, with its generation.
    next: ArrayQueue<(u64, Box<T>)>,
    /// The tables the engine swapped out (or refused), for the control plane to drop.
    retired: ArrayQueue<Box<T>>,
    /// Generations handed out so far (the control plane's side).
    generation: AtomicU64,
    /// The last generation the engine answered. Stored after `refused`, with Release; the
    /// control plane loads it with Acquire, then reads `refused`.
    answered: AtomicU64,
    /// The slot that refused the last answered generation, `u64::MAX` when it was taken.
    refused: AtomicU64,
}

impl<T> Default for TablesMailbox<T> {
    fn default() -> Self {
        TablesMailbox {
            next: ArrayQueue::new(1),
            retired: ArrayQueue::new(2),
            generation: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            refused: AtomicU64::new(u64::MAX),
        }
    }
}

impl<T> TablesMailbox<T> {
    /// The control plane's side: drops the tables retired so far and leaves `tables` for
    /// the engine under a new generation, returned; `Err(tables)` when a hand-off already
    /// waits (callers serialise, so only after a failure to withdraw).
    pub fn offer(&self, tables: Box<T>) -> Result<u64, Box<T>> {
        self.drop_retired();
        // Relaxed: a counter only the (serialised) control plane moves.
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.next
            .push((generation, tables))
            .map(|()| generation)
            .map_err(|(_, t)| t)
    }

    /// The control plane gives up on `generation`: true if it was still waiting (the engine
    /// never saw it and never will), false if the engine took it (its answer follows).
    pub fn withdraw(&self, generation: u64) -> bool {
        match self.next.pop() {
            Some((g, _)) if g == generation => true,
            // Only one hand-off waits at a time, and only this caller offers.
            Some((g, tables)) => {
                debug_assert!(false, "withdrew generation {g}, not {generation}");
                drop(tables);
                false
            }
            None => false,
        }
    }

    /// Drops the tables the engine retired (control plane; frees, off the engine thread).
    pub fn drop_retired(&self) {
        while self.retired.pop().is_some() {}
    }

    /// The engine's side of a `Control::SwapTables`: `swap` takes the waiting tables (leaving
    /// the old ones in their place) or refuses them, and the answer is published under the
    /// hand-off's generation. Nothing waiting (a message left from a withdrawn hand-off):
    /// nothing to do.
    pub fn answer(&self, swap: impl FnOnce(&mut T) -> Result<(), usize>) {
        let Some((generation, mut tables)) = self.next.pop() else {
            return;
        };
        let refused = swap(&mut tables).err();
        // Full only if the control plane stopped dropping old tables: then they are freed
        // here (a free, not an allocation).
        let _ = self.retired.push(tables);
        // Relaxed: published by the Release store of `answered` just below.
        self.refused
            .store(refused.map_or(u64::MAX, |b| b as u64), Ordering::Relaxed);
        // Release: the control plane that sees this generation sees `refused` and the
        // tables in `retired`.
        self.answered.store(generation, Ordering::Release);
    }

    /// The answer for `generation`, once the engine gave it.
    pub fn answer_for(&self, generation: u64) -> Option<TablesAnswer> {
        // Acquire: pairs with the Release store in `answer`.
        if self.answered.load(Ordering::Acquire) < generation {
            return None;
        }
        Some(match self.refused.load(Ordering::Relaxed) {
            u64::MAX => TablesAnswer::Taken,
            b => TablesAnswer::Refused(b as usize),
        })
    }

    /// Tables retired and not yet dropped (tests).
    pub fn retired_len(&self) -> usize {
        self.retired.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::{BackendConfig, Router, RoutingConfig};
    use std::collections::BTreeMap;

    fn tables() -> Box<EngineTables> {
        let backends = [BackendConfig::default_sim("m", 100)];
        let (r, _) = Router::build(&backends, &RoutingConfig::default(), 1).unwrap();
        let t = r
            .next_tables(&backends, &BTreeMap::new(), &BTreeMap::new())
            .unwrap();
        Box::new(EngineTables::new(t))
    }

    #[test]
    fn each_generation_is_answered_taken_or_refused_and_the_old_tables_come_back() {
        let mailbox: TablesMailbox = TablesMailbox::default();
        assert_eq!(mailbox.answer_for(1), None, "not answered yet");
        assert_eq!(mailbox.offer(tables()).unwrap(), 1);
        assert!(mailbox.offer(tables()).is_err(), "one hand-off at a time");
        let mut saw = 0;
        mailbox.answer(|t| {
            saw = t.model_names.len();
            Ok(())
        });
        assert_eq!(saw, 1);
        assert_eq!(mailbox.answer_for(1), Some(TablesAnswer::Taken));
        assert_eq!(mailbox.retired_len(), 1, "for the control plane to drop");
        let g = mailbox.offer(tables()).unwrap();
        assert_eq!(mailbox.retired_len(), 0, "an offer drops what was retired");
        mailbox.answer(|_| Err(3));
        assert_eq!(mailbox.answer_for(g), Some(TablesAnswer::Refused(3)));
        assert_eq!(mailbox.retired_len(), 1);
    }

    #[test]
    fn a_withdrawn_hand_off_is_never_answered_and_its_leftover_message_answers_the_next() {
        let mailbox: TablesMailbox<u32> = TablesMailbox::default();
        let g1 = mailbox.offer(Box::new(1)).unwrap();
        assert!(mailbox.withdraw(g1), "still waiting: withdrawn");
        let g2 = mailbox.offer(Box::new(2)).unwrap();
        // The engine reads g1's message first: it answers g2's hand-off, under g2.
        let mut saw = 0;
        mailbox.answer(|t| {
            saw = *t;
            Err(7)
        });
        assert_eq!(saw, 2);
        assert_eq!(mailbox.answer_for(g2), Some(TablesAnswer::Refused(7)));
        // g2's own message then finds nothing waiting: the answer stands.
        mailbox.answer(|_| Ok(()));
        assert_eq!(mailbox.answer_for(g2), Some(TablesAnswer::Refused(7)));
        assert!(!mailbox.withdraw(g2), "taken: not withdrawn");
    }
}
