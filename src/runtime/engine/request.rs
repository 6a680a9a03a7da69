//! Request-level batching, the engine's [`Mode`] for it: one core per backend ("lane": its
//! queues, its workers, their circuit breakers) and the router.
//!
//! What differs from continuous batching: each submission is routed to a backend's core
//! (trying the model's other backends before a 429 when the chosen queue is full); each
//! core's actions dispatch batches to its workers; a batch's reply answers its requests,
//! or moves a request its backend failed to another backend of the same model; a backend's
//! circuit as routing sees it follows its workers' breakers, and a lane whose circuit opens
//! hands its queued requests to another backend of the model or answers them 503 at once.
//! The shared turn is in `engine/mod.rs`; this file must not allocate per request either
//! (error answers excepted): batch buffers are allocated here once and circulate.

use super::io::{move_latency_samples, move_samples, EngineIo, SampleKind};
use super::pending::PendingLayout;
use super::routing::{RouteState, Routing, MAX_TRIES};
use super::Mode;
use crate::core::circuit::CircuitState;
use crate::core::strategy::StrategyKind;
use crate::core::{Action, BatchOutcome, Completion, Core, FailReason, Nanos, Reject, CLASS_COUNT};
use crate::exec::{BatchItem, ExecError, Work};
use crate::router::{Affinity, BackendId, Decision, Need, Via};
use crate::runtime::batch_claim::BatchClaims;
use crate::runtime::messages::{
    BatchEvent, BatchMsg, DirectBatch, DirectReply, Reply, RequestError, ResultMsg, RouteRequest,
    Submission,
};
use crate::runtime::snapshot::{Snapshot, WorkerSnapshot};
use crate::runtime::sync::Ordering;
use crate::runtime::telemetry::TelemetryEvent;
use std::sync::Arc;

/// One backend's scheduler and where its requests and workers sit in the engine's tables.
/// The lanes' LoRA slots as the router's exact view of adapter residency (backend `b` is
/// lane `b`). Prefix caches it does not know: the router's approximate index judges them,
/// as without a view.
struct LaneAdapters<'a>(&'a [Lane]);

impl crate::router::CacheView for LaneAdapters<'_> {
    #[inline]
    fn cached_prefix_blocks(
        &self,
        _backend: BackendId,
        _blocks: &[crate::core::prefix::BlockHash],
    ) -> Option<u32> {
        None
    }

    #[inline]
    fn adapter_resident(&self, backend: BackendId, adapter: u16) -> Option<bool> {
        self.0
            .get(backend.index())
            .map(|l| l.core.adapter_resident(adapter))
    }
}

pub(super) struct Lane {
    pub core: Core,
    /// The lane's table slot `i` is the engine's pending slot `pending_base + i`.
    pub pending_base: u32,
    /// The lane's worker `w` is the engine's worker `worker_base + w`.
    pub worker_base: u32,
    /// `auto`'s holds already emitted as events (the core counts them; a poll that moved
    /// the count emits the last one).
    pub holds_emitted: u64,
    /// A claim cell per batch slot of `core` (`runtime::batch_claim`).
    pub claims: Arc<BatchClaims>,
}

/// A lane's offsets, copied out so closures over the I/O can use them while the lane's core
/// is borrowed.
#[derive(Clone, Copy)]
struct LaneAt {
    backend: BackendId,
    /// The lane's strategy when the copy was taken (for telemetry).
    strategy: StrategyKind,
    pending_base: u32,
    worker_base: u32,
}

impl Lane {
    fn at(&self, index: usize) -> LaneAt {
        LaneAt {
            backend: BackendId::from_index(index),
            strategy: self.core.strategy(),
            pending_base: self.pending_base,
            worker_base: self.worker_base,
        }
    }
}

/// Each lane's queue capacity: its segment of the pending table.
fn lane_capacities<'a>(cores: impl IntoIterator<Item = &'a Core>) -> Vec<usize> {
    cores
        .into_iter()
        .map(|c| c.config().queue_capacity.max(1))
        .collect()
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
    /// Requests of a batch the core abandoned (timeout, abort) that the worker had already
    /// claimed and answered with an output (`runtime::direct_reply`).
    answered_after_timeout: u64,
    answered_after_abort: u64,
}

