//! The engine thread: the only owner of the scheduling cores and the router in the live
//! runtime.
//!
//! One core per backend ("lane": its queues, its workers, their circuit breakers). Each turn
//! it reads the clock once, takes health changes, drains submitter rings (highest priority
//! first) routing each request to a backend's core, drains worker results (answering, or
//! moving a request a backend failed to another backend), polls every core and carries out
//! their actions, then idles per policy until the earliest deadline or a doorbell. After
//! start-up it must not allocate (error answers excepted), lock (other than `try_lock` to
//! publish a snapshot), or block; `tests/no_alloc.rs` checks the allocation part over
//! 100,000 requests, routed across backends too.

use super::clock::Clock;
use super::doorbell::Doorbell;
use super::idle::Idler;
use super::intake::{self, IntakeRx};
use super::messages::{
    BatchMsg, Completion, Control, Event, FromWorker, Outcome, Reply, RequestError, ResultMsg,
    RouteRequest, Submission, ToWorker,
};
use super::ring::{Consumer, Producer};
use super::snapshot::{WorkerSnapshot, SNAPSHOT_INTERVAL_NS};
use super::Shared;
use crate::core::circuit::CircuitState;
use crate::core::{
    Action, BatchOutcome, Completion as CoreCompletion, Core, FailReason, Nanos, Priority,
    BUCKET_COUNT, CLASS_COUNT,
};
use crate::core::{Reject, RequestMeta};
use crate::exec::{BatchItem, ExecError, Work};
use crate::router::{BackendId, Decision, ModelId, NameId, Need, Router, Via};
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Samples buffered between publishes (latencies and batch sizes each).
const SAMPLE_BUFFER: usize = 16 * 1024;

/// The `tag_slots` key of a tag: its low 32 bits (io threads put a slab index there and a
/// generation above; the live check compares the whole tag).
fn tag_key(tag: u64) -> usize {
    (tag & 0xffff_ffff) as usize
}

/// Which sample buffer a value goes to.
#[derive(Clone, Copy)]
enum SampleKind {
    Latency,
    BatchSize,
}

/// Most submissions admitted per turn, so results keep flowing under a flood.
const ADMIT_BUDGET_PER_TURN: usize = 4096;

/// The engine's end of one submitter.
pub struct SubmitterLink {
    /// One ring per class, indexed by `class_index(priority, bucket)`, with its ready mask.
    pub intake: IntakeRx<Submission>,
    pub completions: Producer<Completion>,
    /// Called after completions were pushed in a turn (e.g. a mio Waker); `None` for
    /// submitters that poll.
    pub wake: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Tags whose client went away (a closed connection): best-effort cancellation.
    pub cancels: Consumer<u64>,
    /// Engine-local: table slot of each live tagged request by tag, for tags below its
    /// length (io threads' tags are small slab indices); `u32::MAX` when none.
    pub tag_slots: Vec<u32>,
    /// Engine-local: submissions taken from `intake` and not yet answered.
    pub live: u32,
}

impl SubmitterLink {
    /// The submitter was dropped and everything it submitted is answered: its place can go
    /// to a new submitter.
    fn is_retired(&self) -> bool {
        self.live == 0 && self.intake.is_closed_and_empty()
    }
}

/// A request the engine holds between admission and its answer, by table slot.
pub(super) struct PendingSlot {
    /// The client went away: cancel at the next opportunity.
    pub(super) cancelled: bool,
    pub(super) work: Option<Work>,
    pub(super) reply: Option<Reply>,
    pub(super) submitter: u16,
    /// Continuous batching: when the first output token was sampled (0: not yet).
    pub(super) first_token_ns: Nanos,
    /// The client asked for a stream (token events wanted).
    pub(super) stream: bool,
    /// A token event reached the submitter: the request may no longer move to another
    /// backend (the client has seen part of this backend's answer).
    pub(super) tokens_sent: bool,
    /// What the request asked for, and when it arrived (`meta.arrival_ns`).
    pub(super) meta: RequestMeta,
    /// Request-level batching: where the request went.
    pub(super) route: RouteState,
}

/// Where a routed request went, and the backends that failed it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RouteState {
    pub(super) name: NameId,
    pub(super) need: Need,
    pub(super) decision: Option<Decision>,
    /// Backends tried so far (the current one last).
    pub(super) tried: [BackendId; MAX_TRIES],
    pub(super) tried_len: u8,
}

/// Most backends one request is tried on: the first plus `routing.max_retries` (<= 8).
pub const MAX_TRIES: usize = 9;

impl RouteState {
    pub(super) const NONE: RouteState = RouteState {
        name: NameId::FIRST,
        need: Need {
            estimated_tokens: 0,
            needs: crate::router::Capabilities {
                vision: false,
                tools: false,
                json_mode: false,
            },
        },
        decision: None,
        tried: [BackendId::FIRST; MAX_TRIES],
        tried_len: 0,
    };

    fn tried(&self) -> &[BackendId] {
        &self.tried[..self.tried_len as usize]
    }
}

/// The engine's end of one worker.
pub struct WorkerLink {
    pub batches: Producer<ToWorker>,
    pub results: Consumer<FromWorker>,
    pub bell: Arc<Doorbell>,
}

