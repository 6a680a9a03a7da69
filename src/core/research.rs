//! State of the research strategies `dynamic` (Pang et al.: memory- and SLA-constrained
//! batch size, Algorithms 1-3) and `multi_bin` (Guldogan et al.: K bins by predicted output
//! length, Algorithms 4-7), as the core uses them.
//!
//! The algorithms live in `strategy::{memory, sla, bins, batch_stats}`; this file holds their
//! instances, the bin FIFOs, and the glue: the batch-size target, bin choice, and the
//! statistics update after every completed batch. Nothing here allocates after `new`.

use super::request::{Nanos, RequestMeta};
use super::strategy::batch_stats::{BatchObservation, BatchStats, OUTPUT_SAMPLE_CAPACITY};
use super::strategy::bins::{
    BinBoundaries, BinPolicy, BinSelector, LengthPredictor, PredictorKind, BIN_COUNT_MAX,
};
use super::strategy::memory::MemoryModel;
use super::strategy::sla::{SlaController, SlaParams};
use super::table::{Fifo, RequestTable};

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
            bin_policy: BinPolicy::RoundRobin,
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

/// The research strategies' live state.
pub struct Research {
    pub cfg: ResearchConfig,
    pub stats: BatchStats,
    pub sla: SlaController,
    pub boundaries: BinBoundaries,
    pub selector: BinSelector,
    pub predictor: LengthPredictor,
    /// One FIFO per bin (only the first `cfg.bins` are used).
    pub bins: [Fifo; BIN_COUNT_MAX],
    /// Requests in all bins.
    pub queued: usize,
    completed_since_recompute: u32,
    pub memory_limit_hits: u64,
    pub boundary_recomputes: u64,
    /// Scratch for bin lengths given to the selector.
    lens: [usize; BIN_COUNT_MAX],
}

impl Research {
    /// State for `cfg` (which must be valid: see `MemoryModel::validate`, `SlaParams::validate`).
    pub fn new(cfg: ResearchConfig) -> Research {
        let bins = cfg.bins.clamp(1, BIN_COUNT_MAX);
        Research {
            stats: BatchStats::new(OUTPUT_SAMPLE_CAPACITY),
            sla: SlaController::new(cfg.sla),
            boundaries: BinBoundaries::new(bins, cfg.max_tokens_limit, OUTPUT_SAMPLE_CAPACITY),
            selector: BinSelector::new(cfg.bin_policy),
            predictor: LengthPredictor::new(cfg.predictor),
            bins: [Fifo::default(); BIN_COUNT_MAX],
            queued: 0,
            completed_since_recompute: 0,
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
    pub fn b_mem(&self, bin: Option<usize>) -> u32 {
        let cap = bin.map(|b| {
            let (lo, hi) = self.boundaries.bounds(b);
            self.cfg.memory.per_bin_cap(lo, hi)
        });
        self.cfg
            .memory
            .b_mem(self.stats.mean_tokens_per_request(), cap)
    }

    /// Algorithm 3's target: `min(b_mem, b_SLA)`, at least 1, for a queue of `backlog`
    /// waiting requests.
    ///
    /// Adaptation for request-level batching (a deviation from the paper, which schedules
    /// iterations): the paper's floor `b_SLA >= N_decode` is what lets its batch grow with
    /// demand, and here no request of a new batch is decoding yet (`N_decode` = 0). Without
    /// a substitute, the in-band rule (a window around the average batch actually formed)
    /// locks onto whatever small batches light load produced, and a backlog can never grow
    /// them (measured: stuck at 2 and overloaded at 100 RPS). So while more requests wait
    /// than the interval's midpoint, the controller probes its upper end `b_high`; the
    /// too-slow branch still pulls `b_high` down when decode TBT leaves the band.
    pub fn b_target(&self, bin: Option<usize>, backlog: usize) -> u32 {
        let mid = self.sla.b_sla(0);
        let b_sla = if backlog > mid as usize {
            self.sla.b_high().max(mid)
        } else {
            mid
        };
        self.b_mem(bin).min(b_sla).max(1)
    }

    /// Algorithms 5-6: the bin to serve next, among non-empty ones.
    pub fn choose_bin(&mut self) -> Option<usize> {
        let k = self.cfg.bins;
        for (i, len) in self.lens[..k].iter_mut().enumerate() {
            *len = self.bins[i].len();
        }
        self.selector.choose(&self.lens[..k])
    }

    /// Algorithm 7: statistics and controller after a completed batch. `requests` yields
    /// (prompt tokens, output tokens) per request; `service_ns` is the batch's service time.
    pub fn observe_batch(
        &mut self,
        requests: impl Iterator<Item = (u32, u32)> + Clone,
        service_ns: Nanos,
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
        if output_max > 0 {
            let tbt_ms = service_ns as f64 / 1e6 / f64::from(output_max);
            self.stats.observe_batch(&BatchObservation {
                batch_size: size,
                prompt_tokens_sum: prompt_sum,
                output_tokens_sum: output_sum,
                decode_tbt_ms: tbt_ms,
            });
            self.sla.update(tbt_ms, size);
        }
        self.completed_since_recompute += size;
        if self.completed_since_recompute >= self.cfg.recompute_every {
            self.completed_since_recompute = 0;
            if self
                .boundaries
                .recompute_equal_mass(self.stats.output_samples())
            {
                self.boundary_recomputes += 1;
            }
        }
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