impl StatsFix {
    fn apply(&self, s: &mut crate::core::CoreStats) {
        let moved = self.moved_from_failed_batch;
        s.completed = s
            .completed
            .saturating_sub(self.moved_from_ok_batch + self.failed_in_ok_batch);
        s.failed = (s.failed + self.failed_in_ok_batch).saturating_sub(moved);
        s.worker_errors = (s.worker_errors + self.failed_in_ok_batch).saturating_sub(moved);
        let (timeout, abort) = (self.answered_after_timeout, self.answered_after_abort);
        s.completed += timeout + abort;
        s.failed = s.failed.saturating_sub(timeout + abort);
        s.batch_timeouts = s.batch_timeouts.saturating_sub(timeout);
        s.aborted = s.aborted.saturating_sub(abort);
    }
}

/// A batch's items and its direct-reply targets.
type BatchBufs = (Vec<BatchItem>, DirectBatch);

/// Request-level batching: a core per backend, the router, and the batch buffers.
pub struct RequestLevel {
    lanes: Vec<Lane>,
    /// Lane of each engine worker.
    worker_lane: Vec<u16>,
    routing: Routing,
    /// Batch buffers at home, with their direct-reply buffers (one pair per batch slot; a
    /// dispatch takes one, its reply gives it back).
    free_bufs: Vec<BatchBufs>,
    /// How pending-table indexes split into lanes and their cores' slots.
    layout: PendingLayout,
    stats_fix: StatsFix,
}

impl RequestLevel {
    /// `cores[b]` schedules backend `b` of `routing`'s router and owns the next
    /// `cores[b].config().workers` engine workers. Every buffer it will use is allocated
    /// here.
    pub fn new(cores: Vec<Core>, routing: Routing) -> RequestLevel {
        assert_eq!(
            cores.len(),
            routing.router.registry().len(),
            "a core per backend"
        );
        let mut lanes = Vec::with_capacity(cores.len());
        let mut worker_lane = Vec::new();
        let layout = PendingLayout::for_lanes(&lane_capacities(&cores));
        let (mut batch_slots, mut batch_len) = (0usize, 0usize);
        for (l, core) in cores.into_iter().enumerate() {
            let cfg = core.config();
            let workers_here = cfg.workers;
            batch_slots += workers_here * cfg.max_inflight_per_worker.max(1) as usize;
            batch_len = batch_len.max(core.max_batch_len());
            lanes.push(Lane {
                pending_base: layout.base(l),
                worker_base: worker_lane.len() as u32,
                holds_emitted: 0,
                claims: Arc::new(BatchClaims::new(
                    workers_here * cfg.max_inflight_per_worker.max(1) as usize,
                )),
                core,
            });
            worker_lane.extend(std::iter::repeat_n(l as u16, workers_here));
        }
        RequestLevel {
            lanes,
            worker_lane,
            routing,
            free_bufs: (0..batch_slots)
                .map(|_| {
                    (
                        Vec::with_capacity(batch_len),
                        DirectBatch::with_capacity(batch_len),
                    )
                })
                .collect(),
            layout,
            stats_fix: StatsFix::default(),
        }
    }

    fn live_requests(&self) -> usize {
        self.lanes.iter().map(|l| l.core.live_requests()).sum()
    }

