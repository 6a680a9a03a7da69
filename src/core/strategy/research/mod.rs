//! State of the research strategies `dynamic` (Pang et al.: memory- and SLA-constrained
//! batch size, Algorithms 1-3) and `multi_bin` (Guldogan et al.: K bins by predicted output
//! length, Algorithms 4-7), as the core uses them.
//!
//! Everything of theirs lives in this directory: the algorithms in [`memory`], [`sla`],
//! [`bins`] and [`batch_stats`], their config table in [`keys`], their tests in `tests`;
//! this file holds their instances, the bin FIFOs, and the glue: the batch-size target,
//! bin choice, and the statistics update after every completed batch. Nothing here
//! allocates after `new`.

pub mod batch_stats;
pub mod bins;
pub mod keys;
pub mod memory;
pub mod sla;
#[cfg(test)]
mod tests;

use crate::core::request::{Nanos, RequestMeta};
use crate::core::table::{Fifo, RequestTable};
use batch_stats::EMA_WEIGHT;
use batch_stats::{BatchObservation, BatchStats, OUTPUT_SAMPLE_CAPACITY};
use bins::{
    choose_age_aware, longest_queue, BinBoundaries, BinPolicy, LengthPredictor, PredictorKind,
    RoundRobin, BIN_COUNT_MAX,
};
use memory::MemoryModel;
use sla::{SlaController, SlaParams};

/// Settings of the research strategies.
#[derive(Clone, Debug, PartialEq)]
pub struct ResearchConfig {
    pub memory: MemoryModel,
    pub sla: SlaParams,
    /// Number of bins K for `multi_bin` (1..=64).
    pub bins: usize,
    pub bin_policy: BinPolicy,
    pub predictor: PredictorKind,
    /// Largest `max_tokens` a request may ask for (upper bin edge before statistics).
    pub max_tokens_limit: u32,
    /// Bin boundaries are recomputed from observed lengths every this many completed
    /// requests (a bounded sample; never on the admission path).
    pub recompute_every: u32,
}

impl Default for ResearchConfig {
    fn default() -> Self {
        ResearchConfig {
            memory: MemoryModel::default(),
            sla: SlaParams::default(),
            bins: 4,
            bin_policy: BinPolicy::AgeAware,
            predictor: PredictorKind::MaxTokens,
            max_tokens_limit: 32_768,
            recompute_every: 1000,
        }
    }
}

/// Controller state exported to metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResearchSnapshot {
    pub b_mem: u32,
    pub b_sla: u32,
    pub b_low: u32,
    pub b_high: u32,
    pub tbt_ms_ema: Option<f64>,
    pub mean_tokens_per_request: Option<f64>,
    pub bins: usize,
    /// Requests waiting per bin (first `bins` entries meaningful).
    pub bin_lens: [usize; BIN_COUNT_MAX],
    /// Upper edge (exclusive) of each bin in predicted output tokens.
    pub bin_upper_tokens: [u32; BIN_COUNT_MAX],
    /// Batches shrunk to pass the memory check.
    pub memory_limit_hits: u64,
    pub boundary_recomputes: u64,
}

impl Default for ResearchSnapshot {
    fn default() -> Self {
        ResearchSnapshot {
            b_mem: 0,
            b_sla: 0,
            b_low: 0,
            b_high: 0,
            tbt_ms_ema: None,
            mean_tokens_per_request: None,
            bins: 0,
            bin_lens: [0; BIN_COUNT_MAX],
            bin_upper_tokens: [0; BIN_COUNT_MAX],
            memory_limit_hits: 0,
            boundary_recomputes: 0,
        }
    }
}

/// One bin's own statistics and SLA controller (Algorithm 5: every bin is sized and
/// controlled from its own batches; a bin of long answers and one of short answers have
/// different memory footprints and batch times, so one shared average fits neither).
#[derive(Clone, Copy, Debug)]
pub struct BinState {
    /// Algorithm 2 for this bin's batches only.
    pub sla: SlaController,
    /// EMA of prompt + output tokens per request in this bin's batches. Meaningless while
    /// `batches == 0`.
    tokens_per_request_ema: f64,
    /// EMA of this bin's batch service time, ns. Meaningless while `batches == 0`.
    service_ns_ema: f64,
    /// Completed batches observed (saturating).
    batches: u64,
}

impl BinState {
    fn new(sla: SlaParams) -> Self {
        BinState {
            sla: SlaController::new(sla),
            tokens_per_request_ema: 0.0,
            service_ns_ema: 0.0,
            batches: 0,
        }
    }

    /// Mean prompt + output tokens per request of this bin; `None` before its first batch.
    pub fn tokens_per_request(&self) -> Option<f64> {
        (self.batches > 0).then_some(self.tokens_per_request_ema)
    }

