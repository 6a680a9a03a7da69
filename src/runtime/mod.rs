//! The live runtime: a pinned engine thread driving the core over lock-free rings, feeding
//! pinned worker threads, behind an in-process handle.
//!
//! `start(config)` spawns everything and returns a [`Handle`]. Callers submit through a
//! [`Submitter`] (one per thread: its own SPSC rings per class, its own completion ring, and
//! a reply lane where workers answer non-streaming requests directly) or through
//! `Handle::submit`, which blocks-free returns a [`Pending`] to wait on. Nothing in this
//! module may block the engine thread.
//!
//! Where things live: `engine/` (the engine thread: its turn, and what each batching mode
//! does in it), `worker` (worker threads), `submitter`, `gate` and `intake` (the way in and
//! the submit/drain handshake), `ring` and `doorbell` (SPSC rings, waking a parked thread),
//! `direct_reply`, `reply_lane` and `batch_claim` (a worker answering the submitter
//! itself, and the claim that keeps that to one answer), `messages` (what crosses threads), `idle`, `pin`, `clock`,
//! `snapshot`, `seq_cell` (a value read without a lock); `dst` (feature `testing`) builds
//! the engine without threads for the deterministic simulation. Every cross-thread atomic
//! comes from `sync`, the std/loom switch, so `loom-tests/` checks the real protocols.

pub mod batch_claim;
pub mod clock;
pub mod direct_reply;
pub mod doorbell;
#[cfg(feature = "testing")]
pub mod dst;
pub mod engine;
pub mod event_loop;
pub mod gate;
pub mod idle;
pub mod intake;
pub mod messages;
pub mod pin;
pub mod ready;
pub mod reply_lane;
pub mod ring;
pub mod seq_cell;
pub mod snapshot;
pub mod submitter;
pub mod tables;
/// The std/loom switch (it lives at the crate root so `exec` can share the stop flag).
pub use crate::sync;
pub mod telemetry;
pub mod worker;

use crate::core::continuous::ContinuousConfig;
use crate::core::strategy::StrategyKind;
use crate::core::{Core, CoreConfig};
use crate::exec::latency::LatencyModel;
use crate::exec::sim::{FaultSettings, Faults, SimConfig, SimExecutor};
use clock::Clock;
use crossbeam_queue::ArrayQueue;
use doorbell::Doorbell;
use engine::{Engine, IterationLevel, RequestLevel, SubmitterLink, WorkerLink};
use gate::Gate;
use idle::{IdlePolicy, Idler};
use messages::{BatchMsg, Control, Reply, StepMsg};
pub use messages::{
    Event, Outcome, Request, RequestError, RouteRequest, TaggedEvent, ThreadRole, Waiter,
};
pub use snapshot::Snapshot;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
pub use submitter::Submitter;
use sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use worker::WorkerThread;

/// Settings of the live runtime.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub core: CoreConfig,
    pub sim: SimConfig,
    /// Faults injected into every worker at start.
    pub faults: FaultSettings,
    /// Pin the engine and workers to cores (where: `pin::plan`).
    pub pin: bool,
    /// HTTP io threads that will run beside this runtime (pinned by the front end on the
    /// cores [`Handle::io_core`] gives them); 0 for in-process use.
    pub io_threads: usize,
    /// How the engine and workers wait when idle.
    pub idle: IdlePolicy,
    /// How long `adaptive` yields before parking.
    pub spin_us: u64,
    /// Capacity of each submitter ring (per class) and of each completion ring.
    pub ring_capacity: usize,
    /// Most submitters (io threads, `Handle::submitter` callers) at once.
    pub max_submitters: usize,
    /// Called first thing on each runtime thread (tests use it to mark threads).
    pub on_thread_start: Option<fn(ThreadRole)>,
    /// Iteration-level (continuous) batching instead of request-level batches.
    pub continuous: Option<crate::core::continuous::ContinuousConfig>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            core: CoreConfig::default(),
            sim: SimConfig::default(),
            faults: FaultSettings::default(),
            pin: true,
            io_threads: 0,
            idle: IdlePolicy::Adaptive,
            spin_us: 20,
            ring_capacity: 1024,
            max_submitters: 64,
            on_thread_start: None,
            continuous: None,
        }
    }
}