    /// A batch came back from lane `l`'s worker: answer, or retry elsewhere, each request.
    fn batch_done(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos, l: usize, msg: ResultMsg) {
        let ResultMsg {
            batch,
            mut items,
            result,
            dispatched_ns,
            mut direct,
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
            Completion::Deliver => {
                // What the worker answered (`runtime::direct_reply`): books only, at the
                // instant the answers left the worker. All of the batch: their books alone
                // (`direct_reply::settle`, the items dropped on the worker); else marked
                // items, below.
                let answered_at = if direct.answered_ns > 0 {
                    direct.answered_ns.min(now)
                } else {
                    now
                };
                for (ticket, summary) in direct.answered.drain(..) {
                    io.finish_answered(answered_at, base + ticket.index, &summary);
                }
                // Walked in place and cleared after: an item moved out of the vector is a
                // copy of a few hundred bytes a request (callgrind: ~64 instructions each).
                for item in items.iter_mut() {
                    let index = base + item.ticket.index;
                    if let Some(summary) = &item.answered {
                        io.finish_answered(answered_at, index, summary);
                        continue;
                    }
                    let error = match &result {
                        Err(e) => Some(e.clone()),
                        Ok(()) => item.error.take(),
                    };
                    match (error, item.output.take()) {
                        (None, Some(out)) => io.finish(now, index, Ok(out)),
                        (None, None) => io.finish(
                            now,
                            index,
                            Err(RequestError::Worker("executor gave no output".into())),
                        ),
                        (Some(e), _) => {
                            // A retry takes the payload (its prompt is shared, not copied).
                            let work = item.work.clone();
                            self.retry_or_fail(io, now, index, work, e, batch_ok)
                        }
                    }
                }
                items.clear();
            }
            Completion::Stale => items.clear(),
        }
        self.routing.sync_circuit(backend, &self.lanes[l].core, now);
        // The worker leaves it empty; a batch not run by `BatchMsg::run` may not.
        direct.targets.clear();
        direct.claims = None;
        // Taken above; a stale batch's books are not kept.
        direct.answered.clear();
        self.free_bufs.push((items, direct));
    }

    /// A request failed on its backend: move it to another backend of the same model when
    /// the failure is the backend's, retries are left, and the client has seen no part of
    /// the answer; otherwise answer the error.
    ///
    /// `batch_ok`: the core counted the batch as served (the failure was this request's
    /// alone), so its stats count the request as completed until corrected here.
    fn retry_or_fail(
        &mut self,
        io: &mut EngineIo<BatchMsg>,
        now: Nanos,
        index: u32,
        work: Work,
        error: ExecError,
        batch_ok: bool,
    ) {
        if error.is_backend_fault() && self.try_move(io, now, index, work, batch_ok, true) {
            return;
        }
        self.answer_unmoved(io, now, index, batch_ok, RequestError::Backend(error));
    }

    /// Moves the request in pending slot `index` to another backend of its model that it
    /// has not tried (and, for a retry, `max_retries` allows), unless the client has seen
    /// part of its answer or went away. True when it moved (its work with it); when it
    /// stays, its work is dropped (the caller answers it).
    fn try_move(
        &mut self,
        io: &mut EngineIo<BatchMsg>,
        now: Nanos,
        index: u32,
        work: Work,
        batch_ok: bool,
        is_retry: bool,
    ) -> bool {
        let slot = &io.pending[index as usize];
        let route = slot.route;
        let (l, _) = self.layout.lane_of(index);
        let retries_used = route
            .tried_len
            .saturating_sub(1)
            .saturating_sub(route.unsent_moves) as u32;
        let Some(d) = route.decision else {
            return false;
        };
        if slot.tokens_sent
            || slot.cancelled
            || (is_retry && retries_used >= self.routing.router.max_retries())
            || route.tried_len as usize >= MAX_TRIES
        {
            return false;
        }
        let affinity = Affinity {
            blocks: work.prompt_blocks.as_deref().unwrap_or(&[]),
            session: route.session,
            exact: None,
            output_tokens: slot.meta.expected_output_tokens(),
        };
        let Some(b) = self.routing.router.pick_excluding_with(
            d.model,
            &route.need.requirements(),
            route.tried(),
            &affinity,
        ) else {
            return false;
        };
        let meta = slot.meta;
        let lane = &mut self.lanes[b.index()];
        let Ok(ticket) = lane.core.readmit(now, meta) else {
            return false;
        };
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
        if !is_retry {
            route.unsent_moves += 1;
        }
        route.decision = Some(Decision { backend: b, ..d });
        let mut work = work;
        self.routing.set_model(&mut work, b, d.model, meta.adapter);
        io.move_pending(index, to, work, route);
        true
    }

