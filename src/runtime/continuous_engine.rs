//! The engine thread in continuous-batching mode: drives [`Continuous`] instead of the
//! request-level core. Each turn: take submissions, take finished steps (answer finished
//! requests, send token events to streaming submitters), tick every idle replica (one step
//! each), idle until a doorbell.
//!
//! Same rules as the request-level engine: after start-up no allocation, no lock (other
//! than `try_lock` to publish), no blocking. Step buffers circulate engine -> worker ->
//! engine; request payloads are moved or `Arc`-shared, never copied.

use super::engine::{EngineIo, RouteState, WorkerLink};
use super::idle::Idler;
use super::messages::{Control, FromWorker, RequestError, Submission, ToWorker};
use super::snapshot::{ContinuousSnapshot, WorkerSnapshot, SNAPSHOT_INTERVAL_NS};
use crate::core::continuous::{Continuous, ContinuousReject, EntryResult, StepAction};
use crate::core::pool::WorkerStatus;
use crate::core::{FailReason, Nanos, Reject, Ticket};
use crate::exec::StepItem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Token-timing samples buffered between publishes (each kind).
const TOKEN_SAMPLES: usize = 16 * 1024;

/// Pushes a sample unless the buffer is full (then it is counted as dropped).
fn push_sample(buf: &mut Vec<u64>, value: u64, dropped: &mut u64) {
    if buf.len() < buf.capacity() {
        buf.push(value);
    } else {
        *dropped += 1;
    }
}

/// The continuous-batching engine.
pub struct ContinuousEngine {
    sched: Continuous,
    io: EngineIo,
    idler: Idler,
    /// One step buffer per replica while it is home (None while its step is out).
    step_bufs: Vec<Option<Vec<StepItem>>>,
    /// Scratch: the results of one step, in entry order.
    results: Vec<EntryResult>,
    /// Scratch: tickets of requests that left their slot in one step.
    ended: Vec<(Ticket, EntryResult)>,
    /// Counters the request-level core would keep.
    completed: u64,
    failed: u64,
    worker_errors: u64,
    rejected_full: u64,
    rejected_draining: u64,
    steps_per_replica: Vec<u64>,
    busy_since: Vec<Nanos>,
    busy_total: Vec<Nanos>,
    drain_deadline_ns: Option<Nanos>,
    aborted: bool,
    stop: Arc<AtomicBool>,
    /// A request still waiting for a slot this long fails (batching.request_timeout).
    request_timeout_ns: Nanos,
    /// Time-to-first-token and time-per-output-token samples since the last publish
    /// (capacity fixed at start; when full, samples are counted as dropped).
    new_ttft_ns: Vec<u64>,
    new_tpot_ns: Vec<u64>,
    output_tokens: u64,
}

impl ContinuousEngine {
    /// Builds the engine; every buffer it will use is allocated here.
    pub(super) fn new(
        sched: Continuous,
        io: EngineIo,
        idler: Idler,
        stop: Arc<AtomicBool>,
        request_timeout_ns: Nanos,
    ) -> ContinuousEngine {
        let replicas = sched.config().replicas;
        let slots = sched.config().max_slots;
        ContinuousEngine {
            step_bufs: (0..replicas)
                .map(|_| Some(Vec::with_capacity(slots)))
                .collect(),
            results: Vec::with_capacity(slots),
            ended: Vec::with_capacity(slots),
            completed: 0,
            failed: 0,
            worker_errors: 0,
            rejected_full: 0,
            rejected_draining: 0,
            steps_per_replica: vec![0; replicas],
            busy_since: vec![0; replicas],
            busy_total: vec![0; replicas],
            sched,
            io,
            idler,
            drain_deadline_ns: None,
            aborted: false,
            stop,
            request_timeout_ns,
            new_ttft_ns: Vec::with_capacity(TOKEN_SAMPLES),
            new_tpot_ns: Vec::with_capacity(TOKEN_SAMPLES),
            output_tokens: 0,
        }
    }

