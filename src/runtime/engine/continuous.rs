//! Iteration-level (continuous) batching, the engine's [`Mode`] for it: drives
//! [`Continuous`] instead of the request-level cores, over one or more `sim` backends.
//!
//! What differs from request-level batching: a submission is routed to a backend at
//! admission (the router's strategy over the backends serving its model; each backend's
//! workers are its replicas, one replica group of the scheduler) and queued for that
//! group's slots; there is no retry on another backend (a sim step fails only by fault
//! injection, and a failed step fails its requests); every idle replica gets one step per turn
//! (`tick`); a step's reply streams the sampled tokens to their submitters, then answers
//! the requests that ended and frees their slots; a request waiting for a slot past the
//! request deadline fails; a cancel drops a waiting request at once and an active one at
//! its next step. A step out longer than the step timeout (`workers.batch_timeout`) fails
//! every request of its replica with [`FailReason::BatchTimeout`] and counts against the
//! replica's circuit breaker, as a failed step does; the late reply is then only taken
//! back. A replica whose circuit is open runs no step and takes no request until its
//! recovery time has passed (then one probe step); a backend whose replicas' circuits are
//! all open is open to the router too (as in request-level mode), so new requests go to
//! the model's other backends or its fallback until a probe is due, and the requests
//! waiting for its slots are answered at once (503) rather than kept for the probe. The
//! shared turn is in `engine/mod.rs`. Same rules: after start-up no allocation, no lock
//! (other than `try_lock` to publish), no blocking. Step buffers circulate engine -> worker
//! -> engine; request payloads are moved or `Arc`-shared, never copied.

use super::io::{move_latency_samples, move_samples, EngineIo};
use super::routing::{RouteState, Routing};
use super::Mode;
use crate::core::circuit::{CircuitBreaker, CircuitParams, CircuitState};
use crate::core::continuous::{Continuous, ContinuousReject, EntryResult, StepAction, StepWork};
use crate::core::pool::WorkerStatus;
use crate::core::prefix::{BlockHash, PromptBlocks, ROOT};
use crate::core::strategy::StrategyKind;
use crate::core::{FailReason, Nanos, Reject, Ticket};
use crate::exec::{ExecError, StepItem};
use crate::router::{Affinity, BackendId, CacheView, Need, Via};
use crate::runtime::messages::{
    Outcome, RequestError, RouteRequest, StepMsg, StepResult, Submission,
};
use crate::runtime::snapshot::{ContinuousSnapshot, Snapshot, WorkerSnapshot};
use crate::runtime::telemetry::TelemetryEvent;
use std::sync::Arc;

/// The prompt-block names of the engine's requests, by table index, for the scheduler's
/// prefix cache.
struct EngineNames<'a>(&'a [Option<Arc<[BlockHash]>>]);

impl PromptBlocks for EngineNames<'_> {
    fn block_count(&self, t: Ticket) -> u32 {
        self.0[t.index as usize]
            .as_ref()
            .map_or(0, |names| names.len() as u32)
    }

    fn block_hash(&self, t: Ticket, i: u32) -> BlockHash {
        self.0[t.index as usize]
            .as_ref()
            .map_or(ROOT, |names| names[i as usize])
    }
}

/// The scheduler's prefix caches as the router's exact [`CacheView`]: backend `b` is replica
/// group `b`, and holds the longest prefix any of its replicas holds (the group's replicas
/// share its queue, so a request routed there can land on that replica). Knows every
/// backend: the router never falls back to its approximate index in continuous mode.
struct GroupCaches<'a>(&'a Continuous);

impl CacheView for GroupCaches<'_> {
    #[inline]
    fn cached_prefix_blocks(&self, backend: BackendId, blocks: &[BlockHash]) -> Option<u32> {
        Some(self.0.group_cached_prefix_blocks(backend.index(), blocks))
    }

    #[inline]
    fn adapter_resident(&self, backend: BackendId, adapter: u16) -> Option<bool> {
        Some(self.0.group_adapter_resident(backend.index(), adapter))
    }
}

