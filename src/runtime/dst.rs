//! The runtime without its threads, for deterministic simulation (`tests/dst_engine.rs`,
//! after TigerBeetle's VOPR): the real [`Engine`] over its real rings, submitters, control
//! queue and intake gate, with the worker ends of its worker links handed to the caller.
//! One seeded scheduler then plays the submitters (push, cancel, pop completions, or not),
//! the workers (take jobs, answer them, or hang) and the clock, and turns the engine at
//! virtual times ([`Engine::turn`] reads no clock), checking invariants between steps.
//!
//! The live runtime never uses this module (it is built with the `testing` feature only). Nothing here spawns a thread or sleeps, and
//! nothing the simulation drives reads a clock: every time is the caller's virtual `now`
//! (the turn's, and arrivals through `Submitter::submit_at_ns`), so a seed replays exactly.
//! The `Clock` built here only serves `Submitter::submit`, which a simulation must not call.

use super::clock::Clock;
use super::doorbell::Doorbell;
use super::engine::{Engine, Mode, TurnResult, WorkerLink};
use super::gate::Gate;
use super::idle::{IdlePolicy, Idler};
use super::messages::{Control, RequestError};
use super::ready::{MarkedProducer, ReadyMask};
use super::ring::{self, Consumer};
use super::snapshot::Snapshot;
use super::submitter::Submitter;
use super::sync::{AtomicBool, Ordering};
use super::worker::{Job, TOKEN_ROOM};
use super::{sync, telemetry, Shared};
use crate::core::strategy::StrategyKind;
use crate::core::Nanos;
use crossbeam_queue::ArrayQueue;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Sizes of a simulated runtime (the live ones come from `RuntimeConfig`).
#[derive(Clone, Copy, Debug)]
pub struct DstConfig {
    /// Capacity of each submitter ring (per class); completion rings hold twice this.
    pub ring_capacity: usize,
    /// Most submitters at once.
    pub max_submitters: usize,
    /// Jobs a worker's ring holds (the mode's in-flight limit per worker).
    pub jobs_per_worker: usize,
    /// Backends of the router (snapshot rows).
    pub backends: usize,
    /// Strategy the snapshot starts with.
    pub strategy: StrategyKind,
    /// Request-level batching (the snapshot keeps an `auto` row per backend).
    pub request_level: bool,
}

/// The worker's end of one worker link: jobs in, replies out. The caller plays the worker.
pub struct WorkerEnd<J: Job> {
    pub jobs: Consumer<J>,
    /// Marks the engine's reply mask after each push, as a live worker's ring does.
    pub replies: MarkedProducer<J::Reply>,
    /// Result-ring slots kept for job replies: token events may use only the rest (as a
    /// live worker's `Events` does).
    pub reserve: usize,
}

/// What the engine holds, read between steps (none of it is published in the snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineState {
    /// Pending-table slots holding a request not yet answered.
    pub pending_live: usize,
    /// Submissions taken from intake rings and not yet answered (per-submitter counts).
    pub taken_unanswered: usize,
    /// Nothing admitted is left, queued or out at a worker.
    pub idle: bool,
    /// Nothing is out at a worker.
    pub nothing_out: bool,
    /// The drain deadline passed and what was left was aborted.
    pub aborted: bool,
    /// The executors' stop flag (set at the abort).
    pub stop: bool,
}

/// An engine, its shared state and its worker ends, with no thread.
pub struct Sim<M: Mode> {
    engine: Engine<M>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    /// The worker ends, `workers[w]` for the mode's worker `w`.
    pub workers: Vec<WorkerEnd<M::Job>>,
}