/// Everything except the scheduler, so closures over it can run while the scheduler is
/// borrowed. Shared by the request-level engine and the continuous one.
pub(super) struct EngineIo {
    pub(super) clock: Clock,
    pub(super) shared: Arc<Shared>,
    /// Registered submitters by place (`PendingSlot::submitter`); a retired one's place is
    /// reused.
    pub(super) submitters: Vec<SubmitterLink>,
    max_submitters: usize,
    /// Submitters that got completions this turn and need a wake.
    needs_wake: Vec<bool>,
    pub(super) pending: Vec<PendingSlot>,
    pub(super) workers: Vec<WorkerLink>,
    free_bufs: Vec<Vec<BatchItem>>,
    /// Latencies (ns) and batch sizes recorded since the last publish. Moved into the
    /// snapshot's histograms at publish time, so publishing costs O(new samples), not
    /// O(histogram size). Capacity fixed at start; when full, the engine publishes at once.
    pub(super) new_latencies_ns: Vec<u64>,
    pub(super) new_batch_sizes: Vec<u64>,
    /// Samples that could not be published because a reader held the snapshot lock while
    /// the buffers were full (exported, expected to stay 0).
    pub(super) samples_dropped: u64,
    pub(super) published_at_ns: Nanos,
}

/// Live health of backends, as a health checker publishes it (`sim` backends are always
/// healthy). Read by the engine once per turn: a generation counter first, the flags only
/// when it moved.
pub trait BackendHealth: Send + Sync {
    /// Bumped on every change.
    fn generation(&self) -> u64;
    fn healthy(&self, backend: usize) -> bool;
}

/// One backend's scheduler and where its requests and workers sit in the engine's tables.
pub struct Lane {
    pub core: Core,
    /// The lane's table slot `i` is the engine's pending slot `pending_base + i`.
    pub pending_base: u32,
    /// The lane's worker `w` is the engine's worker `worker_base + w`.
    pub worker_base: u32,
}

/// A lane's offsets, copied out so closures over the I/O can use them while the lane's core
/// is borrowed.
#[derive(Clone, Copy)]
struct LaneAt {
    backend: BackendId,
    pending_base: u32,
    worker_base: u32,
}

impl Lane {
    fn at(&self, index: usize) -> LaneAt {
        LaneAt {
            backend: BackendId::from_index(index),
            pending_base: self.pending_base,
            worker_base: self.worker_base,
        }
    }
}

/// Routing state the engine owns (only the engine thread touches it).
pub struct Routing {
    pub router: Router,
    /// Served model names by `ModelId`, shared so a request's `Work` gets one without
    /// allocating.
    pub model_names: Vec<Arc<str>>,
    /// Per backend: its executor reads `Work::model` (upstream backends; a `sim` one does
    /// not, and skipping the shared counter's increment and decrement keeps the hot path
    /// cheaper).
    wants_model: Vec<bool>,
    /// The name requests without a resolved model (in-process callers) are routed by.
    pub default_name: NameId,
    pub health: Option<Arc<dyn BackendHealth>>,
    health_seen: u64,
    /// Per backend: counters published in the snapshot.
    counters: Vec<crate::runtime::snapshot::BackendSnapshot>,
    /// Per backend: when its circuit as routing sees it may change without a batch
    /// completing (an open worker circuit becomes due its probe); `Nanos::MAX`: not before
    /// the next completion.
    circuit_due_ns: Vec<Nanos>,
}

impl Routing {
    pub fn new(
        router: Router,
        default_name: NameId,
        health: Option<Arc<dyn BackendHealth>>,
    ) -> Routing {
        let registry = router.registry();
        let model_names = (0..registry.model_count())
            .map(|m| Arc::from(registry.model_name(ModelId::from_index(m))))
            .collect();
        let counters = vec![Default::default(); registry.len()];
        let wants_model = registry
            .backends()
            .map(|(_, b)| matches!(b.kind(), crate::router::BackendKind::Upstream { .. }))
            .collect();
        let circuit_due_ns = vec![Nanos::MAX; registry.len()];
        Routing {
            router,
            model_names,
            wants_model,
            default_name,
            health,
            health_seen: u64::MAX,
            counters,
            circuit_due_ns,
        }
    }

    /// What `Work::model` must hold for `model` on `backend`: its name for an upstream
    /// backend, nothing for a `sim` one.
    fn model_for(&self, backend: BackendId, model: ModelId) -> Option<Arc<str>> {
        self.wants_model[backend.index()].then(|| self.model_names[model.index()].clone())
    }

    /// Takes health changes the checker published.
    fn refresh_health(&mut self) {
        let Some(h) = &self.health else { return };
        let generation = h.generation();
        if generation == self.health_seen {
            return;
        }
        self.health_seen = generation;
        for b in 0..self.counters.len() {
            let healthy = h.healthy(b);
            self.router
                .registry_mut()
                .set_healthy(BackendId::from_index(b), healthy);
        }
    }
}

/// The engine: a core per backend, the router, and their I/O.
pub struct Engine {
    lanes: Vec<Lane>,
    /// Lane of each engine worker.
    worker_lane: Vec<u16>,
    routing: Routing,
    io: EngineIo,
    idler: Idler,
    drain_deadline_ns: Option<Nanos>,
    /// Set once the drain deadline passed and everything left was aborted.
    aborted: bool,
    /// Tells workers (and their executors) to cut work short and exit.
    stop: Arc<AtomicBool>,
    stats_fix: StatsFix,
}

