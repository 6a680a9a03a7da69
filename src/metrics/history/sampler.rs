//! The history thread (`abe-history`): once a second it takes the engine's latest published
//! snapshot (as a /metrics reader does), turns the change since the previous one into a
//! [`Second`], and pushes it into the [`History`] ring.
//!
//! It never talks to the engine: it reads what the engine published, so it can neither slow
//! nor block it. It reads the wall clock for each entry's timestamp (this thread is a
//! driver, not the core). Stopped by its flag, woken at once by `unpark`.

use super::{History, Second};
use crate::runtime::{Handle, Snapshot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time between entries.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The running history thread: its stop flag and handle.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling `source` (a snapshot reader) into `history` every `period`.
    pub fn spawn(
        source: impl Fn() -> Snapshot + Send + 'static,
        history: Arc<History>,
        period: Duration,
    ) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("abe-history".into())
            .spawn(move || {
                let mut prev = source();
                // Acquire: pairs with the Release in `stop`, nothing else is shared.
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(period);
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    let cur = source();
                    if cur.at_ns > prev.at_ns {
                        history.push(Second::between(&prev, &cur, unix_ms()));
                        prev = cur;
                    }
                }
            })?;
        Ok(Sampler { stop, thread })
    }

    /// Samples the runtime behind `handle`.
    pub fn spawn_for(handle: Arc<Handle>, history: Arc<History>) -> std::io::Result<Sampler> {
        Sampler::spawn(move || handle.snapshot(), history, PERIOD)
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        // Release: the thread's Acquire load sees the flag after it wakes.
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// Wall clock, ms since the Unix epoch.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