/// State shared by the handle, submitters and the engine. Lock-free except the snapshot,
/// which the engine only ever `try_lock`s.
pub struct Shared {
    pub(crate) engine_bell: sync::Arc<Doorbell>,
    pub(crate) control: ArrayQueue<Control>,
    pub(crate) registrations: ArrayQueue<SubmitterLink>,
    pub(crate) snapshot: Mutex<Snapshot>,
    pub(crate) rejected_busy: AtomicU64,
    /// Open while the runtime takes submissions; counts those between their check and their
    /// push, so the engine never exits a drain with one of them unanswered (see `gate`).
    pub(crate) gate: Gate,
    /// Registered submitters (`max_submitters` at most); a dropped one gives its place back.
    submitters: AtomicUsize,
    max_submitters: usize,
    ring_capacity: usize,
    clock: Clock,
    faults: Vec<Arc<Faults>>,
    /// Telemetry events from the engine to the events thread (`/events`), and what was
    /// sampled out or dropped on the way.
    pub(crate) telemetry: ArrayQueue<telemetry::TelemetryEvent>,
    pub(crate) telemetry_counters: telemetry::TelemetryCounters,
    /// Routing tables on their way to the engine (`Control::SwapTables`).
    pub(crate) tables: tables::TablesMailbox,
}

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("could not spawn thread '{name}': {source}")]
    Spawn {
        name: String,
        source: std::io::Error,
    },
    #[error("invalid runtime config: {0}")]
    Config(String),
}

/// Starts the engine and worker threads with `sim` executors.
pub fn start(cfg: RuntimeConfig) -> Result<Handle, StartError> {
    let stop = Arc::new(AtomicBool::new(false));
    let LaneWorkers {
        executors, faults, ..
    } = sim_lane(&cfg, &cfg.sim.latency, cfg.core.workers, 0, &stop);
    start_with_executors(cfg, executors, faults, stop)
}

/// `workers` `sim` executors with `latency` (a backend's own model, or `cfg.sim.latency`)
/// and `cfg`'s other sim settings and faults, worker `i` seeded
/// `cfg.sim.seed + seed_offset + i`.
pub fn sim_lane(
    cfg: &RuntimeConfig,
    latency: &LatencyModel,
    workers: usize,
    seed_offset: u64,
    stop: &Arc<AtomicBool>,
) -> LaneWorkers {
    let faults: Vec<Arc<Faults>> = (0..workers).map(|_| Faults::new(cfg.faults)).collect();
    let executors = faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let sim = SimConfig {
                seed: cfg
                    .sim
                    .seed
                    .wrapping_add(seed_offset)
                    .wrapping_add(i as u64),
                latency: *latency,
                ..cfg.sim.clone()
            };
            Box::new(SimExecutor::new(sim, f.clone(), stop.clone()))
                as Box<dyn crate::exec::Executor>
        })
        .collect();
    LaneWorkers {
        executors,
        faults,
        alone: crate::core::Alone::Never,
    }
}

/// The model the runtime serves when started without a router ([`start`],
/// [`start_with_executors`]).
pub const DEFAULT_MODEL: &str = "abe-sim";

