//! The routing state the request-level engine owns: the router, each request's route (and
//! the backends that failed it), backend health as a checker publishes it, and each
//! backend's circuit as routing sees it.
//!
//! Only the engine thread touches it; nothing here may block or allocate per request.

use crate::core::circuit::{CircuitBreaker, CircuitParams, CircuitState};
use crate::core::{Core, Nanos};
use crate::router::{BackendId, Decision, ModelId, NameId, Need, Router, SlotState};
use std::sync::Arc;

/// Where a routed request went, and the backends that failed it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RouteState {
    pub(super) name: NameId,
    pub(super) need: Need,
    /// The request's session key (`RouteRequest::session`), for a retry's choice.
    pub(super) session: Option<u64>,
    pub(super) decision: Option<Decision>,
    /// Backends tried so far (the current one last).
    pub(super) tried: [BackendId; MAX_TRIES],
    pub(super) tried_len: u8,
    /// Moves among `tried` that were not retries: the request left a backend whose circuit
    /// opened while it was queued there, never sent (not counted against `max_retries`).
    pub(super) unsent_moves: u8,
}

/// Most backends one request is tried on: the first plus `routing.max_retries` (<= 8).
pub(super) const MAX_TRIES: usize = 9;

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
            adapter: crate::core::lora::BASE_MODEL,
        },
        session: None,
        decision: None,
        tried: [BackendId::FIRST; MAX_TRIES],
        tried_len: 0,
        unsent_moves: 0,
    };

    pub(super) fn tried(&self) -> &[BackendId] {
        &self.tried[..self.tried_len as usize]
    }
}