impl<M: Mode> Sim<M> {
    /// The engine over `mode`, with rings sized by `cfg`, as `start_routed` builds it.
    pub fn new(mode: M, cfg: DstConfig) -> Sim<M> {
        assert!(cfg.ring_capacity > 0 && cfg.max_submitters > 0 && cfg.jobs_per_worker > 0);
        let workers = mode.workers();
        let mut snapshot = Snapshot::new(workers, cfg.strategy);
        snapshot.backends = vec![Default::default(); cfg.backends];
        if cfg.request_level {
            snapshot.auto = vec![Default::default(); cfg.backends];
        }
        let clock = Clock::new();
        let shared = Arc::new(Shared {
            engine_bell: sync::Arc::new(Doorbell::new()),
            control: ArrayQueue::new(64),
            registrations: ArrayQueue::new(cfg.max_submitters),
            snapshot: Mutex::new(snapshot),
            rejected_busy: sync::AtomicU64::new(0),
            gate: Gate::new(),
            submitters: sync::AtomicUsize::new(0),
            max_submitters: cfg.max_submitters,
            ring_capacity: cfg.ring_capacity,
            clock,
            faults: Vec::new(),
            telemetry: ArrayQueue::new(telemetry::QUEUE_CAPACITY),
            telemetry_counters: Default::default(),
            tables: Default::default(),
        });
        let mut links = Vec::with_capacity(workers);
        let mut ends = Vec::with_capacity(workers);
        let replies_ready = sync::Arc::new(ReadyMask::new());
        for w in 0..workers {
            let (job_tx, job_rx) = ring::ring(cfg.jobs_per_worker);
            let (reply_tx, reply_rx) = ring::ring(cfg.jobs_per_worker + TOKEN_ROOM);
            links.push(WorkerLink {
                jobs: job_tx,
                replies: reply_rx,
                replies_ready: replies_ready.clone(),
                bell: sync::Arc::new(Doorbell::new()),
            });
            ends.push(WorkerEnd {
                jobs: job_rx,
                replies: MarkedProducer::new(reply_tx, replies_ready.clone(), w),
                reserve: cfg.jobs_per_worker,
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let engine = Engine::new(
            mode,
            clock,
            shared.clone(),
            links,
            cfg.max_submitters,
            Idler::new(IdlePolicy::Spin, Duration::ZERO),
            stop.clone(),
        );
        Sim {
            engine,
            shared,
            stop,
            workers: ends,
        }
    }

    /// A new submitter (registered with the engine at its next turn); submit through
    /// [`Submitter::submit_at_ns`] to stamp virtual arrivals. It has a wake, as an io
    /// thread's does (a no-op: the simulation polls), so workers answer its non-streaming
    /// requests directly (`runtime::direct_reply`), as they answer an io thread's.
    pub fn submitter(&self) -> Result<Submitter, RequestError> {
        Submitter::register(self.shared.clone(), Some(Arc::new(|| {})))
    }

    /// Asks for a strategy switch, as `Handle::set_strategy` does.
    pub fn set_strategy(&self, kind: StrategyKind) -> Result<(), RequestError> {
        self.shared
            .control
            .push(Control::SetStrategy(kind))
            .map_err(|_| RequestError::Busy)
    }

    /// Starts a drain, as `Handle::shutdown` does: closes the gate, then asks the engine to
    /// drain, aborting what is left at `deadline_ns`. False if the control queue was full
    /// (the gate is closed anyway; ask again).
    pub fn drain(&self, deadline_ns: Nanos) -> bool {
        self.shared.gate.close();
        self.shared
            .control
            .push(Control::Drain { deadline_ns })
            .is_ok()
    }

    /// True until [`Sim::drain`].
    pub fn is_accepting(&self) -> bool {
        self.shared.gate.is_open()
    }

    /// One engine turn at virtual time `now`.
    pub fn turn(&mut self, now: Nanos) -> TurnResult {
        self.engine.turn(now)
    }

    /// After a turn that reported `watch_gate`: whether the live loop's re-check before it
    /// sleeps would find work (and so not sleep).
    pub fn has_work(&self, watch_gate: bool) -> bool {
        self.engine.has_work(watch_gate)
    }

    /// Publishes a snapshot at `now` (the turn does so every 50 ms of virtual time).
    pub fn publish(&mut self, now: Nanos) {
        self.engine.publish(now);
    }

    /// Reads the last published snapshot without copying it.
    pub fn with_snapshot<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
        f(&self
            .shared
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// What the engine holds now.
    pub fn state(&self) -> EngineState {
        let (idle, nothing_out, aborted) = self.engine.state();
        EngineState {
            pending_live: self.engine.pending_live(),
            taken_unanswered: self.engine.taken_unanswered(),
            idle,
            nothing_out,
            aborted,
            stop: self.stop.load(Ordering::Acquire),
        }
    }
}