    /// Answers with `error` a request that failed on its backend and did not move.
    fn answer_unmoved(
        &mut self,
        io: &mut EngineIo<BatchMsg>,
        now: Nanos,
        index: u32,
        batch_ok: bool,
        error: RequestError,
    ) {
        let (l, _) = self.layout.lane_of(index);
        self.routing.counters[l].failed += 1;
        if batch_ok {
            self.stats_fix.failed_in_ok_batch += 1;
        }
        io.finish(now, index, Err(error));
    }

    /// Every worker's circuit of a lane is open (and none is due its probe) while requests
    /// wait in its queue: they would wait the whole open time (`health.recovery_timeout`,
    /// 30 s by default) for a probe batch. Each moves to another backend of its model, as a
    /// failed batch's requests do (not counted against `max_retries`: it was never sent), or
    /// is answered at once, as a circuit breaker is meant to fail fast: 503
    /// (`ExecError::Unavailable`, a failure after admission, counted as a worker error) with
    /// why no other backend took it (the routing error a new request would get, with each
    /// backend's state, or that it tried the others already or their queues are full).
    fn evacuate_open_lanes(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos) {
        for l in 0..self.lanes.len() {
            if self.routing.counters[l].circuit != CircuitState::Open
                || self.lanes[l].core.queued() == 0
            {
                continue;
            }
            while let Some(ticket) = self.lanes[l].core.take_queued_to_move() {
                let index = self.lanes[l].pending_base + ticket.index;
                let work = io.pending[index as usize]
                    .work
                    .take()
                    .expect("a queued request still holds its work");
                if self.try_move(io, now, index, work, false, false) {
                    continue;
                }
                // Cold path: the error message allocates.
                let route = io.pending[index as usize].route;
                let why = match self
                    .routing
                    .router
                    .explain_unroutable(route.name, &route.need)
                {
                    Some(e) => e.to_string(),
                    None => "another backend could take requests for its model, but not \
                             this one: it tried that backend already, the backend's queue is \
                             full, or it serves the model's alias or fallback (a queued request \
                             moves only between backends of the model it was routed to)"
                        .to_string(),
                };
                let backend = self.routing.router.registry();
                let error = RequestError::Backend(ExecError::Unavailable {
                    backend: backend.backend(BackendId::from_index(l)).name().to_string(),
                    message: format!(
                        "its circuit opened (consecutive failed batches) while the request \
                         was queued for it; {why}"
                    ),
                });
                self.answer_unmoved(io, now, index, false, error);
            }
        }
    }
}

/// What [`act`] needs besides the I/O: the batch buffers, the router, and for failures the
/// lane's claims and the stats correction.
struct Actor<'a> {
    free_bufs: &'a mut Vec<BatchBufs>,
    routing: &'a mut Routing,
    claims: &'a Arc<BatchClaims>,
    stats_fix: &'a mut StatsFix,
}

