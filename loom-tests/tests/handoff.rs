//! Models the engine/worker batch hand-off as the runtime wires it (`runtime::mod::start`,
//! `runtime::worker`): a batch ring and a result ring of equal capacity, one doorbell per
//! side.
//!
//! The engine (the model's main thread) moves pre-allocated batch buffers to the worker
//! through the batch ring and rings the worker's doorbell; the worker fills each buffer in
//! place, pushes it onto the result ring (which cannot be full: the engine never has more
//! than `capacity` batches out) and rings the engine's doorbell. Both sides wait only
//! through `Doorbell::wait`. What must hold: neither side sleeps through a hand-off, every
//! batch comes back exactly once, filled, in the same buffer it left in.
//!
//! Passes at preemption bound 3 (the test command's bound) since `Doorbell::ring` clears
//! `sleeping` with a compare-exchange rather than a swap (loom's RMW-atomicity bug,
//! tokio-rs/loom#254; see `doorbell.rs`).
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::ring::ring;
use abe::runtime::sync::Arc;
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Capacity of both rings, as in the runtime (`per_worker` for each).
const CAPACITY: usize = 2;
/// Batches the engine has out at once; at most `CAPACITY`, the runtime's invariant.
const BATCHES: usize = 2;
/// Items in each batch buffer.
const ITEMS_PER_BATCH: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);

const _: () = assert!(BATCHES <= CAPACITY, "the result ring could fill up");

/// A batch buffer: allocated by the engine up front, filled by the worker in place.
struct Batch {
    id: usize,
    items: Vec<u32>,
}

/// What the worker writes into slot `slot` of batch `id` (distinct for every batch/slot).
fn filled(id: usize, slot: usize) -> u32 {
    u32::try_from(id * 10 + slot).expect("tiny model values fit in u32")
}

#[test]
fn every_batch_comes_back_exactly_once_filled() {
    model(|| {
        let engine_bell = Arc::new(Doorbell::new());
        let worker_bell = Arc::new(Doorbell::new());
        let (mut batch_tx, mut batch_rx) = ring::<Batch>(CAPACITY);
        let (mut result_tx, mut result_rx) = ring::<Batch>(CAPACITY);
        // The engine binds its doorbell before any worker could ring it (as `Engine::run`).
        engine_bell.bind_current();

        let worker = {
            let engine_bell = engine_bell.clone();
            let worker_bell = worker_bell.clone();
            thread::spawn(move || {
                worker_bell.bind_current();
                let mut handled = 0;
                while handled < BATCHES {
                    match batch_rx.pop() {
                        Some(mut batch) => {
                            assert!(batch.items.is_empty(), "batch {} arrived filled", batch.id);
                            for slot in 0..ITEMS_PER_BATCH {
                                batch.items.push(filled(batch.id, slot));
                            }
                            assert!(
                                result_tx.push(batch).is_ok(),
                                "result ring full: engine had more than {CAPACITY} out"
                            );
                            engine_bell.ring();
                            handled += 1;
                        }
                        None => worker_bell.wait(WAIT_TIMEOUT, || !batch_rx.is_empty()),
                    }
                }
                assert!(
                    batch_rx.pop().is_none(),
                    "worker got more batches than sent"
                );
            })
        };

        // Engine: buffers allocated before the hand-off; remember each allocation so we can
        // check the same buffer comes back (moved, never copied or re-allocated).
        let mut buffer_addrs = [0usize; BATCHES];
        for (id, addr) in buffer_addrs.iter_mut().enumerate() {
            let items = Vec::with_capacity(ITEMS_PER_BATCH);
            *addr = items.as_ptr() as usize;
            assert!(
                batch_tx.push(Batch { id, items }).is_ok(),
                "batch ring full"
            );
            worker_bell.ring();
        }

        let mut returned = [0usize; BATCHES];
        let mut received = 0;
        while received < BATCHES {
            match result_rx.pop() {
                Some(batch) => {
                    let expected: Vec<u32> =
                        (0..ITEMS_PER_BATCH).map(|s| filled(batch.id, s)).collect();
                    assert_eq!(batch.items, expected, "batch {} not filled", batch.id);
                    assert_eq!(
                        batch.items.as_ptr() as usize,
                        buffer_addrs[batch.id],
                        "batch {} came back in another buffer",
                        batch.id
                    );
                    returned[batch.id] += 1;
                    received += 1;
                }
                None => engine_bell.wait(WAIT_TIMEOUT, || !result_rx.is_empty()),
            }
        }

        worker.join().unwrap();
        assert!(result_rx.pop().is_none(), "a batch came back twice");
        assert_eq!(
            returned, [1; BATCHES],
            "each batch must come back exactly once"
        );
    });
}
