//! The `upstream` executor: a worker's executor for an `upstream` backend. In
//! request-level batching its worker is a seat of the backend's event loop (`mux`, shared
//! by all the backend's workers: see `runtime::event_loop`); where a runtime calls
//! `execute` on a thread of its own, it runs the batch on a loop of its own.
//!
//! What must never happen here: a batch-wide failure because one request failed (errors
//! are per item), or an item left without an output or an error.

use super::client::UpstreamClient;
use super::mux::Mux;
use super::slot::UpstreamSlot;
use crate::exec::concurrent::{store, ConcurrentExecutor, ItemResult, LoopShare, Progress};
use crate::exec::{BatchItem, ExecError, Executor, TokenSink};
use crate::sync::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Runs batches against one backend: as a seat of the backend's event loop (`Mux`, shared
/// by all its workers: see `runtime::event_loop`), or, where a runtime calls `execute` on a
/// thread of its own, on a loop of its own, one batch at a time.
pub struct UpstreamExecutor {
    /// The backend's cell: each batch goes to its address of the moment.
    slot: UpstreamSlot,
    /// Set at shutdown: no new request starts once it is.
    stop: Arc<AtomicBool>,
    /// The event loop its worker runs on, if any: then `execute` is not called in
    /// request-level batching.
    share: Option<Arc<LoopShare>>,
    /// The loop `execute` runs on, made at its first call.
    own: Option<Mux>,
}

impl UpstreamExecutor {
    pub fn new(client: UpstreamClient, stop: Arc<AtomicBool>) -> UpstreamExecutor {
        UpstreamExecutor::in_slot(client.into(), stop)
    }

    /// An executor for a backend slot: each batch goes to the slot's address of the moment.
    pub fn in_slot(slot: UpstreamSlot, stop: Arc<AtomicBool>) -> UpstreamExecutor {
        UpstreamExecutor {
            slot,
            stop,
            share: None,
            own: None,
        }
    }

    /// This executor, its worker a seat of `share`'s event loop.
    pub fn on_loop(self, share: Arc<LoopShare>) -> UpstreamExecutor {
        UpstreamExecutor {
            share: Some(share),
            ..self
        }
    }
}

/// `execute`'s view of its loop's progress: pieces to the sink, the results kept.
struct Blocking<'a> {
    tokens: &'a mut dyn TokenSink,
    results: Option<Vec<ItemResult>>,
}

impl Progress for Blocking<'_> {
    fn token(&mut self, _seat: usize, item: usize, offset: u32, text: String) {
        self.tokens.token(item, offset, text);
    }

    fn done(&mut self, _seat: usize, results: Vec<ItemResult>) {
        self.results = Some(results);
    }
}

impl Executor for UpstreamExecutor {
    fn event_loop(&self) -> Option<&Arc<LoopShare>> {
        self.share.as_ref()
    }

    fn execute(
        &mut self,
        items: &mut [BatchItem],
        tokens: &mut dyn TokenSink,
    ) -> Result<(), ExecError> {
        let mux = match &mut self.own {
            Some(mux) => mux,
            None => {
                let mux = Mux::new(self.slot.clone(), 1, self.stop.clone()).map_err(|e| {
                    ExecError::Backend(format!("cannot start an upstream event loop: {e}"))
                })?;
                self.own.insert(mux)
            }
        };
        let mut progress = Blocking {
            tokens,
            results: None,
        };
        // What happened since the last batch (a kept-alive connection the backend closed)
        // is seen before this one picks a connection.
        mux.turn(Duration::ZERO, &mut progress);
        mux.start(0, items, &mut progress);
        while progress.results.is_none() {
            // The loop's own deadlines bound each wait; a second is only its longest nap.
            mux.turn(Duration::from_secs(1), &mut progress);
        }
        store(items, progress.results.take().unwrap_or_default());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::tests::{client, item};
    use super::*;
    use crate::core::Kind;

    #[test]
    fn stop_fails_every_item_without_a_request() {
        // Port 9 (discard) on loopback: nothing should even be tried.
        let ms50 = std::time::Duration::from_millis(50);
        let client = client("http://127.0.0.1:9", true, ms50, ms50);
        let mut exec = UpstreamExecutor::new(client, Arc::new(AtomicBool::new(true)));
        let mut items = vec![
            item(Kind::Completion, "a", Some("m")),
            item(Kind::Embedding, "b", Some("m")),
        ];
        exec.execute(&mut items, &mut crate::exec::NoTokens)
            .unwrap();
        for item in &items {
            assert_eq!(item.error, Some(ExecError::Backend("shutting down".into())));
        }
    }
}