/// Starts the runtime with the given executors (one per worker), as one `sim` backend
/// serving [`DEFAULT_MODEL`].
pub fn start_with_executors(
    cfg: RuntimeConfig,
    executors: Vec<Box<dyn crate::exec::Executor>>,
    faults: Vec<Arc<Faults>>,
    stop: Arc<AtomicBool>,
) -> Result<Handle, StartError> {
    if executors.len() != cfg.core.workers || cfg.core.workers == 0 {
        return Err(StartError::Config(format!(
            "{} executors for {} workers (need at least one, one per worker)",
            executors.len(),
            cfg.core.workers
        )));
    }
    let mut backend = crate::router::BackendConfig::default_sim(DEFAULT_MODEL, u32::MAX);
    backend.max_concurrent_batches = executors.len() as u32;
    let (router, _) = crate::router::Router::build(
        &[backend],
        &crate::router::RoutingConfig::default(),
        cfg.core.seed,
    )
    .map_err(|e| StartError::Config(e.to_string()))?;
    let name = router
        .lookup(DEFAULT_MODEL)
        .map_err(|e| StartError::Config(e.to_string()))?;
    let routing = engine::Routing::new(router, name, None);
    let lane = LaneWorkers {
        executors,
        faults,
        alone: crate::core::Alone::Never,
    };
    start_routed(cfg, routing, vec![lane], stop)
}

/// One backend's worker threads: an executor and a fault switch per worker.
pub struct LaneWorkers {
    pub executors: Vec<Box<dyn crate::exec::Executor>>,
    pub faults: Vec<Arc<Faults>>,
    /// Which of its requests go in a batch of their own (`Backend::alone`,
    /// `CoreConfig::alone`).
    pub alone: crate::core::Alone,
}

