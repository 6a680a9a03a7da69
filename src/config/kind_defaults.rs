//! Defaults per executor kind: the four keys whose best value depends on what the backends
//! run (`batching.max_batch_size`, `engine.pin`, `engine.idle`, a backend's `max_concurrent_batches`), and
//! filling them in from the backends' kinds where the config file leaves them out.
//!
//! Why per kind, measured (BENCHMARKS.md, "Issue 25: defaults per executor kind"): one
//! forward pass of the `embed` executor already uses every core (candle's gemm threads), so
//! a second concurrent batch only splits the cores between two passes, a larger batch costs
//! less per input (the fitted cost is concave in the batch), and a pinned server on 2 cores
//! puts every runtime thread, the embed worker with the threads it starts included, on one
//! core. The `sim` and `upstream` executors wait (a latency model, a remote server), so
//! several batches in flight and pinning cost them nothing. The server behind an `upstream`
//! backend batches for itself and serves more the more requests it is sent at once, so an
//! `upstream` backend runs 64 at once (BENCHMARKS.md, "Upstream defaults": at 4, abe in
//! front of a continuous-batching server served 0.39x what the server served directly).
//!
//! Idle threads: the io threads and the engine yield the CPU for `engine.spin_us` before
//! they park, which pays when answers come back within microseconds (a `sim` backend: at
//! 8 connections 0.70x the requests a second when they park at once). Behind `upstream`
//! backends an answer takes a network round trip and the server's own work, which the
//! yielding threads take CPU from: a front forwarding to a server on the same 2 cores
//! served 1.3x the requests a second with its threads parking at once (BENCHMARKS.md,
//! "The proxy path on an event loop").
//!
//! A key the file sets always wins, and so does an `ABE_*` variable (applied after this).
//! What must never happen here: changing a key the file sets, or reading anything but the
//! file's own text (the environment is `layering`'s).

use super::sections::Config;
use crate::router::BackendKindName;
use crate::runtime::idle::IdlePolicy;

/// What each executor kind runs best with, where the user says nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindDefaults {
    /// `batching.max_batch_size`.
    pub max_batch_size: usize,
    /// A `[[backends]]` table's `max_concurrent_batches`.
    pub max_concurrent_batches: u32,
    /// `engine.pin`.
    pub pin: bool,
    /// `engine.idle`.
    pub idle: IdlePolicy,
}

impl KindDefaults {
    /// `sim` and `upstream`: the built-in defaults (`[batching]`, `[engine]`), with the
    /// router's workers of their kind (`router::registry::concurrent_batches_default`: 4 and
    /// 64), and for `upstream` idle threads that park at once. `embed`: one batch at a
    /// time, batches of up to 64, threads unpinned (measured best; see the module doc).
    pub fn of(kind: BackendKindName) -> KindDefaults {
        let max_concurrent_batches = crate::router::registry::concurrent_batches_default(kind);
        match kind {
            BackendKindName::Sim => {
                let c = Config::default();
                KindDefaults {
                    max_batch_size: c.batching.max_batch_size,
                    max_concurrent_batches,
                    pin: c.engine.pin,
                    idle: c.engine.idle,
                }
            }
            BackendKindName::Upstream => {
                let c = Config::default();
                KindDefaults {
                    max_batch_size: c.batching.max_batch_size,
                    max_concurrent_batches,
                    pin: c.engine.pin,
                    idle: IdlePolicy::Park,
                }
            }
            BackendKindName::Embed => KindDefaults {
                max_batch_size: 64,
                max_concurrent_batches,
                pin: false,
                idle: Config::default().engine.idle,
            },
        }
    }
}

/// Fills in, from the kinds of `cfg`'s backends, every per-kind key that `file` (the
/// config file's text, already read into `cfg`) does not set:
/// - each backend's `max_concurrent_batches`: its kind's;
/// - `batching.max_batch_size`: the smallest of the backends' kinds' (one batch size serves
///   them all, so no kind gets batches larger than it runs well);
/// - `engine.pin`: false if any backend's kind runs unpinned (a pinned thread would take a
///   core that kind's compute needs), else true;
/// - `engine.idle`: `park` if every backend's kind parks (all `upstream`), else the
///   built-in `adaptive`.
///
/// Without `[[backends]]` (the default sim backend) nothing changes.
pub(super) fn fill(cfg: &mut Config, file: &toml::Table) {
    if cfg.backends.is_empty() {
        return;
    }
    let set = |section: &str, key: &str| {
        file.get(section)
            .and_then(toml::Value::as_table)
            .is_some_and(|t| t.contains_key(key))
    };
    let tables = file.get("backends").and_then(toml::Value::as_array);
    for (i, b) in cfg.backends.iter_mut().enumerate() {
        let given = tables
            .and_then(|t| t.get(i))
            .and_then(toml::Value::as_table)
            .is_some_and(|t| t.contains_key("max_concurrent_batches"));
        if !given {
            b.max_concurrent_batches = KindDefaults::of(b.kind).max_concurrent_batches;
        }
    }
    let kinds = || cfg.backends.iter().map(|b| KindDefaults::of(b.kind));
    let max_batch_size = kinds().map(|d| d.max_batch_size).min();
    let pin = kinds().all(|d| d.pin);
    let park = kinds().all(|d| d.idle == IdlePolicy::Park);
    if let Some(m) = max_batch_size.filter(|_| !set("batching", "max_batch_size")) {
        cfg.batching.max_batch_size = m;
    }
    if !set("engine", "pin") {
        cfg.engine.pin = pin;
    }
    if park && !set("engine", "idle") {
        cfg.engine.idle = IdlePolicy::Park;
    }
}
