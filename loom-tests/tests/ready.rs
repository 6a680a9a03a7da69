//! Models the engine's worker replies (`runtime::ready`): a ring per worker, one mask all
//! of them mark after a push, and an engine that takes the mask once per turn and pops only
//! the rings of the groups it took.
//!
//! Two workers push (worker 0 twice, so a push may come after the engine already took and
//! cleared its bit) and ring the engine's doorbell, as `WorkerThread::step` does; the engine
//! takes the mask (Acquire swap) and pops every ring of each group taken until empty through
//! `ready::pop_marked`, the walk `Engine::drain_replies` makes, and
//! sleeps through `Doorbell::wait` with `ReadyMask::any` as its re-check, as
//! `EngineIo::has_work` does; the engine is a thread of its own, as in abe. (Rings sharing
//! a group, index `i` and `i + 64`, are a plain index walk, unit-tested in
//! `runtime::ready`.) What must hold: no reply is lost (a push whose bit the engine missed
//! while sleeping would strand it: a deadlock under loom), none is popped twice, and each
//! ring keeps its order.
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::ready::{pop_marked, MarkedProducer, ReadyMask};
use abe::runtime::ring::ring;
use abe::runtime::sync::Arc;
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Ring capacity: the smallest the ring allows.
const CAPACITY: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// What each worker pushes, in order.
const PUSHES: [&[u32]; 2] = [&[10, 11], &[20]];

#[test]
fn every_reply_is_popped_once_in_ring_order() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let mask = Arc::new(ReadyMask::new());
        let mut rings = Vec::new();
        let mut workers = Vec::new();
        for (w, items) in PUSHES.iter().enumerate() {
            let (tx, rx) = ring::<u32>(CAPACITY);
            rings.push(rx);
            let mut tx = MarkedProducer::new(tx, mask.clone(), w);
            let bell = bell.clone();
            workers.push(thread::spawn(move || {
                for &item in items.iter() {
                    assert!(tx.push(item).is_ok(), "ring full below capacity");
                    bell.ring();
                }
            }));
        }

        // The engine is a thread of its own, as in abe: a worker's late ring unparks it
        // (or finds it gone), never the thread joining the others (loom's join does not
        // expect an unpark).
        let total: usize = PUSHES.iter().map(|p| p.len()).sum();
        let engine = thread::spawn(move || {
            bell.bind_current();
            let mut popped = Vec::with_capacity(total);
            while popped.len() < total {
                let any = pop_marked(mask.take(), rings.len(), |w| {
                    let mut any = false;
                    while let Some(item) = rings[w].pop() {
                        popped.push(item);
                        any = true;
                    }
                    any
                });
                if !any && popped.len() < total {
                    bell.wait(WAIT_TIMEOUT, || mask.any());
                }
            }
            (popped, rings)
        });
        for w in workers {
            w.join().unwrap();
        }
        let (popped, mut rings) = engine.join().unwrap();

        for r in rings.iter_mut() {
            assert_eq!(r.pop(), None, "a reply popped twice or pushed from nowhere");
        }
        let ring_0: Vec<u32> = popped.iter().copied().filter(|&i| i < 20).collect();
        assert_eq!(
            ring_0,
            [10, 11],
            "ring 0 out of order, or a reply lost/duplicated"
        );
        assert_eq!(
            popped.iter().filter(|&&i| i == 20).count(),
            1,
            "ring 1's reply"
        );
    });
}