/// Token-timing samples buffered between publishes (each kind).
const TOKEN_SAMPLES: usize = 16 * 1024;

/// Answers pending slot `index` and takes its request off its backend's load: in continuous
/// mode a backend's load as the router sees it (`pending_batches`, which `least_loaded`,
/// `power_of_two` and the smart score read) is its requests waiting for or holding a slot.
fn finish(
    routing: &mut Routing,
    io: &mut EngineIo<StepMsg>,
    now: Nanos,
    index: u32,
    outcome: Outcome,
) {
    if let Some(d) = io.pending[index as usize].route.decision {
        let registry = routing.router.registry_mut();
        registry.batch_finished(d.backend);
        registry.work_finished(d.backend, d.work);
    }
    io.finish(now, index, outcome);
}

/// Pushes a sample unless the buffer is full (then it is counted as dropped).
fn push_sample(buf: &mut Vec<u64>, value: u64, dropped: &mut u64) {
    if buf.len() < buf.capacity() {
        buf.push(value);
    } else {
        *dropped += 1;
    }
}

/// Continuous batching: the scheduler, its step buffers and the counters the request-level
/// core would keep.
pub struct IterationLevel {
    /// Replica group `b` is backend `b` of `routing`'s router.
    sched: Continuous,
    routing: Routing,
    /// One step buffer per replica while it is home (None while its step is out).
    step_bufs: Vec<Option<Vec<StepItem>>>,
    /// Scratch: the results of one step, in entry order.
    results: Vec<EntryResult>,
    /// Scratch: tickets of requests that left their slot in one step.
    ended: Vec<(Ticket, EntryResult)>,
    /// Counters the request-level core would keep.
    completed: u64,
    failed: u64,
    /// Of `failed`, per request as the request-level core counts them: the worker's step
    /// failed, the client went away, the request waited for a slot past its deadline.
    worker_errors: u64,
    cancelled: u64,
    expired: u64,
    /// Requests failed because their step ran past the step timeout.
    batch_timeouts: u64,
    /// Requests failed by the shutdown deadline (abort).
    aborted: u64,
    rejected_full: u64,
    rejected_draining: u64,
    steps_per_replica: Vec<u64>,
    busy_since: Vec<Nanos>,
    busy_total: Vec<Nanos>,
    /// A request still waiting for a slot this long fails (batching.request_timeout).
    request_timeout_ns: Nanos,
    /// A step out this long fails its replica's requests (workers.batch_timeout).
    step_timeout_ns: Nanos,
    circuit: CircuitParams,
    /// One breaker per replica.
    circuits: Vec<CircuitBreaker>,
    /// The replica's step timed out: its requests were failed; the reply is only taken back.
    timed_out: Vec<bool>,
    steps_failed: Vec<u64>,
    /// Scratch: replicas that started a step in one tick.
    started: Vec<usize>,
    /// Time-to-first-token and time-per-output-token samples since the last publish
    /// (capacity fixed at start; when full, samples are counted as dropped).
    new_ttft_ns: Vec<u64>,
    new_tpot_ns: Vec<u64>,
    output_tokens: u64,
    /// Per request-table index, its prompt's block names (the `Arc` of its `Work`, shared;
    /// replaced when the index is next admitted).
    names: Vec<Option<Arc<[BlockHash]>>>,
    /// Per request-table index, the prompt tokens found cached when it last took a slot.
    cached_tokens: Vec<u32>,
}

