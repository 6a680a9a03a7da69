//! `abe serve`: wires config, runtime and HTTP front end together, and shuts them down in
//! order on SIGINT/SIGTERM (stop accepting, drain the engine, write every answer, exit);
//! SIGHUP reloads the config (`live::reload`).

use crate::api::ApiContext;
use crate::config::{Config, ConfigError, Settings};
use crate::exec::concurrent::LoopShare;
use crate::exec::embed::EmbedStats;
use crate::exec::health::{spawn_health_checker, HealthBoard};
use crate::exec::latency::LatencyModel;
use crate::exec::sim::Faults;
use crate::exec::upstream::{
    Mux, UpstreamClient, UpstreamExecutor, UpstreamSlot, UpstreamTarget, UpstreamTimeouts,
};
use crate::exec::Executor;
use crate::live::discovery::{DiscoveryThreads, Resolve, SystemResolver};
use crate::live::reload::{ReloadError, ReloadReport};
use crate::live::thread::LiveThread;
use crate::live::{ConfigSource, LiveBackends};
use crate::metrics::http_stats::HttpStats;
use crate::router::{BackendConfig, BackendId, BackendKind, Router, SlotState};
use crate::runtime::engine::{BackendHealth, Routing};
use crate::runtime::{self, Handle, LaneWorkers, RuntimeConfig, ShutdownReport, StartError};
use crate::server::{self, ServeError, Server};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Why `abe serve` could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// An `embed` backend's model directory is missing a file or holds a wrong one.
    #[cfg(feature = "embed")]
    #[error("backend '{backend}': {source}")]
    Embed {
        backend: String,
        source: crate::exec::embed::LoadError,
    },
}

/// A running abe: engine, workers and HTTP front end.
pub struct Running {
    pub handle: Arc<Handle>,
    pub server: Server,
    pub ctx: Arc<ApiContext>,
    /// The upstream health checker, if any backend is `upstream`: its stop flag and thread.
    health: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// The history thread filling `ctx.history` once a second.
    history: Option<crate::metrics::history::sampler::Sampler>,
    /// The events thread feeding `/events` subscribers.
    events: Option<crate::metrics::events::EventsThread>,
    /// The control plane over the backend slots (admin API, reload, discovery).
    pub live: Arc<LiveBackends>,
    /// One thread per `discovery` table, if any.
    discovery: Option<DiscoveryThreads>,
    /// Where reloads run and moves waiting for a drain finish.
    live_thread: LiveThread,
}

impl Running {
    /// Checks `config` and starts everything it describes.
    pub fn start(config: Config) -> Result<Running, RunError> {
        Self::start_checked(config.check()?)
    }

    /// Starts everything `settings` describe. The engine gets the router; the io threads a
    /// copy of it, for lookups and static checks.
    pub fn start_checked(settings: Settings) -> Result<Running, RunError> {
        Self::start_checked_with(settings, Arc::new(SystemResolver))
    }

