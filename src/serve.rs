//! `abe serve`: wires config, runtime and HTTP front end together, and shuts them down in
//! order on SIGINT/SIGTERM (stop accepting, drain the engine, write every answer, exit).

use crate::api::ApiContext;
use crate::config::{Config, ConfigError};
use crate::http::{self, ServeError, Server};
use crate::metrics::http_stats::HttpStats;
use crate::runtime::{self, Handle, ShutdownReport, StartError};
use std::net::SocketAddr;
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
        let handle = Arc::new(runtime::start(runtime_cfg)?);
        let ctx = Arc::new(ApiContext {
            handle: handle.clone(),
            config: Arc::new(config),
            http_stats: Arc::new(HttpStats::new()),
        });
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

pub use signal_hook::iterator::Signals;

/// Installs SIGINT/SIGTERM handling (before anything starts, so no signal is missed).
pub fn install_signals() -> Result<Signals, RunError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    Signals::new([SIGINT, SIGTERM]).map_err(RunError::Signals)
}
