//! `abe serve`: wires config, runtime and HTTP front end together, and shuts them down in
//! order on SIGINT/SIGTERM (stop accepting, drain the engine, write every answer, exit).

use crate::api::ApiContext;
use crate::config::{Config, ConfigError};
use crate::exec::sim::{Faults, SimConfig, SimExecutor};
use crate::exec::Executor;
use crate::http::{self, ServeError, Server};
use crate::metrics::http_stats::HttpStats;
use crate::router::{BackendConfig, BackendKindName};
use crate::runtime::engine::Routing;
use crate::runtime::{self, Handle, LaneWorkers, RuntimeConfig, ShutdownReport, StartError};
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
}

/// A running abe: engine, workers and HTTP front end.
pub struct Running {
    pub handle: Arc<Handle>,
    pub server: Server,
    pub ctx: Arc<ApiContext>,
}

impl Running {
    /// Starts everything described by `config` (which must be validated).
    pub fn start(config: Config) -> Result<Running, RunError> {
        config.validate()?;
        let runtime_cfg = config.runtime_config()?;
        let backends = config.effective_backends();
        if let Some(w) = config.routing_warning() {
            tracing::warn!("{w}");
        }
        let (engine_router, _) = config.router()?;
        let io_router = Arc::new(config.router()?.0);
        let stop = Arc::new(AtomicBool::new(false));
        let lanes = backends
            .iter()
            .enumerate()
            .map(|(b, backend)| lane_workers(&runtime_cfg, b, backend, &stop))
            .collect();
        let config = Arc::new(config);
        let http_stats = Arc::new(HttpStats::new());
        // The default model must resolve (ApiContext picks one some backend serves).
        let probe_ctx_default = ApiContext::default_model_for(&config, &io_router);
        let default_name = io_router
            .lookup(&probe_ctx_default)
            .map_err(|e| StartError::Config(format!("routing: {e}")))?;
        let routing = Routing::new(engine_router, default_name, None);
        let handle = Arc::new(runtime::start_routed(runtime_cfg, routing, lanes, stop)?);
        let ctx = Arc::new(ApiContext::new(
            handle.clone(),
            config,
            http_stats,
            io_router,
        ));
        let server = http::start(ctx.clone())?;
        Ok(Running {
            handle,
            server,
            ctx,
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
        report
    }

    /// Blocks until SIGINT or SIGTERM arrives on `signals`, then shuts down gracefully.
    pub fn run_until_signal(self, mut signals: Signals) -> ShutdownReport {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "shutting down: draining in-flight requests");
        }
        self.shutdown()
    }
}

/// Backend `index`'s worker threads: `max_concurrent_batches` executors of its kind.
fn lane_workers(
    cfg: &RuntimeConfig,
    index: usize,
    backend: &BackendConfig,
    stop: &Arc<AtomicBool>,
) -> LaneWorkers {
    let n = backend.max_concurrent_batches.max(1) as usize;
    let faults: Vec<Arc<Faults>> = (0..n).map(|_| Faults::new(cfg.faults)).collect();
    let executors = match backend.kind {
        BackendKindName::Sim | BackendKindName::Upstream => (0..n)
            .map(|i| {
                let sim = SimConfig {
                    seed: cfg
                        .sim
                        .seed
                        .wrapping_add((index as u64) << 32)
                        .wrapping_add(i as u64),
                    ..cfg.sim.clone()
                };
                Box::new(SimExecutor::new(sim, faults[i].clone(), stop.clone()))
                    as Box<dyn Executor>
            })
            .collect(),
    };
    LaneWorkers { executors, faults }
}

pub use signal_hook::iterator::Signals;

/// Installs SIGINT/SIGTERM handling (before anything starts, so no signal is missed).
pub fn install_signals() -> Result<Signals, RunError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    Signals::new([SIGINT, SIGTERM]).map_err(RunError::Signals)
}