/// Starts the runtime over the backends of `routing`'s router: `lanes[b]` are backend `b`'s
/// workers, scheduled by a core of their own built from `cfg.core` (its `workers` is each
/// lane's executor count). In continuous batching each lane's workers are the replicas of
/// one replica group of the slot scheduler, and requests are routed to a lane at admission.
pub fn start_routed(
    cfg: RuntimeConfig,
    routing: engine::Routing,
    lanes: Vec<LaneWorkers>,
    stop: Arc<AtomicBool>,
) -> Result<Handle, StartError> {
    let backends = routing.router.registry().len();
    if lanes.len() != backends {
        return Err(StartError::Config(format!(
            "{} worker sets for {backends} backends",
            lanes.len()
        )));
    }
    if let Some(l) = lanes
        .iter()
        .position(|l| l.executors.is_empty() || l.faults.len() != l.executors.len())
    {
        return Err(StartError::Config(format!(
            "backend {l} needs at least one worker, and a fault switch per worker"
        )));
    }
    if cfg.ring_capacity == 0 || cfg.max_submitters == 0 {
        return Err(StartError::Config(
            "ring_capacity and max_submitters must be at least 1".into(),
        ));
    }
    let lane_workers: Vec<usize> = lanes.iter().map(|l| l.executors.len()).collect();
    let lane_alone: Vec<crate::core::Alone> = lanes.iter().map(|l| l.alone).collect();
    let total_workers: usize = lane_workers.iter().sum();
    let mut executors = Vec::with_capacity(total_workers);
    let mut faults = Vec::with_capacity(total_workers);
    for lane in lanes {
        executors.extend(lane.executors);
        faults.extend(lane.faults);
    }
    let clock = Clock::new();
    let strategy = cfg.core.strategy;
    let mut snapshot = Snapshot::new(total_workers, strategy);
    snapshot.backends = vec![Default::default(); backends];
    // Slots that start empty (discovery's) say so before the engine's first publish.
    for (b, dst) in snapshot.backends.iter_mut().enumerate() {
        let id = crate::router::BackendId::from_index(b);
        dst.slot = routing.router.registry().state(id).slot();
    }
    snapshot.backend_names = routing
        .router
        .registry()
        .backends()
        .map(|(_, b)| b.name().to_string())
        .collect();
    if cfg.continuous.is_none() {
        // One per lane, allocated here: the engine copies into them at publish.
        snapshot.auto = vec![Default::default(); backends];
    }
    let shared = Arc::new(Shared {
        engine_bell: sync::Arc::new(Doorbell::new()),
        control: ArrayQueue::new(64),
        registrations: ArrayQueue::new(cfg.max_submitters),
        snapshot: Mutex::new(snapshot),
        rejected_busy: AtomicU64::new(0),
        gate: Gate::new(),
        submitters: AtomicUsize::new(0),
        max_submitters: cfg.max_submitters,
        ring_capacity: cfg.ring_capacity,
        clock,
        faults,
        telemetry: ArrayQueue::new(telemetry::QUEUE_CAPACITY),
        telemetry_counters: Default::default(),
        tables: Default::default(),
    });
    let placement = pin::plan(
        cfg.pin,
        pin::core_count(),
        total_workers,
        cfg.io_threads,
        cfg.idle,
    );
    let spin = Duration::from_micros(cfg.spin_us);
    // The workers' exit flag: set once the engine has returned (the executors' `stop` is
    // set then too, and earlier at a drain deadline's abort).
    let exit = sync::Arc::new(sync::AtomicBool::new(false));
    let workers = Workers {
        cfg: &cfg,
        engine_bell: &shared.engine_bell,
        exit: &exit,
        cores: &placement.workers,
    };
    let idler = Idler::new(cfg.idle, spin);
    let (body, worker_handles): (Box<dyn FnOnce() + Send>, _) = match cfg.continuous.clone() {
        None => {
            let (links, handles) = workers.spawn_batches(executors)?;
            let cores = lane_workers
                .iter()
                .enumerate()
                .map(|(l, &workers)| {
                    Core::new(CoreConfig {
                        workers,
                        seed: cfg.core.seed.wrapping_add(l as u64),
                        alone: lane_alone[l],
                        ..cfg.core.clone()
                    })
                })
                .collect();
            let mut engine = Engine::new(
                RequestLevel::new(cores, routing),
                clock,
                shared.clone(),
                links,
                cfg.max_submitters,
                idler,
                stop.clone(),
            );
            // A first snapshot before the server can be scraped: until the engine's first
            // turn publishes, /metrics would lack the engine's series (the KV capacity of a
            // continuous backend, which tools size from, among them).
            engine.publish(shared.clock.now());
            (Box::new(move || engine.run()), handles)
        }
        Some(ccfg) => {
            let (links, handles) = workers.spawn::<StepMsg>(executors)?;
            let sched = crate::core::continuous::Continuous::with_groups(
                ContinuousConfig {
                    replicas: total_workers,
                    ..ccfg
                },
                &lane_workers,
            );
            let mut engine = Engine::new(
                IterationLevel::new(
                    sched,
                    routing,
                    cfg.core.request_timeout_ns,
                    cfg.core.batch_timeout_ns,
                    cfg.core.circuit,
                ),
                clock,
                shared.clone(),
                links,
                cfg.max_submitters,
                idler,
                stop.clone(),
            );
            // As above.
            engine.publish(shared.clock.now());
            (Box::new(move || engine.run()), handles)
        }
    };
    let hook = cfg.on_thread_start;
    let engine_core = placement.engine;
    let engine_stop = stop.clone();
    let engine_handle = std::thread::Builder::new()
        .name("abe-engine".into())
        .spawn(move || {
            if let Some(h) = hook {
                h(ThreadRole::Engine);
            }
            pin::pin_current("abe-engine", engine_core);
            body();
            worker::signal_exit(&engine_stop, &exit);
            for h in worker_handles {
                h.wake_and_join();
            }
        })
        .map_err(|source| StartError::Spawn {
            name: "abe-engine".into(),
            source,
        })?;
    let shared_submitter =
        Submitter::register(shared.clone(), None).map_err(|e| StartError::Config(e.to_string()))?;
    Ok(Handle {
        shared,
        engine: Mutex::new(Some(engine_handle)),
        shared_submitter: Mutex::new(shared_submitter),
        io_cores: placement.io,
    })
}

/// The engine's links to the workers spawned, and their threads.
type Spawned<J> = (Vec<WorkerLink<J>>, Vec<WorkerHandle>);

