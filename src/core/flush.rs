//! The flush decision: `poll` (expire, then release every batch that is due and has a
//! worker), which group is due and why (drain, critical, full, max wait, the strategy's
//! timeout, an idle worker, or `auto`'s go/hold), and the next instant a time-based rule
//! fires.
//!
//! What must never happen here: a clock read (time is the `now` passed in), I/O, or an
//! allocation (group summaries are fixed arrays on the stack); a deadline the driver is not
//! told about.

use super::request::{self, Nanos, Priority, BUCKET_COUNT};
use super::stats::FlushReason;
use super::strategy::{self, auto, StrategyKind};
use super::{Action, BatchState, Core};

impl Core {
    /// Runs the scheduler at `now`: fails expired work, releases every batch that is due and
    /// has a worker, and returns the next instant it needs to run again by itself (`None`:
    /// only an admission or a completion can change anything).
    pub fn poll(&mut self, now: Nanos, out: &mut impl FnMut(Action<'_>)) -> Option<Nanos> {
        if self.rest_if_idle() {
            return None;
        }
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

    /// A poll of a core with nothing queued, nothing out and no strategy timer of its own:
    /// it sets what the full pass of [`Core::poll`] would set (no hold, no deadline, no
    /// action) without its scans, and returns true; otherwise false and nothing changes. An
    /// engine polls every backend's core each turn, idle or not (24 in the router tier's
    /// config), and calls this first to skip an idle one.
    #[inline]
    pub fn rest_if_idle(&mut self) -> bool {
        if self.queued == 0
            && self.in_flight_batches == 0
            && !self.strategy.is_research()
            && self.strategy != StrategyKind::LatencyAware
        {
            self.auto_hold_until = Nanos::MAX;
            self.auto_hold_started = Nanos::MAX;
            return true;
        }
        false
    }

    /// The most urgent group that is due now, with why. Urgency: drain, critical, full,
    /// max_wait, timeout, idle_worker; ties go to the group with the oldest request.
    fn due_group(&mut self, now: Nanos) -> Option<(usize, FlushReason)> {
        if self.queued == 0 {
            return None;
        }
        let is_auto = self.strategy == StrategyKind::Auto;
        // `auto` holds by its own rule, not a timeout: the timeout arm below is not reached.
        let timeout_ns = if is_auto {
            Nanos::MAX
        } else {
            self.strategy_timeout_ns()
        };
        let free_workers = if is_auto {
            self.free_workers(now, 2)
        } else {
            0
        };
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
                || s.alone
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
            let meta = self.table.meta(head);
            let (arrival, alone) = (meta.arrival_ns, self.cfg.alone.of(meta));
            let max_wait = request::ms_to_nanos(self.cfg.priority_max_wait_ms[priority.index()]);
            let s = &mut groups[g];
            s.alone |= alone;
            s.len += q.len();
            s.tokens += q.tokens();
            s.oldest = s.oldest.min(arrival);
            s.critical |= priority == Priority::Critical;
            s.max_wait_at = s.max_wait_at.min(arrival.saturating_add(max_wait));
            s.max_wait_min_ns = s.max_wait_min_ns.min(max_wait);
        }
        groups
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

    /// `auto`: should group `g` (summary `s`) go now, with `free` workers able to take a
    /// batch (counted up to 2), or be held (not past `latest`)? With more than one free,
    /// holding only delays it (the requests it would wait for can have a worker of their
    /// own), unless a burst is arriving (then every free worker is counted and `auto`
    /// splits the burst over them) or an open loop's replayed window is in force (which
    /// holds as a fixed window does, free workers or not). Otherwise `auto` decides; a hold is remembered in
    /// `auto_hold_until` for [`Core::next_deadline`]. Each group is asked on its own, so two
    /// groups held in one poll can each plan on the same free workers.
    fn auto_goes(
        &mut self,
        now: Nanos,
        g: usize,
        s: &GroupSummary,
        free: usize,
        latest: Nanos,
    ) -> bool {
        // Several free: the requests it would wait for can have a worker of their own, unless
        // a burst is arriving, which `auto` splits over the free workers, or a window holds.
        let free_workers = if free > 1 {
            if !self.auto.holds_by_window() && !self.auto.burst_open(now) {
                return true;
            }
            self.free_workers(now, usize::MAX)
        } else {
            1
        };
        // Room for joiners: in requests, and in tokens at the group's mean per request (a
        // joiner that cannot fit would not join this batch).
        let per_request = (s.tokens / s.len.max(1) as u64).max(1);
        let token_room =
            u64::from(self.cfg.max_batch_tokens).saturating_sub(s.tokens) / per_request;
        let room = self
            .cfg
            .max_batch_size
            .saturating_sub(s.len)
            .min(usize::try_from(token_room).unwrap_or(usize::MAX));
        let group = auto::Group {
            queued: s.len,
            tokens: s.tokens,
            room,
            bucket: self.cfg.token_bucketing.then_some(g),
            latest,
            oldest: s.oldest,
            // Only where the pacing rule can use it: several workers, a batch in flight, a
            // fixed cost fitted (without one, `auto` dispatches before looking).
            other_free_in: if self.workers.len() > 1
                && self.in_flight_batches > 0
                && self.auto.cost().a_ns > 0.0
            {
                self.next_completion_in(now)
            } else {
                None
            },
            free_workers,
        };
        match self.auto.decide(now, &group) {
            auto::Decision::Go => true,
            auto::Decision::HoldUntil(t) => {
                self.auto_hold_until = self.auto_hold_until.min(t);
                false
            }
        }
    }

    /// When the first batch in flight is expected to end, ns from `now`, by `auto`'s fitted
    /// cost (`None`: none in flight).
    fn next_completion_in(&self, now: Nanos) -> Option<Nanos> {
        let cost = self.auto.cost();
        let mut next: Option<Nanos> = None;
        for slot in &self.batches {
            if slot.state != BatchState::InFlight {
                continue;
            }
            let service = cost.service_ns(slot.tickets.len() as f64, slot.tokens as f64) as Nanos;
            let end = slot.dispatched_at_ns.saturating_add(service);
            next = Some(next.map_or(end, |n| n.min(end)));
        }
        next.map(|t| t.saturating_sub(now))
    }

    /// Workers that can take a batch now, counted up to `most` (most callers only ask for
    /// none, one, or more than one, so a large pool is not walked at every poll).
    fn free_workers(&mut self, now: Nanos, most: usize) -> usize {
        let circuit = self.cfg.circuit;
        let max = self.cfg.max_inflight_per_worker;
        let mut free = 0;
        for w in self.workers.iter_mut() {
            free += usize::from(w.can_take(now, max, &circuit));
            if free == most {
                break;
            }
        }
        free
    }

    fn any_idle_worker(&mut self, now: Nanos) -> bool {
        let circuit = self.cfg.circuit;
        self.workers.iter_mut().any(|w| w.is_idle(now, &circuit))
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
    /// A queued head goes in a batch of its own ([`CoreConfig::alone`]): the group is as full
    /// as it gets.
    ///
    /// [`CoreConfig::alone`]: super::CoreConfig::alone
    alone: bool,
}

impl GroupSummary {
    const EMPTY: GroupSummary = GroupSummary {
        len: 0,
        tokens: 0,
        oldest: Nanos::MAX,
        critical: false,
        max_wait_at: Nanos::MAX,
        max_wait_min_ns: Nanos::MAX,
        alone: false,
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
