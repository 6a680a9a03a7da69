//! Batch formation: picking the worker, filling a batch slot from the class queues
//! (highest priority first, oldest first, up to `max_batch_size` and `max_batch_tokens`)
//! or, for `dynamic` / `multi_bin`, from the queue or a bin up to `b_target` under the
//! memory check, and emitting the [`Action::Dispatch`].
//!
//! What must never happen here: a clock read, I/O, or an allocation (a batch's ticket
//! buffer is the slot's, reserved in [`Core::new`], and never grows); a dispatch with no
//! request or to a worker that cannot take it.

use super::circuit::CircuitState;
use super::lora::BatchAdapters;
use super::pool::WorkerView;
use super::request::{self, Nanos, Priority, Ticket, BUCKET_COUNT};
use super::stats::FlushReason;
use super::strategy::StrategyKind;
use super::table::NIL;
use super::{Action, BatchId, BatchState, Core};

/// Most queued requests batch forming looks past, in one queue, for one whose LoRA adapter
/// fits the batch (so forming a batch stays O(this) however long the queue is).
const LORA_SCAN_MOST: usize = 256;

impl Core {
    /// Records a failed batch against `worker`'s circuit (which may open it).
    pub(super) fn record_worker_failure(&mut self, worker: usize, now: Nanos) {
        let circuit = self.cfg.circuit;
        self.workers[worker].circuit.record_failure(now, &circuit);
        self.workers[worker].batches_failed += 1;
        self.circuits_may_be_open = true;
    }

    pub(super) fn pick_worker(&mut self, now: Nanos) -> Option<usize> {
        let circuit = self.cfg.circuit;
        let max = self.cfg.max_inflight_per_worker;
        // Advance every circuit to `now` first, so the balancer sees current states (an open
        // one turns half-open once its recovery time passed; no other state moves by time).
        if self.circuits_may_be_open {
            let mut open = false;
            for w in self.workers.iter_mut() {
                open |= w.circuit.state(now, &circuit) == CircuitState::Open;
            }
            self.circuits_may_be_open = open;
        }
        let workers: &[WorkerView] = &self.workers;
        self.balancer.pick(
            workers.len(),
            &mut self.rng,
            |i| workers[i].pending < max && workers[i].circuit.allows_dispatch(),
            |i| workers[i].pending,
        )
    }

