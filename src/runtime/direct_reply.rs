//! Direct replies (request-level batching): a worker answers the requests of a batch it
//! served straight to each request's submitter ([`ReplyLane`]), instead of handing the
//! outputs to the engine for the engine to send on. The engine still gets the batch back and
//! keeps the books (its core's completion, latency and token counts, the submitter's live
//! count); it sends nothing for a request a worker answered. One hand-off and one wake-up
//! fewer per request (BENCHMARKS.md, "Direct replies").
//!
//! Which requests: those the engine marked at dispatch (`DirectBatch::targets`, in
//! `messages`): tagged, not streaming (a stream's tokens go through the engine and must come
//! before its final answer), from a submitter that sleeps (one with a wake: an io thread).
//! A submitter that polls has no wake-up to save, and for it the engine's send is cheaper
//! than the worker's push: with direct replies `runtime/pipelined_256` (one polling
//! submitter, one worker) was 17 % slower (BENCHMARKS.md, "Direct replies"). Everything else
//! in the batch goes through the engine as before.
//!
//! The claim. The engine may answer a batch's requests while the worker still holds it
//! (batch timeout, abort at the shutdown deadline). A claim cell per batch
//! (`runtime::batch_claim`) decides who answers: the worker ([`deliver`]) or the engine
//! (`BatchClaims::claim_for_engine`), whichever claims first.
//! - The worker claims only when it can answer every target with an output: the batch
//!   succeeded and no target failed alone. Otherwise it claims nothing and the engine
//!   answers the whole batch, retries included, as without direct replies.
//! - Claimed by the worker: it answers every target, marks each item `answered` (with the
//!   output's token counts for the engine's books) and then returns the batch.
//! - Claimed by the engine (it abandoned the batch): the worker answers nothing; the batch
//!   comes back stale, as before.
//!
//! `loom-tests/tests/direct_reply.rs` checks that
//! every request is answered exactly once and that the submitter never sleeps through an
//! answer, with the engine abandoning the batch while the worker finishes it.
//!
//! Never here: a lock, an allocation after the buffers are made, a push to the engine's
//! completion ring.

use super::messages::{DirectBatch, Event, TaggedEvent};
use super::reply_lane::ReplyLane;
use crate::core::Nanos;
use crate::exec::{BatchItem, ExecError};
use std::sync::Arc;

/// Worker, after running a batch: answers its targets straight to their submitters when it
/// can claim the batch (see the module docs), marking each answered item and stamping
/// `direct.answered_ns` with `now()` (the live worker reads the runtime's clock, a
/// simulation passes its virtual time; called only when the worker answers); wakes each
/// submitter it answered once. Leaves `direct` empty either way (its lane handles dropped
/// here, on the worker), ready to go back to the engine.
pub fn deliver(
    direct: &mut DirectBatch,
    items: &mut [BatchItem],
    result: &Result<(), ExecError>,
    now: impl FnOnce() -> Nanos,
) {
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
    // What the engine records as each answer's instant (its latency, the phase times): the
    // answers leave now, not when the engine gets the batch back.
    direct.answered_ns = now().max(1);
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
    let mut woken: [Option<&Arc<ReplyLane<TaggedEvent>>>; 4] = [None; 4];
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
