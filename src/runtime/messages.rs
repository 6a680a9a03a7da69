//! Plain data that crosses threads: submissions, batches, results, replies.
//!
//! Payloads (prompt text, outputs) are owned by these messages and move through the rings;
//! the engine moves them, it never copies them. Nothing here may hold a lock or a reference
//! into another thread's state; the shared endpoints a message carries (a waiter, a
//! submitter's reply lane, a core's claim cells) are `Arc`s to state built for sharing.

use super::batch_claim::BatchClaims;
use super::clock::Clock;
use super::reply_lane::ReplyLane;
use crate::core::{BatchId, FailReason, Nanos, Priority, Reject, RequestMeta, Ticket};
use crate::exec::{BatchItem, ExecError, Output, OutputSummary, Work};
use crate::router::{Decision, NameId, Need, RouteError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A request as a user of the in-process API builds it: how urgent it is, which model it
/// asks for, and the payload its worker gets. The payload moves on as is (into the
/// [`Submission`], then a batch item); only the scheduling facts are read from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    pub priority: Priority,
    /// The model asked for, resolved by the caller; `None`: the runtime's default model.
    pub route: Option<RouteRequest>,
    /// What the executor needs (kind, text, limits, sampling...). `max_tokens` is taken as 0
    /// for an embedding; `model` is set by the engine when it routes the request.
    pub work: Work,
}

/// The model a request asks for, resolved to the router's name id (by
/// [`crate::router::Router::precheck`] on the submitting thread), what it needs, and its
/// session key (for `session` routing). Plain data: it crosses the ring with the request,
/// so the engine routes without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteRequest {
    pub name: NameId,
    pub need: Need,
    /// [`crate::router::affinity::session_key`] of the `X-Session-Id` header, else of the
    /// OpenAI `user` field; `None` without either.
    pub session: Option<u64>,
}

/// Why a request got an error instead of an output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Refused at admission by the scheduler.
    #[error(transparent)]
    Rejected(#[from] Reject),
    /// Admitted, then failed.
    #[error(transparent)]
    Failed(#[from] FailReason),
    /// The submission ring for this priority and size is full: the engine is behind.
    #[error("the engine's intake for this priority is full; retry later")]
    Busy,
    /// The runtime is shutting down or stopped.
    #[error("the server is shutting down and no longer accepts requests")]
    ShuttingDown,
    /// The worker reported an error for the batch.
    #[error("the worker failed the batch: {0}")]
    Worker(String),
    /// The backend failed the request (after any retries on other backends).
    #[error(transparent)]
    Backend(ExecError),
    /// No backend could take the request (e.g. every backend of its model is unhealthy).
    #[error(transparent)]
    Route(RouteError),
}

impl RequestError {
    /// True for errors a client should retry later (overload), as opposed to a failure.
    pub fn is_overload(&self) -> bool {
        matches!(
            self,
            RequestError::Busy | RequestError::Rejected(Reject::QueueFull { .. })
        )
    }
}

/// The final answer to one request.
pub type Outcome = Result<Output, RequestError>;

/// A one-shot slot a blocking caller waits on.
#[derive(Debug, Default)]
pub struct Waiter {
    slot: Mutex<Option<Outcome>>,
    ready: Condvar,
}

impl Waiter {
    /// Stores the outcome and wakes the waiting thread. Called exactly once, by the engine.
    pub fn complete(&self, outcome: Outcome) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert!(slot.is_none(), "a request is answered exactly once");
        *slot = Some(outcome);
        drop(slot);
        self.ready.notify_one();
    }

    /// Blocks until the outcome arrives.
    pub fn wait(&self) -> Outcome {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = slot.take() {
                return o;
            }
            slot = self.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks up to `timeout`; `None` if nothing arrived in time.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = std::time::Instant::now() + timeout;
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = slot.take() {
                return Some(o);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return None;
            }
            slot = self
                .ready
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Where the engine sends a request's answer.
#[derive(Debug)]
pub enum Reply {
    /// Wake a blocking caller.
    Waiter(std::sync::Arc<Waiter>),
    /// Push `(tag, outcome)` to the submitting thread's completion ring.
    Tag(u64),
}

impl Reply {
    /// The tag of a tagged submission; `None` for a blocking caller.
    pub fn tag(&self) -> Option<u64> {
        match self {
            Reply::Tag(t) => Some(*t),
            Reply::Waiter(_) => None,
        }
    }
}

/// One request on its way from a submitter to the engine.
#[derive(Debug)]
pub struct Submission {
    pub meta: RequestMeta,
    pub work: Work,
    pub reply: Reply,
    pub route: Option<RouteRequest>,
}

/// An event for a tagged submission, on its way back to the submitter.
#[derive(Debug)]
pub struct TaggedEvent {
    pub tag: u64,
    pub event: Event,
    /// With the final answer of a routed request: which backend served it and why.
    pub route: Option<Decision>,
}

/// What happened to a tagged submission.
#[derive(Debug)]
pub enum Event {
    /// A token of a streaming request (continuous batching), in order. Best effort: the
    /// engine skips token events when the submitter's ring is short of room, so a consumer
    /// must take the rest of the text from the final output.
    /// `offset` is where `text` starts in the output (bytes): a preempted request
    /// regenerates its text from 0, and a skipped event leaves a gap, so a consumer keeps a
    /// piece only when it starts where its stream stands (the final output completes it).
    Token { offset: u32, text: String },
    /// The final answer; exactly one per submission.
    Done(Outcome),
}

impl TaggedEvent {
    /// The final answer, if this is it.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.event {
            Event::Done(o) => Some(o),
            Event::Token { .. } => None,
        }
    }
}

