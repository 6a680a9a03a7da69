//! Admission: the way into the core. `admit` queues a new request (or refuses it with a
//! [`Reject`]), `readmit` takes one moved here from another core, `cancel` takes a
//! still-queued one back out, `take_queued_to_move` hands one back to be moved to another
//! core, `begin_drain` closes the door.
//!
//! What must never happen here: a clock read (time is the `now` passed in), I/O, or an
//! allocation (a request takes a slot of the table built in [`Core::new`]); a refusal that
//! leaves anything queued or counted as admitted.

use super::request::{Nanos, Priority, RequestMeta, Ticket};
use super::strategy::StrategyKind;
use super::table;
use super::{Core, Reject};

impl Core {
    /// Queues a request. On success the ticket identifies it until its final answer.
    pub fn admit(&mut self, now: Nanos, mut meta: RequestMeta) -> Result<Ticket, Reject> {
        if !self.cfg.priority_enabled {
            meta.priority = Priority::Normal;
        }
        if self.draining {
            self.stats.rejected_draining += 1;
            return Err(Reject::ShuttingDown);
        }
        let Some(ticket) = self.table.insert(meta) else {
            self.stats.rejected_full += 1;
            return Err(Reject::QueueFull {
                capacity: self.table.capacity(),
            });
        };
        if self.strategy == StrategyKind::Auto {
            self.auto.observe_arrival(now, meta.class(), meta.bucket());
        }
        self.enqueue(ticket.index);
        self.queued += 1;
        self.stats.admitted += 1;
        Ok(ticket)
    }

    /// Queues a request the driver moves here from another core (a retry on another
    /// backend): accepted while draining too (it was admitted before the drain began), and
    /// counted in `stats.readmitted`, not `admitted`. A refusal (table full) is not counted
    /// either: the driver answers the request, which the first core already counted.
    pub fn readmit(&mut self, _now: Nanos, mut meta: RequestMeta) -> Result<Ticket, Reject> {
        if !self.cfg.priority_enabled {
            meta.priority = Priority::Normal;
        }
        let Some(ticket) = self.table.insert(meta) else {
            return Err(Reject::QueueFull {
                capacity: self.table.capacity(),
            });
        };
        self.enqueue(ticket.index);
        self.queued += 1;
        self.stats.readmitted += 1;
        Ok(ticket)
    }

    /// Removes a still-queued request (client went away). Returns false when the request is
    /// unknown or already dispatched (its batch will still complete; the driver drops the
    /// answer).
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        if !self.table.is_live(ticket) || self.table.state(ticket.index) != table::SlotState::Queued
        {
            return false;
        }
        self.dequeue(ticket.index);
        self.queued -= 1;
        self.table.remove(ticket);
        self.stats.failed += 1;
        self.stats.cancelled += 1;
        true
    }

    /// Takes one still-queued request out so the driver can move it to another backend
    /// (every worker's circuit here opened while it waited: it would wait the whole open
    /// time for a probe). Counted as a worker failure, as a request of a failed batch is:
    /// the driver corrects the count when the request moves, as it does for a retry.
    /// `None` when nothing is queued.
    pub fn take_queued_to_move(&mut self) -> Option<Ticket> {
        let index = self.any_queued()?;
        Some(self.remove_queued(index, super::FailReason::WorkerError))
    }

    /// Stops admitting; from now on every queued request is flushed as soon as a worker can
    /// take it (reason `drain`).
    pub fn begin_drain(&mut self) {
        self.draining = true;
    }
}