/// Carries out one action of lane `at`'s core.
fn act(
    io: &mut EngineIo<BatchMsg>,
    actor: &mut Actor<'_>,
    now: Nanos,
    at: LaneAt,
    action: Action<'_>,
) {
    let Actor {
        free_bufs,
        routing,
        claims,
        stats_fix,
    } = actor;
    match action {
        Action::Dispatch {
            worker,
            batch,
            tickets,
            reason,
            lora_loads,
        } => {
            let (mut items, mut direct) = free_bufs
                .pop()
                .expect("one buffer per batch slot: a dispatch always finds one");
            for (position, t) in tickets.iter().enumerate() {
                let slot = &mut io.pending[(at.pending_base + t.index) as usize];
                if slot.dispatched_ns == 0 {
                    // The first dispatch ends its queue wait (a retry elsewhere does not).
                    slot.dispatched_ns = now.max(1);
                }
                let work = slot
                    .work
                    .take()
                    .expect("a queued request still holds its work");
                items.push(BatchItem::new(*t, work));
                // A tagged request that does not stream, from a submitter that sleeps: the
                // worker may answer it itself (`runtime::direct_reply`).
                if let (Some(Reply::Tag(tag)), false, true) = (
                    &slot.reply,
                    slot.stream,
                    io.submitters[slot.submitter as usize].wake.is_some(),
                ) {
                    let (tag, route, s) = (*tag, slot.route.decision, slot.submitter);
                    slot.direct_batch = batch.0;
                    direct.targets.push(DirectReply {
                        item: position as u32,
                        lane: io.submitters[s as usize].lane.clone(),
                        tag,
                        route,
                    });
                }
            }
            if !direct.targets.is_empty() {
                claims.open(batch.0);
                direct.claims = Some(Arc::clone(claims));
                direct.index = batch.0;
                direct.clock = Some(io.clock);
                direct.answered_ns = 0;
            }
            if let Some(first) = items.first_mut() {
                first.lora_loads = lora_loads;
            }
            io.record_sample(SampleKind::BatchSize, tickets.len() as u64);
            let tokens = tickets
                .iter()
                .map(|t| {
                    let slot = &io.pending[(at.pending_base + t.index) as usize];
                    u64::from(slot.meta.tokens_estimated)
                })
                .sum();
            io.emit(
                now,
                TelemetryEvent::Batch {
                    at_ns: now,
                    backend: at.backend.index() as u16,
                    worker: worker as u16,
                    size: tickets.len() as u32,
                    tokens,
                    strategy: at.strategy,
                    reason,
                },
            );
            routing.router.registry_mut().batch_started(at.backend);
            let link = &mut io.workers[at.worker_base as usize + worker];
            if link
                .jobs
                .push(BatchMsg {
                    batch,
                    items,
                    dispatched_ns: now,
                    direct,
                })
                .is_err()
            {
                unreachable!("worker ring sized to max_inflight_per_worker");
            }
            link.bell.ring();
        }
        Action::Fail { ticket, reason } => {
            let index = at.pending_base + ticket.index;
            let b = io.pending[index as usize].direct_batch;
            // An abandoned batch's request the worker may answer itself: whoever claims
            // the batch first answers (`runtime::direct_reply`).
            if b != u32::MAX && !claims.claim_for_engine(b) {
                match reason {
                    FailReason::BatchTimeout => stats_fix.answered_after_timeout += 1,
                    _ => stats_fix.answered_after_abort += 1,
                }
                io.finish_claimed_by_worker(now, index);
                return;
            }
            io.finish(now, index, Err(RequestError::Failed(reason)));
        }
    }
}

impl Mode for RequestLevel {
    type Job = BatchMsg;

    fn pending_lanes(&self) -> Vec<usize> {
        lane_capacities(self.lanes.iter().map(|l| &l.core))
    }

    fn workers(&self) -> usize {
        self.worker_lane.len()
    }

    /// Takes health changes, and makes a circuit due its probe routable before this turn's
    /// requests are admitted (nothing else wakes the engine when a recovery time passes).
    #[inline]
    fn begin_turn(&mut self, now: Nanos) {
        self.routing.refresh_health();
        let lanes = &self.lanes;
        // A lane holds nothing once its core has nothing queued and nothing out.
        self.routing.settle_drains(|b| lanes[b].core.is_idle());
        for (l, lane) in self.lanes.iter().enumerate() {
            if now >= self.routing.circuit_due_ns[l] {
                self.routing
                    .sync_circuit(BackendId::from_index(l), &lane.core, now);
            }
        }
    }

    fn set_strategy(&mut self, kind: StrategyKind) {
        for lane in &mut self.lanes {
            lane.core.set_strategy(kind);
        }
    }

    fn routing(&mut self) -> &mut Routing {
        &mut self.routing
    }

    fn begin_drain(&mut self) {
        for lane in &mut self.lanes {
            lane.core.begin_drain();
        }
    }

    fn forget_adapter(&mut self, adapter: crate::core::lora::AdapterId) {
        for lane in &mut self.lanes {
            lane.core.forget_adapter(adapter);
        }
    }

