//! The hand-off of routing tables (`router::tables`) from the control plane to the engine:
//! the control plane builds an [`EngineTables`] off the engine thread, puts it in the
//! [`TablesMailbox`] and sends `Control::SwapTables`; the engine swaps it in between two
//! turns (moves only), puts the old tables in the mailbox's `retired` queue for the control
//! plane to drop, and says by generation whether it took them or refused them (a slot
//! whose backend would change still holds requests). The control plane waits for that
//! answer before it shows the new tables to the io threads, so an io thread never hands
//! the engine an id its tables do not have.
//!
//! What must never happen here: the engine allocating or blocking (it pops and pushes
//! bounded lock-free queues and stores two atomics), or a second hand-off before the first
//! was answered (the control plane serialises them, and the queue of one refuses it).

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
pub struct TablesMailbox {
    /// At most one hand-off waiting.
    pub(crate) next: ArrayQueue<Box<EngineTables>>,
    /// The tables the engine swapped out (or refused), for the control plane to drop.
    pub(crate) retired: ArrayQueue<Box<EngineTables>>,
    /// Generations handed out so far (the control plane's side).
    pub(crate) generation: AtomicU64,
    /// The last generation the engine answered. Stored after `refused`, with Release; the
    /// control plane loads it with Acquire, then reads `refused`.
    pub(crate) answered: AtomicU64,
    /// The slot that refused the last answered generation, `u64::MAX` when it was taken.
    pub(crate) refused: AtomicU64,
}

impl Default for TablesMailbox {
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

impl TablesMailbox {
    /// The engine's side of `Control::SwapTables { generation }`: `swap` takes the waiting
    /// tables (leaving the old ones in their place) or refuses them.
    pub(crate) fn answer(
        &self,
        generation: u64,
        swap: impl FnOnce(&mut EngineTables) -> Result<(), usize>,
    ) {
        let refused = match self.next.pop() {
            Some(mut tables) => {
                let r = swap(&mut tables);
                // Full only if the control plane stopped dropping old tables: then they
                // are freed here (a free, not an allocation).
                let _ = self.retired.push(tables);
                r.err()
            }
            None => None,
        };
        // Relaxed: published by the Release store of `answered` just below.
        self.refused
            .store(refused.map_or(u64::MAX, |b| b as u64), Ordering::Relaxed);
        // Release: the control plane that sees this generation sees `refused` and the
        // tables in `retired`.
        self.answered.store(generation, Ordering::Release);
    }

    /// The answer for `generation`, once the engine gave it.
    pub(crate) fn answer_for(&self, generation: u64) -> Option<TablesAnswer> {
        // Acquire: pairs with the Release store in `answer`.
        if self.answered.load(Ordering::Acquire) < generation {
            return None;
        }
        Some(match self.refused.load(Ordering::Relaxed) {
            u64::MAX => TablesAnswer::Taken,
            b => TablesAnswer::Refused(b as usize),
        })
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
        let mailbox = TablesMailbox::default();
        assert_eq!(mailbox.answer_for(1), None, "not answered yet");
        mailbox.next.push(tables()).unwrap();
        assert!(
            mailbox.next.push(tables()).is_err(),
            "one hand-off at a time"
        );
        let mut saw = 0;
        mailbox.answer(1, |t| {
            saw = t.model_names.len();
            Ok(())
        });
        assert_eq!(saw, 1);
        assert_eq!(mailbox.answer_for(1), Some(TablesAnswer::Taken));
        assert_eq!(mailbox.retired.len(), 1, "for the control plane to drop");
        mailbox.next.push(tables()).unwrap();
        mailbox.answer(2, |_| Err(3));
        assert_eq!(mailbox.answer_for(2), Some(TablesAnswer::Refused(3)));
        assert_eq!(mailbox.retired.len(), 2);
        assert!(mailbox.next.is_empty());
    }
}
