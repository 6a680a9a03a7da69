//! Counters the core keeps in plain fields: outcomes, flush reasons, queue-wait histogram,
//! and a sliding window of recent latencies for the latency-aware strategy's p99.
//!
//! Everything is sized in `new`; recording never allocates. The runtime copies these out as
//! snapshots, so nothing here is shared across threads.

use super::request::Nanos;

/// Why a batch was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushReason {
    /// `max_batch_size` or `max_batch_tokens` reached.
    Full,
    /// The strategy's timeout for the oldest request passed.
    Timeout,
    /// A critical request was queued.
    Critical,
    /// A request reached its priority's max wait.
    MaxWait,
    /// A worker was idle and `dispatch_when_idle` is on.
    IdleWorker,
    /// The engine is draining for shutdown.
    Drain,
}

impl FlushReason {
    /// Number of reasons.
    pub const COUNT: usize = 6;
    /// Every reason, in metric order.
    pub const ALL: [FlushReason; 6] = [
        FlushReason::Full,
        FlushReason::Timeout,
        FlushReason::Critical,
        FlushReason::MaxWait,
        FlushReason::IdleWorker,
        FlushReason::Drain,
    ];

    /// Metric label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            FlushReason::Full => "full",
            FlushReason::Timeout => "timeout",
            FlushReason::Critical => "critical",
            FlushReason::MaxWait => "max_wait",
            FlushReason::IdleWorker => "idle_worker",
            FlushReason::Drain => "drain",
        }
    }

    /// Dense index.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Number of log2 buckets in [`WaitHistogram`]: bucket `i` holds waits in
/// `[2^(i-1), 2^i)` ns (bucket 0 holds 0 ns); 2^40 ns is about 18 minutes.
pub const WAIT_BUCKETS: usize = 41;

/// Histogram of queue waits with power-of-two nanosecond buckets.
#[derive(Clone, Copy, Debug)]
pub struct WaitHistogram {
    pub counts: [u64; WAIT_BUCKETS],
    pub sum_ns: u64,
    pub count: u64,
}

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram {
            counts: [0; WAIT_BUCKETS],
            sum_ns: 0,
            count: 0,
        }
    }
}

impl WaitHistogram {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &WaitHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        self.count += other.count;
    }

    /// Records one wait.
    pub fn record(&mut self, wait_ns: Nanos) {
        let bucket = (u64::BITS - wait_ns.leading_zeros()) as usize;
        self.counts[bucket.min(WAIT_BUCKETS - 1)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(wait_ns);
        self.count += 1;
    }

    /// Upper bound (exclusive) in ns of bucket `i`.
    pub fn bucket_upper_ns(i: usize) -> u64 {
        1u64 << i.min(63)
    }

    /// Mean wait in ns (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }
}

/// Outcome and batching counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreStats {
    /// Requests accepted into the table.
    pub admitted: u64,
    /// LoRA adapters loaded into a worker's slots for a batch (each paid `lora_load_ms`).
    pub lora_loads: u64,
    /// Requests moved into the table from another backend's core after a failure there
    /// (`Core::readmit`); not in `admitted`, so admitted + readmitted = completed + failed +
    /// live for one core.
    pub readmitted: u64,
    /// Requests refused at admission because the table was full.
    pub rejected_full: u64,
    /// Requests refused at admission because the core is draining.
    pub rejected_draining: u64,
    /// Requests answered with a result.
    pub completed: u64,
    /// Requests answered with an error (any reason).
    pub failed: u64,
    /// Of `failed`: waited in the queue past `request_timeout`.
    pub expired: u64,
    /// Of `failed`: their worker did not answer within `batch_timeout`.
    pub batch_timeouts: u64,
    /// Of `failed`: their worker reported an error.
    pub worker_errors: u64,
    /// Of `failed`: cancelled by the client.
    pub cancelled: u64,
    /// Of `failed`: aborted at shutdown deadline.
    pub aborted: u64,
    /// Batches handed to workers.
    pub batches_formed: u64,
    /// Requests handed to workers in batches (sum of batch sizes).
    pub batched_requests: u64,
    /// Batches by flush reason (index: [`FlushReason::index`]).
    pub flush_reasons: [u64; FlushReason::COUNT],
    /// How long requests waited in the queue before dispatch.
    pub queue_wait: WaitHistogram,
}