/// What every worker thread of one start shares.
struct Workers<'a> {
    cfg: &'a RuntimeConfig,
    engine_bell: &'a sync::Arc<Doorbell>,
    exit: &'a sync::Arc<sync::AtomicBool>,
    /// Where worker `i` is pinned (see [`pin::plan`]).
    cores: &'a [Option<usize>],
}

impl Workers<'_> {
    /// Spawns a worker thread per executor, each with its job ring (`max_inflight_per_worker`
    /// jobs) and reply ring (as many replies, plus room for token events); returns the
    /// engine's links and the threads.
    fn spawn<J>(
        &self,
        executors: Vec<Box<dyn crate::exec::Executor>>,
    ) -> Result<Spawned<J>, StartError>
    where
        J: worker::Job<Exec = dyn crate::exec::Executor>,
    {
        let mut links = Vec::with_capacity(executors.len());
        let mut handles = Vec::with_capacity(executors.len());
        // One mask for every worker's reply ring: the engine pops only the marked ones.
        let replies_ready = sync::Arc::new(ready::ReadyMask::new());
        for (id, executor) in executors.into_iter().enumerate() {
            let (link, handle) = self.spawn_worker::<J>(id, executor, &replies_ready)?;
            links.push(link);
            handles.push(handle);
        }
        Ok((links, handles))
    }

    /// As [`Workers::spawn`] for request-level batching, except that a run of executors
    /// sharing one event loop (`Executor::event_loop`) becomes the seats of one thread
    /// (`runtime::event_loop`).
    fn spawn_batches(
        &self,
        executors: Vec<Box<dyn crate::exec::Executor>>,
    ) -> Result<Spawned<BatchMsg>, StartError> {
        let mut links = Vec::with_capacity(executors.len());
        let mut handles = Vec::with_capacity(executors.len());
        let replies_ready = sync::Arc::new(ready::ReadyMask::new());
        let mut executors = executors.into_iter().enumerate().peekable();
        while let Some((id, executor)) = executors.next() {
            let Some(share) = executor.event_loop().cloned() else {
                let (link, handle) = self.spawn_worker::<BatchMsg>(id, executor, &replies_ready)?;
                links.push(link);
                handles.push(handle);
                continue;
            };
            let mut seats = 1;
            while executors
                .next_if(|(_, e)| e.event_loop().is_some_and(|s| Arc::ptr_eq(s, &share)))
                .is_some()
            {
                seats += 1;
            }
            let exec = share.take().ok_or_else(|| {
                StartError::Config(format!("worker {id}: its event loop was taken by another"))
            })?;
            let (seat_links, handle) = self.spawn_loop(id, seats, exec, &replies_ready)?;
            links.extend(seat_links);
            handles.push(handle);
        }
        Ok((links, handles))
    }

    /// One worker thread `id` running `executor`.
    fn spawn_worker<J>(
        &self,
        id: usize,
        executor: Box<dyn crate::exec::Executor>,
        replies_ready: &sync::Arc<ready::ReadyMask>,
    ) -> Result<(WorkerLink<J>, WorkerHandle), StartError>
    where
        J: worker::Job<Exec = dyn crate::exec::Executor>,
    {
        let per_worker = self.cfg.core.max_inflight_per_worker.max(1) as usize;
        let spin = Duration::from_micros(self.cfg.spin_us);
        let (job_tx, job_rx) = ring::ring(per_worker);
        let (reply_tx, reply_rx) = ring::ring(per_worker + worker::TOKEN_ROOM);
        let bell = sync::Arc::new(Doorbell::new());
        let link = WorkerLink {
            jobs: job_tx,
            replies: reply_rx,
            replies_ready: replies_ready.clone(),
            bell: bell.clone(),
        };
        let thread = WorkerThread::<J> {
            id,
            jobs: job_rx,
            results: ready::MarkedProducer::new(reply_tx, replies_ready.clone(), id),
            executor,
            bell,
            engine_bell: self.engine_bell.clone(),
            exit: self.exit.clone(),
            idle: self.cfg.idle,
            spin,
            reserve: per_worker,
        };
        let handle = self.spawn_thread(format!("abe-worker-{id}"), id, move || thread.run())?;
        Ok((link, WorkerHandle { handle, bell: None }))
    }

    /// One event-loop thread running workers `first..first + seats` on `exec`.
    fn spawn_loop(
        &self,
        first: usize,
        seats: usize,
        exec: Box<dyn crate::exec::concurrent::ConcurrentExecutor>,
        replies_ready: &sync::Arc<ready::ReadyMask>,
    ) -> Result<(Vec<WorkerLink<BatchMsg>>, WorkerHandle), StartError> {
        let per_worker = self.cfg.core.max_inflight_per_worker.max(1) as usize;
        let bell = sync::Arc::new(Doorbell::new());
        let mut links = Vec::with_capacity(seats);
        let mut loop_seats = Vec::with_capacity(seats);
        for id in first..first + seats {
            let (job_tx, job_rx) = ring::ring(per_worker);
            let (reply_tx, reply_rx) = ring::ring(per_worker + worker::TOKEN_ROOM);
            links.push(WorkerLink {
                jobs: job_tx,
                replies: reply_rx,
                replies_ready: replies_ready.clone(),
                bell: bell.clone(),
            });
            loop_seats.push(event_loop::Seat::new(
                job_rx,
                ready::MarkedProducer::new(reply_tx, replies_ready.clone(), id),
            ));
        }
        let event_loop = event_loop::EventLoop {
            seats: loop_seats,
            exec,
            bell: bell.clone(),
            engine_bell: self.engine_bell.clone(),
            exit: self.exit.clone(),
            reserve: per_worker,
            done: Vec::with_capacity(seats),
        };
        let handle =
            self.spawn_thread(format!("abe-loop-{first}"), first, move || event_loop.run())?;
        Ok((
            links,
            WorkerHandle {
                handle,
                bell: Some(bell),
            },
        ))
    }
}

