//! Expiry and abort: queued requests past `request_timeout`, in-flight batches past
//! `batch_timeout` (abandoned: their requests are failed, the slot stays taken until the
//! worker returns it), and `abort_all` at the shutdown deadline. Each failed request is
//! answered once, through [`Action::Fail`].
//!
//! What must never happen here: a clock read (deadlines are judged against the `now`
//! passed in), I/O, an allocation, or a request failed twice (an abandoned batch's
//! requests are forgotten when failed; its late `complete` is stale).

use super::request::Nanos;
use super::strategy::StrategyKind;
use super::{Action, BatchState, Core, FailReason};

impl Core {
    /// Fails every queued request and abandons every in-flight batch with
    /// [`FailReason::Aborted`] (shutdown deadline passed). Workers still return their
    /// batches through `complete`, which then reports them stale.
    pub fn abort_all(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
        self.draining = true;
        while let Some(index) = self.any_queued() {
            self.fail_queued(index, FailReason::Aborted, out);
        }
        for b in 0..self.batches.len() {
            if self.batches[b].state == BatchState::InFlight {
                self.abandon(b, now, FailReason::Aborted, out);
            }
        }
    }

    pub(super) fn expire_queued(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
        if self.queued == 0 {
            return;
        }
        let limit = self.cfg.request_timeout_ns;
        if self.strategy == StrategyKind::MultiBin {
            for bin in 0..self.research.cfg.bins {
                while let Some(index) = self.research.bins[bin].front() {
                    if now.saturating_sub(self.table.meta(index).arrival_ns) < limit {
                        break;
                    }
                    self.fail_queued(index, FailReason::QueueTimeout, out);
                }
            }
            return;
        }
        let mut mask = self.nonempty;
        while mask != 0 {
            let class = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            while let Some(index) = self.queues[class].front() {
                if now.saturating_sub(self.table.meta(index).arrival_ns) < limit {
                    break;
                }
                self.fail_queued(index, FailReason::QueueTimeout, out);
            }
        }
    }

    pub(super) fn expire_batches(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
        if self.in_flight_batches == 0 {
            return;
        }
        for b in 0..self.batches.len() {
            let slot = &self.batches[b];
            if slot.state == BatchState::InFlight
                && now.saturating_sub(slot.dispatched_at_ns) >= self.cfg.batch_timeout_ns
            {
                self.abandon(b, now, FailReason::BatchTimeout, out);
            }
        }
    }

    /// Fails every request of in-flight batch `b`; the slot stays taken until the worker
    /// returns it.
    fn abandon(
        &mut self,
        b: usize,
        now: Nanos,
        reason: FailReason,
        out: &mut impl FnMut(Action<'_>),
    ) {
        let worker = self.batches[b].worker as usize;
        self.batches[b].state = BatchState::Abandoned;
        if reason == FailReason::BatchTimeout {
            self.record_worker_failure(worker, now);
        }
        for i in 0..self.batches[b].tickets.len() {
            let ticket = self.batches[b].tickets[i];
            self.table.remove(ticket);
            self.stats.failed += 1;
            match reason {
                FailReason::BatchTimeout => self.stats.batch_timeouts += 1,
                _ => self.stats.aborted += 1,
            }
            out(Action::Fail { ticket, reason });
        }
    }

    /// Takes queued table slot `index` out of its queue, frees it, counts the failure and
    /// tells the driver to answer it with `reason`.
    fn fail_queued(&mut self, index: u32, reason: FailReason, out: &mut impl FnMut(Action<'_>)) {
        let ticket = self.remove_queued(index, reason);
        out(Action::Fail { ticket, reason });
    }

    /// Takes queued table slot `index` out of its queue and frees it, counting it failed
    /// for `reason`; its ticket, for the caller to answer or move.
    pub(super) fn remove_queued(&mut self, index: u32, reason: FailReason) -> super::Ticket {
        self.dequeue(index);
        self.queued -= 1;
        let ticket = self.table.ticket_at(index);
        self.table.remove(ticket);
        self.stats.failed += 1;
        match reason {
            FailReason::QueueTimeout => self.stats.expired += 1,
            FailReason::Aborted => self.stats.aborted += 1,
            FailReason::Cancelled => self.stats.cancelled += 1,
            FailReason::BatchTimeout => self.stats.batch_timeouts += 1,
            FailReason::WorkerError => self.stats.worker_errors += 1,
        }
        ticket
    }
}
