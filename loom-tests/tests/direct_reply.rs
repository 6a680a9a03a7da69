//! Models direct replies (`runtime::direct_reply`, `runtime::reply_lane`) as the runtime
//! wires them: a worker answers a batch's request straight to the submitter's reply lane
//! (the real `deliver`, `BatchClaims` and `ReplyLane`), while the engine abandons the same
//! batch (a batch timeout) and, if it wins the claim, answers through the submitter's
//! completion ring. The submitter's thread waits as an io thread does: announce the sleep,
//! re-check both ways back (`Submitter::has_completions`), sleep; every producer wakes it
//! through the same doorbell protocol (`SleepFlag`; a `Doorbell` here, parking rather than
//! `epoll_wait`).
//!
//! What must hold: the request is answered exactly once, by whoever claimed the batch; the
//! submitter never sleeps through the answer; the batch the worker returns says which
//! (`answered` set exactly when the worker answered).
#![cfg(feature = "loom")]

use abe::core::Ticket;
use abe::exec::{BatchItem, FinishReason, Output, Work};
use abe::runtime::batch_claim::BatchClaims;
use abe::runtime::direct_reply::deliver;
use abe::runtime::doorbell::Doorbell;
use abe::runtime::messages::{DirectBatch, DirectReply, Event, TaggedEvent};
use abe::runtime::reply_lane::ReplyLane;
use abe::runtime::ring::ring;
use loom::thread;
use loom_tests::model;
use std::sync::Arc;
use std::time::Duration;

/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);

fn output() -> Output {
    Output::Text {
        text: String::new(),
        prompt_tokens: 1,
        completion_tokens: 1,
        finish_reason: FinishReason::Stop,
        tool_calls: None,
        cached_tokens: None,
    }
}

/// A batch of `tags.len()` requests, each with a direct-reply target into `lane`, claim
/// cell 0 opened (as the engine's dispatch does).
fn batch(
    claims: &Arc<BatchClaims>,
    lane: &Arc<ReplyLane<TaggedEvent>>,
    tags: &[u64],
) -> (Vec<BatchItem>, DirectBatch) {
    let mut items = Vec::new();
    let mut direct = DirectBatch::with_capacity(tags.len());
    for (i, &tag) in tags.iter().enumerate() {
        let ticket = Ticket {
            index: i as u32,
            generation: 0,
        };
        items.push(BatchItem::new(ticket, Work::default()));
        direct.targets.push(DirectReply {
            item: i as u32,
            lane: lane.clone(),
            tag,
            route: None,
        });
    }
    claims.open(0);
    direct.claims = Some(claims.clone());
    direct.index = 0;
    (items, direct)
}

#[test]
fn an_abandoned_batch_is_answered_once_by_whoever_claims_it() {
    model(|| {
        let io_bell = abe::runtime::sync::Arc::new(Doorbell::new());
        let engine_bell = abe::runtime::sync::Arc::new(Doorbell::new());
        engine_bell.bind_current();
        let wake = {
            let bell = io_bell.clone();
            Arc::new(move || bell.ring()) as Arc<dyn Fn() + Send + Sync>
        };
        let lane = Arc::new(ReplyLane::new(1, Some(wake)));
        let claims = Arc::new(BatchClaims::new(1));
        let (mut completions_tx, mut completions_rx) = ring::<TaggedEvent>(2);
        let (mut result_tx, mut result_rx) = ring::<Vec<BatchItem>>(1);
        let (items, direct) = batch(&claims, &lane, &[7]);

        let io = {
            let (bell, lane) = (io_bell.clone(), lane.clone());
            thread::spawn(move || {
                bell.bind_current();
                let mut answers = Vec::new();
                while answers.is_empty() {
                    while let Some(c) = completions_rx.pop() {
                        answers.push((c.tag, c.event));
                    }
                    // As `Submitter::drain_completions` reads the lane.
                    lane.drain(|c| answers.push((c.tag, c.event)));
                    if answers.is_empty() {
                        bell.wait(WAIT_TIMEOUT, || {
                            !completions_rx.is_empty() || !lane.is_empty()
                        });
                    }
                }
                (answers, completions_rx)
            })
        };
        let worker = {
            let bell = engine_bell.clone();
            thread::spawn(move || {
                let (mut items, mut direct) = (items, direct);
                items[0].output = Some(output());
                deliver(&mut direct, &mut items, &Ok(()), || 1);
                assert!(direct.targets.is_empty() && direct.claims.is_none());
                assert!(result_tx.push(items).is_ok());
                bell.ring();
            })
        };

        // The engine: the batch times out; it answers only if it claims the batch.
        let engine_answers = claims.claim_for_engine(0);
        if engine_answers {
            let fail = TaggedEvent {
                tag: 7,
                event: Event::Done(Err(abe::runtime::RequestError::Failed(
                    abe::core::FailReason::BatchTimeout,
                ))),
                route: None,
            };
            assert!(completions_tx.push(fail).is_ok());
            io_bell.ring();
        }
        // Later the worker's batch comes back (stale or not).
        let items = loop {
            if let Some(items) = result_rx.pop() {
                break items;
            }
            engine_bell.wait(WAIT_TIMEOUT, || !result_rx.is_empty());
        };
        assert_eq!(
            items[0].answered.is_some(),
            !engine_answers,
            "the batch says the worker answered exactly when the engine did not"
        );
        worker.join().unwrap();
        let (answers, completions_rx) = io.join().unwrap();
        assert_eq!(answers.len(), 1, "answered once");
        assert!(
            completions_rx.is_empty() && lane.is_empty(),
            "answered twice"
        );
        assert_eq!(answers[0].0, 7);
        assert_eq!(
            matches!(answers[0].1, Event::Done(Ok(_))),
            !engine_answers,
            "the answer is the claimant's"
        );
    });
}

#[test]
fn a_batch_answered_by_its_worker_reaches_a_sleeping_submitter() {
    model(|| {
        let io_bell = abe::runtime::sync::Arc::new(Doorbell::new());
        let wake = {
            let bell = io_bell.clone();
            Arc::new(move || bell.ring()) as Arc<dyn Fn() + Send + Sync>
        };
        let lane = Arc::new(ReplyLane::new(2, Some(wake)));
        let claims = Arc::new(BatchClaims::new(1));
        let (items, direct) = batch(&claims, &lane, &[1, 2]);

        let worker = thread::spawn(move || {
            let (mut items, mut direct) = (items, direct);
            for item in &mut items {
                item.output = Some(output());
            }
            // Two answers, one wake: the submitter must still see both.
            deliver(&mut direct, &mut items, &Ok(()), || 1);
            assert!(items.iter().all(|i| i.answered.is_some()));
        });

        io_bell.bind_current();
        let mut tags = Vec::new();
        while tags.len() < 2 {
            lane.drain(|c| tags.push(c.tag));
            if tags.len() < 2 {
                io_bell.wait(WAIT_TIMEOUT, || !lane.is_empty());
            }
        }
        worker.join().unwrap();
        tags.sort_unstable();
        assert_eq!(tags, [1, 2]);
        assert!(lane.is_empty());
    });
}
