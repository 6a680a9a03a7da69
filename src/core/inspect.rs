//! What the driver and metrics may read of the core: its configuration, counters, queue
//! depths, workers, live requests and batches, and the strategies' snapshots.
//!
//! What must never happen here: a change of state, a clock read, I/O, or an allocation
//! (everything returned is a borrow or a copy).

use super::pool::WorkerView;
use super::request::{Nanos, RequestMeta, Ticket};
use super::stats::CoreStats;
use super::strategy::research;
use super::strategy::{auto, StrategyKind};
use super::{BatchId, Core, CoreConfig};

impl Core {
    /// The configuration the core runs with.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// What `auto` has learned and decided (for metrics).
    pub fn auto_snapshot(&self) -> auto::AutoSnapshot {
        self.auto.snapshot()
    }

    /// `auto`'s holds so far and the last one (a copy of two fields: cheap enough to ask
    /// after every poll).
    pub fn auto_holds(&self) -> (u64, auto::Hold) {
        self.auto.holds()
    }

    /// Controller state of the research strategies (for metrics).
    pub fn research_snapshot(&self) -> research::ResearchSnapshot {
        self.research.snapshot()
    }

    /// Longest batch this core forms (buffers handed to workers need this capacity).
    pub fn max_batch_len(&self) -> usize {
        super::max_batch_len(&self.cfg)
    }

    /// Adds the adapters of the requests in in-flight batches to `running` and of queued
    /// ones to `waiting`. O(queued requests): for a snapshot, not per batch.
    pub fn lora_adapters(
        &self,
        running: &mut super::lora::AdapterSet,
        waiting: &mut super::lora::AdapterSet,
    ) {
        for b in self.batches.iter() {
            if b.state == super::BatchState::InFlight {
                for t in &b.tickets {
                    running.insert(self.table.meta(t.index).adapter);
                }
            }
        }
        for q in self.queues.iter().chain(self.research.bins.iter()) {
            let mut i = q.front().unwrap_or(super::table::NIL);
            while i != super::table::NIL {
                waiting.insert(self.table.meta(i).adapter);
                i = self.table.next_in_fifo(i);
            }
        }
    }

    /// Does some worker hold LoRA adapter `adapter` resident?
    pub fn adapter_resident(&self, adapter: super::lora::AdapterId) -> bool {
        self.lora.iter().any(|s| s.is_resident(adapter))
    }

    /// The strategy in force.
    pub fn strategy(&self) -> StrategyKind {
        self.strategy
    }

    /// True once `begin_drain` was called.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Nothing queued and no batch out (abandoned batches included).
    pub fn is_idle(&self) -> bool {
        self.queued == 0 && self.in_flight_batches == 0
    }

    /// Requests queued (not yet dispatched).
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Requests queued in class `class` (priority x bucket).
    pub fn queued_in_class(&self, class: usize) -> usize {
        self.queues[class].len()
    }

    /// Requests admitted and not yet answered.
    pub fn live_requests(&self) -> usize {
        self.table.live()
    }

    /// Counters so far.
    pub fn stats(&self) -> &CoreStats {
        &self.stats
    }

    /// The workers as the core sees them.
    pub fn workers(&self) -> &[WorkerView] {
        &self.workers
    }

    /// The observed p99 latency as last refreshed, in ns.
    pub fn observed_p99_ns(&self) -> Option<Nanos> {
        self.latencies.p99()
    }

    /// The ticket of table slot `index` while it holds a request.
    pub fn ticket_of(&self, index: u32) -> Option<Ticket> {
        self.table.ticket_if_live(index)
    }

    /// Metadata of a live request.
    pub fn meta(&self, ticket: Ticket) -> Option<&RequestMeta> {
        self.table
            .is_live(ticket)
            .then(|| self.table.meta(ticket.index))
    }

    /// The tickets of an in-flight batch.
    pub fn batch_tickets(&self, batch: BatchId) -> &[Ticket] {
        &self.batches[batch.0 as usize].tickets
    }
}
