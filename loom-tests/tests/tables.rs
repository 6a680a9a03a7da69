//! Models the routing-table hand-off (`runtime::tables::TablesMailbox`): the control plane
//! offers tables and wakes the engine (spawning it stands for the control message here);
//! the engine answers whatever hand-off waits; the control plane reads the answer while
//! the engine may still be writing it. What must hold: an answer the control plane reads
//! is the one the engine gave for that very hand-off (the refusing slot is never read
//! stale) and comes after the old tables were put back. No spinning: loom would explore
//! every turn of a spin loop.
//!
//! Not modelled: a withdraw racing the engine's take. Both are pops of one crossbeam
//! `ArrayQueue`, which loom cannot see (it would explore one execution); the queue's own
//! guarantee (each element popped once) is what makes it exact, and the unit tests in
//! `runtime::tables` check the sequences.
#![cfg(feature = "loom")]

use abe::runtime::sync::Arc;
use abe::runtime::tables::{TablesAnswer, TablesMailbox};
use loom::thread;
use loom_tests::model;

/// The engine's side, on a control message: refuses tables numbered 2 with slot 5, takes
/// the rest (marking them swapped).
fn engine(mailbox: Arc<TablesMailbox<u32>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        mailbox.answer(|t| {
            if *t == 2 {
                Err(5)
            } else {
                *t += 100;
                Ok(())
            }
        })
    })
}

#[test]
fn the_answer_read_is_the_one_given_for_that_hand_off() {
    for (tables, expected) in [(1, TablesAnswer::Taken), (2, TablesAnswer::Refused(5))] {
        model(move || {
            let mailbox = Arc::new(TablesMailbox::<u32>::default());
            let generation = mailbox.offer(Box::new(tables)).unwrap();
            let engine = engine(mailbox.clone());
            // Read while the engine may be mid-answer: nothing yet, or the whole answer.
            if let Some(early) = mailbox.answer_for(generation) {
                assert_eq!(early, expected, "an answer read half-written");
                assert_eq!(
                    mailbox.retired_len(),
                    1,
                    "answered before the swap was put back"
                );
            }
            engine.join().unwrap();
            assert_eq!(mailbox.answer_for(generation), Some(expected));
            assert_eq!(mailbox.retired_len(), 1, "the swapped-out tables come back");
        });
    }
}