    /// Mean batch service time of this bin, ns; `None` before its first batch.
    pub fn service_ns(&self) -> Option<f64> {
        (self.batches > 0).then_some(self.service_ns_ema)
    }

    fn observe(&mut self, size: u32, tokens_sum: u64, service_ns: Nanos, tbt_ms: Option<f64>) {
        let tokens = tokens_sum as f64 / f64::from(size);
        let service = service_ns as f64;
        if self.batches == 0 {
            self.tokens_per_request_ema = tokens;
            self.service_ns_ema = service;
        } else {
            let w = EMA_WEIGHT;
            self.tokens_per_request_ema = w * tokens + (1.0 - w) * self.tokens_per_request_ema;
            self.service_ns_ema = w * service + (1.0 - w) * self.service_ns_ema;
        }
        self.batches = self.batches.saturating_add(1);
        if let Some(tbt_ms) = tbt_ms {
            self.sla.update(tbt_ms, size);
        }
    }
}

/// The research strategies' live state.
pub struct Research {
    pub cfg: ResearchConfig,
    pub stats: BatchStats,
    pub sla: SlaController,
    pub boundaries: BinBoundaries,
    /// The `round_robin` policy's cursor (unused by the others).
    pub round_robin: RoundRobin,
    pub predictor: LengthPredictor,
    /// Per-bin statistics and controllers (only the first `cfg.bins` are used).
    pub bin_state: [BinState; BIN_COUNT_MAX],
    /// One FIFO per bin (only the first `cfg.bins` are used).
    pub bins: [Fifo; BIN_COUNT_MAX],
    /// Requests in all bins.
    pub queued: usize,
    completed_since_recompute: u32,
    /// Requests completed since start (saturating): sets the early recompute schedule.
    completed_total: u32,
    pub memory_limit_hits: u64,
    pub boundary_recomputes: u64,
    /// Scratch for bin lengths given to the length-based bin policies.
    lens: [usize; BIN_COUNT_MAX],
    /// The bins are in use (`multi_bin` in force): only then are the boundaries recomputed
    /// as batches complete (a recompute costs ~60 us at K = 4); switching to `multi_bin`
    /// recomputes them at once from the samples gathered meanwhile (`use_bins`).
    bins_in_use: bool,
}

impl Research {
    /// State for `cfg` (which must be valid: see `MemoryModel::validate`, `SlaParams::validate`).
    pub fn new(cfg: ResearchConfig) -> Research {
        let bins = cfg.bins.clamp(1, BIN_COUNT_MAX);
        Research {
            stats: BatchStats::new(OUTPUT_SAMPLE_CAPACITY),
            sla: SlaController::new(cfg.sla),
            boundaries: BinBoundaries::new(bins, cfg.max_tokens_limit, OUTPUT_SAMPLE_CAPACITY),
            round_robin: RoundRobin::default(),
            predictor: LengthPredictor::new(cfg.predictor),
            bin_state: [BinState::new(cfg.sla); BIN_COUNT_MAX],
            bins: [Fifo::default(); BIN_COUNT_MAX],
            queued: 0,
            completed_since_recompute: 0,
            completed_total: 0,
            bins_in_use: false,
            memory_limit_hits: 0,
            boundary_recomputes: 0,
            lens: [0; BIN_COUNT_MAX],
            cfg: ResearchConfig { bins, ..cfg },
        }
    }

    /// The bin a request belongs to (by predicted output length).
    pub fn bin_for(&self, meta: &RequestMeta) -> usize {
        self.boundaries.bin_of(self.predictor.predict_for(meta))
    }

    /// Algorithm 1: the memory-constrained batch size for `bin` (`None`: no bins).
    ///
    /// A bin with completed batches is sized from its own mean request length (per-bin
    /// statistics). Before that, from the global mean capped by the reference's per-bin
    /// cap, which assumes prompt ~ output at the bin's midpoint and an open last bin as
    /// long as the context: a prior only, since it holds a bin of ~1,000-token answers to
    /// 7 requests where 30 fit (measured on `long_tail`, where that cap, applied to the
    /// one bin everything fell in before statistics, overloaded the workers). Every batch
    /// still passes the memory check on its real token counts.
    pub fn b_mem(&self, bin: Option<usize>) -> u32 {
        let Some(b) = bin else {
            return self
                .cfg
                .memory
                .b_mem(self.stats.mean_tokens_per_request(), None);
        };
        if let Some(mean) = self.bin_state[b].tokens_per_request() {
            return self.cfg.memory.b_mem(Some(mean), None);
        }
        let (lo, hi) = self.boundaries.bounds(b);
        let cap = self.cfg.memory.per_bin_cap(lo, hi);
        self.cfg
            .memory
            .b_mem(self.stats.mean_tokens_per_request(), Some(cap))
    }