    /// Runs until drained (after a `Drain` control) and every step has come back.
    pub fn run(mut self) {
        self.io.shared.engine_bell.bind_current();
        loop {
            let now = self.io.clock.now();
            let mut worked = self.io.accept_submitters();
            worked |= self.read_controls(now);
            worked |= self.admit_submissions(now);
            worked |= self.drain_cancels(now);
            worked |= self.drain_steps(now);
            self.expire_waiting(now);
            if let Some(deadline) = self.drain_deadline_ns {
                if now >= deadline && !self.aborted && !self.sched.is_idle() {
                    self.abort(now);
                }
            }
            worked |= self.tick(now);
            self.io.flush_wakes();
            if now.saturating_sub(self.io.published_at_ns) >= SNAPSHOT_INTERVAL_NS {
                self.publish(now);
            }
            let finished = self.sched.is_idle()
                || (self.aborted && (0..self.step_bufs.len()).all(|r| !self.sched.is_busy(r)));
            let watch_gate = self.drain_deadline_ns.is_some() && finished;
            if watch_gate && self.io.intake_drained() {
                self.publish(now);
                return;
            }
            if worked {
                self.idler.busy();
            } else {
                let io = &self.io;
                self.idler
                    .idle(io.clock.instant(now), None, &io.shared.engine_bell, || {
                        io.has_work() || (watch_gate && io.shared.gate.is_closed_and_empty())
                    });
            }
        }
    }

    fn read_controls(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        while let Some(c) = self.io.shared.control.pop() {
            worked = true;
            match c {
                // Strategies govern request-level batches; the API refuses the switch in
                // continuous mode, so one reaching here is ignored.
                Control::SetStrategy(_) => {}
                Control::Drain { deadline_ns } => {
                    while self.admit_submissions(now) {}
                    self.sched.begin_drain();
                    self.drain_deadline_ns = Some(deadline_ns);
                }
            }
        }
        worked
    }

    fn admit_submissions(&mut self, _now: Nanos) -> bool {
        let sched = &mut self.sched;
        let rejected_full = &mut self.rejected_full;
        let rejected_draining = &mut self.rejected_draining;
        self.io.drain_submissions(|io, s, sub| {
            // One backend only (config enforces it): the io thread checked the model.
            let Submission {
                meta, work, reply, ..
            } = sub;
            match sched.admit(meta) {
                Ok(ticket) => io.occupy(ticket.index, s, reply, work, meta, RouteState::NONE),
                Err(reject) => {
                    let error = match reject {
                        ContinuousReject::QueueFull { .. } => {
                            *rejected_full += 1;
                            RequestError::Rejected(Reject::QueueFull {
                                capacity: sched.config().max_queue,
                            })
                        }
                        ContinuousReject::ShuttingDown => {
                            *rejected_draining += 1;
                            RequestError::Rejected(Reject::ShuttingDown)
                        }
                        ContinuousReject::TooLarge { needed, capacity } => {
                            RequestError::Rejected(Reject::TooLarge { needed, capacity })
                        }
                    };
                    drop(work);
                    io.send(s, reply, Err(error), None);
                }
            }
        })
    }

    /// Cancels requests whose client went away: a waiting one is dropped and answered
    /// (cancelled) now; an active one is marked and leaves its slot at its next step.
    fn drain_cancels(&mut self, now: Nanos) -> bool {
        let sched = &mut self.sched;
        let failed = &mut self.failed;
        self.io.drain_cancels(|io, index| {
            if let Some(ticket) = sched.ticket_of(index) {
                if sched.cancel_waiting(ticket) {
                    *failed += 1;
                    io.finish(now, index, Err(RequestError::Failed(FailReason::Cancelled)));
                }
            }
        })
    }

