//! Models worker shutdown and drain: the `stop` flag, the batch ring and the doorbell.
//!
//! The worker loop below mirrors `WorkerThread::run` (pop and handle; exit only when `stop`
//! is set AND the ring is empty; otherwise wait with `has_work` = "ring non-empty or stop
//! set"); keep the two in step. The real loop cannot run under loom as is (it takes an
//! executor and a wall-clock idler), so the ring and doorbell here are the production
//! types and the loop is a copy. The engine pushes a batch, sets `stop` (Release), and then
//! wakes the worker once, either through the doorbell or, as `runtime::start` does when the
//! engine exits, by unparking the thread. What must hold: the worker handles the batch
//! (nothing lost at shutdown) and then exits (the join returns; a missed wake-up would be a
//! loom deadlock).
#![cfg(loom)]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::ring::{ring, Consumer};
use abe::runtime::sync::{Arc, AtomicBool, Ordering};
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Ring capacity under loom: the smallest the ring allows.
const CAPACITY: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// The one batch the engine sends before stopping.
const BATCH: u32 = 7;

/// The worker's loop: returns every batch it handled, once `stop` is set and the ring is
/// drained.
fn worker_loop(mut batches: Consumer<u32>, bell: &Doorbell, stop: &AtomicBool) -> Vec<u32> {
    bell.bind_current();
    let mut handled = Vec::with_capacity(CAPACITY);
    loop {
        if let Some(batch) = batches.pop() {
            handled.push(batch);
            continue;
        }
        // Acquire: pairs with the engine's Release store, so every batch pushed before
        // `stop` is visible to the `is_empty` check that follows.
        if stop.load(Ordering::Acquire) && batches.is_empty() {
            return handled;
        }
        bell.wait(WAIT_TIMEOUT, || {
            !batches.is_empty() || stop.load(Ordering::Acquire)
        });
    }
}

/// How the engine wakes the worker after setting `stop`.
#[derive(Clone, Copy)]
enum Wake {
    /// `Doorbell::ring`, the normal path.
    Doorbell,
    /// `JoinHandle::thread().unpark()`, as `runtime::start` does when the engine exits.
    Unpark,
}

fn stop_after_one_batch(wake: Wake) {
    model(move || {
        let bell = Arc::new(Doorbell::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (mut tx, rx) = ring::<u32>(CAPACITY);

        let worker = {
            let bell = bell.clone();
            let stop = stop.clone();
            thread::spawn(move || worker_loop(rx, &bell, &stop))
        };

        assert!(tx.push(BATCH).is_ok(), "batch ring full");
        // Release: the push above happens before a worker that sees `stop`.
        stop.store(true, Ordering::Release);
        // A single wake-up has to cover both the batch and the stop.
        match wake {
            Wake::Doorbell => bell.ring(),
            Wake::Unpark => worker.thread().unpark(),
        }

        let handled = worker.join().unwrap();
        assert_eq!(handled, [BATCH], "batch lost or duplicated at shutdown");
    });
}

#[test]
fn stop_with_a_doorbell_ring_drains_the_batch_and_exits() {
    stop_after_one_batch(Wake::Doorbell);
}

#[test]
fn stop_with_a_direct_unpark_drains_the_batch_and_exits() {
    stop_after_one_batch(Wake::Unpark);
}