    /// The SLA controller of `bin` (`None`: the global one `dynamic` uses).
    pub fn sla_for(&self, bin: Option<usize>) -> &SlaController {
        bin.map_or(&self.sla, |b| &self.bin_state[b].sla)
    }

    /// Algorithm 3's target: `min(b_mem, b_SLA)`, at least 1, for a queue of `backlog`
    /// waiting requests.
    ///
    /// The controller is the bin's own for `multi_bin`, the global one for `dynamic`.
    ///
    /// Adaptation for request-level batching (a deviation from the paper, which schedules
    /// iterations): the paper's floor `b_SLA >= N_decode` is what lets its batch grow with
    /// demand, and here no request of a new batch is decoding yet (`N_decode` = 0). The
    /// waiting backlog is the substitute: those are the requests the paper's loop, stepping
    /// every few ms, would already have admitted. So while more requests wait than the
    /// interval's midpoint, the SLA bounds the batch only when it is being missed (`tau`
    /// above the band: `b_high`, which the too-slow branch pulls down); otherwise the
    /// memory bound and the backlog decide. Probing `b_high` instead (one window width
    /// above the average batch per completed batch) grew too slowly where a batch lasts
    /// seconds: measured on `long_tail` (batches of ~7 s), `dynamic` overloaded for its
    /// first 250 s and lost 61 requests to queue timeouts that `fixed` completes.
    pub fn b_target(&self, bin: Option<usize>, backlog: usize) -> u32 {
        let sla = self.sla_for(bin);
        let mid = sla.b_sla(0);
        let b_sla = if backlog <= mid as usize {
            mid
        } else if sla.too_slow() {
            sla.b_high().max(mid)
        } else {
            sla.params().b_max
        };
        self.b_mem(bin).min(b_sla).max(1)
    }

    /// Algorithm 5: the bin to serve next, among non-empty ones, at `now`. With the
    /// `age_aware` and `response_ratio` policies a head waiting `age_bound_ns` or more goes
    /// first; else `age_aware` serves the oldest head, `response_ratio` the highest ratio
    /// of wait to the bin's expected batch time ([`choose_age_aware`]).
    pub fn choose_bin(
        &mut self,
        now: Nanos,
        table: &RequestTable,
        age_bound_ns: Nanos,
    ) -> Option<usize> {
        let k = self.cfg.bins;
        let policy = self.cfg.bin_policy;
        if matches!(policy, BinPolicy::RoundRobin | BinPolicy::LongestQueue) {
            for (len, bin) in self.lens[..k].iter_mut().zip(&self.bins) {
                *len = bin.len();
            }
            return match policy {
                BinPolicy::RoundRobin => self.round_robin.choose(&self.lens[..k]),
                _ => longest_queue(&self.lens[..k]),
            };
        }
        let mut waits = [None; BIN_COUNT_MAX];
        for (wait, bin) in waits[..k].iter_mut().zip(&self.bins) {
            *wait = bin
                .front()
                .map(|head| now.saturating_sub(table.meta(head).arrival_ns));
        }
        // age_aware: every bin's expected time the same (1 ns), so the ratio orders heads
        // by age.
        let mut services = [1.0; BIN_COUNT_MAX];
        if policy == BinPolicy::ResponseRatio {
            // A bin without statistics expects the mean batch time of the bins with some
            // (none yet: 1 ns for all, so the oldest head first).
            let (mut sum, mut n) = (0.0, 0u32);
            for s in self.bin_state[..k].iter().filter_map(BinState::service_ns) {
                sum += s;
                n += 1;
            }
            let fallback = if n > 0 { sum / f64::from(n) } else { 1.0 };
            for (service, st) in services[..k].iter_mut().zip(&self.bin_state) {
                *service = st.service_ns().unwrap_or(fallback).max(1.0);
            }
        }
        choose_age_aware(&waits[..k], &services[..k], age_bound_ns)
    }

