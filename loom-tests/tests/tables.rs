//! Models the routing-table hand-off (`runtime::tables::TablesMailbox`): the control plane
//! offers tables, sends the engine a message (an atomic flag here; the runtime's control
//! queue) and waits for the answer, or gives up and withdraws; the engine answers whatever
//! hand-off waits when a message comes. What must hold: an answer the control plane reads
//! is the one the engine gave for that very hand-off (the refusing slot is never read
//! stale), a withdrawn hand-off is never answered, and a hand-off the engine took is never
//! also withdrawn (the control plane cannot report a failure the engine did not have).
#![cfg(feature = "loom")]

use abe::runtime::sync::{Arc, AtomicBool, Ordering};
use abe::runtime::tables::{TablesAnswer, TablesMailbox};
use loom::thread;
use loom_tests::model;

/// The engine's side: waits for a message, then answers. Refuses tables numbered 2 with
/// slot 5; takes the rest, marking them swapped.
fn engine(mailbox: Arc<TablesMailbox<u32>>, message: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !message.swap(false, Ordering::Acquire) {
            thread::yield_now();
        }
        mailbox.answer(|t| {
            if *t == 2 {
                Err(5)
            } else {
                *t += 100;
                Ok(())
            }
        });
    })
}

#[test]
fn the_answer_read_is_the_one_given_for_that_hand_off() {
    for (tables, expected) in [(1, TablesAnswer::Taken), (2, TablesAnswer::Refused(5))] {
        model(move || {
            let mailbox = Arc::new(TablesMailbox::<u32>::default());
            let message = Arc::new(AtomicBool::new(false));
            let engine = engine(mailbox.clone(), message.clone());
            let generation = mailbox.offer(Box::new(tables)).unwrap();
            message.store(true, Ordering::Release);
            let answer = loop {
                if let Some(a) = mailbox.answer_for(generation) {
                    break a;
                }
                thread::yield_now();
            };
            assert_eq!(answer, expected);
            assert_eq!(mailbox.retired_len(), 1, "the swapped-out tables come back");
            engine.join().unwrap();
        });
    }
}

#[test]
fn a_withdrawn_hand_off_is_never_answered_and_a_taken_one_never_withdrawn() {
    model(|| {
        let mailbox = Arc::new(TablesMailbox::<u32>::default());
        let message = Arc::new(AtomicBool::new(false));
        let engine = engine(mailbox.clone(), message.clone());
        let generation = mailbox.offer(Box::new(1)).unwrap();
        message.store(true, Ordering::Release);
        // The control plane gives up at once (its timeout), racing the engine.
        if mailbox.withdraw(generation) {
            engine.join().unwrap();
            assert_eq!(
                mailbox.answer_for(generation),
                None,
                "withdrawn, yet answered"
            );
            assert_eq!(mailbox.retired_len(), 0, "withdrawn, yet swapped");
        } else {
            let answer = loop {
                if let Some(a) = mailbox.answer_for(generation) {
                    break a;
                }
                thread::yield_now();
            };
            assert_eq!(answer, TablesAnswer::Taken);
            engine.join().unwrap();
            assert_eq!(mailbox.retired_len(), 1);
        }
    });
}
