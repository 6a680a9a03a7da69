//! What one simulation run measures while it runs: latency histogram, queue waits, SLA
//! hits, token counts, batch sizes, failures and the time series.
//!
//! Every buffer is sized when the run starts (the histogram's range, one counter per
//! possible batch size); recording is O(1) and allocation-free, except the time series,
//! which grows by one window per window of virtual time. Times are virtual ns.

use super::series::TimeSeries;
use super::tokens::TokenRecord;
use super::workload::{Digest, SimRequest};
use crate::core::Priority;
use crate::latency_histogram::latency_histogram;
pub use crate::latency_histogram::LATENCY_MAX_NS;
use hdrhistogram::Histogram;

/// Latency and counts of one priority class.
#[derive(Clone, Debug)]
pub struct PriorityRecord {
    /// End-to-end latency of this class's completed requests, ns, 3 significant digits.
    pub latency_ns: Histogram<u64>,
    pub latency_sum_ns: u128,
    pub offered: u64,
    pub completed: u64,
    /// Failed (timeouts) or refused at admission.
    pub failed: u64,
}

impl PriorityRecord {
    fn new() -> Self {
        PriorityRecord {
            latency_ns: latency_histogram(),
            latency_sum_ns: 0,
            offered: 0,
            completed: 0,
            failed: 0,
        }
    }
}

/// Measurements of one run.
#[derive(Clone, Debug)]
pub struct Recorder {
    /// End-to-end latency (arrival to completion) of completed requests, ns, 3 significant
    /// digits.
    pub latency_ns: Histogram<u64>,
    pub latency_sum_ns: u128,
    pub queue_wait_sum_ns: u128,
    pub dispatched: u64,
    pub offered: u64,
    pub admitted: u64,
    pub rejected_full: u64,
    pub completed: u64,
    pub failed: u64,
    pub sla_met: u64,
    pub sla_ns: u64,
    pub prompt_tokens_completed: u64,
    pub output_tokens_completed: u64,
    /// `batch_sizes[s]` = batches of size `s`.
    pub batch_sizes: Vec<u64>,
    pub first_arrival_ns: Option<u64>,
    pub last_completion_ns: u64,
    /// Fingerprint of every request offered to the core, in offer order.
    pub offered_digest: Digest,
    /// Per priority class (indexed by [`Priority::index`]): what `latency_ns` and the
    /// offered / completed / failed counts are for all requests.
    pub by_priority: [PriorityRecord; Priority::COUNT],
    pub series: TimeSeries,
    /// Continuous batching only: TTFT, TPOT, ITL, goodput, steps, KV and slots.
    pub tokens: Option<Box<TokenRecord>>,
}

impl Recorder {
    /// A recorder for batches of at most `max_batch_size`, an SLA of `sla_ns`, and a series
    /// of `window_ns` windows expected to span `expected_ns`.
    pub fn new(max_batch_size: usize, sla_ns: u64, window_ns: u64, expected_ns: u64) -> Self {
        Recorder {
            latency_ns: latency_histogram(),
            latency_sum_ns: 0,
            queue_wait_sum_ns: 0,
            dispatched: 0,
            offered: 0,
            admitted: 0,
            rejected_full: 0,
            completed: 0,
            failed: 0,
            sla_met: 0,
            sla_ns,
            prompt_tokens_completed: 0,
            output_tokens_completed: 0,
            batch_sizes: vec![0; max_batch_size + 1],
            first_arrival_ns: None,
            last_completion_ns: 0,
            offered_digest: Digest::default(),
            by_priority: std::array::from_fn(|_| PriorityRecord::new()),
            series: TimeSeries::new(window_ns, expected_ns),
            tokens: None,
        }
    }

    /// A request was offered to the core (admitted or not).
    pub fn on_offer(&mut self, r: &SimRequest, admitted: bool) {
        self.offered += 1;
        self.offered_digest.push(r);
        self.first_arrival_ns.get_or_insert(r.arrival_ns);
        let class = &mut self.by_priority[r.priority.index()];
        class.offered += 1;
        if admitted {
            self.admitted += 1;
        } else {
            class.failed += 1;
            self.rejected_full += 1;
            self.series.on_fail(r.arrival_ns);
        }
    }

    /// A request left the queue in a batch at `now_ns`.
    pub fn on_dispatched(&mut self, now_ns: u64, r: &SimRequest) {
        self.dispatched += 1;
        self.queue_wait_sum_ns += u128::from(now_ns.saturating_sub(r.arrival_ns));
    }

    /// A batch of `size` requests was formed at `now_ns`.
    pub fn on_batch(&mut self, now_ns: u64, size: usize) {
        let last = self.batch_sizes.len() - 1;
        self.batch_sizes[size.min(last)] += 1;
        self.series.on_dispatch(now_ns, size);
    }

    /// A request completed at `now_ns`.
    pub fn on_complete(&mut self, now_ns: u64, r: &SimRequest) {
        let latency = now_ns.saturating_sub(r.arrival_ns);
        self.latency_ns.saturating_record(latency.max(1));
        self.latency_sum_ns += u128::from(latency);
        self.completed += 1;
        let class = &mut self.by_priority[r.priority.index()];
        class.latency_ns.saturating_record(latency.max(1));
        class.latency_sum_ns += u128::from(latency);
        class.completed += 1;
        if latency <= self.sla_ns {
            self.sla_met += 1;
        }
        self.prompt_tokens_completed += u64::from(r.prompt_tokens);
        self.output_tokens_completed += u64::from(r.output_tokens);
        self.last_completion_ns = self.last_completion_ns.max(now_ns);
        self.series.on_complete(now_ns, latency);
    }

    /// Request `r` was answered with an error at `now_ns` (queue or batch timeout).
    pub fn on_fail(&mut self, now_ns: u64, r: &SimRequest) {
        self.by_priority[r.priority.index()].failed += 1;
        self.failed += 1;
        self.series.on_fail(now_ns);
    }
}
