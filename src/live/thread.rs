//! The live thread (`abe-live`): where a reload reads and checks the config and applies it
//! (a big file, a slow disk or an `embed` model directory to look at never holds an io
//! thread or the signal thread), and where moves waiting for a drain are finished
//! ([`LiveBackends::settle`], every [`SETTLE_EVERY`]).
//!
//! `SIGHUP` and `POST /admin/reload` queue a reload here; the caller says what to do with
//! the outcome (log it; answer the HTTP request, which the io thread writes once it is
//! filled). What must never happen here: a reload answered twice or not at all (every
//! queued one is run, or answered "stopping" when the thread stops first).

use super::reload::{ReloadError, ReloadReport};
use super::LiveBackends;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often moves waiting for a drain are looked at.
pub const SETTLE_EVERY: Duration = Duration::from_millis(20);

/// What to do with a reload's outcome (called on the live thread).
pub type OnReload = Box<dyn FnOnce(Result<ReloadReport, ReloadError>) + Send>;

pub(super) enum Job {
    Reload(OnReload),
    Stop,
}

/// The running live thread (its job queue's sender sits in [`LiveBackends`]).
pub struct LiveThread {
    live: Arc<LiveBackends>,
    thread: Option<JoinHandle<()>>,
}

impl LiveThread {
    /// Starts the thread over `live`; reloads queued through `live` run on it from now on.
    pub fn spawn(live: Arc<LiveBackends>) -> std::io::Result<LiveThread> {
        let (tx, rx) = mpsc::channel::<Job>();
        let on_thread = live.clone();
        let thread = std::thread::Builder::new()
            .name("abe-live".into())
            .spawn(move || loop {
                match rx.recv_timeout(SETTLE_EVERY) {
                    Ok(Job::Reload(on_reload)) => on_reload(on_thread.reload()),
                    Ok(Job::Stop) | Err(RecvTimeoutError::Disconnected) => {
                        // Answer what was queued behind the stop.
                        while let Ok(job) = rx.try_recv() {
                            if let Job::Reload(on_reload) = job {
                                on_reload(Err(ReloadError::Stopping));
                            }
                        }
                        return;
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
                on_thread.settle();
            })?;
        *lock_jobs(&live) = Some(tx);
        Ok(LiveThread {
            live,
            thread: Some(thread),
        })
    }

    /// Stops the thread (after the job it is running) and joins it; reloads queued later
    /// are answered `Stopping` at once.
    pub fn stop(mut self) {
        if let Some(tx) = lock_jobs(&self.live).take() {
            let _ = tx.send(Job::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock_jobs(live: &LiveBackends) -> std::sync::MutexGuard<'_, Option<Sender<Job>>> {
    live.jobs.lock().unwrap_or_else(|e| e.into_inner())
}

impl LiveBackends {
    /// Queues a reload on the live thread; `on_reload` gets its outcome there (or at once,
    /// `Stopping`, without a running live thread).
    pub fn queue_reload(&self, on_reload: OnReload) {
        let jobs = lock_jobs(self);
        let Some(tx) = jobs.as_ref() else {
            drop(jobs);
            on_reload(Err(ReloadError::Stopping));
            return;
        };
        if let Err(mpsc::SendError(Job::Reload(on_reload))) = tx.send(Job::Reload(on_reload)) {
            drop(jobs);
            on_reload(Err(ReloadError::Stopping));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::router::{BackendConfig, Router, RoutingConfig};
    use std::sync::mpsc::channel;

    fn live() -> Arc<LiveBackends> {
        let handle = Arc::new(crate::runtime::start(Default::default()).unwrap());
        let (router, _) = Router::build(
            &[BackendConfig::default_sim("m", 100)],
            &RoutingConfig::default(),
            1,
        )
        .unwrap();
        Arc::new(LiveBackends::new(
            handle,
            &[],
            Vec::new(),
            Vec::new(),
            Config::default(),
            Arc::new(router),
        ))
    }

    #[test]
    fn every_queued_reload_is_answered_once_on_the_live_thread_or_as_stopping() {
        let live = live();
        let (tx, rx) = channel();
        let answer = move |tx: Sender<(String, String)>| -> OnReload {
            Box::new(move |outcome| {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                let _ = tx.send((thread, outcome.unwrap_err().to_string()));
            })
        };
        // No live thread yet: answered at once.
        live.queue_reload(answer(tx.clone()));
        let (_, e) = rx.recv().unwrap();
        assert!(e.contains("stopping"), "{e}");
        let thread = LiveThread::spawn(live.clone()).unwrap();
        // Without a config source: the reload runs (on abe-live) and says so.
        live.queue_reload(answer(tx.clone()));
        let (on, e) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(on, "abe-live");
        assert!(e.contains("without a config source"), "{e}");
        thread.stop();
        live.queue_reload(answer(tx));
        let (_, e) = rx.recv().unwrap();
        assert!(e.contains("stopping"), "{e}");
        assert!(rx.try_recv().is_err(), "each answered once");
    }
}
