//! The HTTP/1.1 front end: a minimal, strict server on mio, over the messages of
//! [`crate::http`] and the routes of [`crate::api`].
//!
//! `start` binds the listener and spawns `server.io_threads` io threads, each with its own
//! submitter (rings into the engine) and mio `Waker` (the engine's way back). The front end
//! never blocks on the engine and never runs engine code.

pub mod conn;
pub mod eviction;
pub mod io_thread;

use crate::api::ApiContext;
use crate::runtime::doorbell::SleepFlag;
use io_thread::{IoThread, ServerShared};
use mio::{Poll, Token, Waker};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start io thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot register with the engine: {0}")]
    Engine(#[from] crate::runtime::RequestError),
}

/// A running front end.
pub struct Server {
    control: Arc<ServerControl>,
    threads: Vec<JoinHandle<()>>,
    local_addr: SocketAddr,
}

/// Stops the io threads; shareable with a signal or timer thread.
pub struct ServerControl {
    shared: Arc<ServerShared>,
    wakers: Vec<Arc<Waker>>,
}

impl ServerControl {
    /// Stop accepting; io threads exit once every admitted request is answered and written.
    pub fn begin_stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.wake_all();
    }

    /// Exit now, closing whatever is still open.
    pub fn hard_stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.hard_stop.store(true, Ordering::Release);
        self.wake_all();
    }

    fn wake_all(&self) {
        for w in &self.wakers {
            let _ = w.wake();
        }
    }
}

/// Binds `server.host:server.port` and starts the io threads.
pub fn start(ctx: Arc<ApiContext>) -> Result<Server, ServeError> {
    let server_cfg = &ctx.config.server;
    let addr = format!("{}:{}", server_cfg.host, server_cfg.port);
    let listener = StdListener::bind(&addr).map_err(|source| ServeError::Bind {
        addr: addr.clone(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    let shared = Arc::new(ServerShared {
        stopping: AtomicBool::new(false),
        hard_stop: AtomicBool::new(false),
        open_connections: AtomicUsize::new(0),
    });
    let mut wakers = Vec::new();
    let mut threads = Vec::new();
    for i in 0..server_cfg.io_threads {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), Token(1))?);
        let wake_for_engine = waker.clone();
        let sleep_flag = Arc::new(SleepFlag::new());
        let flag_for_engine = sleep_flag.clone();
        // The engine wakes this thread only when it sleeps in epoll: one syscall saved per
        // engine turn while the io thread is busy anyway.
        let submitter = ctx.handle.submitter(Some(Arc::new(move || {
            if flag_for_engine.take_sleeper() {
                let _ = wake_for_engine.wake();
            }
        })))?;
        let mio_listener = mio::net::TcpListener::from_std(listener.try_clone()?);
        let core = ctx.handle.io_core(i);
        let io = IoThread::new(
            poll,
            mio_listener,
            submitter,
            sleep_flag,
            ctx.clone(),
            shared.clone(),
            i as u64,
        )?;
        wakers.push(waker);
        threads.push(
            std::thread::Builder::new()
                .name(format!("abe-io-{i}"))
                .spawn(move || {
                    crate::runtime::pin::pin_current(&format!("abe-io-{i}"), core);
                    io.run()
                })?,
        );
    }
    Ok(Server {
        control: Arc::new(ServerControl { shared, wakers }),
        threads,
        local_addr,
    })
}

impl Server {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The stop control, to share with other threads.
    pub fn control(&self) -> Arc<ServerControl> {
        self.control.clone()
    }

    /// Waits for the io threads to exit.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}