/// A batch on its way to a worker. `items` is a recycled buffer of capacity
/// `max_batch_size`.
#[derive(Debug)]
pub struct BatchMsg {
    pub batch: BatchId,
    pub items: Vec<BatchItem>,
    /// Engine clock at dispatch, handed back with the result (backend latency).
    pub dispatched_ns: u64,
    /// Which of `items` the worker answers itself, and the batch's claim
    /// (`runtime::direct_reply`). A recycled buffer, as `items`.
    pub direct: DirectBatch,
}

/// A batch on its way back from a worker, outputs filled (or an error). Items the worker
/// answered itself have `answered` set and no output; when it answered all of them, `items`
/// comes back empty and `direct.answered` holds their books.
#[derive(Debug)]
pub struct ResultMsg {
    pub batch: BatchId,
    pub items: Vec<BatchItem>,
    pub result: Result<(), ExecError>,
    pub dispatched_ns: u64,
    /// The direct-reply buffer, emptied by the worker, on its way home.
    pub direct: DirectBatch,
}

/// Request-level batching: what a worker sends back for a batch (see `worker::Job`).
#[derive(Debug)]
pub enum BatchEvent {
    /// A piece of a streaming request's output while the batch runs, as the executor relays
    /// it (best effort; the final output carries the whole text).
    Token {
        ticket: crate::core::Ticket,
        offset: u32,
        text: String,
    },
    /// The batch is done: outputs filled, or an error.
    Done(ResultMsg),
}

/// Continuous batching: one step on its way to a worker (a recycled buffer of `max_slots`
/// capacity).
#[derive(Debug)]
pub struct StepMsg {
    pub items: Vec<crate::exec::StepItem>,
    /// The clock reading of the engine turn that formed it (at or before the send): a
    /// simulated step's duration counts from here, so the hand-off to the worker is inside
    /// the step, as the simulator has it, and not on top of it.
    pub dispatched: std::time::Instant,
}

/// Continuous batching: the step's items with their results filled, or the executor's error.
#[derive(Debug)]
pub struct StepResult {
    pub items: Vec<crate::exec::StepItem>,
    pub result: Result<(), ExecError>,
}

/// A control message for the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Control {
    SetStrategy(crate::core::strategy::StrategyKind),
    /// Stop admitting, finish everything; abort what remains at `deadline_ns`.
    Drain {
        deadline_ns: u64,
    },
    /// A backend slot becomes active, or starts draining (see `router::slots`); `seq` comes
    /// back in the snapshot (`BackendSnapshot::slot_seq`) once the engine took it.
    SetSlot {
        backend: crate::router::BackendId,
        slot: crate::router::SlotState,
        seq: u32,
    },
    /// Take the routing tables waiting in `Shared::tables` (`runtime::tables`), or refuse
    /// them; the mailbox says which, by the hand-off's generation.
    SwapTables,
    /// `[routing]` settings a reload changed (strategy, weights, retries, prefix thresholds).
    SetRouting(crate::router::LiveRouting),
    /// A LoRA adapter id was unloaded, or handed to a newly loaded adapter: every slot table
    /// forgets it (`core::lora::LoraSlots::forget`), so the next request with it pays a load.
    ForgetAdapter(crate::core::lora::AdapterId),
}

/// Which runtime thread is starting (for `RuntimeConfig::on_thread_start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadRole {
    Engine,
    Worker(usize),
}

/// Where a worker sends one request's answer.
#[derive(Debug)]
pub struct DirectReply {
    /// The request's position in the batch's items.
    pub item: u32,
    pub lane: Arc<ReplyLane<TaggedEvent>>,
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
    /// The runtime's clock (the engine's epoch), for the worker to stamp its answers.
    pub clock: Option<Clock>,
    /// Set by the worker when it answered: the clock reading just before its first push,
    /// the instant the engine's books take as each answer's (0: none answered).
    pub answered_ns: Nanos,
    /// Filled by the worker when it answered every item of the batch
    /// ([`crate::runtime::direct_reply::settle`]): each item's ticket and what the books
    /// need of its output. The items themselves are then dropped on the worker. Empty
    /// until a batch first uses it (a buffer that never carries a whole answer, such as a
    /// spare backend slot's, holds no memory for it); kept with its capacity after.
    pub answered: Vec<(Ticket, OutputSummary)>,
}

impl DirectBatch {
    /// An empty buffer for batches of up to `capacity` items.
    pub fn with_capacity(capacity: usize) -> DirectBatch {
        DirectBatch {
            claims: None,
            index: 0,
            targets: Vec::with_capacity(capacity),
            clock: None,
            answered_ns: 0,
            answered: Vec::new(),
        }
    }
}
