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
//!   output's token counts for the engine's books) and then returns the batch; when every
//!   item was answered, as their books alone ([`settle`]), the items dropped on the worker.
//! - Claimed by the engine (it abandoned the batch): the worker answers nothing; the batch
//!   comes back stale, as before.
//!
//! `loom-tests/tests/direct_reply.rs` checks that
//! every request is answered exactly once and that the submitter never sleeps through an
//! answer, with the engine abandoning the batch while the worker finishes it.
//!
//! Never here: a lock of abe's, an allocation after the buffers are made (the books'
//! buffer of [`settle`] is made on its first use, then recycled), a push to the engine's
//! completion ring. Frees are: `settle` drops answered items on the worker, so that the
//! engine does not.

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

/// Worker, after [`deliver`]: when it answered every item of the batch, moves what the
/// engine's books need of each (ticket, output summary) into `direct.answered` and drops the
/// items here. Their payloads (a prompt an io thread allocated) are then freed on the
/// worker, not on the engine's thread, where each such free went past the thread's cache
/// into the io thread's arena (its lock, or an atomic for small chunks) for every request
/// (BENCHMARKS.md, "A batch answered whole comes back as its books"). A batch with an item
/// not answered comes back whole, as before.
pub fn settle(direct: &mut DirectBatch, items: &mut Vec<BatchItem>) {
    debug_assert!(direct.answered.is_empty(), "emptied by the engine");
    if direct.answered_ns == 0 || items.iter().any(|i| i.answered.is_none()) {
        return;
    }
    // Grows on a buffer's first whole answer only: buffers are recycled with their capacity.
    direct.answered.reserve(items.len());
    direct.answered.extend(
        items
            .iter_mut()
            .map(|i| (i.ticket, i.answered.take().expect("checked above"))),
    );
    items.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Ticket;
    use crate::exec::{FinishReason, Output, Work};
    use crate::runtime::batch_claim::BatchClaims;
    use crate::runtime::messages::DirectReply;

    /// A batch of `n` items (ticket index = 10 + position), the first `targets` of them
    /// direct-reply targets into the returned lane, each with an output of `i + 1`
    /// completion tokens, run through a worker's [`deliver`] and [`settle`]; with
    /// `engine_first`, the engine abandons the batch (claims it) before the worker is done.
    fn served(
        n: usize,
        targets: usize,
        engine_first: bool,
    ) -> (Vec<BatchItem>, DirectBatch, Arc<ReplyLane<TaggedEvent>>) {
        let lane = Arc::new(ReplyLane::new(4, None));
        let claims = Arc::new(BatchClaims::new(1));
        let mut items = Vec::with_capacity(n);
        let mut direct = DirectBatch::with_capacity(n);
        for i in 0..n {
            let ticket = Ticket {
                index: 10 + i as u32,
                generation: 3,
            };
            let mut item = BatchItem::new(ticket, Work::default());
            item.output = Some(Output::Text {
                text: "word".into(),
                prompt_tokens: 2,
                completion_tokens: i as u32 + 1,
                finish_reason: FinishReason::Length,
                tool_calls: None,
                cached_tokens: None,
            });
            items.push(item);
            if i < targets {
                direct.targets.push(DirectReply {
                    item: i as u32,
                    lane: lane.clone(),
                    tag: i as u64,
                    route: None,
                });
            }
        }
        claims.open(0);
        direct.claims = Some(claims.clone());
        if engine_first {
            assert!(
                claims.claim_for_engine(0),
                "the engine abandons the batch first"
            );
        }
        deliver(&mut direct, &mut items, &Ok(()), || 5);
        settle(&mut direct, &mut items);
        (items, direct, lane)
    }

    #[test]
    fn a_batch_answered_whole_goes_back_as_its_books_and_its_items_stay_with_the_worker() {
        let (items, direct, lane) = served(3, 3, false);
        assert!(items.is_empty(), "dropped on the worker");
        let books: Vec<(u32, u32, u32)> = direct
            .answered
            .iter()
            .map(|(t, s)| (t.index, t.generation, s.completion_tokens))
            .collect();
        assert_eq!(books, [(10, 3, 1), (11, 3, 2), (12, 3, 3)]);
        assert_eq!(direct.answered_ns, 5);
        let mut tags = Vec::new();
        lane.drain(|c| tags.push(c.tag));
        assert_eq!(tags, [0, 1, 2], "each answered once, in order");
    }

    #[test]
    fn a_batch_with_an_item_left_to_the_engine_comes_back_whole() {
        // The third item is not a target (a stream, say): the engine answers it.
        let (items, direct, _lane) = served(3, 2, false);
        assert_eq!(items.len(), 3);
        assert!(direct.answered.is_empty());
        assert!(items[0].answered.is_some() && items[1].answered.is_some());
        assert!(items[2].answered.is_none() && items[2].output.is_some());
    }

    #[test]
    fn a_batch_the_engine_claimed_comes_back_whole_and_unanswered() {
        let (items, direct, lane) = served(2, 2, true);
        assert_eq!(items.len(), 2);
        assert!(direct.answered.is_empty());
        assert!(items.iter().all(|i| i.answered.is_none()));
        assert!(lane.is_empty(), "nothing answered by the worker");
    }
}