impl Workers<'_> {
    /// Starts thread `name` for worker `id` (its start hook, its core), running `body`.
    fn spawn_thread(
        &self,
        name: String,
        id: usize,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<JoinHandle<()>, StartError> {
        let core_id = self.cores[id];
        let hook = self.cfg.on_thread_start;
        let thread_name = name.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                if let Some(h) = hook {
                    h(ThreadRole::Worker(id));
                }
                pin::pin_current(&thread_name, core_id);
                body();
            })
            .map_err(|source| StartError::Spawn { name, source })
    }
}

/// A worker thread or an event-loop thread, as the engine thread wakes and joins it at exit.
struct WorkerHandle {
    handle: JoinHandle<()>,
    /// An event loop's doorbell (it sleeps in a poll, which an unpark does not end).
    bell: Option<sync::Arc<Doorbell>>,
}

impl WorkerHandle {
    /// Wakes the thread to see `exit`, and waits for it to return.
    fn wake_and_join(self) {
        match &self.bell {
            Some(bell) => bell.ring(),
            None => self.handle.thread().unpark(),
        }
        let _ = self.handle.join();
    }
}

/// The in-process API of a running abe.
pub struct Handle {
    shared: Arc<Shared>,
    engine: Mutex<Option<JoinHandle<()>>>,
    shared_submitter: Mutex<Submitter>,
    /// Where io thread `i` should be pinned (see [`pin::plan`]).
    io_cores: Vec<Option<usize>>,
}

/// A request submitted through `Handle::submit`; wait on it for the answer.
pub struct Pending {
    waiter: Arc<Waiter>,
}

impl Pending {
    /// Blocks until the request is answered.
    pub fn wait(self) -> Outcome {
        self.waiter.wait()
    }

    /// Blocks up to `timeout`; gives the pending request back if it is not answered yet.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Outcome, Pending> {
        match self.waiter.wait_timeout(timeout) {
            Some(o) => Ok(o),
            None => Err(self),
        }
    }
}