/// What the cores' own counters get wrong about requests that failed on one backend: a
/// request moved to another backend is counted again there (as `readmitted`) and its first
/// core counted it as finished; a request that failed alone in a batch its core counted as
/// served was not completed. Applied to the merged stats at publish, so the exported
/// outcomes count each client request once, by its final answer.
#[derive(Clone, Copy, Debug, Default)]
struct StatsFix {
    moved_from_ok_batch: u64,
    moved_from_failed_batch: u64,
    failed_in_ok_batch: u64,
}

impl StatsFix {
    fn apply(&self, s: &mut crate::core::CoreStats) {
        let moved = self.moved_from_failed_batch;
        s.completed = s
            .completed
            .saturating_sub(self.moved_from_ok_batch + self.failed_in_ok_batch);
        s.failed = (s.failed + self.failed_in_ok_batch).saturating_sub(moved);
        s.worker_errors = (s.worker_errors + self.failed_in_ok_batch).saturating_sub(moved);
    }
}

impl Engine {
    /// Builds the engine: `cores[b]` schedules backend `b` of `routing`'s router and owns the
    /// next `cores[b].config().workers` entries of `workers`. Every buffer it will use is
    /// allocated here.
    #[allow(clippy::too_many_arguments)] // each is a separate thing the engine takes over
    pub fn new(
        cores: Vec<Core>,
        routing: Routing,
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink>,
        idler: Idler,
        max_submitters: usize,
        stop: Arc<AtomicBool>,
    ) -> Engine {
        assert_eq!(
            cores.len(),
            routing.router.registry().len(),
            "a core per backend"
        );
        let mut lanes = Vec::with_capacity(cores.len());
        let mut worker_lane = Vec::with_capacity(workers.len());
        let (mut table, mut batch_slots, mut batch_len) = (0usize, 0usize, 0usize);
        for (l, core) in cores.into_iter().enumerate() {
            let cfg = core.config();
            let (capacity, workers_here) = (cfg.queue_capacity.max(1), cfg.workers);
            batch_slots += workers_here * cfg.max_inflight_per_worker.max(1) as usize;
            batch_len = batch_len.max(core.max_batch_len());
            lanes.push(Lane {
                pending_base: table as u32,
                worker_base: worker_lane.len() as u32,
                core,
            });
            table += capacity;
            worker_lane.extend(std::iter::repeat_n(l as u16, workers_here));
        }
        assert_eq!(
            worker_lane.len(),
            workers.len(),
            "a worker link per core worker"
        );
        let io = EngineIo::new(
            clock,
            shared,
            workers,
            max_submitters,
            table,
            batch_slots,
            batch_len,
        );
        Engine {
            lanes,
            worker_lane,
            routing,
            io,
            idler,
            drain_deadline_ns: None,
            aborted: false,
            stop,
            stats_fix: StatsFix::default(),
        }
    }

    fn all_idle(&self) -> bool {
        self.lanes.iter().all(|l| l.core.is_idle())
    }

    fn live_requests(&self) -> usize {
        self.lanes.iter().map(|l| l.core.live_requests()).sum()
    }