    /// Routes the submission to a backend and admits it into that backend's core.
    #[inline]
    fn admit(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos, submitter: u16, sub: Submission) {
        let (lanes, routing) = (&mut self.lanes, &mut self.routing);
        let Submission {
            meta,
            mut work,
            reply,
            route,
        } = sub;
        let route = route.unwrap_or(RouteRequest {
            name: routing.default_name,
            need: Need::default(),
            session: None,
        });
        // Upstream backends' caches cannot be asked: the router's approximate index judges.
        // The lanes answer for their LoRA slots.
        let lanes_view = LaneAdapters(lanes);
        let affinity = Affinity {
            blocks: work.prompt_blocks.as_deref().unwrap_or(&[]),
            session: route.session,
            exact: (meta.adapter != crate::core::lora::BASE_MODEL).then_some(&lanes_view as _),
            output_tokens: meta.expected_output_tokens(),
        };
        let mut decision = match routing
            .router
            .route_name_with(route.name, &route.need, &affinity)
        {
            Ok(d) => d,
            Err(e) => {
                // Cold path (no backend can take it now): the error message allocates.
                io.send(submitter, reply, Err(RequestError::Route(e)), None);
                return;
            }
        };
        // A full queue on the chosen backend: try the model's other candidates before 429
        // (by load: the lanes are being admitted into, not asked).
        let affinity = Affinity {
            blocks: work.prompt_blocks.as_deref().unwrap_or(&[]),
            session: route.session,
            exact: None,
            output_tokens: meta.expected_output_tokens(),
        };
        let mut full = [BackendId::FIRST; MAX_TRIES];
        let mut full_len = 0;
        let admitted = loop {
            let b = decision.backend.index();
            match lanes[b].core.admit(now, meta) {
                Err(Reject::QueueFull { capacity }) if full_len < MAX_TRIES - 1 => {
                    full[full_len] = decision.backend;
                    full_len += 1;
                    let req = route.need.requirements();
                    match routing.router.pick_excluding_with(
                        decision.model,
                        &req,
                        &full[..full_len],
                        &affinity,
                    ) {
                        Some(next) => decision.backend = next,
                        None => break Err(Reject::QueueFull { capacity }),
                    }
                }
                other => break other,
            }
        };
        let b = decision.backend.index();
        routing.set_model(&mut work, decision.backend, decision.model, meta.adapter);
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
                state.session = route.session;
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

    /// A queued request is removed and answered (cancelled); a dispatched one runs to
    /// completion (its batch is already out).
    fn cancel(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos, index: u32) {
        let (l, local) = self.layout.lane_of(index);
        let core = &mut self.lanes[l].core;
        if let Some(ticket) = core.ticket_of(local) {
            if core.cancel(ticket) {
                io.finish(now, index, Err(RequestError::Failed(FailReason::Cancelled)));
            }
        }
    }

    #[inline]
    fn on_reply(
        &mut self,
        io: &mut EngineIo<BatchMsg>,
        now: Nanos,
        worker: usize,
        reply: BatchEvent,
    ) {
        let l = self.worker_lane[worker] as usize;
        match reply {
            BatchEvent::Token {
                ticket,
                offset,
                text,
            } => {
                let lane = &self.lanes[l];
                if lane.core.ticket_of(ticket.index) == Some(ticket) {
                    let index = lane.pending_base + ticket.index;
                    if io.send_token(index, offset, text) {
                        let slot = &mut io.pending[index as usize];
                        slot.tokens_sent = true;
                        if slot.first_token_ns == 0 {
                            slot.first_token_ns = now.max(1);
                        }
                    }
                }
            }
            BatchEvent::Done(msg) => self.batch_done(io, now, l, msg),
        }
    }

    /// Polls every core and carries out its actions (dispatches, failures).
    #[inline]
    fn poll(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos) -> (bool, Option<Nanos>) {
        self.evacuate_open_lanes(io, now);
        let RequestLevel {
            lanes,
            routing,
            free_bufs,
            stats_fix,
            ..
        } = self;
        let mut dispatched = false;
        let mut next: Option<Nanos> = None;
        let mut opened = false;
        for (l, lane) in lanes.iter_mut().enumerate() {
            if lane.core.rest_if_idle() {
                // Its poll would do nothing and set no deadline; its holds did not move.
                continue;
            }
            let at = lane.at(l);
            let mut timed_out = false;
            let mut actor = Actor {
                free_bufs,
                routing,
                claims: &lane.claims,
                stats_fix,
            };
            let lane_next = lane.core.poll(now, &mut |a| {
                dispatched = true;
                timed_out |= matches!(
                    a,
                    Action::Fail {
                        reason: FailReason::BatchTimeout,
                        ..
                    }
                );
                act(io, &mut actor, now, at, a)
            });
            if timed_out {
                // Batch timeouts count against the workers' breakers inside the core's poll:
                // routing must see a circuit they opened now, not at the next completion.
                routing.sync_circuit(at.backend, &lane.core, now);
                opened |= routing.counters[l].circuit == CircuitState::Open;
            }
            let (held, hold) = lane.core.auto_holds();
            if held != lane.holds_emitted {
                lane.holds_emitted = held;
                io.emit(
                    now,
                    TelemetryEvent::Hold {
                        at_ns: now,
                        backend: at.backend.index() as u16,
                        queued: hold.queued,
                        expected_joiners: hold.expected_joiners,
                        joiners_within_horizon: hold.joiners_within_horizon,
                        planned_wait_ns: hold.wait_ns,
                        reason: hold.reason,
                    },
                );
            }
            next = match (next, lane_next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if opened {
            // Its queued requests leave now; the lanes they moved to are polled next turn,
            // which follows at once (this turn worked).
            self.evacuate_open_lanes(io, now);
        }
        (dispatched, next)
    }

    fn abort(&mut self, io: &mut EngineIo<BatchMsg>, now: Nanos) {
        let RequestLevel {
            lanes,
            routing,
            free_bufs,
            stats_fix,
            ..
        } = self;
        for (l, lane) in lanes.iter_mut().enumerate() {
            let at = lane.at(l);
            let mut actor = Actor {
                free_bufs,
                routing,
                claims: &lane.claims,
                stats_fix,
            };
            lane.core
                .abort_all(now, &mut |a| act(io, &mut actor, now, at, a));
        }
    }

    fn is_idle(&self) -> bool {
        self.lanes.iter().all(|l| l.core.is_idle())
    }

    fn nothing_out(&self) -> bool {
        self.live_requests() == 0
    }

    fn publish(
        &mut self,
        io: &mut EngineIo<BatchMsg>,
        snap: &mut Snapshot,
        now: Nanos,
        _aborted: bool,
    ) {
        let mut stats = crate::core::CoreStats::default();
        let mut queued_by_class = [0usize; CLASS_COUNT];
        let (mut queued, mut live, mut p99) = (0, 0, None::<Nanos>);
        let mut w = 0;
        let lora = &mut snap.lora;
        lora.running.clear();
        lora.waiting.clear();
        for (l, lane) in self.lanes.iter().enumerate() {
            let core = &lane.core;
            core.lora_adapters(&mut lora.running, &mut lora.waiting);
            stats.merge(core.stats());
            for (c, q) in queued_by_class.iter_mut().enumerate() {
                *q += core.queued_in_class(c);
            }
            queued += core.queued();
            live += core.live_requests();
            p99 = p99.max(core.observed_p99_ns());
            for view in core.workers() {
                if let Some(dst) = snap.workers.get_mut(w) {
                    *dst = WorkerSnapshot::from_view(view, l as u16, now);
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
        move_latency_samples(&mut io.new_latencies_ns, snap);
        move_samples(&mut io.new_batch_sizes, &mut snap.batch_size);
        snap.samples_dropped = io.samples_dropped;
        snap.rejected_busy = io.shared.rejected_busy.load(Ordering::Relaxed);
        snap.draining = self.lanes[0].core.is_draining();
        snap.research = self.lanes[0].core.research_snapshot();
        for (dst, lane) in snap.auto.iter_mut().zip(&self.lanes) {
            *dst = lane.core.auto_snapshot();
        }
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
