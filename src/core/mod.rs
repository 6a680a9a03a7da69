//! The sans-IO scheduling core: admission, per-class queues, flush decisions, batch
//! formation, worker selection, circuit breaking and outcome accounting.
//!
//! Driven from outside with the current time (`admit`, `poll`, `complete`), it is the same
//! code under the live runtime and the virtual-time simulator. It must never read a clock,
//! spawn or block, do I/O, or allocate after [`Core::new`]; `tests/no_alloc.rs` holds it to
//! that.

pub mod balancer;
pub mod circuit;
pub mod continuous;
pub mod names;
pub mod pool;
pub mod prefix;
pub mod request;
pub mod research;
pub mod research_keys;
pub mod settings;
pub mod stats;
pub mod strategy;
pub mod table;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use balancer::Balancer;
use pool::WorkerView;
pub use request::{
    Kind, Nanos, Priority, RequestMeta, Ticket, BUCKET_COUNT, BUCKET_LABELS, CLASS_COUNT,
};
use research::Research;
pub use settings::{BatchingMode, CoreConfig};
use stats::LatencyWindow;
pub use stats::{CoreStats, FlushReason};
use strategy::auto::{self, Auto};
use strategy::StrategyKind;
use table::{Fifo, RequestTable};

/// Why a request was refused at admission. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("the request queue is full ({capacity} requests queued or in flight); retry later")]
    QueueFull { capacity: usize },
    #[error("the server is shutting down and no longer accepts requests")]
    ShuttingDown,
    #[error("the request needs {needed} KV-cache tokens (prompt + max_tokens) but a replica holds at most {capacity}; shorten the prompt or lower max_tokens")]
    TooLarge { needed: u64, capacity: u64 },
}

/// Why an admitted request ended in an error instead of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    #[error("request waited in the queue past its deadline: no worker could take it")]
    QueueTimeout,
    #[error("the worker did not answer within the batch timeout")]
    BatchTimeout,
    #[error("the worker failed while processing the batch")]
    WorkerError,
    #[error("the request was cancelled by the client")]
    Cancelled,
    #[error("the server shut down before the request could be served")]
    Aborted,
}

/// Identifies one batch handed to a worker (an index into the core's batch slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchId(pub u32);

/// What the driver must do after `poll`.
#[derive(Debug)]
pub enum Action<'a> {
    /// Hand these requests, as one batch, to `worker`.
    Dispatch {
        worker: usize,
        batch: BatchId,
        reason: FlushReason,
        tickets: &'a [Ticket],
    },
    /// Answer this request with an error now; the core has forgotten it.
    Fail { ticket: Ticket, reason: FailReason },
}

/// How a worker finished a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    Ok,
    Failed,
}

/// What `complete` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The batch's requests are finished now: answer each of them (with the result on
    /// success, with [`FailReason::WorkerError`] on failure).
    Deliver,
    /// The batch had already timed out and its requests were answered; drop the results.
    Stale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchState {
    Free,
    InFlight,
    /// Timed out: its requests were failed, the worker still holds it.
    Abandoned,
}

/// One batch slot. `tickets` has capacity `max_batch_size`, reserved in `new`.
struct BatchSlot {
    tickets: Vec<Ticket>,
    worker: u32,
    dispatched_at_ns: Nanos,
    state: BatchState,
    /// The `multi_bin` bin the batch came from (its statistics learn from the result).
    bin: Option<usize>,
}

/// The scheduler. See the module docs for the rules it lives by.
pub struct Core {
    cfg: CoreConfig,
    table: RequestTable,
    /// One FIFO per (priority x bucket), indexed by [`request::class_index`].
    queues: [Fifo; CLASS_COUNT],
    /// Requests in all queues.
    queued: usize,
    /// Bit `c` set iff `queues[c]` is non-empty, so scans touch only occupied classes.
    nonempty: u32,
    strategy: StrategyKind,
    workers: Vec<WorkerView>,
    balancer: Balancer,
    rng: SmallRng,
    batches: Vec<BatchSlot>,
    /// Stack of free batch slot indices.
    free_batches: Vec<u32>,
    in_flight_batches: usize,
    stats: CoreStats,
    latencies: LatencyWindow,
    p99_refreshed_at_ns: Nanos,
    draining: bool,
    /// `dynamic` / `multi_bin` state; its bins hold the queue while `multi_bin` is active.
    research: Research,
    /// `auto`'s learned cost and arrivals, fed only while `auto` is in force: learning
    /// under every strategy cost 26 ns per request in `core/request_cycle` (98 -> 72 ns).
    /// Switched to at run time, `auto` starts from what it learned when it last ran (or its
    /// work-conserving prior) and catches up within ~16 completed batches.
    auto: Auto,
    /// The earliest instant `auto` chose to hold a group until, at the last poll
    /// (`Nanos::MAX`: holding nothing).
    auto_hold_until: Nanos,
    /// When `auto`'s current hold began (a worker was free and it held), `Nanos::MAX` when
    /// not holding. Priority max waits bound a hold from here: they bound the delay the
    /// strategy adds, not the time a request waited for a busy worker.
    auto_hold_started: Nanos,
}