    /// Runs until drained (after a `Drain` control) and every batch has come back.
    pub fn run(mut self) {
        self.io.shared.engine_bell.bind_current();
        loop {
            let now = self.io.clock.now();
            self.routing.refresh_health();
            // Before admission: a circuit due its probe must be routable for this turn's
            // requests (nothing else wakes the engine when a recovery time passes).
            for (l, lane) in self.lanes.iter().enumerate() {
                if now >= self.routing.circuit_due_ns[l] {
                    Self::sync_circuit(&mut self.routing, lane.at(l).backend, &lane.core, now);
                }
            }
            let mut worked = self.io.accept_submitters();
            worked |= self.read_controls(now);
            worked |= self.admit_submissions(now);
            worked |= self.drain_cancels(now);
            worked |= self.drain_results(now);
            if let Some(deadline) = self.drain_deadline_ns {
                if now >= deadline && !self.aborted && !self.all_idle() {
                    for (l, lane) in self.lanes.iter_mut().enumerate() {
                        let at = lane.at(l);
                        let io = &mut self.io;
                        let routing = &mut self.routing;
                        lane.core
                            .abort_all(now, &mut |a| io.act(now, at, routing, a));
                    }
                    self.aborted = true;
                    // Executors still running abandoned batches may stop early now.
                    self.stop.store(true, Ordering::Release);
                }
            }
            let mut dispatched = false;
            let mut next: Option<Nanos> = None;
            for (l, lane) in self.lanes.iter_mut().enumerate() {
                let at = lane.at(l);
                let io = &mut self.io;
                let routing = &mut self.routing;
                let lane_next = lane.core.poll(now, &mut |a| {
                    dispatched = true;
                    io.act(now, at, routing, a)
                });
                next = match (next, lane_next) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            worked |= dispatched;
            self.io.flush_wakes();
            if now.saturating_sub(self.io.published_at_ns) >= SNAPSHOT_INTERVAL_NS {
                self.publish(now);
            }
            // Done when drained; after an abort, do not wait for abandoned batches.
            let finished = self.all_idle() || (self.aborted && self.live_requests() == 0);
            // Drained and finished, the engine waits only for the gate to empty: a submitter
            // leaving it rings, and the re-check before sleeping looks at the gate.
            let watch_gate = self.drain_deadline_ns.is_some() && finished;
            if watch_gate && self.io.intake_drained() {
                self.publish(now);
                return;
            }
            if worked {
                self.idler.busy();
            } else {
                let io = &self.io;
                let deadline = next.map(|n| io.clock.instant(n));
                self.idler.idle(
                    io.clock.instant(now),
                    deadline,
                    &io.shared.engine_bell,
                    || io.has_work() || (watch_gate && io.shared.gate.is_closed_and_empty()),
                );
            }
        }
    }

    /// A backend's circuit as routing sees it, from its workers' breakers: closed while any
    /// worker's is closed or due a probe (so the probe batch can be routed there), open when
    /// every worker's is open and none is due.
    fn sync_circuit(routing: &mut Routing, backend: BackendId, core: &Core, now: Nanos) {
        let params = core.config().circuit;
        let mut state = CircuitState::Open;
        // Only while no worker's circuit is closed can time alone change the state (an open
        // one becomes due its probe); a closed one changes only when a batch completes,
        // which syncs again.
        let mut next_due = Nanos::MAX;
        for w in core.workers() {
            match w.circuit.last_state() {
                CircuitState::Closed => {
                    state = CircuitState::Closed;
                    next_due = Nanos::MAX;
                    break;
                }
                CircuitState::HalfOpen => state = CircuitState::HalfOpen,
                CircuitState::Open => match w.circuit.reopens_at(&params) {
                    Some(t) if now >= t => state = CircuitState::HalfOpen,
                    Some(t) => next_due = next_due.min(t),
                    None => {}
                },
            }
        }
        routing.circuit_due_ns[backend.index()] = next_due;
        let c = &mut routing.counters[backend.index()];
        c.circuit = state;
        let routed_state = match state {
            CircuitState::Open => CircuitState::Open,
            _ => CircuitState::Closed,
        };
        if routing.router.registry().state(backend).circuit() != routed_state {
            routing
                .router
                .registry_mut()
                .set_circuit(backend, routed_state);
        }
    }

    fn read_controls(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        while let Some(c) = self.io.shared.control.pop() {
            worked = true;
            match c {
                Control::SetStrategy(kind) => {
                    for lane in &mut self.lanes {
                        lane.core.set_strategy(kind);
                    }
                }
                Control::Drain { deadline_ns } => {
                    // Admit what is already in the rings before refusing new work.
                    self.admit_all(now);
                    for lane in &mut self.lanes {
                        lane.core.begin_drain();
                    }
                    self.drain_deadline_ns = Some(deadline_ns);
                }
            }
        }
        worked
    }

    fn admit_all(&mut self, now: Nanos) {
        while self.admit_submissions(now) {}
    }

    /// Admits up to the per-turn budget, highest priority first across all submitters.
    fn admit_submissions(&mut self, now: Nanos) -> bool {
        let lanes = &mut self.lanes;
        let routing = &mut self.routing;
        self.io
            .drain_submissions(|io, s, sub| Self::admit_one(lanes, routing, io, now, s, sub))
    }

    fn admit_one(
        lanes: &mut [Lane],
        routing: &mut Routing,
        io: &mut EngineIo,
        now: Nanos,
        submitter: u16,
        sub: Submission,
    ) {
        let Submission {
            meta,
            mut work,
            reply,
            route,
        } = sub;
        let route = route.unwrap_or(RouteRequest {
            name: routing.default_name,
            need: Need::default(),
        });
        let mut decision = match routing.router.route_name(route.name, &route.need) {
            Ok(d) => d,
            Err(e) => {
                // Cold path (no backend can take it now): the error message allocates.
                io.send(submitter, reply, Err(RequestError::Route(e)), None);
                return;
            }
        };
        // A full queue on the chosen backend: try the model's other candidates before 429.
        let mut full = [BackendId::FIRST; MAX_TRIES];
        let mut full_len = 0;
        let admitted = loop {
            let b = decision.backend.index();
            match lanes[b].core.admit(now, meta) {
                Err(Reject::QueueFull { capacity }) if full_len < MAX_TRIES - 1 => {
                    full[full_len] = decision.backend;
                    full_len += 1;
                    let req = route.need.requirements();
                    match routing
                        .router
                        .pick_excluding(decision.model, &req, &full[..full_len])
                    {
                        Some(next) => decision.backend = next,
                        None => break Err(Reject::QueueFull { capacity }),
                    }
                }
                other => break other,
            }
        };
        let b = decision.backend.index();
        work.model = routing.model_for(decision.backend, decision.model);
        let lane = &mut lanes[b];
        match admitted {
            Ok(ticket) => {
                let c = &mut routing.counters[b];
                c.routed += 1;
                match decision.via {
                    Via::Direct => {}
                    Via::Alias { .. } => c.via_alias += 1,
                    Via::Fallback { .. } => c.via_fallback += 1,
                }
                let index = lane.pending_base + ticket.index;
                let mut state = RouteState::NONE;
                state.name = route.name;
                state.need = route.need;
                state.decision = Some(decision);
                state.tried[0] = decision.backend;
                state.tried_len = 1;
                io.occupy(index, submitter, reply, work, meta, state);
            }
            Err(reject) => {
                drop(work);
                io.send(submitter, reply, Err(RequestError::Rejected(reject)), None);
            }
        }
    }

    /// Cancels requests whose client went away: a queued one is removed and answered
    /// (cancelled); a dispatched one runs to completion (its batch is already out).
    fn drain_cancels(&mut self, now: Nanos) -> bool {
        let lanes = &mut self.lanes;
        self.io.drain_cancels(|io, index| {
            let (l, local) = lane_of(lanes, index);
            let core = &mut lanes[l].core;
            if let Some(ticket) = core.ticket_of(local) {
                if core.cancel(ticket) {
                    io.finish(now, index, Err(RequestError::Failed(FailReason::Cancelled)));
                }
            }
        })
    }

    fn drain_results(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        for w in 0..self.io.workers.len() {
            let l = self.worker_lane[w] as usize;
            while let Some(msg) = self.io.workers[w].results.pop() {
                worked = true;
                match msg {
                    FromWorker::Token {
                        ticket,
                        offset,
                        text,
                    } => {
                        let lane = &self.lanes[l];
                        if lane.core.ticket_of(ticket.index) == Some(ticket) {
                            let index = lane.pending_base + ticket.index;
                            if self.io.send_token(index, offset, text) {
                                let slot = &mut self.io.pending[index as usize];
                                slot.tokens_sent = true;
                                if slot.first_token_ns == 0 {
                                    slot.first_token_ns = now.max(1);
                                }
                            }
                        }
                    }
                    FromWorker::Batch(msg) => self.batch_done(now, l, msg),
                    FromWorker::Step(..) => unreachable!("request-level engine sent no steps"),
                }
            }
        }
        worked
    }

    /// A batch came back from lane `l`'s worker: answer, or retry elsewhere, each request.
    fn batch_done(&mut self, now: Nanos, l: usize, msg: ResultMsg) {
        let ResultMsg {
            batch,
            mut items,
            result,
            dispatched_ns,
        } = msg;
        let backend = BackendId::from_index(l);
        let backend_fault = match &result {
            Err(e) => e.is_backend_fault(),
            Ok(()) => {
                !items.is_empty()
                    && items
                        .iter()
                        .all(|i| i.error.as_ref().is_some_and(ExecError::is_backend_fault))
            }
        };
        let outcome = if backend_fault || result.is_err() {
            BatchOutcome::Failed
        } else {
            BatchOutcome::Ok
        };
        {
            let registry = self.routing.router.registry_mut();
            registry.batch_finished(backend);
            // A backend that fails at once must not look fast to the smart score.
            if outcome == BatchOutcome::Ok {
                let ms = now.saturating_sub(dispatched_ns) as f64 / 1e6;
                registry.record_latency_ms(backend, ms);
            }
        }
        let batch_ok = outcome == BatchOutcome::Ok;
        let base = self.lanes[l].pending_base;
        match self.lanes[l].core.complete(now, batch, outcome) {
            CoreCompletion::Deliver => {
                for item in items.drain(..) {
                    let index = base + item.ticket.index;
                    let error = match &result {
                        Err(e) => Some(e.clone()),
                        Ok(()) => item.error,
                    };
                    match (error, item.output) {
                        (None, Some(out)) => self.io.finish(now, index, Ok(out)),
                        (None, None) => self.io.finish(
                            now,
                            index,
                            Err(RequestError::Worker("executor gave no output".into())),
                        ),
                        (Some(e), _) => self.retry_or_fail(now, index, item.work, e, batch_ok),
                    }
                }
            }
            CoreCompletion::Stale => items.clear(),
        }
        let at = self.lanes[l].at(l);
        Self::sync_circuit(&mut self.routing, at.backend, &self.lanes[l].core, now);
        self.io.free_bufs.push(items);
    }

    /// A request failed on its backend: move it to another backend of the same model when
    /// the failure is the backend's, retries are left, and the client has seen no part of
    /// the answer; otherwise answer the error.
    ///
    /// `batch_ok`: the core counted the batch as served (the failure was this request's
    /// alone), so its stats count the request as completed until corrected here.
    fn retry_or_fail(
        &mut self,
        now: Nanos,
        index: u32,
        work: Work,
        error: ExecError,
        batch_ok: bool,
    ) {
        let slot = &self.io.pending[index as usize];
        let route = slot.route;
        let (l, _) = lane_of(&self.lanes, index);
        let retries_used = route.tried_len.saturating_sub(1) as u32;
        let retry_to = match route.decision {
            Some(d)
                if error.is_backend_fault()
                    && !slot.tokens_sent
                    && !slot.cancelled
                    && retries_used < self.routing.router.max_retries()
                    && (route.tried_len as usize) < MAX_TRIES =>
            {
                self.routing
                    .router
                    .pick_excluding(d.model, &route.need.requirements(), route.tried())
                    .map(|b| (d, b))
            }
            _ => None,
        };
        if let Some((d, b)) = retry_to {
            let meta = slot.meta;
            let lane = &mut self.lanes[b.index()];
            if let Ok(ticket) = lane.core.readmit(now, meta) {
                let to = lane.pending_base + ticket.index;
                if batch_ok {
                    self.stats_fix.moved_from_ok_batch += 1;
                } else {
                    self.stats_fix.moved_from_failed_batch += 1;
                }
                self.routing.counters[l].retried_away += 1;
                self.routing.counters[b.index()].routed += 1;
                let mut route = route;
                route.tried[route.tried_len as usize] = b;
                route.tried_len += 1;
                route.decision = Some(Decision { backend: b, ..d });
                let mut work = work;
                work.model = self.routing.model_for(b, d.model);
                self.io.move_pending(index, to, work, route);
                return;
            }
        }
        self.routing.counters[l].failed += 1;
        if batch_ok {
            self.stats_fix.failed_in_ok_batch += 1;
        }
        self.io
            .finish(now, index, Err(RequestError::Backend(error)));
    }

    fn publish(&mut self, now: Nanos) {
        self.io.published_at_ns = now;
        let Ok(mut snap) = self.io.shared.snapshot.try_lock() else {
            return;
        };
        snap.at_ns = now;
        let mut stats = crate::core::CoreStats::default();
        let mut queued_by_class = [0usize; CLASS_COUNT];
        let (mut queued, mut live, mut p99) = (0, 0, None::<Nanos>);
        let mut w = 0;
        for lane in &self.lanes {
            let core = &lane.core;
            stats.merge(core.stats());
            for (c, q) in queued_by_class.iter_mut().enumerate() {
                *q += core.queued_in_class(c);
            }
            queued += core.queued();
            live += core.live_requests();
            p99 = p99.max(core.observed_p99_ns());
            for view in core.workers() {
                if let Some(dst) = snap.workers.get_mut(w) {
                    *dst = WorkerSnapshot::from_view(view, now);
                }
                w += 1;
            }
        }
        self.stats_fix.apply(&mut stats);
        snap.stats = stats;
        snap.strategy = self.lanes[0].core.strategy();
        snap.queued_by_class = queued_by_class;
        snap.queued = queued;
        snap.live_requests = live;
        snap.observed_p99_ns = p99;
        EngineIo::move_samples(&mut self.io.new_latencies_ns, &mut snap.latency);
        EngineIo::move_samples(&mut self.io.new_batch_sizes, &mut snap.batch_size);
        snap.samples_dropped = self.io.samples_dropped;
        snap.rejected_busy = self.io.shared.rejected_busy.load(Ordering::Relaxed);
        snap.draining = self.lanes[0].core.is_draining();
        snap.research = self.lanes[0].core.research_snapshot();
        let registry = self.routing.router.registry();
        for (b, dst) in snap.backends.iter_mut().enumerate() {
            let state = registry.state(BackendId::from_index(b));
            let mut c = self.routing.counters[b];
            c.healthy = state.healthy();
            c.pending_batches = state.pending_batches();
            c.latency_ema_ms = state.latency_ema_ms();
            *dst = c;
        }
    }
}

/// The lane holding engine pending slot `index`, and the lane-local index.
fn lane_of(lanes: &[Lane], index: u32) -> (usize, u32) {
    let l = lanes
        .partition_point(|lane| lane.pending_base <= index)
        .saturating_sub(1);
    (l, index - lanes[l].pending_base)
}

impl EngineIo {
    /// I/O state for `workers` with a pending table of `table_capacity` slots and
    /// `batch_bufs` batch buffers of capacity `batch_len` (0 of them for continuous mode).
    pub(super) fn new(
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink>,
        max_submitters: usize,
        table_capacity: usize,
        batch_bufs: usize,
        batch_len: usize,
    ) -> EngineIo {
        EngineIo {
            clock,
            shared,
            submitters: Vec::with_capacity(max_submitters),
            max_submitters,
            needs_wake: Vec::with_capacity(max_submitters),
            pending: (0..table_capacity.max(1))
                .map(|_| PendingSlot {
                    cancelled: false,
                    work: None,
                    reply: None,
                    submitter: 0,
                    first_token_ns: 0,
                    stream: false,
                    tokens_sent: false,
                    meta: RequestMeta::new(
                        Priority::Normal,
                        crate::core::Kind::Completion,
                        0,
                        0,
                        0,
                    ),
                    route: RouteState::NONE,
                })
                .collect(),
            workers,
            free_bufs: (0..batch_bufs)
                .map(|_| Vec::with_capacity(batch_len))
                .collect(),
            new_latencies_ns: Vec::with_capacity(SAMPLE_BUFFER),
            new_batch_sizes: Vec::with_capacity(SAMPLE_BUFFER),
            samples_dropped: 0,
            published_at_ns: 0,
        }
    }

