//! Direct replies (request-level batching): a worker answers the requests of a batch it
//! served straight to each request's submitter ([`ReplyLane`]), instead of handing the
//! outputs to the engine for the engine to send on. The engine still gets the batch back and
//! keeps the books (its core's completion, latency and token counts, the submitter's live
//! count); it sends nothing for a request a worker answered. One hand-off and one wake-up
//! fewer per request (BENCHMARKS.md, "Direct replies").
//!
//! Which requests: those the engine marked at dispatch ([`DirectBatch::targets`]): tagged,
//! not streaming (a stream's tokens go through the engine and must come before its final
//! answer). Everything else in the batch goes through the engine as before.
//!
//! The claim. The engine may answer a batch's requests while the worker still holds it
//! (batch timeout, abort at the shutdown deadline). A cell per batch slot of the core
//! ([`BatchClaims`]) decides who answers: set to `OPEN` at dispatch, then exactly one
//! compare-exchange wins, the worker's (`OPEN -> WORKER`, [`deliver`]) or the engine's
//! (`OPEN -> ENGINE`, [`BatchClaims::claim_for_engine`]).
//! - The worker claims only when it can answer every target with an output: the batch
//!   succeeded and no target failed alone. Otherwise it claims nothing and the engine
//!   answers the whole batch, retries included, as without direct replies.
//! - Claimed by the worker: it answers every target, marks each item `answered` (with the
//!   output's token counts for the engine's books) and then returns the batch.
//! - Claimed by the engine (it abandoned the batch): the worker answers nothing; the batch
//!   comes back stale, as before.
//!
//! A cell is reused only when its batch slot is, after the engine took the batch back, so
//! no worker can hold an old claim on it. `loom-tests/tests/direct_reply.rs` checks that
//! every request is answered exactly once and that the submitter never sleeps through an
//! answer, with the engine abandoning the batch while the worker finishes it.
//!
//! Never here: a lock, an allocation after the buffers are made, a push to the engine's
//! completion ring.

use super::messages::{Event, TaggedEvent};
use super::reply_lane::ReplyLane;
use super::sync::{AtomicU32, Ordering};
use crate::exec::{BatchItem, ExecError};
use crate::router::Decision;
use std::sync::Arc;

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
    fn claim_for_worker(&self, index: u32) -> bool {
        self.cells[index as usize]
            .compare_exchange(OPEN, WORKER, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

/// Where a worker sends one request's answer.
#[derive(Debug)]
pub struct DirectReply {
    /// The request's position in the batch's items.
    pub item: u32,
    pub lane: Arc<ReplyLane>,
    pub tag: u64,
    /// The routing decision the answer carries (as the engine's answer would).
    pub route: Option<Decision>,
}

/// A batch's direct replies: its claim cell and its targets. A buffer that circulates with
/// the batch (allocated once per batch slot); empty when no request of the batch is
/// answered directly.
#[derive(Debug)]
pub struct DirectBatch {
    pub claims: Option<Arc<BatchClaims>>,
    /// The batch's slot (its claim cell).
    pub index: u32,
    pub targets: Vec<DirectReply>,
}

impl DirectBatch {
    /// An empty buffer for up to `capacity` targets.
    pub fn with_capacity(capacity: usize) -> DirectBatch {
        DirectBatch {
            claims: None,
            index: 0,
            targets: Vec::with_capacity(capacity),
        }
    }
}

/// Worker, after running a batch: answers its targets straight to their submitters when it
/// can claim the batch (see the module docs), marking each answered item; wakes each
/// submitter it answered once. Leaves `direct` empty either way (its lane handles dropped
/// here, on the worker), ready to go back to the engine.
pub fn deliver(direct: &mut DirectBatch, items: &mut [BatchItem], result: &Result<(), ExecError>) {
    let Some(claims) = direct.claims.take() else {
        direct.targets.clear();
        return;
    };
    let answerable = result.is_ok()
        && direct.targets.iter().all(|t| {
            let item = &items[t.item as usize];
            item.error.is_none() && item.output.is_some()
        });
    if !answerable || !claims.claim_for_worker(direct.index) {
        direct.targets.clear();
        return;
    }
    for t in &direct.targets {
        let item = &mut items[t.item as usize];
        let output = item.output.take().expect("checked above");
        item.answered = Some(output.summary());
        t.lane.push(TaggedEvent {
            tag: t.tag,
            event: Event::Done(Ok(output)),
            route: t.route,
        });
    }
    // Once per submitter: a batch's requests mostly come from one or two io threads. A
    // lane beyond the few remembered is woken again, which costs it a fence and a load.
    let mut woken: [Option<&Arc<ReplyLane>>; 4] = [None; 4];
    for t in &direct.targets {
        if woken.iter().flatten().any(|l| Arc::ptr_eq(l, &t.lane)) {
            continue;
        }
        t.lane.wake();
        if let Some(free) = woken.iter_mut().find(|l| l.is_none()) {
            *free = Some(&t.lane);
        }
    }
    direct.targets.clear();
}
