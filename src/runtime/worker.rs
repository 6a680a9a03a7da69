//! A worker thread: takes batches from its ring, runs its executor, returns the results.
//!
//! The worker never talks to the scheduler directly; it only moves buffers between its two
//! rings and rings the engine's doorbell. It must never drop a batch: every batch it takes
//! goes back, answered or failed.

use super::doorbell::Doorbell;
use super::idle::{IdlePolicy, Idler};
use super::messages::{BatchMsg, FromWorker, ResultMsg, ToWorker};
use super::ring::{Consumer, Producer};
use crate::core::Ticket;
use crate::exec::{ExecError, Executor, TokenSink};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything one worker thread owns.
pub struct WorkerThread {
    pub id: usize,
    pub batches: Consumer<ToWorker>,
    pub results: Producer<FromWorker>,
    pub executor: Box<dyn Executor>,
    pub bell: Arc<Doorbell>,
    pub engine_bell: Arc<Doorbell>,
    /// Set by the engine when it exits; the worker finishes what it holds and stops.
    pub stop: Arc<AtomicBool>,
    pub idle: IdlePolicy,
    pub spin: Duration,
    /// Result-ring slots kept for batch results (the worker's in-flight limit); the rest of
    /// the ring carries token events.
    pub reserve: usize,
}

/// Room in a worker's result ring beyond its in-flight batches, for token events.
pub const TOKEN_ROOM: usize = 64;

/// Runs `f` on the executor, turning a panic into an error for this batch or step.
fn guarded(
    exec: &mut dyn Executor,
    f: impl FnOnce(&mut dyn Executor) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(exec)))
        .unwrap_or_else(|_| Err(ExecError::Backend("executor panicked".into())))
}

/// Relays streaming text from the executor to the engine through the result ring, never
/// taking the room reserved for batch results (pieces are dropped instead: the final output
/// carries the whole text).
struct RingTokens<'a> {
    results: &'a mut Producer<FromWorker>,
    engine_bell: &'a Doorbell,
    /// Slots kept free for batch results.
    reserve: usize,
    tickets: smallvec::SmallVec<[Ticket; 32]>,
}

impl TokenSink for RingTokens<'_> {
    fn token(&mut self, item: usize, offset: u32, text: String) {
        let Some(&ticket) = self.tickets.get(item) else {
            return;
        };
        if self.results.free_slots() > self.reserve
            && self
                .results
                .push(FromWorker::Token {
                    ticket,
                    offset,
                    text,
                })
                .is_ok()
        {
            self.engine_bell.ring();
        }
    }
}

impl WorkerThread {
    /// The worker's loop; returns when `stop` is set and its ring is empty.
    pub fn run(mut self) {
        self.bell.bind_current();
        let mut idler = Idler::new(self.idle, self.spin);
        loop {
            if let Some(msg) = self.batches.pop() {
                idler.busy();
                let reply = match msg {
                    ToWorker::Batch(BatchMsg {
                        batch,
                        mut items,
                        dispatched_ns,
                    }) => {
                        let mut sink = RingTokens {
                            results: &mut self.results,
                            engine_bell: &self.engine_bell,
                            reserve: self.reserve,
                            tickets: items.iter().map(|i| i.ticket).collect(),
                        };
                        let result = guarded(&mut *self.executor, |exec| {
                            exec.execute(&mut items, &mut sink)
                        });
                        FromWorker::Batch(ResultMsg {
                            batch,
                            items,
                            result,
                            dispatched_ns,
                        })
                    }
                    ToWorker::Step(mut items) => {
                        let result = guarded(&mut *self.executor, |exec| exec.step(&mut items));
                        FromWorker::Step(items, result)
                    }
                };
                // The engine sends at most `capacity` messages before it gets them back, and
                // the result ring has the same capacity, so this cannot be full.
                if self.results.push(reply).is_err() {
                    unreachable!(
                        "worker {} result ring full: engine invariant broken",
                        self.id
                    );
                }
                self.engine_bell.ring();
                continue;
            }
            if self.stop.load(Ordering::Acquire) && self.batches.is_empty() {
                return;
            }
            let batches = &self.batches;
            let stop = &self.stop;
            idler.idle(Instant::now(), None, &self.bell, || {
                !batches.is_empty() || stop.load(Ordering::Acquire)
            });
        }
    }
}