    /// Pops submissions, highest priority first across submitters, up to the per-turn
    /// budget, handing each to `admit(io, submitter, submission)`. True if any.
    pub(super) fn drain_submissions(
        &mut self,
        mut admit: impl FnMut(&mut EngineIo, u16, Submission),
    ) -> bool {
        let mut any = 0u32;
        for link in self.submitters.iter_mut() {
            any |= link.intake.take_ready();
        }
        if any == 0 {
            return false;
        }
        let mut budget = ADMIT_BUDGET_PER_TURN;
        let mut worked = false;
        for p in Priority::HIGHEST_FIRST {
            let priority_bits = ((1u32 << BUCKET_COUNT) - 1) << (p.index() * BUCKET_COUNT);
            for s in 0..self.submitters.len() {
                while budget > 0 {
                    let link = &mut self.submitters[s];
                    let Some(sub) = link.intake.pop(priority_bits) else {
                        break;
                    };
                    link.live += 1;
                    budget -= 1;
                    worked = true;
                    admit(self, s as u16, sub);
                }
            }
        }
        worked
    }

    /// Puts a request just admitted (or moved) into table slot `index`, and remembers its
    /// tag's slot for cancels.
    pub(super) fn occupy(
        &mut self,
        index: u32,
        submitter: u16,
        reply: Reply,
        work: Work,
        meta: RequestMeta,
        route: RouteState,
    ) {
        if let Some(tag) = reply.tag() {
            if let Some(t) = self.submitters[submitter as usize]
                .tag_slots
                .get_mut(tag_key(tag))
            {
                *t = index;
            }
        }
        let slot = &mut self.pending[index as usize];
        debug_assert!(slot.reply.is_none(), "pending slot reused while live");
        slot.cancelled = false;
        slot.stream = work.stream;
        slot.tokens_sent = false;
        slot.first_token_ns = 0;
        slot.work = Some(work);
        slot.reply = Some(reply);
        slot.submitter = submitter;
        slot.meta = meta;
        slot.route = route;
    }

