//! Backend health: a board of one flag per backend that the engine reads when it routes, and
//! the "abe-health" thread that probes each upstream backend periodically and marks it.
//!
//! What must never happen here: a probe blocking the checker past a stop (probes run on
//! their own short-lived threads, the checker only waits on them in short slices), a
//! transition logged more than once, or the board locked (reads are two atomic loads).

use super::upstream::UpstreamSlot;
use super::ExecError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest the checker waits before looking at `stop` again.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Health of every backend, by backend index.
#[derive(Debug)]
pub struct HealthBoard {
    /// One flag per backend; every backend starts healthy (an unprobed backend is given the
    /// benefit of the doubt, its circuit breaker still guards it).
    healthy: Box<[AtomicBool]>,
    /// Bumped after every change of a flag, so a reader can cache what it derived from the
    /// flags and rebuild only when this moves.
    generation: AtomicU64,
}

impl HealthBoard {
    /// A board of `backends` healthy backends, generation 0.
    pub fn new(backends: usize) -> Arc<HealthBoard> {
        Arc::new(HealthBoard {
            healthy: (0..backends).map(|_| AtomicBool::new(true)).collect(),
            generation: AtomicU64::new(0),
        })
    }

    /// Number of backends on the board.
    pub fn len(&self) -> usize {
        self.healthy.len()
    }

    /// True when the board has no backends.
    pub fn is_empty(&self) -> bool {
        self.healthy.is_empty()
    }

    /// Whether backend `i` passed its last probe. Panics if `i` is not a backend index.
    pub fn healthy(&self, i: usize) -> bool {
        // Acquire: pairs with the Release swap in `set`. Health is advisory; a stale value
        // routes one request to a backend whose circuit breaker catches it.
        self.healthy[i].load(Ordering::Acquire)
    }

    /// Bumped on every change. Read it before the flags: once a reader sees generation g,
    /// every flag change counted in g is visible to it.
    pub fn generation(&self) -> u64 {
        // Acquire: pairs with the Release increment in `set`, which follows the flag store.
        self.generation.load(Ordering::Acquire)
    }

    /// Marks backend `i`; bumps the generation when that changes its flag. Panics if `i` is
    /// not a backend index.
    pub fn set(&self, i: usize, healthy: bool) {
        // AcqRel: the swap decides which of two racing setters saw the change (only that
        // one bumps), and publishes the flag before the generation moves.
        if self.healthy[i].swap(healthy, Ordering::AcqRel) != healthy {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// Spawns a thread "abe-health" probing each (backend index, client) every `interval` (first
/// probe at once), marking the board; logs transitions with tracing (warn when a backend goes
/// down with the error, info when it comes back); returns promptly (within ~50 ms) after
/// `stop` is set.
///
/// Each round probes every backend at once, each on a short-lived thread, so one backend
/// that hangs until `timeout` delays neither the others nor a stop; a probe still running at
/// stop finishes on its own within `timeout` and its result is dropped.
pub fn spawn_health_checker(
    targets: Vec<(usize, UpstreamSlot)>,
    board: Arc<HealthBoard>,
    interval: Duration,
    timeout: Duration,
    path: String,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    for &(i, _) in &targets {
        assert!(
            i < board.len(),
            "health target index {i} is not on a board of {} backends",
            board.len()
        );
    }
    std::thread::Builder::new()
        .name("abe-health".into())
        .spawn(move || {
            let checker = Checker {
                targets,
                board,
                timeout,
                path,
                stop,
            };
            checker.run(interval);
        })
}

struct Checker {
    /// Each backend's slot: its current client is probed (it may be filled again with
    /// another address between rounds).
    targets: Vec<(usize, UpstreamSlot)>,
    board: Arc<HealthBoard>,
    timeout: Duration,
    path: String,
    stop: Arc<AtomicBool>,
}

impl Checker {
    fn stopped(&self) -> bool {
        // Acquire: pairs with the Release store of whoever stops the server.
        self.stop.load(Ordering::Acquire)
    }

    fn run(&self, interval: Duration) {
        while !self.stopped() {
            let round_start = Instant::now();
            self.round();
            let next = round_start + interval;
            loop {
                if self.stopped() {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                std::thread::sleep((next - now).min(STOP_POLL));
            }
        }
    }

    /// Probes every target once and marks the board; returns early on stop.
    fn round(&self) {
        let (tx, rx) = mpsc::channel::<(usize, Result<(), ExecError>)>();
        let mut waiting = 0usize;
        for (slot, (_, client)) in self.targets.iter().enumerate() {
            let client = client.current();
            if client.base_url() == crate::router::slots::SPARE_PLACEHOLDER_URL {
                // A spare slot nothing filled yet: nothing to probe (it counts healthy, as
                // every backend does until its first probe).
                continue;
            }
            let tx = tx.clone();
            let path = self.path.clone();
            let timeout = self.timeout;
            let spawned = std::thread::Builder::new()
                .name("abe-health-probe".into())
                .spawn(move || {
                    let result = client.probe(&path, timeout);
                    // The checker may have stopped and gone: then nobody needs the result.
                    let _ = tx.send((slot, result));
                });
            match spawned {
                Ok(_) => waiting += 1,
                Err(e) => {
                    // No thread to spare: probe here (this round may then overrun a stop).
                    tracing::warn!(error = %e, "cannot start a health probe thread; probing inline");
                    let result = self.targets[slot]
                        .1
                        .current()
                        .probe(&self.path, self.timeout);
                    self.mark(slot, result);
                }
            }
        }
        drop(tx);
        while waiting > 0 && !self.stopped() {
            match rx.recv_timeout(STOP_POLL) {
                Ok((slot, result)) => {
                    waiting -= 1;
                    self.mark(slot, result);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// Records one probe's result and logs a transition.
    fn mark(&self, slot: usize, result: Result<(), ExecError>) {
        let (i, cell) = &self.targets[slot];
        let client = cell.current();
        let was = self.board.healthy(*i);
        self.board.set(*i, result.is_ok());
        match result {
            Err(e) if was => tracing::warn!(
                backend = client.name(),
                url = %format_args!("{}{}", client.base_url(), self.path),
                error = %e,
                "backend is down: health probe failed"
            ),
            Ok(()) if !was => tracing::info!(
                backend = client.name(),
                "backend is healthy again: health probe passed"
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_moves_only_on_change() {
        let board = HealthBoard::new(2);
        assert!(board.healthy(0) && board.healthy(1));
        assert_eq!(board.generation(), 0);
        board.set(0, true);
        assert_eq!(board.generation(), 0);
        board.set(0, false);
        assert!(!board.healthy(0));
        assert!(board.healthy(1));
        assert_eq!(board.generation(), 1);
        board.set(0, false);
        board.set(0, true);
        assert_eq!(board.generation(), 2);
    }
}