/// What `shutdown` observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// True when everything finished before the deadline (nothing aborted).
    pub clean: bool,
    pub completed: u64,
    pub failed: u64,
    pub aborted: u64,
}

impl Handle {
    /// The core io thread `i` should be pinned to, if any (`RuntimeConfig::io_threads`).
    pub fn io_core(&self, i: usize) -> Option<usize> {
        self.io_cores.get(i).copied().flatten()
    }

    /// Submits one request; the returned [`Pending`] yields exactly one outcome. Refusals at
    /// the door (shutting down, intake full) come back as an already-answered `Pending`.
    pub fn submit(&self, request: Request) -> Pending {
        let waiter = Arc::new(Waiter::default());
        let mut sub = self
            .shared_submitter
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Err(e) = sub.submit_reply(request, Reply::Waiter(waiter.clone())) {
            waiter.complete(Err(e));
        }
        Pending { waiter }
    }

    /// A new submitter for the calling thread (an io thread, a load generator). `wake` is
    /// called from the engine after it pushed completions for this submitter.
    pub fn submitter(
        &self,
        wake: Option<Arc<dyn Fn() + Send + Sync>>,
    ) -> Result<Submitter, RequestError> {
        Submitter::register(self.shared.clone(), wake)
    }

    /// Switches the batching strategy; nothing queued is lost.
    pub fn set_strategy(&self, kind: StrategyKind) -> Result<(), RequestError> {
        self.shared
            .control
            .push(Control::SetStrategy(kind))
            .map_err(|_| RequestError::Busy)?;
        self.shared.engine_bell.ring();
        Ok(())
    }

    /// Backend `backend` becomes active again, or starts draining: nothing new is routed
    /// to it, what it holds finishes, then the engine marks it empty (the snapshot's
    /// `backends[b].slot` shows each step). `Busy` when the control queue is full.
    pub fn set_slot(
        &self,
        backend: crate::router::BackendId,
        slot: crate::router::SlotState,
        seq: u32,
    ) -> Result<(), RequestError> {
        self.shared
            .control
            .push(Control::SetSlot { backend, slot, seq })
            .map_err(|_| RequestError::Busy)?;
        self.shared.engine_bell.ring();
        Ok(())
    }

    /// The names `/metrics` labels each backend slot's series with, after a swap of the
    /// routing tables gave slots new backends (the engine never reads them).
    pub fn set_backend_names(&self, names: Vec<String>) {
        let mut snap = self
            .shared
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(snap.backend_names.len(), names.len());
        snap.backend_names = names;
    }

