//! Completion: a worker returned a batch. Frees its slot, feeds what the strategy in force
//! (`auto` or a research strategy), the circuit breaker and the latency window learn from
//! it, and counts each request completed or failed.
//!
//! What must never happen here: a clock read (service time is `now` minus the dispatch
//! instant), I/O, an allocation, or a request answered twice (a batch already abandoned
//! is reported [`Completion::Stale`] and counted nowhere).

use super::request::Nanos;
use super::strategy::StrategyKind;
use super::{BatchId, BatchOutcome, BatchState, Completion, Core};

impl Core {
    /// A worker returned `batch`. On [`Completion::Deliver`] the driver answers every request
    /// of the batch (`batch_tickets` lists them until the next `poll`/`admit`).
    pub fn complete(&mut self, now: Nanos, batch: BatchId, outcome: BatchOutcome) -> Completion {
        let b = batch.0 as usize;
        let worker = self.batches[b].worker as usize;
        let state = self.batches[b].state;
        assert_ne!(
            state,
            BatchState::Free,
            "complete for a batch not out: {batch:?}"
        );
        self.workers[worker].on_return(now);
        self.in_flight_batches -= 1;
        self.batches[b].state = BatchState::Free;
        self.free_batches.push(batch.0);
        if state == BatchState::Abandoned {
            // Already failed and counted against the worker when it timed out.
            return Completion::Stale;
        }
        let service_ns = now.saturating_sub(self.batches[b].dispatched_at_ns);
        if self.strategy == StrategyKind::Auto {
            let slot = &self.batches[b];
            let sample = (outcome == BatchOutcome::Ok).then_some(service_ns);
            self.auto
                .observe_completion(now, slot.tickets.len(), slot.tokens, sample);
        }
        if outcome == BatchOutcome::Ok && self.strategy.is_research() {
            // Algorithm 7: statistics and SLA controller after every completed batch, while
            // a research strategy is in force (nothing else reads them; as `auto`'s models,
            // they resume from what they learned when one is switched to again).
            let table = &self.table;
            let requests = self.batches[b].tickets.iter().map(|t| {
                let m = table.meta(t.index);
                (m.tokens_estimated - m.max_tokens, m.max_tokens)
            });
            self.research
                .observe_batch(requests, service_ns, self.batches[b].bin);
        }
        match outcome {
            BatchOutcome::Ok => {
                self.workers[worker].circuit.record_success();
                self.workers[worker].batches_ok += 1;
            }
            BatchOutcome::Failed => self.record_worker_failure(worker, now),
        }
        for i in 0..self.batches[b].tickets.len() {
            let ticket = self.batches[b].tickets[i];
            let arrival = self.table.meta(ticket.index).arrival_ns;
            self.table.remove(ticket);
            match outcome {
                BatchOutcome::Ok => {
                    self.stats.completed += 1;
                    self.latencies.record(now.saturating_sub(arrival));
                }
                BatchOutcome::Failed => {
                    self.stats.failed += 1;
                    self.stats.worker_errors += 1;
                }
            }
        }
        Completion::Deliver
    }
}
