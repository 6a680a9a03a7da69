//! The claim on a batch that decides who answers its requests when both could: the worker
//! that served it (direct replies, `runtime::direct_reply`) or the engine that abandoned it
//! (batch timeout, abort at the shutdown deadline).
//!
//! One cell per batch slot of a core (`core::BatchId`): set to `OPEN` by the engine at
//! dispatch, then exactly one compare-exchange wins, the worker's (`OPEN -> WORKER`) or the
//! engine's (`OPEN -> ENGINE`). A cell is reused only when its batch slot is, after the
//! engine took the batch back, so no worker can hold an old claim on it.
//! `loom-tests/tests/direct_reply.rs` checks the race. Nothing here may block or allocate
//! after [`BatchClaims::new`].

use super::sync::{AtomicU32, Ordering};

const OPEN: u32 = 0;
const WORKER: u32 = 1;
const ENGINE: u32 = 2;

/// One claim cell per batch slot of a core (`core::BatchId`).
#[derive(Debug)]
pub struct BatchClaims {
    cells: Box<[AtomicU32]>,
}

impl BatchClaims {
    /// Cells for `slots` batch slots.
    pub fn new(slots: usize) -> BatchClaims {
        BatchClaims {
            cells: (0..slots.max(1)).map(|_| AtomicU32::new(ENGINE)).collect(),
        }
    }

    /// Engine, at dispatch, before the batch goes out: nobody has answered batch slot
    /// `index` yet. Relaxed: the push of the batch into the worker's ring (Release)
    /// publishes it.
    pub fn open(&self, index: u32) {
        self.cells[index as usize].store(OPEN, Ordering::Relaxed);
    }

    /// Engine, when it is about to answer a request of batch slot `index` that the worker
    /// still holds (the batch was abandoned): true when the engine answers (it claimed the
    /// batch now or earlier), false when the worker claimed it first and answers (or has
    /// answered) every request it was sent a target for.
    pub fn claim_for_engine(&self, index: u32) -> bool {
        match self.cells[index as usize].compare_exchange(
            OPEN,
            ENGINE,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(state) => state == ENGINE,
        }
    }

    /// Worker: true when it may answer batch slot `index`'s targets.
    pub fn claim_for_worker(&self, index: u32) -> bool {
        self.cells[index as usize]
            .compare_exchange(OPEN, WORKER, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}