impl IterationLevel {
    /// Builds the mode over `sched` (one replica per engine worker; replica group `b` the
    /// workers of backend `b` of `routing`'s router) with the request and step timeouts and
    /// the circuit-breaker settings; every buffer it will use is allocated here.
    pub fn new(
        sched: Continuous,
        mut routing: Routing,
        request_timeout_ns: Nanos,
        step_timeout_ns: Nanos,
        circuit: CircuitParams,
    ) -> IterationLevel {
        // The scheduler's block tables answer for every backend's cache (`GroupCaches`):
        // the router keeps no approximate index for them.
        for b in 0..routing.router.registry().len() {
            routing.router.set_cache_exact(BackendId::from_index(b));
        }
        let replicas = sched.config().replicas;
        let slots = sched.config().max_slots;
        assert_eq!(
            sched.groups(),
            routing.router.registry().len(),
            "one replica group per backend"
        );
        IterationLevel {
            routing,
            step_bufs: (0..replicas)
                .map(|_| Some(Vec::with_capacity(slots)))
                .collect(),
            results: Vec::with_capacity(slots),
            ended: Vec::with_capacity(slots),
            completed: 0,
            failed: 0,
            worker_errors: 0,
            cancelled: 0,
            expired: 0,
            batch_timeouts: 0,
            aborted: 0,
            rejected_full: 0,
            rejected_draining: 0,
            steps_per_replica: vec![0; replicas],
            busy_since: vec![0; replicas],
            busy_total: vec![0; replicas],
            request_timeout_ns,
            step_timeout_ns: step_timeout_ns.max(1),
            circuit,
            circuits: vec![CircuitBreaker::default(); replicas],
            timed_out: vec![false; replicas],
            steps_failed: vec![0; replicas],
            started: Vec::with_capacity(replicas),
            new_ttft_ns: Vec::with_capacity(TOKEN_SAMPLES),
            new_tpot_ns: Vec::with_capacity(TOKEN_SAMPLES),
            output_tokens: 0,
            names: vec![None; sched.table_capacity()],
            cached_tokens: vec![0; sched.table_capacity()],
            sched,
        }
    }

    /// Requests waiting for (or holding, outside the failed step) the slots of a backend
    /// every replica of which has an open circuit (none due its probe) would wait the whole
    /// open time (`health.recovery_timeout`, 30 s by default): answered at once with a 503
    /// saying why (`ExecError::Unavailable`, a failure after admission, counted as a worker
    /// error), as a circuit breaker is meant to fail fast. Unlike request-level mode there
    /// is no move to another backend. Every turn; O(groups) while no circuit is open.
    fn fail_waiting_behind_open_circuits(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos) {
        let replicas = self.replicas();
        for g in 0..self.sched.groups() {
            if self.routing.counters[g].circuit != CircuitState::Open {
                continue;
            }
            let (sched, failed, errors, routing) = (
                &mut self.sched,
                &mut self.failed,
                &mut self.worker_errors,
                &mut self.routing,
            );
            let mut answer = |t: Ticket| {
                *failed += 1;
                *errors += 1;
                // Cold path: the error message allocates.
                let backend = routing.router.registry().backend(BackendId::from_index(g));
                let outcome = Err(RequestError::Backend(ExecError::Unavailable {
                    backend: backend.name().to_string(),
                    message: "every replica's circuit opened (consecutive failed steps) while \
                              the request waited for a slot, or held one outside the failed \
                              step; retry later"
                        .to_string(),
                }));
                finish(routing, io, now, t.index, outcome);
            };
            // Slots held outside the failed step (prefills the token budget left out): their
            // replica runs no step before the probe either. A replica with a step out is
            // left to that step's reply or timeout.
            for r in 0..replicas {
                if sched.group_of(r) == g && !sched.is_busy(r) && sched.active_slots(r) > 0 {
                    sched.fail_replica(r, &mut answer);
                }
            }
            if sched.waiting_in_group(g) > 0 {
                sched.drop_waiting_in_group(g, &mut answer);
            }
        }
    }

    /// Backend `g`'s circuit as routing sees it, from its replicas' breakers (open when
    /// every replica's is open and none is due a probe), so a backend whose replicas all
    /// failed takes no new requests (a model's other backends, or its fallback, get them).
    fn sync_circuit(&mut self, g: usize, now: Nanos) {
        let (sched, circuits) = (&self.sched, &self.circuits);
        let breakers = circuits
            .iter()
            .enumerate()
            .filter(|(r, _)| sched.group_of(*r) == g)
            .map(|(_, c)| c);
        self.routing
            .sync_circuit_from(BackendId::from_index(g), breakers, &self.circuit, now);
    }