    /// Hands `next` to the engine and waits (up to `timeout`) for it to swap the tables in
    /// or refuse them (see `runtime::tables`). Blocks: call it off the engine and io
    /// threads. `Busy` when the control queue is full or the engine did not answer in time
    /// (it is stopping). Callers serialise their calls.
    pub fn swap_tables(
        &self,
        next: tables::EngineTables,
        timeout: Duration,
    ) -> Result<tables::TablesAnswer, RequestError> {
        let mailbox = &self.shared.tables;
        let generation = mailbox
            .offer(Box::new(next))
            .map_err(|_| RequestError::Busy)?;
        if self.shared.control.push(Control::SwapTables).is_err() && mailbox.withdraw(generation) {
            return Err(RequestError::Busy);
        }
        // (A failed push whose hand-off is gone: a message left from a withdrawn hand-off
        // took it, and its answer follows.)
        self.shared.engine_bell.ring();
        let start = std::time::Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            if let Some(answer) = mailbox.answer_for(generation) {
                mailbox.drop_retired();
                return Ok(answer);
            }
            // Past the timeout, withdraw what the engine has not taken; what it took is
            // answered within that engine turn (moves only), so wait for the answer: a
            // failure reported for tables the engine swapped in would leave the control
            // plane's copy behind the engine's. Only an engine thread that is gone never
            // answers.
            if start.elapsed() >= timeout && (mailbox.withdraw(generation) || self.engine_gone()) {
                return Err(RequestError::Busy);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// The engine thread has returned (or was joined): nothing will answer it any more.
    fn engine_gone(&self) -> bool {
        self.engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(JoinHandle::is_finished)
    }

    /// LoRA adapter `adapter` was unloaded, or its id handed to a new adapter: the engine
    /// forgets it in every slot table between two turns, so the next request with the id
    /// pays a load. `Busy` when the control queue is full.
    pub fn forget_adapter(
        &self,
        adapter: crate::core::lora::AdapterId,
    ) -> Result<(), RequestError> {
        self.shared
            .control
            .push(Control::ForgetAdapter(adapter))
            .map_err(|_| RequestError::Busy)?;
        self.shared.engine_bell.ring();
        Ok(())
    }

    /// `[routing]` settings a reload changed (the engine's router takes them between turns).
    pub fn set_routing(&self, live: crate::router::LiveRouting) -> Result<(), RequestError> {
        self.shared
            .control
            .push(Control::SetRouting(live))
            .map_err(|_| RequestError::Busy)?;
        self.shared.engine_bell.ring();
        Ok(())
    }

    /// Changes the faults injected into worker `worker` (tests and chaos runs).
    pub fn set_faults(&self, worker: usize, faults: FaultSettings) {
        if let Some(f) = self.shared.faults.get(worker) {
            f.set(faults);
        }
    }

    /// Changes the faults injected into every worker (`POST /admin/faults`, chaos runs).
    /// Only `sim` executors act on them; `upstream` workers ignore them.
    pub fn set_faults_all(&self, faults: FaultSettings) {
        for f in &self.shared.faults {
            f.set(faults);
        }
    }

    /// The faults injected into worker `worker`, if there is one.
    pub fn faults(&self, worker: usize) -> Option<FaultSettings> {
        self.shared.faults.get(worker).map(|f| f.get())
    }

    /// The latest published snapshot (at most ~50 ms old).
    pub fn snapshot(&self) -> Snapshot {
        self.shared
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The next telemetry event the engine emitted, if any (for the one events thread).
    pub fn pop_telemetry(&self) -> Option<telemetry::TelemetryEvent> {
        self.shared.telemetry.pop()
    }

    /// Telemetry events the engine sampled out, and dropped on a full queue, so far.
    pub fn telemetry_lost(&self) -> (u64, u64) {
        let c = &self.shared.telemetry_counters;
        // Relaxed: independent counters, read for display.
        (
            c.sampled_out.load(Ordering::Relaxed),
            c.queue_full.load(Ordering::Relaxed),
        )
    }

    /// The runtime's clock (for stamping arrivals and reading snapshot times).
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// True while new requests are accepted.
    pub fn is_accepting(&self) -> bool {
        self.shared.gate.is_open()
    }

    /// Stops admitting, finishes queued and in-flight work, answers everything; whatever is
    /// still unanswered at `deadline` is answered with an error. Returns when all threads
    /// have exited. Calling it again returns at once.
    pub fn shutdown(&self, deadline: Duration) -> ShutdownReport {
        let engine = self.engine.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(engine) = engine {
            // Close before the Drain control: the engine reads the gate after the control.
            self.shared.gate.close();
            let deadline_ns = self
                .shared
                .clock
                .now()
                .saturating_add(deadline.as_nanos() as u64);
            while self
                .shared
                .control
                .push(Control::Drain { deadline_ns })
                .is_err()
            {
                self.shared.engine_bell.ring();
                std::thread::sleep(Duration::from_millis(1));
            }
            self.shared.engine_bell.ring();
            let _ = engine.join();
        }
        let s = self.snapshot().stats;
        ShutdownReport {
            clean: s.aborted == 0,
            completed: s.completed,
            failed: s.failed,
            aborted: s.aborted,
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}
