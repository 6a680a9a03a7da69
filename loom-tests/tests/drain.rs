//! Models the submit/drain handshake (`runtime::gate`, `runtime::intake::submit`,
//! `intake::drained`): a submitter racing `Handle::shutdown` and the engine's drain exit.
//!
//! The submitter submits two requests through the real `intake::submit` (enter the gate,
//! push if open, leave, ring). The main thread is the shutdown and then the draining
//! engine: it closes the gate, then drains the intake until the real exit check
//! (`intake::drained`: gate closed and empty, then every ring empty) passes, sleeping
//! through `Doorbell::wait` with the engine's re-check (a ring has work, or the gate has
//! emptied). What must hold: every submission the gate let in is popped (answered) before
//! the engine exits, none twice, and the rest were refused as shutting down; the engine
//! never sleeps through the last submitter leaving (that would be a deadlock here).
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::gate::Gate;
use abe::runtime::intake::{self, intake, Refused};
use abe::runtime::sync::Arc;
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Classes in the model.
const CLASSES: usize = 2;
/// Ring capacity per class: the smallest the ring allows (never full here).
const CAPACITY: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// The submitter's requests: (class, id).
const REQUESTS: [(usize, u32); 2] = [(0, 1), (1, 2)];

#[test]
fn a_submission_let_in_is_answered_before_the_drain_exits() {
    model(|| {
        let gate = Arc::new(Gate::new());
        let bell = Arc::new(Doorbell::new());
        let (mut tx, mut rx) = intake::<u32>(CLASSES, CAPACITY);
        bell.bind_current();

        let submitter = {
            let (gate, bell) = (gate.clone(), bell.clone());
            thread::spawn(move || {
                let mut let_in = Vec::with_capacity(REQUESTS.len());
                for (class, id) in REQUESTS {
                    match intake::submit(&gate, &bell, &mut tx, || (class, id)) {
                        Ok(()) => let_in.push(id),
                        Err(Refused::Closed) => {}
                        Err(Refused::Full) => panic!("ring full below capacity"),
                    }
                }
                let_in
            })
        };

        // `Handle::shutdown`, then the engine's drain (the engine is idle otherwise, so it
        // is "finished" and waits only on the intake).
        gate.close();
        let mut answered = Vec::with_capacity(REQUESTS.len());
        loop {
            rx.take_ready();
            while let Some(id) = rx.pop(!0) {
                answered.push(id);
            }
            if intake::drained(&gate, [&rx]) {
                break;
            }
            bell.wait(WAIT_TIMEOUT, || rx.any() || gate.is_closed_and_empty());
        }

        let let_in = submitter.join().unwrap();
        rx.take_ready();
        assert_eq!(
            rx.pop(!0),
            None,
            "a submission left in a ring after the drain"
        );
        answered.sort_unstable();
        assert_eq!(answered, let_in, "a submission lost or answered twice");
        assert!(gate.enter().is_none(), "the gate reopened");
    });
}