    /// Takes the cancellations submitters sent, calling `cancel(io, table index)` for each
    /// request that is still live.
    pub(super) fn drain_cancels(&mut self, mut cancel: impl FnMut(&mut EngineIo, u32)) -> bool {
        let mut worked = false;
        for s in 0..self.submitters.len() {
            while let Some(tag) = self.submitters[s].cancels.pop() {
                worked = true;
                let index = match self.submitters[s].tag_slots.get(tag_key(tag)) {
                    Some(&i) if i != u32::MAX => Some(i),
                    // A tag beyond the map (not an io thread's): look it up the slow way.
                    _ => self
                        .pending
                        .iter()
                        .position(|p| {
                            matches!(p.reply, Some(Reply::Tag(t)) if t == tag)
                                && p.submitter as usize == s
                        })
                        .map(|i| i as u32),
                };
                let Some(index) = index else { continue };
                let p = &self.pending[index as usize];
                let live =
                    matches!(p.reply, Some(Reply::Tag(t)) if t == tag) && p.submitter as usize == s;
                if live {
                    self.pending[index as usize].cancelled = true;
                    cancel(self, index);
                }
            }
        }
        worked
    }

    /// Takes newly registered submitters, each in a new place or in the place of a retired
    /// one (see [`SubmitterLink::is_retired`]).
    pub(super) fn accept_submitters(&mut self) -> bool {
        let mut worked = false;
        while !self.shared.registrations.is_empty() {
            let place = if self.submitters.len() < self.max_submitters {
                None
            } else {
                match self.submitters.iter().position(SubmitterLink::is_retired) {
                    Some(s) => Some(s),
                    // Every place is taken: the registration waits for a retirement.
                    None => break,
                }
            };
            let Some(link) = self.shared.registrations.pop() else {
                break;
            };
            match place {
                None => {
                    self.submitters.push(link);
                    self.needs_wake.push(false);
                }
                Some(s) => {
                    self.submitters[s] = link;
                    self.needs_wake[s] = false;
                }
            }
            worked = true;
        }
        worked
    }