    /// Takes finished steps: answers requests that ended, frees slots.
    fn drain_steps(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        for r in 0..self.io.workers.len() {
            while let Some(msg) = self.io.workers[r].results.pop() {
                worked = true;
                let FromWorker::Step(mut items, result) = msg else {
                    unreachable!("continuous engine sent no batches");
                };
                self.busy_total[r] += now.saturating_sub(self.busy_since[r]);
                if result.is_ok() {
                    // Tokens first: a request's Done must follow its last token.
                    for item in items.iter_mut() {
                        let e = item.entry;
                        if e.samples() && e.generated == 0 {
                            let slot = &mut self.io.pending[e.ticket.index as usize];
                            if slot.first_token_ns == 0 {
                                slot.first_token_ns = now.max(1);
                                let ttft = now.saturating_sub(slot.meta.arrival_ns).max(1);
                                push_sample(
                                    &mut self.new_ttft_ns,
                                    ttft,
                                    &mut self.io.samples_dropped,
                                );
                            }
                        }
                        if let Some(text) = item.token.take() {
                            self.io.send_token(e.ticket.index, item.token_offset, text);
                        }
                    }
                }
                self.results.clear();
                if result.is_err() {
                    // The forward pass failed: every request in it fails with the error.
                    self.worker_errors += 1;
                    self.results
                        .extend(items.iter().map(|_| EntryResult::Cancelled));
                } else {
                    let pending = &self.io.pending;
                    self.results.extend(items.iter().map(|i| {
                        if pending[i.entry.ticket.index as usize].cancelled {
                            EntryResult::Cancelled
                        } else {
                            i.result
                        }
                    }));
                }
                self.ended.clear();
                let ended = &mut self.ended;
                self.sched
                    .complete_step(r, &self.results, &mut |t, res| ended.push((t, res)));
                for i in 0..self.ended.len() {
                    let (ticket, _) = self.ended[i];
                    let first_token_ns =
                        std::mem::take(&mut self.io.pending[ticket.index as usize].first_token_ns);
                    let outcome = match (
                        &result,
                        items.iter_mut().find(|it| it.entry.ticket == ticket),
                    ) {
                        (Ok(()), Some(item)) => match item.output.take() {
                            Some(out) => Ok(out),
                            None => Err(RequestError::Failed(FailReason::Cancelled)),
                        },
                        (Err(e), _) => Err(RequestError::Worker(e.to_string())),
                        (Ok(()), None) => Err(RequestError::Failed(FailReason::WorkerError)),
                    };
                    if let Ok(crate::exec::Output::Text {
                        completion_tokens, ..
                    }) = &outcome
                    {
                        self.output_tokens += u64::from(*completion_tokens);
                        if *completion_tokens > 1 && first_token_ns > 0 {
                            let tpot = now.saturating_sub(first_token_ns)
                                / u64::from(completion_tokens - 1);
                            push_sample(
                                &mut self.new_tpot_ns,
                                tpot.max(1),
                                &mut self.io.samples_dropped,
                            );
                        }
                    }
                    if outcome.is_ok() {
                        self.completed += 1;
                    } else {
                        self.failed += 1;
                    }
                    self.io.finish(now, ticket.index, outcome);
                }
                for item in items.iter_mut() {
                    item.work = None;
                    item.token = None;
                    item.output = None;
                }
                items.clear();
                self.step_bufs[r] = Some(items);
            }
        }
        worked
    }

    /// One tick: every replica without a step out gets its next step.
    fn tick(&mut self, now: Nanos) -> bool {
        let io = &mut self.io;
        let bufs = &mut self.step_bufs;
        let steps = &mut self.steps_per_replica;
        let busy_since = &mut self.busy_since;
        self.sched.tick(&mut |action| match action {
            StepAction::Step {
                replica, entries, ..
            } => {
                let mut items = bufs[replica]
                    .take()
                    .expect("a replica without a step out has its buffer");
                for e in entries {
                    let work = if e.admitted {
                        // Arc-shared prompt: no allocation; the engine keeps its copy so a
                        // preempted request can be sent again.
                        io.pending[e.ticket.index as usize].work.clone()
                    } else {
                        None
                    };
                    items.push(StepItem {
                        entry: *e,
                        work,
                        token: None,
                        token_offset: 0,
                        result: EntryResult::Continue,
                        output: None,
                    });
                }
                steps[replica] += 1;
                busy_since[replica] = now;
                let link: &mut WorkerLink = &mut io.workers[replica];
                if link.batches.push(ToWorker::Step(items)).is_err() {
                    unreachable!("one step out per replica fits its ring");
                }
                link.bell.ring();
            }
            // The worker drops the slot's state when the slot is next admitted into.
            StepAction::Preempted { .. } => {}
        })
    }