    fn replicas(&self) -> usize {
        self.step_bufs.len()
    }
}

impl IterationLevel {
    /// Empties a step buffer and keeps it for the replica's next step.
    fn return_buffer(&mut self, r: usize, mut items: Vec<StepItem>) {
        for item in items.iter_mut() {
            item.work = None;
            item.token = None;
            item.output = None;
        }
        items.clear();
        self.step_bufs[r] = Some(items);
    }
}

impl Mode for IterationLevel {
    type Job = StepMsg;

    fn pending_lanes(&self) -> Vec<usize> {
        vec![self.sched.table_capacity()]
    }

    fn workers(&self) -> usize {
        self.replicas()
    }

    /// Makes a backend whose circuit is due its probe routable before this turn's requests
    /// are admitted (nothing else wakes the engine when a recovery time passes).
    #[inline]
    fn begin_turn(&mut self, now: Nanos) {
        // A backend's load here is its requests waiting for or holding a slot (see
        // `finish`): at 0 a draining backend holds nothing.
        self.routing.settle_unloaded_drains();
        for g in 0..self.routing.circuit_due_ns.len() {
            if now >= self.routing.circuit_due_ns[g] {
                self.sync_circuit(g, now);
            }
        }
    }

    /// Strategies govern request-level batches; the API refuses the switch in continuous
    /// mode, so one reaching here is ignored.
    fn set_strategy(&mut self, _kind: StrategyKind) {}

    fn begin_drain(&mut self) {
        self.sched.begin_drain();
    }

    fn forget_adapter(&mut self, adapter: crate::core::lora::AdapterId) {
        self.sched.forget_adapter(adapter);
    }

    fn routing(&mut self) -> &mut Routing {
        &mut self.routing
    }

