//! An event-loop thread: the workers of one backend whose executor runs batches
//! concurrently (`exec::concurrent`, the `upstream` executor) as seats of one thread.
//!
//! Each seat is a worker as the engine sees it (its own job ring, result ring and place in
//! the reply mask) and runs one batch at a time, as a worker thread would; the seats share
//! one doorbell, whose ring wakes the executor's poll. A batch's reply is built as a worker
//! thread builds it (`worker::batch_done`: direct replies first, then the batch back).
//!
//! Shutdown, as for worker threads: the thread exits once `exit` is set, every seat's ring is
//! empty and no batch is running (`stop`, set first, makes the executor fail what it has
//! not started). What must never happen here: a job taken and not answered, a seat running
//! two batches, or a sleep that a ring of the doorbell does not end.

use super::doorbell::Doorbell;
use super::messages::{BatchEvent, BatchMsg, DirectBatch};
use super::ready::MarkedProducer;
use super::ring::Consumer;
use super::sync::{Arc, AtomicBool, Ordering};
use super::worker::{batch_done, Events};
use crate::core::{BatchId, Ticket};
use crate::exec::concurrent::{store, ConcurrentExecutor, ItemResult, Progress};
use crate::exec::BatchItem;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// Longest single sleep (the thread needs no re-check: jobs and exit ring its doorbell).
const MAX_SLEEP: Duration = super::idle::WORKER_MAX_PARK;

/// One worker's place on the loop.
pub struct Seat {
    pub jobs: Consumer<BatchMsg>,
    /// Marks the engine's reply mask after each push (`runtime::ready`).
    pub results: MarkedProducer<BatchEvent>,
    /// The batch running, if any.
    running: Option<Running>,
}

impl Seat {
    /// A seat with its rings, idle.
    pub fn new(jobs: Consumer<BatchMsg>, results: MarkedProducer<BatchEvent>) -> Seat {
        Seat {
            jobs,
            results,
            running: None,
        }
    }
}

/// A running batch and what its reply needs.
struct Running {
    batch: BatchId,
    items: Vec<BatchItem>,
    dispatched_ns: u64,
    direct: DirectBatch,
    /// Each item's ticket, for its token events.
    tickets: smallvec::SmallVec<[Ticket; 32]>,
    /// Set when the executor reported the batch done; the reply goes at the next settle.
    results: Option<Vec<ItemResult>>,
}

/// Everything the loop thread owns.
pub struct EventLoop {
    pub seats: Vec<Seat>,
    pub exec: Box<dyn ConcurrentExecutor>,
    /// Rung by the engine for every seat's jobs, and at exit.
    pub bell: Arc<Doorbell>,
    pub engine_bell: Arc<Doorbell>,
    pub exit: Arc<AtomicBool>,
    /// Result-ring slots kept for job replies (the rest carries token events).
    pub reserve: usize,
    /// Seats whose batch the executor reported done, to settle.
    pub done: Vec<usize>,
}

/// The seats as the executor's [`Progress`]: token events and finished batches go back.
struct SeatProgress<'a> {
    seats: &'a mut [Seat],
    engine_bell: &'a Doorbell,
    reserve: usize,
    done: &'a mut Vec<usize>,
}

impl Progress for SeatProgress<'_> {
    fn token(&mut self, seat: usize, item: usize, offset: u32, text: String) {
        let seat = &mut self.seats[seat];
        let Some(ticket) = seat
            .running
            .as_ref()
            .and_then(|r| r.tickets.get(item).copied())
        else {
            return;
        };
        Events::new(&mut seat.results, self.engine_bell, self.reserve).send(BatchEvent::Token {
            ticket,
            offset,
            text,
        });
    }

    fn done(&mut self, seat: usize, results: Vec<ItemResult>) {
        let Some(running) = self.seats[seat].running.as_mut() else {
            unreachable!("seat {seat} reported done without a batch");
        };
        debug_assert!(running.results.is_none(), "seat {seat} reported done twice");
        running.results = Some(results);
        self.done.push(seat);
    }
}