impl Core {
    /// Builds a core; every table and buffer it will ever use is allocated here.
    pub fn new(cfg: CoreConfig) -> Core {
        assert!(cfg.workers > 0, "a core needs at least one worker");
        assert!(cfg.max_batch_size > 0, "max_batch_size must be at least 1");
        let max_inflight = cfg.max_inflight_per_worker.max(1);
        // Batch slots: one per batch any worker may hold at once.
        let slot_count = cfg.workers * max_inflight as usize;
        let batch_len = max_batch_len(&cfg);
        let batches = (0..slot_count)
            .map(|_| BatchSlot {
                tickets: Vec::with_capacity(batch_len),
                worker: 0,
                dispatched_at_ns: 0,
                state: BatchState::Free,
                bin: None,
            })
            .collect();
        let free_batches = (0..slot_count as u32).rev().collect();
        Core {
            table: RequestTable::new(cfg.queue_capacity),
            queues: [Fifo::default(); CLASS_COUNT],
            queued: 0,
            nonempty: 0,
            strategy: cfg.strategy,
            workers: vec![WorkerView::default(); cfg.workers],
            balancer: Balancer::new(cfg.balancer),
            rng: SmallRng::seed_from_u64(cfg.seed),
            batches,
            free_batches,
            in_flight_batches: 0,
            stats: CoreStats::default(),
            latencies: LatencyWindow::new(cfg.latency_window),
            p99_refreshed_at_ns: 0,
            draining: false,
            research: {
                let mut r = Research::new(cfg.research.clone());
                r.use_bins(cfg.strategy == StrategyKind::MultiBin);
                r
            },
            auto: Auto::default(),
            auto_hold_until: Nanos::MAX,
            auto_hold_started: Nanos::MAX,
            cfg: CoreConfig {
                max_inflight_per_worker: max_inflight,
                ..cfg
            },
        }
    }

    /// The configuration the core runs with.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

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

    /// Switches strategy. Nothing queued is lost: switching into or out of `multi_bin`
    /// moves every queued request between the class queues and the bins, in arrival order.
    pub fn set_strategy(&mut self, kind: StrategyKind) {
        let was_bins = self.strategy == StrategyKind::MultiBin;
        let to_bins = kind == StrategyKind::MultiBin;
        if was_bins && !to_bins {
            self.strategy = kind;
            self.research.use_bins(false);
            self.move_bins_to_classes();
        } else if !was_bins && to_bins {
            self.strategy = kind;
            self.research.use_bins(true);
            self.move_classes_to_bins();
        } else {
            self.strategy = kind;
        }
    }

    fn move_bins_to_classes(&mut self) {
        let k = self.research.cfg.bins;
        let queues = &mut self.queues;
        let mut mask = self.nonempty;
        Research::drain_in_arrival_order(&mut self.table, &mut self.research.bins[..k], |t, i| {
            let class = t.meta(i).class();
            queues[class].push_back(t, i);
            mask |= 1 << class;
        });
        self.nonempty = mask;
        self.research.queued = 0;
    }

    fn move_classes_to_bins(&mut self) {
        let research = &mut self.research;
        let mut moved = 0;
        Research::drain_in_arrival_order(&mut self.table, &mut self.queues, |t, i| {
            let bin = research.bin_for(t.meta(i));
            t.set_tag(i, bin as u32);
            research.bins[bin].push_back(t, i);
            moved += 1;
        });
        research.queued += moved;
        self.nonempty = 0;
    }

    /// Puts table slot `index` in the queue the current strategy uses.
    fn enqueue(&mut self, index: u32) {
        if self.strategy == StrategyKind::MultiBin {
            let bin = self.research.bin_for(self.table.meta(index));
            self.table.set_tag(index, bin as u32);
            self.research.bins[bin].push_back(&mut self.table, index);
            self.research.queued += 1;
        } else {
            let class = self.table.meta(index).class();
            self.queues[class].push_back(&mut self.table, index);
            self.sync_class(class);
        }
    }