    /// A registration is waiting and has a place to go.
    fn registration_ready(&self) -> bool {
        !self.shared.registrations.is_empty()
            && (self.submitters.len() < self.max_submitters
                || self.submitters.iter().any(SubmitterLink::is_retired))
    }

    /// Carries out one action of lane `at`'s core.
    fn act(&mut self, now: Nanos, at: LaneAt, routing: &mut Routing, action: Action<'_>) {
        match action {
            Action::Dispatch {
                worker,
                batch,
                tickets,
                ..
            } => {
                let mut items = self
                    .free_bufs
                    .pop()
                    .expect("one buffer per batch slot: a dispatch always finds one");
                for t in tickets {
                    let work = self.pending[(at.pending_base + t.index) as usize]
                        .work
                        .take()
                        .expect("a queued request still holds its work");
                    items.push(BatchItem::new(*t, work));
                }
                self.record_sample(SampleKind::BatchSize, tickets.len() as u64);
                routing.router.registry_mut().batch_started(at.backend);
                let link = &mut self.workers[at.worker_base as usize + worker];
                if link
                    .batches
                    .push(ToWorker::Batch(BatchMsg {
                        batch,
                        items,
                        dispatched_ns: now,
                    }))
                    .is_err()
                {
                    unreachable!("worker ring sized to max_inflight_per_worker");
                }
                link.bell.ring();
            }
            Action::Fail { ticket, reason } => {
                self.finish(
                    now,
                    at.pending_base + ticket.index,
                    Err(RequestError::Failed(reason)),
                );
            }
        }
    }

    /// Moves a live request from pending slot `from` to `to` (admitted into another
    /// backend's core), with its work back and its new route.
    fn move_pending(&mut self, from: u32, to: u32, work: Work, route: RouteState) {
        let slot = &mut self.pending[from as usize];
        let reply = slot.reply.take().expect("a live request has its reply");
        slot.work = None;
        let (submitter, meta, cancelled) = (slot.submitter, slot.meta, slot.cancelled);
        self.occupy(to, submitter, reply, work, meta, route);
        // A cancel that came while the request was out still holds.
        self.pending[to as usize].cancelled = cancelled;
    }