impl EventLoop {
    /// The loop; returns when `exit` is set, every ring is empty and no batch runs.
    pub fn run(mut self) {
        self.bell.bind_wake(self.exec.waker());
        loop {
            // No poll of its own here: the sleep's poll returns at once when sockets are
            // ready, and a zero-timeout poll before it was one more syscall per turn.
            self.start_jobs();
            self.settle();
            // Acquire: pairs with the engine thread's Release store (as `worker::run`).
            if self.exit.load(Ordering::Acquire) && self.finished() {
                return;
            }
            let bell = self.bell.clone();
            bell.sleep_with(|| {
                // The re-check after announcing the sleep (`Doorbell` protocol). At exit the
                // batches still running are turned on until they end (the executor cuts
                // them short once `stop` is set, which comes before `exit`).
                let done = self.exit.load(Ordering::Acquire) && self.finished();
                if self.has_jobs() || done {
                    return;
                }
                self.turn(MAX_SLEEP);
            });
            self.settle();
        }
    }

    /// Sends the reply of every batch reported done: its results stored into its items,
    /// then as a worker thread sends it. Whether there was any.
    fn settle(&mut self) -> bool {
        if self.done.is_empty() {
            return false;
        }
        for seat_index in std::mem::take(&mut self.done) {
            let seat = &mut self.seats[seat_index];
            let Some(mut running) = seat.running.take() else {
                continue;
            };
            store(
                &mut running.items,
                running.results.take().unwrap_or_default(),
            );
            let reply = batch_done(
                running.batch,
                running.items,
                Ok(()),
                running.dispatched_ns,
                running.direct,
            );
            // As on a worker thread: the engine sends at most `reserve` jobs before it gets
            // their replies back, and events never take those slots.
            if seat.results.push(reply).is_err() {
                unreachable!("seat {seat_index} result ring full: engine invariant broken");
            }
        }
        self.engine_bell.ring();
        true
    }

    /// Starts the next job of every idle seat; whether any started.
    fn start_jobs(&mut self) -> bool {
        let mut started = false;
        for s in 0..self.seats.len() {
            let seat = &mut self.seats[s];
            if seat.running.is_some() {
                continue;
            }
            let Some(job) = seat.jobs.pop() else {
                continue;
            };
            let BatchMsg {
                batch,
                items,
                dispatched_ns,
                direct,
            } = job;
            let tickets = items.iter().map(|i| i.ticket).collect();
            seat.running = Some(Running {
                batch,
                items: Vec::new(),
                dispatched_ns,
                direct,
                tickets,
                results: None,
            });
            started = true;
            let (exec, mut progress) = self.parts();
            let outcome = catch_unwind(AssertUnwindSafe(|| exec.start(s, &items, &mut progress)));
            if let Some(running) = self.seats[s].running.as_mut() {
                running.items = items;
            }
            if outcome.is_err() {
                self.recover();
            }
        }
        started
    }

    /// One turn of the executor, waiting at most `timeout`; whether anything moved.
    fn turn(&mut self, timeout: Duration) -> bool {
        let (exec, mut progress) = self.parts();
        let outcome = catch_unwind(AssertUnwindSafe(|| exec.turn(timeout, &mut progress)));
        outcome.unwrap_or_else(|_| {
            self.recover();
            true
        })
    }

    /// After a panic inside the executor: every batch it holds comes back failed. A seat
    /// whose items went down with the panic cannot be answered, which the runtime cannot
    /// survive: the process aborts rather than leave its requests hanging.
    fn recover(&mut self) {
        tracing::error!("the upstream event loop panicked; failing the batches it held");
        let (exec, mut progress) = self.parts();
        let abandoned = catch_unwind(AssertUnwindSafe(|| exec.abandon(&mut progress)));
        let lost = self
            .seats
            .iter()
            .any(|s| s.running.as_ref().is_some_and(|r| r.results.is_none()));
        if abandoned.is_err() || lost {
            tracing::error!("the upstream event loop lost batches in a panic; aborting");
            std::process::abort();
        }
    }

    fn parts(&mut self) -> (&mut dyn ConcurrentExecutor, SeatProgress<'_>) {
        (
            &mut *self.exec,
            SeatProgress {
                seats: &mut self.seats,
                engine_bell: &self.engine_bell,
                reserve: self.reserve,
                done: &mut self.done,
            },
        )
    }

    /// An idle seat has a job waiting.
    fn has_jobs(&self) -> bool {
        self.seats
            .iter()
            .any(|s| s.running.is_none() && !s.jobs.is_empty())
    }

    /// No job waits and no batch runs.
    fn finished(&self) -> bool {
        self.seats
            .iter()
            .all(|s| s.running.is_none() && s.jobs.is_empty())
    }
}