/// Live health of backends, as a health checker publishes it (`sim` backends are always
/// healthy). Read by the engine once per turn: a generation counter first, the flags only
/// when it moved.
pub trait BackendHealth: Send + Sync {
    /// Bumped on every change.
    fn generation(&self) -> u64;
    fn healthy(&self, backend: usize) -> bool;
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
    pub(super) counters: Vec<crate::runtime::snapshot::BackendSnapshot>,
    /// Per backend: when its circuit as routing sees it may change without a batch
    /// completing (an open worker circuit becomes due its probe); `Nanos::MAX`: not before
    /// the next completion.
    pub(super) circuit_due_ns: Vec<Nanos>,
    /// Backends in [`SlotState::Draining`]: while 0, a turn looks at no slot.
    draining: u32,
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
            draining: 0,
        }
        .with_slots_of_router()
    }

    /// Counts the slots the router was built with in each state (a discovery table's start
    /// empty) and copies them into the counters.
    fn with_slots_of_router(mut self) -> Routing {
        for b in 0..self.counters.len() {
            let slot = self
                .router
                .registry()
                .state(BackendId::from_index(b))
                .slot();
            self.counters[b].slot = slot;
            self.draining += u32::from(slot == SlotState::Draining);
        }
        self
    }

    /// A `Control::SetSlot` with its `seq` (published as `BackendSnapshot::slot_seq`).
    pub(super) fn set_slot_asked(&mut self, backend: BackendId, slot: SlotState, seq: u32) {
        if let Some(c) = self.counters.get_mut(backend.index()) {
            c.slot_seq = seq;
        }
        self.set_slot(backend, slot);
    }

    /// A `Control::SwapTables`: the router's tables and the engine's by model and backend
    /// swapped with `next` (moves; `next` then holds the old ones). A slot whose backend
    /// changes starts its counters again (its series are a new backend's). Refused with
    /// the slot that still holds requests; nothing changes then.
    pub(super) fn swap_tables(
        &mut self,
        next: &mut crate::runtime::tables::EngineTables,
    ) -> Result<(), usize> {
        debug_assert!(next.model_names.len() >= self.model_names.len());
        self.router
            .swap_tables(&mut next.router)
            .map_err(|e| e.0.index())?;
        // `next` holds the old tables now.
        for b in 0..self.counters.len() {
            let id = BackendId::from_index(b);
            let was = next.router.registry().backend(id).name();
            if self.router.registry().backend(id).name() != was {
                self.counters[b] = crate::runtime::snapshot::BackendSnapshot {
                    slot: self.counters[b].slot,
                    slot_seq: self.counters[b].slot_seq,
                    ..Default::default()
                };
            }
        }
        std::mem::swap(&mut self.model_names, &mut next.model_names);
        std::mem::swap(&mut self.wants_model, &mut next.wants_model);
        Ok(())
    }

    /// A `Control::SetSlot`: backend `backend` becomes `slot` (an empty or draining slot
    /// active again, an active one draining; `Empty` only through [`Self::settle_drains`]
    /// or for a slot that holds nothing). Out-of-range ids are ignored (a stale message).
    pub(super) fn set_slot(&mut self, backend: BackendId, slot: SlotState) {
        let Some(c) = self.counters.get_mut(backend.index()) else {
            return;
        };
        let was = c.slot;
        if was == slot {
            return;
        }
        c.slot = slot;
        self.draining -= u32::from(was == SlotState::Draining);
        self.draining += u32::from(slot == SlotState::Draining);
        self.router.registry_mut().set_slot(backend, slot);
    }

    /// [`Self::settle_drains`] by the registry's load: every draining backend with no
    /// pending batch (continuous batching counts each request waiting for or holding a
    /// slot as one) becomes empty.
    #[inline]
    pub(super) fn settle_unloaded_drains(&mut self) {
        if self.draining == 0 {
            return;
        }
        for b in 0..self.counters.len() {
            let id = BackendId::from_index(b);
            if self.counters[b].slot == SlotState::Draining
                && self.router.registry().state(id).pending_batches() == 0
            {
                self.set_slot(id, SlotState::Empty);
            }
        }
    }

    /// Every draining backend for which `holds_nothing(b)` becomes empty. A plain loop over
    /// the backends, only while some drain: no allocation.
    #[inline]
    pub(super) fn settle_drains(&mut self, holds_nothing: impl Fn(usize) -> bool) {
        if self.draining == 0 {
            return;
        }
        for b in 0..self.counters.len() {
            if self.counters[b].slot == SlotState::Draining && holds_nothing(b) {
                self.set_slot(BackendId::from_index(b), SlotState::Empty);
            }
        }
    }

    /// What `Work::model` must hold for `model` on `backend`: its name for an upstream
    /// backend, nothing for a `sim` one.
    pub(super) fn model_for(&self, backend: BackendId, model: ModelId) -> Option<Arc<str>> {
        self.wants_model[backend.index()].then(|| self.model_names[model.index()].clone())
    }

    /// Sets `work.model` for a request of `model` (LoRA adapter `adapter`) routed to
    /// `backend`: [`Routing::model_for`], except that a LoRA request keeps the adapter's
    /// name the io thread gave it, so an upstream backend is asked for the adapter (as a
    /// gateway in front of vLLM asks), not for its base model.
    pub(super) fn set_model(
        &self,
        work: &mut crate::exec::Work,
        backend: BackendId,
        model: ModelId,
        adapter: crate::core::lora::AdapterId,
    ) {
        if adapter == crate::core::lora::BASE_MODEL || work.model.is_none() {
            work.model = self.model_for(backend, model);
        }
    }

    /// Takes health changes the checker published.
    pub(super) fn refresh_health(&mut self) {
        let Some(h) = &self.health else { return };
        let generation = h.generation();
        if generation == self.health_seen {
            return;
        }
        self.health_seen = generation;
        for b in 0..self.counters.len() {
            let healthy = h.healthy(b);
            // Back from unhealthy: the router forgets what it guessed the backend caches.
            self.router.set_healthy(BackendId::from_index(b), healthy);
        }
    }

    /// A backend's circuit as routing sees it, from its workers' breakers: closed while any
    /// worker's is closed or due a probe (so the probe batch can be routed there), open when
    /// every worker's is open and none is due.
    pub(super) fn sync_circuit(&mut self, backend: BackendId, core: &Core, now: Nanos) {
        let params = core.config().circuit;
        let breakers = core.workers().iter().map(|w| &w.circuit);
        self.sync_circuit_from(backend, breakers, &params, now);
    }

    /// [`Routing::sync_circuit`] over any set of breakers: the workers of a request-level
    /// lane, or the replicas of a continuous backend.
    pub(super) fn sync_circuit_from<'a>(
        &mut self,
        backend: BackendId,
        breakers: impl Iterator<Item = &'a CircuitBreaker>,
        params: &CircuitParams,
        now: Nanos,
    ) {
        let mut state = CircuitState::Open;
        // Only while no worker's circuit is closed can time alone change the state (an open
        // one becomes due its probe); a closed one changes only when a batch completes,
        // which syncs again.
        let mut next_due = Nanos::MAX;
        for circuit in breakers {
            match circuit.last_state() {
                CircuitState::Closed => {
                    state = CircuitState::Closed;
                    next_due = Nanos::MAX;
                    break;
                }
                CircuitState::HalfOpen => state = CircuitState::HalfOpen,
                CircuitState::Open => match circuit.reopens_at(params) {
                    Some(t) if now >= t => state = CircuitState::HalfOpen,
                    Some(t) => next_due = next_due.min(t),
                    None => {}
                },
            }
        }
        self.circuit_due_ns[backend.index()] = next_due;
        let c = &mut self.counters[backend.index()];
        c.circuit = state;
        let routed_state = match state {
            CircuitState::Open => CircuitState::Open,
            _ => CircuitState::Closed,
        };
        if self.router.registry().state(backend).circuit() != routed_state {
            self.router
                .registry_mut()
                .set_circuit(backend, routed_state);
        }
    }
}