impl CoreStats {
    /// Adds `other`'s counters to these (one engine runs a core per backend; metrics show
    /// their sum).
    pub fn merge(&mut self, other: &CoreStats) {
        self.admitted += other.admitted;
        self.readmitted += other.readmitted;
        self.rejected_full += other.rejected_full;
        self.rejected_draining += other.rejected_draining;
        self.completed += other.completed;
        self.failed += other.failed;
        self.expired += other.expired;
        self.batch_timeouts += other.batch_timeouts;
        self.worker_errors += other.worker_errors;
        self.cancelled += other.cancelled;
        self.aborted += other.aborted;
        self.batches_formed += other.batches_formed;
        self.batched_requests += other.batched_requests;
        for (a, b) in self
            .flush_reasons
            .iter_mut()
            .zip(other.flush_reasons.iter())
        {
            *a += b;
        }
        self.queue_wait.merge(&other.queue_wait);
    }

    /// Mean batch size so far (0 before the first batch).
    pub fn avg_batch_size(&self) -> f64 {
        if self.batches_formed == 0 {
            0.0
        } else {
            self.batched_requests as f64 / self.batches_formed as f64
        }
    }
}

/// Sliding window of the last N end-to-end latencies, with a cached p99.
///
/// Invariant: `len <= samples.len()`; `scratch.len() == samples.len()`.
pub struct LatencyWindow {
    samples: Vec<Nanos>,
    scratch: Vec<Nanos>,
    next: usize,
    len: usize,
    /// Samples recorded since `p99` was last computed.
    dirty: bool,
    p99: Option<Nanos>,
}

impl LatencyWindow {
    /// A window of `size` samples (at least 1); the Go spec's `percentile_window_size` 1000.
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        LatencyWindow {
            samples: vec![0; size],
            scratch: vec![0; size],
            next: 0,
            len: 0,
            dirty: false,
            p99: None,
        }
    }

    /// Records one latency, evicting the oldest when full.
    pub fn record(&mut self, latency_ns: Nanos) {
        self.samples[self.next] = latency_ns;
        self.next = (self.next + 1) % self.samples.len();
        self.len = (self.len + 1).min(self.samples.len());
        self.dirty = true;
    }

    /// Recomputes the p99 if samples arrived since the last call (O(window), no allocation).
    pub fn refresh(&mut self) -> Option<Nanos> {
        if self.dirty && self.len > 0 {
            let s = &mut self.scratch[..self.len];
            s.copy_from_slice(&self.samples[..self.len]);
            // Nearest-rank p99: the smallest sample with at least 99 % at or below it.
            let rank = (self.len * 99).div_ceil(100).max(1) - 1;
            let (_, p, _) = s.select_nth_unstable(rank);
            self.p99 = Some(*p);
            self.dirty = false;
        }
        self.p99
    }

    /// The p99 as last refreshed.
    pub fn p99(&self) -> Option<Nanos> {
        self.p99
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_histogram_buckets_by_powers_of_two() {
        let mut h = WaitHistogram::default();
        h.record(0);
        h.record(1);
        h.record(1023);
        h.record(1024);
        h.record(u64::MAX);
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[10], 1);
        assert_eq!(h.counts[11], 1);
        assert_eq!(h.counts[WAIT_BUCKETS - 1], 1);
        assert_eq!(h.count, 5);
    }

    #[test]
    fn p99_of_one_to_one_thousand_is_nine_hundred_ninety() {
        let mut w = LatencyWindow::new(1000);
        assert_eq!(w.refresh(), None);
        for i in 1..=1000 {
            w.record(i);
        }
        assert_eq!(w.refresh(), Some(990));
        // The window slides: 1000 more samples of 5 push every old sample out.
        for _ in 0..1000 {
            w.record(5);
        }
        assert_eq!(w.refresh(), Some(5));
    }
}