    /// Takes the batch for group `g` (highest priority first, FIFO within a priority, across
    /// buckets by arrival when bucketing is off) and emits the dispatch.
    pub(super) fn dispatch(
        &mut self,
        now: Nanos,
        g: usize,
        reason: FlushReason,
        worker: usize,
        out: &mut impl FnMut(Action<'_>),
    ) {
        let buckets = self.group_buckets(g);
        let limit = BatchLimit::Tokens(u64::from(self.cfg.max_batch_tokens));
        let (slot, tickets) = self.fill_from_classes(now, buckets, self.cfg.max_batch_size, limit);
        self.emit_dispatch(now, slot, tickets, reason, worker, out);
    }

    /// The buckets of group `g`.
    fn group_buckets(&self, g: usize) -> std::ops::Range<usize> {
        if self.cfg.token_bucketing {
            g..g + 1
        } else {
            0..BUCKET_COUNT
        }
    }

    /// `dynamic` and `multi_bin`: whenever a worker can take a batch, form one of up to
    /// `b_target = min(b_mem, b_SLA)` requests (FIFO; for `multi_bin` from the bin the bin
    /// policy picks, sized by that bin's statistics and controller) that passes the memory
    /// check.
    pub(super) fn dispatch_research(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
        while self.queued > 0 {
            let Some(worker) = self.pick_worker(now) else {
                return;
            };
            let (slot, tickets, target) = if self.strategy == StrategyKind::MultiBin {
                // A head waiting half the request timeout goes first, whatever its bin.
                let age_bound_ns = self.cfg.request_timeout_ns / 2;
                let Some(bin) = self.research.choose_bin(now, &self.table, age_bound_ns) else {
                    return;
                };
                let backlog = self.research.bins[bin].len();
                let target = self.research.b_target(Some(bin), backlog) as usize;
                let (slot, tickets) = self.fill_from_bin(now, bin, target);
                self.batches[slot as usize].bin = Some(bin);
                (slot, tickets, target)
            } else {
                let target = self.research.b_target(None, self.queued) as usize;
                let (slot, tickets) =
                    self.fill_from_classes(now, 0..BUCKET_COUNT, target, BatchLimit::Memory);
                (slot, tickets, target)
            };
            let reason = if self.draining {
                FlushReason::Drain
            } else if tickets.len() >= target {
                FlushReason::Full
            } else {
                FlushReason::IdleWorker
            };
            self.emit_dispatch(now, slot, tickets, reason, worker, out);
        }
    }

    /// Would a request of `t` tokens still fit a batch already holding `tokens` tokens?
    /// Counts a memory-limit hit when the memory check says no.
    fn fits(&mut self, limit: BatchLimit, tokens: u64, t: u64) -> bool {
        match limit {
            BatchLimit::Tokens(max) => tokens + t <= max,
            BatchLimit::Memory => {
                let ok = self.research.cfg.memory.fits(tokens + t);
                if !ok {
                    self.research.memory_limit_hits += 1;
                }
                ok
            }
        }
    }

    /// Takes a free batch slot and fills it from the class queues of `buckets`: highest
    /// priority first, oldest first across buckets, up to `max_len` requests and `limit`.
    /// A first request larger than the limit still goes alone.
    fn fill_from_classes(
        &mut self,
        now: Nanos,
        buckets: std::ops::Range<usize>,
        max_len: usize,
        limit: BatchLimit,
    ) -> (u32, Vec<Ticket>) {
        let (slot, mut tickets) = self.take_batch_slot();
        let max_len = max_len.min(tickets.capacity());
        let mut tokens = 0u64;
        let mut adapters = BatchAdapters::new(self.cfg.max_loras);
        // A request that goes alone closes the batch (`CoreConfig::alone`).
        let mut closed = false;
        // The group's buckets as a mask over one priority's classes: only the occupied
        // ones (`nonempty`) are looked at, and one occupied queue gives its first request
        // without comparing arrivals.
        let group = ((1u32 << buckets.end) - 1) & !((1u32 << buckets.start) - 1);
        'fill: for p in Priority::HIGHEST_FIRST {
            let first_class = request::class_index(p, 0);
            loop {
                if tickets.len() >= max_len {
                    break 'fill;
                }
                // Oldest request among this priority's queues in the group whose LoRA
                // adapter fits the batch (the head, unless its adapter does not).
                let mut occupied = (self.nonempty >> first_class) & group;
                debug_assert!(buckets.clone().all(|b| {
                    let class = request::class_index(p, b);
                    self.queues[class].is_empty() == (occupied & (1 << b) == 0)
                }));
                let pick = if occupied & occupied.wrapping_sub(1) == 0 {
                    // One occupied queue (or none): its first fitting request, no comparing.
                    let class = first_class + occupied.trailing_zeros() as usize;
                    match occupied {
                        0 => None,
                        _ => self
                            .first_fitting(self.queues[class].front(), &adapters)
                            .map(|first| (class, first)),
                    }
                } else {
                    let mut oldest: Option<(usize, u32, Nanos)> = None;
                    while occupied != 0 {
                        let class = first_class + occupied.trailing_zeros() as usize;
                        occupied &= occupied - 1;
                        let front = self.queues[class].front();
                        if let Some(first) = self.first_fitting(front, &adapters) {
                            let arrival = self.table.meta(first).arrival_ns;
                            if oldest.is_none_or(|(_, _, a)| arrival < a) {
                                oldest = Some((class, first, arrival));
                            }
                        }
                    }
                    oldest.map(|(class, first, _)| (class, first))
                };
                let Some((class, index)) = pick else {
                    break;
                };
                let meta = self.table.meta(index);
                let (t, adapter, arrival) = (
                    u64::from(meta.tokens_estimated),
                    meta.adapter,
                    meta.arrival_ns,
                );
                let alone = self.cfg.alone.of(meta);
                if !tickets.is_empty() && (alone || closed || !self.fits(limit, tokens, t)) {
                    break 'fill;
                }
                self.queues[class].unlink(&mut self.table, index);
                self.sync_class(class);
                self.take_queued(now, index, arrival, &mut tickets);
                adapters.add(adapter);
                tokens += t;
                closed = alone;
            }
        }
        (slot, tickets)
    }

    /// The LoRA rule of batch forming: from `front` on (a queue), the first request whose
    /// adapter fits `adapters` (at most `max_loras` distinct adapters a batch). A request
    /// passed over stays queued, first in line for the next batch: a batch's first request
    /// is always the oldest of the highest priority waiting, so a request's wait is bounded
    /// by the requests ahead of it, whatever their adapters. Looks at most
    /// [`LORA_SCAN_MOST`] requests.
    fn first_fitting(&self, front: Option<u32>, adapters: &BatchAdapters) -> Option<u32> {
        let mut i = front?;
        for _ in 0..LORA_SCAN_MOST {
            if adapters.fits(self.table.meta(i).adapter) {
                return Some(i);
            }
            i = self.table.next_in_fifo(i);
            if i == NIL {
                return None;
            }
        }
        None
    }

