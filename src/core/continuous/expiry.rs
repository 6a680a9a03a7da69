//! Requests that leave without finishing: waiting past the timeout (`expire_waiting`,
//! `next_expiry`), everything at the shutdown deadline (`abort_all`), a group whose every
//! circuit is open (`drop_waiting_in_group`), a replica whose step hung (`fail_replica`).
//!
//! What must never happen here: a request dropped without being handed to `out` (the
//! driver answers each one), a preempted request expired, or an allocation.

use super::replica::SlotPhase;
use super::{Continuous, TAG_PREEMPTED};
use crate::core::request::{Priority, Ticket};
use crate::core::table::NIL;

impl Continuous {
    /// Drops every waiting request that arrived more than `timeout_ns` before `now` (no slot
    /// freed up in time), handing each to `out`. Oldest first; O(expired + preempted) per
    /// call. A preempted request is never dropped: it has started (its client may hold
    /// streamed tokens), and the timeout is for waiting to start, as in vLLM, which has
    /// none. Preempted requests sit at the front of their queue, the rest in arrival order.
    pub fn expire_waiting(
        &mut self,
        now: crate::core::request::Nanos,
        timeout_ns: crate::core::request::Nanos,
        out: &mut impl FnMut(Ticket),
    ) {
        for g in 0..self.groups() {
            for p in 0..Priority::COUNT {
                let mut at = self.waiting[g][p].front().unwrap_or(NIL);
                while at != NIL {
                    let index = at;
                    at = self.table.next_in_fifo(index);
                    if self.table.tag(index) == TAG_PREEMPTED {
                        continue;
                    }
                    if now.saturating_sub(self.table.meta(index).arrival_ns) < timeout_ns {
                        break;
                    }
                    self.waiting[g][p].unlink(&mut self.table, index);
                    self.waiting_len -= 1;
                    self.group_waiting[g] -= 1;
                    let ticket = self.table.ticket_at(index);
                    self.table.remove(ticket);
                    out(ticket);
                }
            }
        }
    }

    /// When [`Continuous::expire_waiting`] with `timeout_ns` next fails a request: the
    /// earliest deadline among the oldest waiting request of each queue that was never
    /// preempted (the ones it looks at); `None` when none waits. O(groups x priorities +
    /// preempted).
    pub fn next_expiry(
        &self,
        timeout_ns: crate::core::request::Nanos,
    ) -> Option<crate::core::request::Nanos> {
        let mut next: Option<crate::core::request::Nanos> = None;
        for g in 0..self.groups() {
            for p in 0..Priority::COUNT {
                // Preempted requests (at the front) never expire: the first other one.
                let mut index = self.waiting[g][p].front().unwrap_or(NIL);
                while index != NIL && self.table.tag(index) == TAG_PREEMPTED {
                    index = self.table.next_in_fifo(index);
                }
                if index != NIL {
                    let at = self.table.meta(index).arrival_ns.saturating_add(timeout_ns);
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        next
    }

    /// Fails everything: every waiting request and every active slot is freed and handed to
    /// `out` (shutdown deadline passed). Steps still out come back through
    /// `complete_step`, which then finds their slots idle and ignores them.
    pub fn abort_all(&mut self, out: &mut impl FnMut(Ticket)) {
        self.draining = true;
        for g in 0..self.groups() {
            self.drop_waiting_in_group(g, out);
        }
        for r in 0..self.replicas.len() {
            for s in 0..self.replicas[r].slots.len() {
                if self.replicas[r].slots[s].phase != SlotPhase::Idle {
                    let ticket = self.replicas[r].free(s);
                    self.table.remove(ticket);
                    out(ticket);
                }
            }
        }
    }

    /// Drops every request waiting in group `group`, handing each to `out` (the driver
    /// answers them): every replica of the group has an open circuit, so they would wait
    /// for a probe step. Preempted ones too: their backend cannot resume them either.
    /// O(waiting in the group).
    pub fn drop_waiting_in_group(&mut self, group: usize, out: &mut impl FnMut(Ticket)) {
        for p in 0..Priority::COUNT {
            while let Some(index) = self.waiting[group][p].pop_front(&mut self.table) {
                self.waiting_len -= 1;
                self.group_waiting[group] -= 1;
                let ticket = self.table.ticket_at(index);
                self.table.remove(ticket);
                out(ticket);
            }
        }
    }

    /// The step out on `replica` will not be waited for (it hung past the step timeout):
    /// every request active on the replica is freed and handed to `out`, to be failed. The
    /// replica stays busy until the step comes back through `complete_step`, which then
    /// finds its slots idle and ignores it. O(slots).
    pub fn fail_replica(&mut self, replica: usize, out: &mut impl FnMut(Ticket)) {
        let rep = &mut self.replicas[replica];
        for s in 0..rep.slots.len() {
            if rep.slots[s].phase != SlotPhase::Idle {
                let ticket = rep.free(s);
                self.table.remove(ticket);
                out(ticket);
            }
        }
        debug_assert!(rep.counters_hold());
    }
}