    /// As [`start_checked`](Self::start_checked), with discovery resolving through
    /// `resolver` (tests answer without DNS).
    pub fn start_checked_with(
        settings: Settings,
        resolver: Arc<dyn Resolve>,
    ) -> Result<Running, RunError> {
        let Settings {
            runtime: runtime_cfg,
            backends,
            sim_latency,
            router: mut engine_router,
            routing_warning,
            discovery,
            spare,
            config,
        } = settings;
        // A discovery table's slots start empty (its addresses fill them), and so do the
        // spare slots (an add or a reload fills them).
        let empty_at_start = discovery.iter().flat_map(|p| &p.slots).chain(&spare);
        for &b in empty_at_start {
            engine_router
                .registry_mut()
                .set_slot(BackendId::from_index(b), SlotState::Empty);
        }
        if let Some(w) = routing_warning {
            tracing::warn!("{w}");
        }
        if sim_latency.len() != backends.len() {
            return Err(StartError::Config(format!(
                "settings hold {} latency models for {} backends (build them with Config::check)",
                sim_latency.len(),
                backends.len()
            ))
            .into());
        }
        // Resolves, prechecks and describes only: no copy of the prefix indexes.
        let io_router = Arc::new(engine_router.lookup_copy());
        // The default model must resolve (ApiContext picks one some backend serves).
        let default_name = io_router
            .lookup(&ApiContext::default_model_for(&config, &io_router))
            .map_err(|e| StartError::Config(format!("routing: {e}")))?;
        // The executors' stop flag goes through the std/loom switch: the engine sets it.
        let stop = Arc::new(crate::sync::AtomicBool::new(false));
        let timeouts = UpstreamTimeouts {
            connect: config.upstream.connect_timeout.duration(),
            request: config.upstream.request_timeout.duration(),
        };
        let mut clients = Vec::new();
        let mut cells = Vec::with_capacity(backends.len());
        let mut embed_stats = Vec::new();
        let mut lanes = Vec::with_capacity(backends.len());
        for (b, backend) in backends.iter().enumerate() {
            let client = upstream_client(&io_router, b, timeouts).map(UpstreamSlot::new);
            if let Some(c) = &client {
                clients.push((b, c.clone()));
            }
            cells.push(client.clone());
            let routed = io_router.registry().backend(BackendId::from_index(b));
            let mut lane = lane_workers(
                &runtime_cfg,
                Lane {
                    index: b,
                    backend,
                    kind: routed.kind(),
                    sim_latency: &sim_latency[b],
                },
                client,
                &stop,
                &mut embed_stats,
            )?;
            lane.alone = routed.alone();
            lanes.push(lane);
        }
        let board = HealthBoard::new(backends.len());
        let health = if clients.is_empty() {
            None
        } else {
            let health_stop = Arc::new(AtomicBool::new(false));
            let thread = spawn_health_checker(
                clients,
                board.clone(),
                config.health.check_interval.duration(),
                config.upstream.health_timeout.duration(),
                config.upstream.health_path.clone(),
                health_stop.clone(),
            )
            .map_err(|source| StartError::Spawn {
                name: "abe-health".into(),
                source,
            })?;
            Some((health_stop, thread))
        };
        let running_config = config.clone();
        let config = Arc::new(config);
        let http_stats = Arc::new(HttpStats::new());
        let health_view = health
            .is_some()
            .then(|| board.clone() as Arc<dyn BackendHealth>);
        let routing = Routing::new(engine_router, default_name, health_view);
        let handle = match runtime::start_routed(runtime_cfg, routing, lanes, stop) {
            Ok(h) => Arc::new(h),
            Err(e) => {
                if let Some((stop, thread)) = health {
                    stop.store(true, std::sync::atomic::Ordering::Release);
                    let _ = thread.join();
                }
                return Err(e.into());
            }
        };
        let live = Arc::new(LiveBackends::new(
            handle.clone(),
            &backends,
            cells,
            discovery,
            running_config,
            io_router.clone(),
        ));
        if health.is_some() {
            live.set_health_board(board.clone());
        }
        let live_thread = LiveThread::spawn(live.clone()).map_err(|source| StartError::Spawn {
            name: "abe-live".into(),
            source,
        })?;
        let mut ctx = ApiContext::new(handle.clone(), config, http_stats, io_router);
        ctx.embed_stats = embed_stats;
        ctx.live = Some(live.clone());
        let ctx = Arc::new(ctx);
        let server = server::start(ctx.clone())?;
        // Without the thread abe serves on, with an empty history: not worth refusing to run.
        let history = crate::metrics::history::sampler::Sampler::spawn_for(
            handle.clone(),
            ctx.history.clone(),
        )
        .map_err(|e| tracing::warn!("no /metrics/history: cannot start abe-history: {e}"))
        .ok();
        let events =
            crate::metrics::events::EventsThread::spawn(handle.clone(), ctx.events.clone())
                .map_err(|e| tracing::warn!("no /events: cannot start abe-events: {e}"))
                .ok();
        let discovery = if live.plans().is_empty() {
            None
        } else {
            match DiscoveryThreads::spawn(live.clone(), resolver) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!("no discovery: cannot start abe-discovery: {e}");
                    None
                }
            }
        };
        Ok(Running {
            handle,
            server,
            ctx,
            health,
            history,
            events,
            live,
            discovery,
            live_thread,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Graceful stop: refuse new work, drain the engine (up to `server.shutdown_timeout`,
    /// then answer what remains with an error), write every answer, join all threads.
    pub fn shutdown(self) -> ShutdownReport {
        let server_cfg = &self.ctx.config.server;
        let drain = server_cfg.shutdown_timeout.duration();
        let write_grace = server_cfg
            .write_timeout
            .duration()
            .min(Duration::from_secs(5));
        if let Some(d) = self.discovery {
            d.stop();
        }
        self.live_thread.stop();
        let control = self.server.control();
        control.begin_stop();
        let report = self.handle.shutdown(drain);
        // Every request is answered now; give io threads a bounded time to write them.
        let timer_control = control.clone();
        std::thread::spawn(move || {
            std::thread::sleep(write_grace);
            timer_control.hard_stop();
        });
        self.server.join();
        if let Some(history) = self.history {
            history.stop();
        }
        if let Some(events) = self.events {
            events.stop();
        }
        if let Some((stop, thread)) = self.health {
            stop.store(true, std::sync::atomic::Ordering::Release);
            let _ = thread.join();
        }
        report
    }

    /// Where a reload (`SIGHUP`, `POST /admin/reload`) reads the config again.
    pub fn set_config_source(&self, source: ConfigSource) {
        self.live.set_source(source);
    }

    /// Reads the config again and applies what can change live (see `live::reload`), on
    /// the calling thread.
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        self.live.reload()
    }

    /// Serves until SIGINT or SIGTERM arrives on `signals`, then shuts down gracefully. A
    /// SIGHUP reloads the config (a refused one is logged; the running one stays).
    pub fn run_until_signal(self, mut signals: Signals) -> ShutdownReport {
        for sig in signals.forever() {
            if sig == signal_hook::consts::SIGHUP {
                tracing::info!("SIGHUP: reloading the config (on abe-live)");
                self.live.queue_reload(Box::new(|outcome| {
                    if let Err(e) = outcome {
                        tracing::error!("{e}");
                    }
                }));
                continue;
            }
            tracing::info!(signal = sig, "shutting down: draining in-flight requests");
            break;
        }
        self.shutdown()
    }
}

/// The HTTP client of backend `index` if it is `upstream` (one connection pool, shared by
/// its workers and the health checker).
fn upstream_client(
    router: &Router,
    index: usize,
    timeouts: UpstreamTimeouts,
) -> Option<UpstreamClient> {
    let backend = router.registry().backend(BackendId::from_index(index));
    match backend.kind() {
        BackendKind::Sim | BackendKind::Embed { .. } => None,
        BackendKind::Upstream { base_url, api_key } => Some(UpstreamClient::new(
            UpstreamTarget {
                name: backend.name().to_string(),
                base_url: base_url.clone(),
                api_key: api_key.as_ref().map(|k| k.expose().to_string()),
                prompt_array: backend.accepts_prompt_array(),
            },
            timeouts,
        )),
    }
}

/// What [`lane_workers`] builds one backend's workers from.
struct Lane<'a> {
    /// The backend's index in the router (its workers' seeds are offset by it).
    index: usize,
    backend: &'a BackendConfig,
    kind: &'a BackendKind,
    /// Its latency model if it is `sim` (`Settings::sim_latency`).
    sim_latency: &'a LatencyModel,
}