    /// Takes queued table slot `index` out of whichever queue holds it.
    fn dequeue(&mut self, index: u32) {
        if self.strategy == StrategyKind::MultiBin {
            let bin = self.table.tag(index) as usize;
            self.research.bins[bin].unlink(&mut self.table, index);
            self.research.queued -= 1;
        } else {
            let class = self.table.meta(index).class();
            self.queues[class].unlink(&mut self.table, index);
            self.sync_class(class);
        }
    }

    /// Some queued request, from whichever queues the current strategy uses.
    fn any_queued(&self) -> Option<u32> {
        if self.strategy == StrategyKind::MultiBin {
            let k = self.research.cfg.bins;
            self.research.bins[..k].iter().find_map(|q| q.front())
        } else {
            let class = self.nonempty.trailing_zeros() as usize;
            (self.nonempty != 0)
                .then(|| self.queues[class].front())
                .flatten()
        }
    }

    /// Takes queued table slot `index` out of its queue, frees it, counts the failure and
    /// tells the driver to answer it with `reason`.
    fn fail_queued(&mut self, index: u32, reason: FailReason, out: &mut impl FnMut(Action<'_>)) {
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
        out(Action::Fail { ticket, reason });
    }

    /// What `auto` has learned and decided (for metrics).
    pub fn auto_snapshot(&self) -> auto::AutoSnapshot {
        self.auto.snapshot()
    }

    /// Controller state of the research strategies (for metrics).
    pub fn research_snapshot(&self) -> research::ResearchSnapshot {
        self.research.snapshot()
    }

    /// Longest batch this core forms (buffers handed to workers need this capacity).
    pub fn max_batch_len(&self) -> usize {
        max_batch_len(&self.cfg)
    }

    /// The strategy in force.
    pub fn strategy(&self) -> StrategyKind {
        self.strategy
    }

    /// Stops admitting; from now on every queued request is flushed as soon as a worker can
    /// take it (reason `drain`).
    pub fn begin_drain(&mut self) {
        self.draining = true;
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

    /// Runs the scheduler at `now`: fails expired work, releases every batch that is due and
    /// has a worker, and returns the next instant it needs to run again by itself (`None`:
    /// only an admission or a completion can change anything).
    pub fn poll(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) -> Option<Nanos> {
        self.expire_queued(now, out);
        self.expire_batches(now, out);
        if self.strategy == StrategyKind::LatencyAware
            && now.saturating_sub(self.p99_refreshed_at_ns) >= self.cfg.p99_refresh_ns
        {
            self.latencies.refresh();
            self.p99_refreshed_at_ns = now;
        }
        self.auto_hold_until = Nanos::MAX;
        if self.strategy.is_research() {
            self.dispatch_research(now, out);
        } else {
            while let Some((group, reason)) = self.due_group(now) {
                let Some(worker) = self.pick_worker(now) else {
                    break;
                };
                self.dispatch(now, group, reason, worker, out);
            }
        }
        self.auto_hold_started = if self.auto_hold_until == Nanos::MAX {
            Nanos::MAX
        } else {
            self.auto_hold_started.min(now)
        };
        self.next_deadline(now)
    }

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
        let circuit = self.cfg.circuit;
        let service_ns = now.saturating_sub(self.batches[b].dispatched_at_ns);
        if self.strategy == StrategyKind::Auto {
            let table = &self.table;
            let tickets = &self.batches[b].tickets;
            let tokens = tickets
                .iter()
                .map(|t| u64::from(table.meta(t.index).tokens_estimated))
                .sum();
            let sample = (outcome == BatchOutcome::Ok).then_some(service_ns);
            self.auto
                .observe_completion(now, tickets.len(), tokens, sample);
        }
        if outcome == BatchOutcome::Ok {
            // Algorithm 7: statistics and SLA controller after every completed batch.
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
            BatchOutcome::Failed => {
                self.workers[worker].circuit.record_failure(now, &circuit);
                self.workers[worker].batches_failed += 1;
            }
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

    // ---- internals -------------------------------------------------------------------

    fn expire_queued(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
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

    fn expire_batches(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
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
            let circuit = self.cfg.circuit;
            self.workers[worker].circuit.record_failure(now, &circuit);
            self.workers[worker].batches_failed += 1;
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

    /// The buckets of group `g`.
    fn group_buckets(&self, g: usize) -> std::ops::Range<usize> {
        if self.cfg.token_bucketing {
            g..g + 1
        } else {
            0..BUCKET_COUNT
        }
    }

    /// The strategy's flush timeout at the current queue depth, in ns.
    fn strategy_timeout_ns(&self) -> Nanos {
        let p99_ms = self.latencies.p99().map(|ns| ns as f64 / 1e6);
        let ms = strategy::timeout_ms(
            self.strategy,
            &self.cfg.strategy_params,
            self.queued,
            p99_ms,
        );
        request::ms_to_nanos(ms)
    }

    /// Keeps the non-empty mask in step with `queues[class]`.
    #[inline]
    fn sync_class(&mut self, class: usize) {
        if self.queues[class].is_empty() {
            self.nonempty &= !(1 << class);
        } else {
            self.nonempty |= 1 << class;
        }
    }

    /// One pass over the occupied classes: per group, size, tokens, oldest arrival, whether
    /// a critical request waits, and the earliest priority max-wait deadline.
    fn summarize(&self) -> [GroupSummary; BUCKET_COUNT] {
        let mut groups = [GroupSummary::EMPTY; BUCKET_COUNT];
        let mut mask = self.nonempty;
        while mask != 0 {
            let class = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let q = &self.queues[class];
            let Some(head) = q.front() else { continue };
            let priority = Priority::from_index(class / BUCKET_COUNT);
            let g = if self.cfg.token_bucketing {
                class % BUCKET_COUNT
            } else {
                0
            };
            let arrival = self.table.meta(head).arrival_ns;
            let max_wait = request::ms_to_nanos(self.cfg.priority_max_wait_ms[priority.index()]);
            let s = &mut groups[g];
            s.len += q.len();
            s.tokens += q.tokens();
            s.oldest = s.oldest.min(arrival);
            s.critical |= priority == Priority::Critical;
            s.max_wait_at = s.max_wait_at.min(arrival.saturating_add(max_wait));
            s.max_wait_min_ns = s.max_wait_min_ns.min(max_wait);
        }
        groups
    }

    /// The most urgent group that is due now, with why. Urgency: drain, critical, full,
    /// max_wait, timeout, idle_worker; ties go to the group with the oldest request.
    fn due_group(&mut self, now: Nanos) -> Option<(usize, FlushReason)> {
        if self.queued == 0 {
            return None;
        }
        let timeout_ns = self.strategy_timeout_ns();
        let is_auto = self.strategy == StrategyKind::Auto;
        let free_workers = if is_auto { self.free_workers(now) } else { 0 };
        let idle_worker = !is_auto && self.cfg.dispatch_when_idle && self.any_idle_worker(now);
        let mut best: Option<(usize, FlushReason, u8, Nanos)> = None;
        for (g, s) in self.summarize().iter().enumerate() {
            if s.len == 0 {
                continue;
            }
            let reason = if self.draining {
                FlushReason::Drain
            } else if s.critical {
                FlushReason::Critical
            } else if s.len >= self.cfg.max_batch_size
                || s.tokens >= u64::from(self.cfg.max_batch_tokens)
            {
                FlushReason::Full
            } else if is_auto {
                if free_workers == 0 {
                    continue;
                }
                let held_since = self.auto_hold_started.min(now);
                let latest = held_since
                    .saturating_add(s.max_wait_min_ns)
                    .min(s.oldest.saturating_add(self.cfg.request_timeout_ns));
                if now >= latest {
                    FlushReason::MaxWait
                } else if self.auto_goes(now, g, s, free_workers, latest) {
                    FlushReason::IdleWorker
                } else {
                    continue;
                }
            } else if now >= s.max_wait_at {
                FlushReason::MaxWait
            } else if now.saturating_sub(s.oldest) >= timeout_ns && s.len >= self.cfg.min_batch_size
            {
                FlushReason::Timeout
            } else if idle_worker {
                FlushReason::IdleWorker
            } else {
                continue;
            };
            let rank = reason_rank(reason);
            let better = match best {
                None => true,
                Some((_, _, r, o)) => rank < r || (rank == r && s.oldest < o),
            };
            if better {
                best = Some((g, reason, rank, s.oldest));
            }
        }
        best.map(|(g, reason, _, _)| (g, reason))
    }

    /// `auto`: should group `g` (summary `s`) go now, with `free` workers able to take a
    /// batch, or be held (not past `latest`)? With more than one free, holding only delays
    /// it (the requests it would wait for can have a worker of their own). Otherwise `auto`
    /// decides; a hold is remembered in `auto_hold_until` for [`Core::next_deadline`].
    fn auto_goes(
        &mut self,
        now: Nanos,
        g: usize,
        s: &GroupSummary,
        free: usize,
        latest: Nanos,
    ) -> bool {
        if free > 1 {
            return true;
        }
        let group = auto::Group {
            queued: s.len,
            tokens: s.tokens,
            room: self.cfg.max_batch_size.saturating_sub(s.len),
            bucket: self.cfg.token_bucketing.then_some(g),
            latest,
        };
        match self.auto.decide(now, &group) {
            auto::Decision::Go => true,
            auto::Decision::HoldUntil(t) => {
                self.auto_hold_until = self.auto_hold_until.min(t);
                false
            }
        }
    }

    /// Workers that can take a batch now, counted up to 2 (callers only ask for none, one,
    /// or more than one), so a large pool is not walked at every poll.
    fn free_workers(&mut self, now: Nanos) -> usize {
        let circuit = self.cfg.circuit;
        let max = self.cfg.max_inflight_per_worker;
        let mut free = 0;
        for w in self.workers.iter_mut() {
            free += usize::from(w.can_take(now, max, &circuit));
            if free == 2 {
                break;
            }
        }
        free
    }

    fn any_idle_worker(&mut self, now: Nanos) -> bool {
        let circuit = self.cfg.circuit;
        self.workers.iter_mut().any(|w| w.is_idle(now, &circuit))
    }

    fn pick_worker(&mut self, now: Nanos) -> Option<usize> {
        let circuit = self.cfg.circuit;
        let max = self.cfg.max_inflight_per_worker;
        // Advance every circuit to `now` first, so the balancer sees current states.
        for w in self.workers.iter_mut() {
            w.circuit.state(now, &circuit);
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
    fn dispatch(
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

    /// `dynamic` and `multi_bin`: whenever a worker can take a batch, form one of up to
    /// `b_target = min(b_mem, b_SLA)` requests (FIFO; for `multi_bin` from the bin the bin
    /// policy picks, sized by that bin's statistics and controller) that passes the memory
    /// check.
    fn dispatch_research(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) {
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
        'fill: for p in Priority::HIGHEST_FIRST {
            loop {
                if tickets.len() >= max_len {
                    break 'fill;
                }
                // Oldest head among this priority's queues in the group.
                let mut pick: Option<(usize, u32, Nanos)> = None;
                for bucket in buckets.clone() {
                    let class = request::class_index(p, bucket);
                    if let Some(head) = self.queues[class].front() {
                        let arrival = self.table.meta(head).arrival_ns;
                        if pick.is_none_or(|(_, _, a)| arrival < a) {
                            pick = Some((class, head, arrival));
                        }
                    }
                }
                let Some((class, index, arrival)) = pick else {
                    break;
                };
                let t = u64::from(self.table.meta(index).tokens_estimated);
                if !tickets.is_empty() && !self.fits(limit, tokens, t) {
                    break 'fill;
                }
                self.queues[class].unlink(&mut self.table, index);
                self.sync_class(class);
                self.take_queued(now, index, arrival, &mut tickets);
                tokens += t;
            }
        }
        (slot, tickets)
    }

    /// Takes a free batch slot and fills it from bin `bin` (FIFO) up to `max_len` requests
    /// that pass the memory check; the rest stay at the front of the bin.
    fn fill_from_bin(&mut self, now: Nanos, bin: usize, max_len: usize) -> (u32, Vec<Ticket>) {
        let (slot, mut tickets) = self.take_batch_slot();
        let max_len = max_len.min(tickets.capacity());
        let mut tokens = 0u64;
        while tickets.len() < max_len {
            let Some(index) = self.research.bins[bin].front() else {
                break;
            };
            let meta = self.table.meta(index);
            let (t, arrival) = (u64::from(meta.tokens_estimated), meta.arrival_ns);
            if !tickets.is_empty() && !self.fits(BatchLimit::Memory, tokens, t) {
                break;
            }
            self.research.bins[bin].unlink(&mut self.table, index);
            self.research.queued -= 1;
            self.take_queued(now, index, arrival, &mut tickets);
            tokens += t;
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
        self.stats.batches_formed += 1;
        self.stats.batched_requests += tickets.len() as u64;
        self.stats.flush_reasons[reason.index()] += 1;
        self.workers[worker].on_dispatch(now);
        self.in_flight_batches += 1;
        let slot_ref = &mut self.batches[b];
        slot_ref.tickets = tickets;
        slot_ref.worker = worker as u32;
        slot_ref.dispatched_at_ns = now;
        slot_ref.state = BatchState::InFlight;
        out(Action::Dispatch {
            worker,
            batch: BatchId(slot),
            reason,
            tickets: &self.batches[b].tickets,
        });
    }

    /// The earliest instant at which some time-based rule fires.
    fn next_deadline(&mut self, now: Nanos) -> Option<Nanos> {
        let mut next = Nanos::MAX;
        if self.queued > 0 {
            let timeout_ns = self.strategy_timeout_ns();
            let can_dispatch = {
                let circuit = self.cfg.circuit;
                let max = self.cfg.max_inflight_per_worker;
                self.workers
                    .iter_mut()
                    .any(|w| w.can_take(now, max, &circuit))
            };
            if self.strategy == StrategyKind::MultiBin {
                for bin in 0..self.research.cfg.bins {
                    if let Some(head) = self.research.bins[bin].front() {
                        let arrival = self.table.meta(head).arrival_ns;
                        next = next.min(arrival.saturating_add(self.cfg.request_timeout_ns));
                    }
                }
            }
            let research = self.strategy.is_research();
            for summary in self.summarize().iter().filter(|s| s.len > 0) {
                if research {
                    // Work-conserving: only the request deadline is a timer.
                    next = next.min(summary.oldest.saturating_add(self.cfg.request_timeout_ns));
                    continue;
                }
                next = next.min(summary.oldest.saturating_add(self.cfg.request_timeout_ns));
                if can_dispatch && self.strategy != StrategyKind::Auto {
                    next = next.min(summary.max_wait_at);
                    if summary.len >= self.cfg.min_batch_size {
                        next = next.min(summary.oldest.saturating_add(timeout_ns));
                    }
                }
            }
            if can_dispatch {
                next = next.min(self.auto_hold_until);
            } else {
                // Work waits for a worker: an open circuit reopening is an event too.
                let circuit = self.cfg.circuit;
                for w in &self.workers {
                    if let Some(t) = w.circuit.reopens_at(&circuit) {
                        next = next.min(t);
                    }
                }
            }
        }
        if self.in_flight_batches > 0 {
            for slot in &self.batches {
                if slot.state == BatchState::InFlight {
                    next = next.min(
                        slot.dispatched_at_ns
                            .saturating_add(self.cfg.batch_timeout_ns),
                    );
                }
            }
        }
        if self.strategy == StrategyKind::LatencyAware && self.queued > 0 {
            next = next.min(
                self.p99_refreshed_at_ns
                    .saturating_add(self.cfg.p99_refresh_ns),
            );
        }
        (next != Nanos::MAX).then_some(next.max(now))
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

/// Longest batch `cfg` can form: `max_batch_size`, or the research strategies' `b_max`.
fn max_batch_len(cfg: &CoreConfig) -> usize {
    let research = cfg.research.memory.b_max.max(cfg.research.sla.b_max) as usize;
    cfg.max_batch_size.max(research).max(1)
}

/// What a scan of one group's queues found.
#[derive(Clone, Copy, Debug)]
struct GroupSummary {
    len: usize,
    tokens: u64,
    oldest: Nanos,
    critical: bool,
    /// Earliest instant a queued head reaches its priority's max wait.
    max_wait_at: Nanos,
    /// Shortest max wait among the priorities queued in the group.
    max_wait_min_ns: Nanos,
}

impl GroupSummary {
    const EMPTY: GroupSummary = GroupSummary {
        len: 0,
        tokens: 0,
        oldest: Nanos::MAX,
        critical: false,
        max_wait_at: Nanos::MAX,
        max_wait_min_ns: Nanos::MAX,
    };
}

/// Lower is more urgent.
fn reason_rank(r: FlushReason) -> u8 {
    match r {
        FlushReason::Drain => 0,
        FlushReason::Critical => 1,
        FlushReason::Full => 2,
        FlushReason::MaxWait => 3,
        FlushReason::Timeout => 4,
        FlushReason::IdleWorker => 5,
    }
}

#[cfg(test)]
mod auto_tests;
#[cfg(test)]
mod tests;
