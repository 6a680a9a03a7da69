//! A worker thread: takes jobs from its ring, runs each on its executor, sends the reply back.
//!
//! The worker never talks to the scheduler directly; it only moves buffers between its two
//! rings and rings the engine's doorbell. It must never drop a job: every job it takes goes
//! back, answered or failed. A job is a batch (request-level batching) or a step
//! (continuous batching); each mode has its own [`Job`] type and reply type, so neither the
//! worker nor the engine matches on the other mode's messages.
//!
//! Shutdown: the engine thread sets `stop`, then `exit` ([`signal_exit`], Release) after the
//! engine returned, then unparks the worker; the worker exits once `exit` is set and its
//! ring is empty (Acquire), so a job pushed before the flag is still run. `loom-tests/tests/shutdown.rs` runs
//! [`WorkerThread::run`] itself under loom.

use super::direct_reply;
use super::doorbell::Doorbell;
use super::idle::{IdlePolicy, Idler, WORKER_MAX_PARK};
use super::messages::{BatchEvent, BatchMsg, DirectBatch, ResultMsg, StepMsg, StepResult};
use super::ready::MarkedProducer;
use super::ring::Consumer;
use super::sync::{Arc, AtomicBool, Ordering};
use crate::core::{BatchId, Ticket};
use crate::exec::{BatchItem, ExecError, Executor, TokenSink};
use std::time::{Duration, Instant};

/// What a worker runs: one message from the engine, answered by one reply.
pub trait Job: Send + 'static {
    /// What goes back to the engine: the job's result, and any events sent while it runs.
    type Reply: Send + 'static;
    /// What the job runs on (an executor).
    type Exec: ?Sized + Send;

    /// Runs the job on `exec`. Events while it runs go through `events`; the return value
    /// is the final reply, which always finds room in the result ring.
    fn run(self, exec: &mut Self::Exec, events: &mut Events<'_, Self::Reply>) -> Self::Reply;
}

/// A job's way to send events to the engine while it runs, never taking the result-ring
/// slots kept for job replies.
pub struct Events<'a, R> {
    results: &'a mut MarkedProducer<R>,
    engine_bell: &'a Doorbell,
    /// Result-ring slots kept free for job replies.
    reserve: usize,
}

impl<'a, R> Events<'a, R> {
    /// Events into `results`, ringing `engine_bell`, keeping `reserve` slots for replies.
    pub(super) fn new(
        results: &'a mut MarkedProducer<R>,
        engine_bell: &'a Doorbell,
        reserve: usize,
    ) -> Self {
        Events {
            results,
            engine_bell,
            reserve,
        }
    }

    /// Sends `event` and rings the engine if the ring has room beyond the reserve; false
    /// if the event was dropped.
    pub fn send(&mut self, event: R) -> bool {
        if self.results.free_slots() > self.reserve && self.results.push(event).is_ok() {
            self.engine_bell.ring();
            return true;
        }
        false
    }
}

/// Everything one worker thread owns.
pub struct WorkerThread<J: Job> {
    pub id: usize,
    pub jobs: Consumer<J>,
    /// Marks the engine's reply mask after each push (`runtime::ready`).
    pub results: MarkedProducer<J::Reply>,
    pub executor: Box<J::Exec>,
    pub bell: Arc<Doorbell>,
    pub engine_bell: Arc<Doorbell>,
    /// Set by the engine thread once the engine has returned; the worker runs what its
    /// ring still holds and stops.
    pub exit: Arc<AtomicBool>,
    pub idle: IdlePolicy,
    pub spin: Duration,
    /// Result-ring slots kept for job replies (the worker's in-flight limit); the rest of
    /// the ring carries events.
    pub reserve: usize,
}

/// The engine thread's last word to its workers, once the engine has returned: `stop` tells
/// executors still running abandoned work to cut it short, then `exit` lets each worker
/// return once its ring is empty. Release on both: every job the engine sent is visible to
/// a worker that sees `exit`, and `stop` is set before any worker can see `exit`. The caller
/// then wakes each worker (`unpark`) and joins it; `loom-tests/tests/shutdown.rs` checks
/// that a job blocked until `stop` still comes back and its worker exits.
pub fn signal_exit(stop: &AtomicBool, exit: &AtomicBool) {
    stop.store(true, Ordering::Release);
    exit.store(true, Ordering::Release);
}

/// Room in a worker's result ring beyond its in-flight jobs, for token events.
pub const TOKEN_ROOM: usize = 64;