/// Backend `index`'s worker threads: `max_concurrent_batches` executors of its kind. A
/// `sim` backend's run `sim_latency` (its `[workers.backends.<name>]` model, or
/// `[workers]`'). An `embed` backend loads its model here, once for all its workers (a bad
/// model directory stops the start, naming the file), and adds its padding counters to
/// `embed_stats`.
fn lane_workers(
    cfg: &RuntimeConfig,
    lane: Lane<'_>,
    client: Option<UpstreamSlot>,
    stop: &Arc<crate::sync::AtomicBool>,
    embed_stats: &mut Vec<(Box<str>, Arc<EmbedStats>)>,
) -> Result<LaneWorkers, RunError> {
    let Lane {
        index,
        backend,
        kind,
        sim_latency,
    } = lane;
    let n = backend.max_concurrent_batches.max(1) as usize;
    let faults = || (0..n).map(|_| Faults::new(cfg.faults)).collect();
    if let Some(client) = client {
        // All of the backend's workers are seats of one event loop (`runtime::event_loop`).
        let mux = Mux::new(client.clone(), n, stop.clone()).map_err(|e| {
            StartError::Config(format!(
                "backend '{}': cannot start its event loop: {e}",
                backend.name
            ))
        })?;
        let share = LoopShare::new(Box::new(mux));
        return Ok(LaneWorkers {
            executors: (0..n)
                .map(|_| {
                    Box::new(
                        UpstreamExecutor::in_slot(client.clone(), stop.clone())
                            .on_loop(share.clone()),
                    ) as Box<dyn Executor>
                })
                .collect(),
            faults: faults(),
            alone: crate::core::Alone::Never,
        });
    }
    match kind {
        #[cfg(feature = "embed")]
        BackendKind::Embed {
            model_dir,
            truncate,
        } => {
            use crate::exec::embed::{ComputeThreads, EmbedExecutor, EmbedModel};
            let started = std::time::Instant::now();
            let model =
                Arc::new(
                    EmbedModel::load(model_dir).map_err(|source| RunError::Embed {
                        backend: backend.name.clone(),
                        source,
                    })?,
                );
            tracing::info!(
                backend = %backend.name,
                model_dir = %model_dir.display(),
                dimensions = model.dimensions(),
                max_seq_length = model.max_seq_length(),
                load_ms = started.elapsed().as_millis() as u64,
                "embedding model loaded"
            );
            let stats = Arc::new(EmbedStats::default());
            embed_stats.push((backend.name.as_str().into(), stats.clone()));
            let name: Arc<str> = backend.name.as_str().into();
            let mut executors: Vec<Box<dyn Executor>> = Vec::with_capacity(n);
            for w in 0..n {
                let threads = ComputeThreads::new(&format!("abe-embed-{w}")).map_err(|why| {
                    StartError::Config(format!("backend '{}': {why}", backend.name))
                })?;
                executors.push(Box::new(EmbedExecutor::new(
                    model.clone(),
                    name.clone(),
                    *truncate,
                    stats.clone(),
                    threads,
                )));
            }
            Ok(LaneWorkers {
                executors,
                faults: faults(),
                alone: crate::core::Alone::Never,
            })
        }
        #[cfg(not(feature = "embed"))]
        BackendKind::Embed { .. } => {
            // The registry refuses kind = "embed" without the feature.
            let _ = embed_stats;
            Err(StartError::Config(format!(
                "backend '{}': kind = \"embed\" needs abe built with --features embed",
                backend.name
            ))
            .into())
        }
        BackendKind::Sim | BackendKind::Upstream { .. } => {
            if sim_latency != &cfg.sim.latency {
                tracing::info!(
                    backend = %backend.name,
                    latency = ?sim_latency,
                    "sim backend with its own latency model ([workers.backends.{}])",
                    backend.name
                );
            }
            Ok(runtime::sim_lane(
                cfg,
                sim_latency,
                n,
                (index as u64) << 32,
                stop,
            ))
        }
    }
}

/// The engine reads upstream health from the checker's board.
impl BackendHealth for HealthBoard {
    fn generation(&self) -> u64 {
        HealthBoard::generation(self)
    }
    fn healthy(&self, backend: usize) -> bool {
        HealthBoard::healthy(self, backend)
    }
}

pub use signal_hook::iterator::Signals;

/// Installs SIGINT/SIGTERM (stop) and SIGHUP (reload) handling, before anything starts, so
/// no signal is missed.
pub fn install_signals() -> Result<Signals, RunError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(RunError::Signals)
}