    /// Routes the submission to a backend and queues it for that backend's replicas.
    #[inline]
    fn admit(&mut self, io: &mut EngineIo<StepMsg>, _now: Nanos, s: u16, sub: Submission) {
        let (sched, routing) = (&mut self.sched, &mut self.routing);
        let Submission {
            meta,
            work,
            reply,
            route,
        } = sub;
        let route = route.unwrap_or(RouteRequest {
            name: routing.default_name,
            need: Need::default(),
            session: None,
        });
        let exact = GroupCaches(sched);
        let affinity = Affinity {
            blocks: work.prompt_blocks.as_deref().unwrap_or(&[]),
            session: route.session,
            exact: Some(&exact),
            output_tokens: meta.expected_output_tokens(),
        };
        let decision = match routing
            .router
            .route_name_with(route.name, &route.need, &affinity)
        {
            Ok(d) => d,
            Err(e) => {
                // Cold path (no backend serves it): the error message allocates.
                drop(work);
                io.send(s, reply, Err(RequestError::Route(e)), None);
                return;
            }
        };
        let b = decision.backend.index();
        match sched.admit_to(b, meta) {
            Ok(ticket) => {
                // An Arc clone (no allocation); the name table's previous entry is dropped.
                self.names[ticket.index as usize] = work.prompt_blocks.clone();
                let c = &mut routing.counters[b];
                c.routed += 1;
                let registry = routing.router.registry_mut();
                registry.batch_started(decision.backend);
                registry.work_started(decision.backend, decision.work);
                match decision.via {
                    Via::Direct => {}
                    Via::Alias { .. } => c.via_alias += 1,
                    Via::Fallback { .. } => c.via_fallback += 1,
                }
                let mut state = RouteState::NONE;
                state.name = route.name;
                state.need = route.need;
                state.session = route.session;
                state.decision = Some(decision);
                state.tried[0] = decision.backend;
                state.tried_len = 1;
                io.occupy(ticket.index, s, reply, work, meta, state)
            }
            Err(reject) => {
                let error = match reject {
                    ContinuousReject::QueueFull { .. } => {
                        self.rejected_full += 1;
                        RequestError::Rejected(Reject::QueueFull {
                            capacity: sched.config().max_queue,
                        })
                    }
                    ContinuousReject::ShuttingDown => {
                        self.rejected_draining += 1;
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
    }

    /// A waiting request is dropped and answered (cancelled) now; an active one is marked
    /// and leaves its slot at its next step.
    fn cancel(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos, index: u32) {
        if let Some(ticket) = self.sched.ticket_of(index) {
            if self.sched.cancel_waiting(ticket) {
                self.failed += 1;
                self.cancelled += 1;
                let outcome = Err(RequestError::Failed(FailReason::Cancelled));
                finish(&mut self.routing, io, now, index, outcome);
            }
        }
    }

    /// A finished step from replica `r`: streams its tokens, answers the requests that
    /// ended, frees their slots, takes the step buffer back.
    #[inline]
    fn on_reply(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos, r: usize, reply: StepResult) {
        let StepResult { mut items, result } = reply;
        self.busy_total[r] += now.saturating_sub(self.busy_since[r]);
        if std::mem::take(&mut self.timed_out[r]) {
            // Its requests were failed when it timed out; the slots are idle, so completing
            // the step only marks the replica free.
            self.results.clear();
            self.results
                .extend(items.iter().map(|_| EntryResult::Cancelled));
            let names = EngineNames(&self.names);
            self.sched
                .complete_step_with(r, &names, &self.results, &mut |_, _| {
                    unreachable!("a timed-out replica's slots were freed")
                });
            self.return_buffer(r, items);
            return;
        }
        if result.is_ok() {
            self.circuits[r].record_success();
        } else {
            self.circuits[r].record_failure(now, &self.circuit);
            self.steps_failed[r] += 1;
        }
        self.sync_circuit(self.sched.group_of(r), now);
        if result.is_ok() {
            // Tokens first: a request's Done must follow its last token.
            for item in items.iter_mut() {
                let e = item.entry;
                if e.samples() && e.generated == 0 {
                    let slot = &mut io.pending[e.ticket.index as usize];
                    if slot.first_token_ns == 0 {
                        slot.first_token_ns = now.max(1);
                        let ttft = now.saturating_sub(slot.meta.arrival_ns).max(1);
                        push_sample(&mut self.new_ttft_ns, ttft, &mut io.samples_dropped);
                    }
                }
                if let Some(text) = item.token.take() {
                    io.send_token(e.ticket.index, item.token_offset, text);
                }
            }
        }
        self.results.clear();
        if result.is_err() {
            // The forward pass failed: every request in it fails with the error (each
            // counted below, as it leaves its slot).
            self.results
                .extend(items.iter().map(|_| EntryResult::Cancelled));
        } else {
            let pending = &io.pending;
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
        let names = EngineNames(&self.names);
        self.sched
            .complete_step_with(r, &names, &self.results, &mut |t, res| ended.push((t, res)));
        let caching = self.sched.config().prefix_caching;
        for i in 0..self.ended.len() {
            let (ticket, _) = self.ended[i];
            // Read, not taken: `io.finish` reads it too (for the prefill / decode split);
            // the next occupant's admission resets it.
            let first_token_ns = io.pending[ticket.index as usize].first_token_ns;
            let outcome = match (
                &result,
                items.iter_mut().find(|it| it.entry.ticket == ticket),
            ) {
                (Ok(()), Some(item)) => match item.output.take() {
                    Some(mut out) => {
                        if let crate::exec::Output::Text { cached_tokens, .. } = &mut out {
                            if caching {
                                *cached_tokens = Some(self.cached_tokens[ticket.index as usize]);
                            }
                        }
                        Ok(out)
                    }
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
                    let tpot =
                        now.saturating_sub(first_token_ns) / u64::from(completion_tokens - 1);
                    push_sample(&mut self.new_tpot_ns, tpot.max(1), &mut io.samples_dropped);
                }
            }
            match &outcome {
                Ok(_) => self.completed += 1,
                Err(e) => {
                    self.failed += 1;
                    match e {
                        RequestError::Failed(FailReason::Cancelled) => self.cancelled += 1,
                        _ => self.worker_errors += 1,
                    }
                }
            }
            finish(&mut self.routing, io, now, ticket.index, outcome);
        }
        self.return_buffer(r, items);
    }

    /// Fails the requests of steps out past the step timeout, and requests that waited for
    /// a slot past the request deadline.
    fn expire(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos) {
        for r in 0..self.replicas() {
            if !self.sched.is_busy(r)
                || self.timed_out[r]
                || now.saturating_sub(self.busy_since[r]) < self.step_timeout_ns
            {
                continue;
            }
            self.timed_out[r] = true;
            self.steps_failed[r] += 1;
            self.circuits[r].record_failure(now, &self.circuit);
            self.sync_circuit(self.sched.group_of(r), now);
            let (failed, timeouts) = (&mut self.failed, &mut self.batch_timeouts);
            let routing = &mut self.routing;
            self.sched.fail_replica(r, &mut |t| {
                *failed += 1;
                *timeouts += 1;
                let outcome = Err(RequestError::Failed(FailReason::BatchTimeout));
                finish(routing, io, now, t.index, outcome);
            });
        }
        self.fail_waiting_behind_open_circuits(io, now);
        if self.sched.waiting() == 0 {
            return;
        }
        let (failed, expired, routing) = (&mut self.failed, &mut self.expired, &mut self.routing);
        self.sched
            .expire_waiting(now, self.request_timeout_ns, &mut |t| {
                *failed += 1;
                *expired += 1;
                let outcome = Err(RequestError::Failed(FailReason::QueueTimeout));
                finish(routing, io, now, t.index, outcome);
            });
    }

    /// One tick: every replica without a step out whose circuit allows it gets its next
    /// step. The next deadline is the earliest step timeout, an open circuit's recovery
    /// while requests wait or hold its replica's slots, or a waiting request's deadline.
    #[inline]
    fn poll(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos) -> (bool, Option<Nanos>) {
        let bufs = &mut self.step_bufs;
        let steps = &mut self.steps_per_replica;
        let busy_since = &mut self.busy_since;
        let (circuits, params) = (&mut self.circuits, &self.circuit);
        let started = &mut self.started;
        started.clear();
        let names = EngineNames(&self.names);
        let cached_tokens = &mut self.cached_tokens;
        let mut allow = |r: usize| circuits[r].can_execute(now, params);
        let worked = self
            .sched
            .tick_replicas(&names, &mut allow, &mut |action| match action {
                StepAction::Step {
                    replica,
                    entries,
                    shape,
                } => {
                    let (decode_tokens, prefill_tokens) =
                        (shape.decode_tokens, shape.prefill_tokens);
                    io.emit(
                        now,
                        TelemetryEvent::Tick {
                            at_ns: now,
                            replica: replica as u16,
                            entries: entries.len() as u32,
                            decode_tokens,
                            prefill_tokens,
                        },
                    );
                    let mut items = bufs[replica]
                        .take()
                        .expect("a replica without a step out has its buffer");
                    for e in entries.iter() {
                        if let (true, StepWork::Prefill { offset, .. }) = (e.admitted, e.work) {
                            // A fresh slot's prefill starts after its cached prefix.
                            cached_tokens[e.ticket.index as usize] = offset;
                        }
                        let work = if e.admitted {
                            let slot = &mut io.pending[e.ticket.index as usize];
                            if slot.dispatched_ns == 0 {
                                // The first admission into a slot ends its queue wait (a
                                // preempted request admitted again does not).
                                slot.dispatched_ns = now.max(1);
                            }
                            // Arc-shared prompt: no allocation; the engine keeps its copy so a
                            // preempted request can be sent again.
                            slot.work.clone()
                        } else {
                            None
                        };
                        items.push(StepItem {
                            entry: e,
                            work,
                            token: None,
                            token_offset: 0,
                            result: EntryResult::Continue,
                            output: None,
                        });
                    }
                    steps[replica] += 1;
                    busy_since[replica] = now;
                    started.push(replica);
                    let link = &mut io.workers[replica];
                    let dispatched = io.clock.instant(now);
                    if link.jobs.push(StepMsg { items, dispatched }).is_err() {
                        unreachable!("one step out per replica fits its ring");
                    }
                    link.bell.ring();
                }
                // The worker drops the slot's state when the slot is next admitted into.
                StepAction::Preempted { .. } => {}
            });
        for &r in &self.started {
            self.circuits[r].on_dispatch();
        }
        let mut next: Option<Nanos> = None;
        for r in 0..self.replicas() {
            let due = if self.sched.is_busy(r) && !self.timed_out[r] {
                Some(self.busy_since[r].saturating_add(self.step_timeout_ns))
            } else if self.sched.waiting() > 0 || self.sched.active_slots(r) > 0 {
                // Its circuit's recovery lets a probe step run requests waiting for a slot,
                // or those holding this replica's slots.
                self.circuits[r].reopens_at(&self.circuit)
            } else {
                None
            };
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if self.sched.waiting() > 0 {
            // A request waiting for a slot fails at its deadline (`expire`), not at the next
            // wake-up.
            let due = self.sched.next_expiry(self.request_timeout_ns);
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        (worked, next)
    }

    fn abort(&mut self, io: &mut EngineIo<StepMsg>, now: Nanos) {
        let (failed, aborted) = (&mut self.failed, &mut self.aborted);
        let routing = &mut self.routing;
        self.sched.abort_all(&mut |t| {
            *failed += 1;
            *aborted += 1;
            let outcome = Err(RequestError::Failed(FailReason::Aborted));
            finish(routing, io, now, t.index, outcome);
        });
    }

    fn is_idle(&self) -> bool {
        self.sched.is_idle()
    }

    /// No replica has a step out.
    fn nothing_out(&self) -> bool {
        (0..self.replicas()).all(|r| !self.sched.is_busy(r))
    }

    fn publish(
        &mut self,
        io: &mut EngineIo<StepMsg>,
        snap: &mut Snapshot,
        now: Nanos,
        _aborted: bool,
    ) {
        let c = *self.sched.stats();
        let lora = &mut snap.lora;
        lora.running.clear();
        lora.waiting.clear();
        self.sched
            .lora_adapters(&mut lora.running, &mut lora.waiting);
        snap.stats.admitted = c.admitted;
        snap.stats.rejected_full = self.rejected_full;
        snap.stats.rejected_draining = self.rejected_draining;
        snap.stats.completed = self.completed;
        snap.stats.failed = self.failed;
        snap.stats.worker_errors = self.worker_errors;
        snap.stats.cancelled = self.cancelled;
        snap.stats.expired = self.expired;
        snap.stats.batch_timeouts = self.batch_timeouts;
        snap.stats.aborted = self.aborted;
        snap.queued = self.sched.waiting();
        snap.live_requests = self.sched.waiting()
            + (0..self.step_bufs.len())
                .map(|r| self.sched.active_slots(r))
                .sum::<usize>();
        for (r, w) in snap.workers.iter_mut().enumerate() {
            let busy = self.sched.is_busy(r);
            *w = WorkerSnapshot {
                backend: self.sched.group_of(r) as u16,
                status: if busy {
                    WorkerStatus::Busy
                } else {
                    WorkerStatus::Idle
                },
                circuit: self.circuits[r].last_state(),
                pending: u32::from(busy),
                busy_ns: self.busy_total[r]
                    + if busy {
                        now.saturating_sub(self.busy_since[r])
                    } else {
                        0
                    },
                batches_ok: self.steps_per_replica[r] - self.steps_failed[r],
                batches_failed: self.steps_failed[r],
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
            prefix: self
                .sched
                .config()
                .prefix_caching
                .then(|| self.sched.prefix_stats()),
        });
        move_samples(&mut self.new_ttft_ns, &mut snap.ttft);
        move_samples(&mut self.new_tpot_ns, &mut snap.tpot);
        move_latency_samples(&mut io.new_latencies_ns, snap);
        snap.samples_dropped = io.samples_dropped;
        snap.draining = self.sched.is_draining();
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
