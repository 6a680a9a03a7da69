//! [`LoadgenError`]: everything that can stop a load run, each with a message a user can
//! act on.

use crate::sim::SimError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can stop a load run, with a message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    /// The scenario or its workload is invalid (same messages as `abe simulate`).
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A flag is out of range.
    #[error("invalid {what}: {why}")]
    Invalid { what: String, why: String },
    /// The URL cannot be used.
    #[error("invalid --url '{url}': {why}")]
    Url { url: String, why: String },
    /// The URL resolves to a non-loopback address and `--allow-remote` was not given.
    #[error("--url '{url}' resolves to {addr}, which is not loopback: abe loadgen sends real load; pass --allow-remote if you mean to load that host")]
    NotLoopback { url: String, addr: SocketAddr },
    /// Nothing accepts connections at the target.
    #[error("cannot connect to {url} ({addr}): is the server running?")]
    Connect { url: String, addr: SocketAddr },
    /// The target refused an admin request (strategy switch).
    #[error("{what} failed: {why}")]
    Admin { what: String, why: String },
    /// A connection thread could not be started.
    #[error("cannot start a connection thread: {source}")]
    Spawn {
        #[source]
        source: std::io::Error,
    },
    /// A report file could not be written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LoadgenError {
    /// A [`LoadgenError::Invalid`] for `what` with reason `why`.
    pub fn invalid(what: impl Into<String>, why: impl Into<String>) -> LoadgenError {
        LoadgenError::Invalid {
            what: what.into(),
            why: why.into(),
        }
    }
}