impl<J: Job> WorkerThread<J> {
    /// The worker's loop; returns when `exit` is set and its ring is empty.
    ///
    /// Never inlined: `tools/bench/instruction_budget.sh` finds this thread by the name.
    #[inline(never)]
    pub fn run(mut self) {
        self.bell.bind_current();
        let mut idler = Idler::new(self.idle, self.spin).parking_at_most(WORKER_MAX_PARK);
        loop {
            if self.step() {
                idler.busy();
                continue;
            }
            // Acquire: pairs with the engine thread's Release store, so every job pushed
            // before `exit` is visible to the `is_empty` check that follows.
            if self.exit.load(Ordering::Acquire) && self.jobs.is_empty() {
                return;
            }
            let (jobs, exit) = (&self.jobs, &self.exit);
            idler.idle(Instant::now(), None, &self.bell, || {
                !jobs.is_empty() || exit.load(Ordering::Acquire)
            });
        }
    }

    /// Takes one job, runs it, sends its reply and rings the engine. False if the ring was
    /// empty.
    pub fn step(&mut self) -> bool {
        let Some(job) = self.jobs.pop() else {
            return false;
        };
        let mut events = Events {
            results: &mut self.results,
            engine_bell: &self.engine_bell,
            reserve: self.reserve,
        };
        let reply = job.run(&mut *self.executor, &mut events);
        // The engine sends at most `reserve` jobs before it gets their replies back, and
        // events never take those slots, so this cannot be full.
        if self.results.push(reply).is_err() {
            unreachable!(
                "worker {} result ring full: engine invariant broken",
                self.id
            );
        }
        self.engine_bell.ring();
        true
    }
}

/// Runs `f` on the executor, turning a panic into an error for this batch or step.
fn guarded(
    exec: &mut dyn Executor,
    f: impl FnOnce(&mut dyn Executor) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(exec)))
        .unwrap_or_else(|_| Err(ExecError::Backend("executor panicked".into())))
}

/// Relays streaming text from the executor to the engine as token events (dropped when the
/// ring is short of room: the final output carries the whole text).
struct RingTokens<'a, 'b> {
    events: &'a mut Events<'b, BatchEvent>,
    tickets: smallvec::SmallVec<[Ticket; 32]>,
}

impl TokenSink for RingTokens<'_, '_> {
    fn token(&mut self, item: usize, offset: u32, text: String) {
        let Some(&ticket) = self.tickets.get(item) else {
            return;
        };
        self.events.send(BatchEvent::Token {
            ticket,
            offset,
            text,
        });
    }
}

/// Request-level batching: run the batch, relaying streamed text as token events, and
/// answer what it can straight to the submitters (`runtime::direct_reply`).
impl Job for BatchMsg {
    type Reply = BatchEvent;
    type Exec = dyn Executor;

    fn run(self, exec: &mut Self::Exec, events: &mut Events<'_, BatchEvent>) -> BatchEvent {
        let BatchMsg {
            batch,
            mut items,
            dispatched_ns,
            direct,
        } = self;
        let mut sink = RingTokens {
            events,
            tickets: items.iter().map(|i| i.ticket).collect(),
        };
        let result = guarded(exec, |exec| exec.execute(&mut items, &mut sink));
        batch_done(batch, items, result, dispatched_ns, direct)
    }
}

/// A batch's reply once its executor is done with it: what it can answer goes straight to
/// the submitters first, so the engine, once it has the batch, knows each answered
/// request's answer is on its way.
pub(super) fn batch_done(
    batch: BatchId,
    mut items: Vec<BatchItem>,
    result: Result<(), ExecError>,
    dispatched_ns: u64,
    mut direct: DirectBatch,
) -> BatchEvent {
    let clock = direct.clock;
    direct_reply::deliver(&mut direct, &mut items, &result, || {
        clock.map_or(0, |c| c.now())
    });
    direct_reply::settle(&mut direct, &mut items);
    BatchEvent::Done(ResultMsg {
        batch,
        items,
        result,
        dispatched_ns,
        direct,
    })
}

/// Continuous batching: one forward pass over the step's items.
impl Job for StepMsg {
    type Reply = StepResult;
    type Exec = dyn Executor;

    fn run(self, exec: &mut Self::Exec, _events: &mut Events<'_, StepResult>) -> StepResult {
        let StepMsg {
            mut items,
            dispatched,
        } = self;
        let result = guarded(exec, |exec| exec.step(&mut items, dispatched));
        StepResult { items, result }
    }
}