    /// Algorithm 7: statistics and controller after a completed batch. `requests` yields
    /// (prompt tokens, output tokens) per request; `service_ns` is the batch's service time;
    /// `bin` the bin it came from (`multi_bin`), whose own statistics and controller learn
    /// from it too.
    pub fn observe_batch(
        &mut self,
        requests: impl Iterator<Item = (u32, u32)> + Clone,
        service_ns: Nanos,
        bin: Option<usize>,
    ) {
        let mut size = 0u32;
        let mut prompt_sum = 0u64;
        let mut output_sum = 0u64;
        let mut output_max = 0u32;
        for (prompt, output) in requests.clone() {
            size += 1;
            prompt_sum += u64::from(prompt);
            output_sum += u64::from(output);
            output_max = output_max.max(output);
            self.stats.record_output_tokens(output);
            self.predictor.observe(prompt, output);
        }
        if size == 0 {
            return;
        }
        // Decode time between tokens: the batch's service time over its decode steps (the
        // longest output). Embedding-only batches have no decode steps and teach the SLA
        // controller nothing.
        let tbt_ms = (output_max > 0).then(|| service_ns as f64 / 1e6 / f64::from(output_max));
        if let Some(tbt_ms) = tbt_ms {
            self.stats.observe_batch(&BatchObservation {
                batch_size: size,
                prompt_tokens_sum: prompt_sum,
                output_tokens_sum: output_sum,
                decode_tbt_ms: tbt_ms,
            });
            self.sla.update(tbt_ms, size);
        }
        if let Some(b) = bin.filter(|&b| b < self.cfg.bins) {
            self.bin_state[b].observe(size, prompt_sum + output_sum, service_ns, tbt_ms);
        }
        self.completed_since_recompute = self.completed_since_recompute.saturating_add(size);
        self.completed_total = self.completed_total.saturating_add(size);
        if self.bins_in_use && self.completed_since_recompute >= self.recompute_period() {
            self.recompute_boundaries();
        }
    }

    /// Algorithm 6's recompute, with least-second-moment edges instead of equal-mass
    /// quantiles (why: `recompute_min_second_moment`).
    fn recompute_boundaries(&mut self) {
        self.completed_since_recompute = 0;
        if self
            .boundaries
            .recompute_min_second_moment(self.stats.output_samples())
        {
            self.boundary_recomputes += 1;
        }
    }

    /// Turns the bins on or off (`multi_bin` comes into force or leaves). Coming on, the
    /// boundaries are recomputed from the samples gathered while they were off, if they are
    /// due (so a switch bins by current lengths, as if they had been kept up to date).
    pub fn use_bins(&mut self, on: bool) {
        if on && !self.bins_in_use && self.completed_since_recompute >= self.recompute_period() {
            self.bins_in_use = true;
            self.recompute_boundaries();
        }
        self.bins_in_use = on;
    }

    /// Completed requests between boundary recomputes: `recompute_every`, but while fewer
    /// requests than that have completed, as many as have (so the first recomputes come at
    /// 8K, 16K, 32K, ... completions, each on twice the data). Before its first recompute
    /// every bin is equal-width over `[1, max_tokens_limit]`, so with the default 32,768 and
    /// K = 4 every answer under 8,193 tokens shares bin 0: waiting for `recompute_every`
    /// (1,000) completions meant ~200 s of unbinned batches on `long_tail`, half of its
    /// queue timeouts.
    fn recompute_period(&self) -> u32 {
        let first = 8 * self.cfg.bins as u32;
        self.cfg
            .recompute_every
            .min(self.completed_total.max(first))
    }

    /// Controller state for metrics.
    pub fn snapshot(&self) -> ResearchSnapshot {
        let mut s = ResearchSnapshot {
            b_mem: self.b_mem(None),
            b_sla: self.sla.b_sla(0),
            b_low: self.sla.b_low(),
            b_high: self.sla.b_high(),
            tbt_ms_ema: self.sla.tbt_ms_ema(),
            mean_tokens_per_request: self.stats.mean_tokens_per_request(),
            bins: self.cfg.bins,
            memory_limit_hits: self.memory_limit_hits,
            boundary_recomputes: self.boundary_recomputes,
            ..Default::default()
        };
        for b in 0..self.cfg.bins {
            s.bin_lens[b] = self.bins[b].len();
            s.bin_upper_tokens[b] = self.boundaries.bounds(b).1;
        }
        s
    }

    /// Moves every request of `from` (one FIFO per source) into `push(index)` in arrival
    /// order, emptying the sources. Used when switching between bin and class queues.
    pub fn drain_in_arrival_order(
        table: &mut RequestTable,
        from: &mut [Fifo],
        mut push: impl FnMut(&mut RequestTable, u32),
    ) {
        loop {
            let mut pick: Option<(usize, Nanos)> = None;
            for (i, q) in from.iter().enumerate() {
                if let Some(head) = q.front() {
                    let arrival = table.meta(head).arrival_ns;
                    if pick.is_none_or(|(_, a)| arrival < a) {
                        pick = Some((i, arrival));
                    }
                }
            }
            let Some((i, _)) = pick else { return };
            let index = from[i].pop_front(table).expect("picked a non-empty queue");
            push(table, index);
        }
    }
}