    /// Fails requests that waited for a slot past the request deadline.
    fn expire_waiting(&mut self, now: Nanos) {
        if self.sched.waiting() == 0 {
            return;
        }
        let io = &mut self.io;
        let failed = &mut self.failed;
        self.sched
            .expire_waiting(now, self.request_timeout_ns, &mut |t| {
                *failed += 1;
                io.finish(
                    now,
                    t.index,
                    Err(RequestError::Failed(FailReason::QueueTimeout)),
                );
            });
    }

    /// Deadline passed: answer everything left with an error and let workers stop.
    fn abort(&mut self, now: Nanos) {
        let io = &mut self.io;
        let failed = &mut self.failed;
        self.sched.abort_all(&mut |t| {
            *failed += 1;
            io.finish(now, t.index, Err(RequestError::Failed(FailReason::Aborted)));
        });
        self.aborted = true;
        self.stop.store(true, Ordering::Release);
    }

    fn publish(&mut self, now: Nanos) {
        self.io.published_at_ns = now;
        let Ok(mut snap) = self.io.shared.snapshot.try_lock() else {
            return;
        };
        snap.at_ns = now;
        let c = *self.sched.stats();
        snap.stats.admitted = c.admitted;
        snap.stats.rejected_full = self.rejected_full;
        snap.stats.rejected_draining = self.rejected_draining;
        snap.stats.completed = self.completed;
        snap.stats.failed = self.failed;
        snap.stats.worker_errors = self.worker_errors;
        snap.stats.aborted = if self.aborted { self.failed } else { 0 };
        snap.queued = self.sched.waiting();
        snap.live_requests = self.sched.waiting()
            + (0..self.step_bufs.len())
                .map(|r| self.sched.active_slots(r))
                .sum::<usize>();
        for (r, w) in snap.workers.iter_mut().enumerate() {
            let busy = self.sched.is_busy(r);
            *w = WorkerSnapshot {
                status: if busy {
                    WorkerStatus::Busy
                } else {
                    WorkerStatus::Idle
                },
                circuit: crate::core::circuit::CircuitState::Closed,
                pending: u32::from(busy),
                busy_ns: self.busy_total[r]
                    + if busy {
                        now.saturating_sub(self.busy_since[r])
                    } else {
                        0
                    },
                batches_ok: self.steps_per_replica[r],
                batches_failed: 0,
            };
        }
        snap.continuous = Some(ContinuousSnapshot {
            stats: c,
            slots_total: self.sched.slots_total(),
            active_slots: (0..self.step_bufs.len())
                .map(|r| self.sched.active_slots(r))
                .sum(),
            kv_used_tokens: (0..self.step_bufs.len())
                .map(|r| self.sched.kv_used(r))
                .sum(),
            kv_capacity_tokens: self.sched.config().kv_capacity_tokens
                * self.step_bufs.len() as u64,
            output_tokens: self.output_tokens,
        });
        EngineIo::move_samples(&mut self.new_ttft_ns, &mut snap.ttft);
        EngineIo::move_samples(&mut self.new_tpot_ns, &mut snap.tpot);
        EngineIo::move_samples(&mut self.io.new_latencies_ns, &mut snap.latency);
        snap.samples_dropped = self.io.samples_dropped;
        snap.draining = self.sched.is_draining();
    }
}