    /// Forgets LoRA adapter `adapter` on every worker (unloaded, or its id handed to a new
    /// adapter): the next batch with it pays a load (`LoraSlots::forget`).
    pub fn forget_adapter(&mut self, adapter: super::lora::AdapterId) {
        self.lora.iter_mut().for_each(|s| s.forget(adapter));
    }

    /// Takes a free batch slot and fills it from bin `bin` (FIFO) up to `max_len` requests
    /// that pass the memory check; the rest stay at the front of the bin.
    fn fill_from_bin(&mut self, now: Nanos, bin: usize, max_len: usize) -> (u32, Vec<Ticket>) {
        let (slot, mut tickets) = self.take_batch_slot();
        let max_len = max_len.min(tickets.capacity());
        let mut tokens = 0u64;
        let mut adapters = BatchAdapters::new(self.cfg.max_loras);
        // A request that goes alone closes the batch (`CoreConfig::alone`).
        let mut closed = false;
        while tickets.len() < max_len {
            let Some(index) = self.first_fitting(self.research.bins[bin].front(), &adapters) else {
                break;
            };
            let meta = self.table.meta(index);
            let (t, arrival, adapter) = (
                u64::from(meta.tokens_estimated),
                meta.arrival_ns,
                meta.adapter,
            );
            let alone = self.cfg.alone.of(meta);
            if !tickets.is_empty() && (alone || closed || !self.fits(BatchLimit::Memory, tokens, t))
            {
                break;
            }
            self.research.bins[bin].unlink(&mut self.table, index);
            self.research.queued -= 1;
            self.take_queued(now, index, arrival, &mut tickets);
            adapters.add(adapter);
            tokens += t;
            closed = alone;
        }
        (slot, tickets)
    }

    fn take_batch_slot(&mut self) -> (u32, Vec<Ticket>) {
        let slot = self
            .free_batches
            .pop()
            .expect("a worker with room implies a free batch slot");
        self.batches[slot as usize].bin = None;
        let mut tickets = std::mem::take(&mut self.batches[slot as usize].tickets);
        tickets.clear();
        (slot, tickets)
    }

    /// Bookkeeping for a request leaving its queue for a batch.
    fn take_queued(&mut self, now: Nanos, index: u32, arrival: Nanos, tickets: &mut Vec<Ticket>) {
        self.queued -= 1;
        self.table.set_dispatched(index);
        self.stats.queue_wait.record(now.saturating_sub(arrival));
        debug_assert!(
            tickets.len() < tickets.capacity(),
            "batch buffer never grows"
        );
        tickets.push(self.table.ticket_at(index));
    }

    /// Hands a filled batch slot to `worker` and emits the dispatch.
    fn emit_dispatch(
        &mut self,
        now: Nanos,
        slot: u32,
        tickets: Vec<Ticket>,
        reason: FlushReason,
        worker: usize,
        out: &mut impl FnMut(Action<'_>),
    ) {
        debug_assert!(
            !tickets.is_empty(),
            "a dispatched batch has at least one request"
        );
        let b = slot as usize;
        let mut adapters = BatchAdapters::new(self.cfg.max_loras);
        let mut tokens = 0u64;
        for t in &tickets {
            let meta = self.table.meta(t.index);
            adapters.add(meta.adapter);
            tokens += u64::from(meta.tokens_estimated);
        }
        let lora_loads = self.lora[worker].load_batch(&adapters);
        self.stats.lora_loads += u64::from(lora_loads);
        self.stats.batches_formed += 1;
        self.stats.batched_requests += tickets.len() as u64;
        self.stats.flush_reasons[reason.index()] += 1;
        self.workers[worker].on_dispatch(now);
        self.in_flight_batches += 1;
        let slot_ref = &mut self.batches[b];
        slot_ref.tickets = tickets;
        slot_ref.worker = worker as u32;
        slot_ref.dispatched_at_ns = now;
        slot_ref.tokens = tokens;
        slot_ref.state = BatchState::InFlight;
        out(Action::Dispatch {
            worker,
            batch: BatchId(slot),
            reason,
            tickets: &self.batches[b].tickets,
            lora_loads,
        });
    }
}

/// What bounds a batch besides its length.
#[derive(Clone, Copy, Debug)]
enum BatchLimit {
    /// `max_batch_tokens` estimated tokens.
    Tokens(u64),
    /// The research strategies' memory check (Algorithm 3).
    Memory,
}
