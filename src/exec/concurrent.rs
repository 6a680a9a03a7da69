//! Executors that run many batches at once on one thread (an event loop), for work that is
//! waiting on a network, not computing: the `upstream` executor's requests to a backend.
//!
//! A backend of `n` workers whose executors all return the same [`LoopShare`] from
//! [`Executor::event_loop`](super::Executor::event_loop) runs as `n` seats on one thread
//! (`runtime::event_loop`): the engine still sees `n` workers, each with its rings, and each
//! seat runs one batch at a time, as a worker thread would.
//!
//! What must never happen here: a batch started and never reported done (every item comes
//! back with an output or an error), or a wait that a [`ConcurrentExecutor::waker`] call
//! does not cut short.

use super::{BatchItem, ExecError, Output};
use std::sync::{Arc, Mutex};

/// One item's answer: its index in the batch, and its output or error.
pub type ItemResult = (usize, Result<Output, ExecError>);
use std::time::Duration;

/// What a concurrent executor reports while it runs batches.
pub trait Progress {
    /// A piece of streamed text for item `item` of the batch on `seat`.
    fn token(&mut self, seat: usize, item: usize, offset: u32, text: String);
    /// The batch on `seat` is finished with `results`; an item without one failed (the
    /// executor lost it).
    fn done(&mut self, seat: usize, results: Vec<ItemResult>);
}

/// Runs batches concurrently, on the thread that calls it.
pub trait ConcurrentExecutor: Send {
    /// Starts `items` as the batch of `seat` (no other batch runs on that seat); reports it
    /// done through `progress` (at once, for a batch that needs no I/O). The items stay
    /// with the caller, which stores the results.
    fn start(&mut self, seat: usize, items: &[BatchItem], progress: &mut dyn Progress);

    /// Waits at most `timeout` for I/O (zero: does not wait), then moves every batch in
    /// flight on. Returns whether anything happened.
    fn turn(&mut self, timeout: Duration, progress: &mut dyn Progress) -> bool;

    /// Ends every batch in flight, reported done without results (after a panic inside the
    /// executor).
    fn abandon(&mut self, progress: &mut dyn Progress);

    /// Cuts a [`ConcurrentExecutor::turn`] that is waiting short, from any thread.
    fn waker(&self) -> Arc<dyn Fn() + Send + Sync>;
}

/// Stores `results` into their batch's `items`; an item without one fails (the executor
/// lost it: after a panic, `ConcurrentExecutor::abandon` reports no results).
pub fn store(items: &mut [BatchItem], results: Vec<ItemResult>) {
    for (index, result) in results {
        let Some(item) = items.get_mut(index) else {
            continue;
        };
        match result {
            Ok(output) => item.output = Some(output),
            Err(error) => item.error = Some(error),
        }
    }
    for item in items.iter_mut() {
        if item.output.is_none() && item.error.is_none() {
            item.error = Some(ExecError::Backend(
                "the executor left the request unanswered".into(),
            ));
        }
    }
}

/// The one event loop that a backend's executors share, taken once by the thread that runs
/// it.
pub struct LoopShare {
    exec: Mutex<Option<Box<dyn ConcurrentExecutor>>>,
}

impl LoopShare {
    /// A share holding `exec`.
    pub fn new(exec: Box<dyn ConcurrentExecutor>) -> Arc<LoopShare> {
        Arc::new(LoopShare {
            exec: Mutex::new(Some(exec)),
        })
    }

    /// The executor, the first time (`None` after).
    pub fn take(&self) -> Option<Box<dyn ConcurrentExecutor>> {
        self.exec.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl std::fmt::Debug for LoopShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopShare").finish_non_exhaustive()
    }
}