    /// Answers the request in table slot `index`.
    pub(super) fn finish(&mut self, now: Nanos, index: u32, outcome: Outcome) {
        let slot = &mut self.pending[index as usize];
        let reply = slot
            .reply
            .take()
            .expect("every live request has exactly one reply");
        slot.work = None;
        let submitter = slot.submitter;
        let route = std::mem::replace(&mut slot.route, RouteState::NONE).decision;
        if outcome.is_ok() {
            let latency_ns = now.saturating_sub(slot.meta.arrival_ns).max(1);
            self.record_sample(SampleKind::Latency, latency_ns);
        }
        self.send(submitter, reply, outcome, route);
    }

    /// Sends a token of a streaming request (table slot `index`) to its submitter, if the
    /// submitter's ring has room beyond what its final answers need. Skipped tokens are not
    /// lost: the final output carries the whole text.
    /// True if it was sent.
    pub(super) fn send_token(&mut self, slot_index: u32, offset: u32, text: String) -> bool {
        let slot = &self.pending[slot_index as usize];
        let Some(Reply::Tag(tag)) = slot.reply else {
            return false;
        };
        if !slot.stream {
            return false;
        }
        let s = slot.submitter as usize;
        let link = &mut self.submitters[s];
        // The ring holds 2x the submitter's in-flight limit; keep half for final answers.
        if link.completions.free_slots() <= link.completions.capacity() / 2 {
            return false;
        }
        if link
            .completions
            .push(Completion {
                tag,
                event: Event::Token { offset, text },
                route: slot.route.decision,
            })
            .is_ok()
        {
            self.needs_wake[s] = true;
            return true;
        }
        false
    }

    /// Buffers one sample for the next publish; a full buffer is flushed into the snapshot
    /// at once (`try_lock`: if a reader holds the lock, the sample is counted as dropped).
    fn record_sample(&mut self, kind: SampleKind, value: u64) {
        let full = match kind {
            SampleKind::Latency => self.new_latencies_ns.len() == self.new_latencies_ns.capacity(),
            SampleKind::BatchSize => self.new_batch_sizes.len() == self.new_batch_sizes.capacity(),
        };
        if full && !self.flush_samples() {
            self.samples_dropped += 1;
            return;
        }
        match kind {
            SampleKind::Latency => self.new_latencies_ns.push(value),
            SampleKind::BatchSize => self.new_batch_sizes.push(value),
        }
    }

    /// Moves buffered samples into the snapshot's histograms. False if the lock was busy.
    fn flush_samples(&mut self) -> bool {
        let Ok(mut snap) = self.shared.snapshot.try_lock() else {
            return false;
        };
        Self::move_samples(&mut self.new_latencies_ns, &mut snap.latency);
        Self::move_samples(&mut self.new_batch_sizes, &mut snap.batch_size);
        true
    }

    pub(super) fn move_samples(samples: &mut Vec<u64>, into: &mut Histogram<u64>) {
        for &v in samples.iter() {
            let _ = into.record(v);
        }
        samples.clear();
    }

    /// Delivers an outcome to its reply target.
    pub(super) fn send(
        &mut self,
        submitter: u16,
        reply: Reply,
        outcome: Outcome,
        route: Option<Decision>,
    ) {
        match reply {
            Reply::Waiter(w) => {
                self.submitters[submitter as usize].live -= 1;
                w.complete(outcome)
            }
            Reply::Tag(tag) => {
                let s = submitter as usize;
                self.submitters[s].live -= 1;
                // The submitter reuses a key only after it got this final answer, so the key
                // still maps to this request here.
                if let Some(t) = self.submitters[s].tag_slots.get_mut(tag_key(tag)) {
                    *t = u32::MAX;
                }
                if self.submitters[s]
                    .completions
                    .push(Completion {
                        tag,
                        event: Event::Done(outcome),
                        route,
                    })
                    .is_err()
                {
                    unreachable!("submitter in-flight limit equals its completion ring size");
                }
                self.needs_wake[s] = true;
            }
        }
    }

    /// Wakes each submitter that got completions this turn, once.
    pub(super) fn flush_wakes(&mut self) {
        for (s, flag) in self.needs_wake.iter_mut().enumerate() {
            if std::mem::take(flag) {
                if let Some(wake) = &self.submitters[s].wake {
                    wake();
                }
            }
        }
    }

    /// Any submission waiting in a ring?
    pub(super) fn any_input(&self) -> bool {
        self.submitters.iter().any(|s| s.intake.any())
    }

    /// The drain-exit check on the intake: the gate is closed and empty, and (read after
    /// that) no submission is left in a ring, so nothing that got in goes unanswered.
    pub(super) fn intake_drained(&self) -> bool {
        intake::drained(&self.shared.gate, self.submitters.iter().map(|s| &s.intake))
    }

    /// Anything at all for the engine to do (the doorbell's re-check).
    pub(super) fn has_work(&self) -> bool {
        !self.shared.control.is_empty()
            || self.submitters.iter().any(|s| !s.cancels.is_empty())
            || self.registration_ready()
            || self.any_input()
            || self.workers.iter().any(|w| !w.results.is_empty())
    }
}
