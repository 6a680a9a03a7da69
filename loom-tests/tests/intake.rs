//! Models a submitter's intake (`runtime::intake`): a ring per class and the ready bitmask
//! the engine swaps once per turn instead of looking at every ring.
//!
//! The submitter pushes into two classes (bit set after each push, Release) and rings the
//! engine's doorbell; the engine takes the mask (Acquire swap), pops the unread classes
//! lowest first, forgets a class only when its ring is found empty, and sleeps through
//! `Doorbell::wait` with `IntakeRx::any` as its re-check, as `EngineIo::has_work` does.
//! What must hold: no item is lost (a bit cleared by the swap while its push is unread
//! would strand it: the engine would sleep, a deadlock here), none is popped twice, and
//! each class comes out in push order.
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::intake::intake;
use abe::runtime::sync::Arc;
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Classes in the model (the runtime has one per priority x token bucket).
const CLASSES: usize = 2;
/// Ring capacity per class: the smallest the ring allows.
const CAPACITY: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// What the submitter pushes, in order: (class, item). Class 1 twice, so one class sees a
/// second push after the engine may already have taken (and cleared) its bit.
const PUSHES: [(usize, u32); 3] = [(1, 10), (0, 20), (1, 11)];

#[test]
fn every_push_is_popped_once_in_class_order() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let (mut tx, mut rx) = intake::<u32>(CLASSES, CAPACITY);
        bell.bind_current();

        let submitter = {
            let bell = bell.clone();
            thread::spawn(move || {
                for (class, item) in PUSHES {
                    assert!(tx.push(class, item).is_ok(), "ring full below capacity");
                    bell.ring();
                }
            })
        };

        let mut popped = Vec::with_capacity(PUSHES.len());
        while popped.len() < PUSHES.len() {
            rx.take_ready();
            let mut any = false;
            while let Some(item) = rx.pop(!0) {
                popped.push(item);
                any = true;
            }
            if !any {
                bell.wait(WAIT_TIMEOUT, || rx.any());
            }
        }
        submitter.join().unwrap();

        rx.take_ready();
        assert_eq!(
            rx.pop(!0),
            None,
            "an item popped twice or pushed from nowhere"
        );
        assert!(
            !rx.any(),
            "the mask still shows work after everything was popped"
        );
        let class_1: Vec<u32> = popped.iter().copied().filter(|&i| i < 20).collect();
        assert_eq!(
            class_1,
            [10, 11],
            "class 1 out of order or an item lost/duplicated"
        );
        assert_eq!(
            popped.iter().filter(|&&i| i == 20).count(),
            1,
            "class 0 item"
        );
    });
}
