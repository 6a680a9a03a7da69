//! Algorithm 7's statistics for the dynamic-batching research strategy: EMAs of prompt
//! length, output length, decode time-between-tokens and batch size, updated after every
//! completed batch, and a bounded sample of observed output lengths from which the
//! multi-bin boundaries are recomputed.
//!
//! Source: TravisLeeTS/llm-scheduler-sim `update_after_batch` (EMA weight 0.2, prompt and
//! output EMAs starting at 300 and 200 tokens, true lengths).
//!
//! The sample ring is allocated in `new`; after that nothing here allocates. No clock
//! reads: the TBT is passed in as f64 ms.

/// EMA weight of the newest batch (the reference's `ema_alpha`).
pub const EMA_WEIGHT: f64 = 0.2;
/// Prior for the prompt-length EMA before any batch completes, tokens (the reference's).
pub const PROMPT_TOKENS_PRIOR: f64 = 300.0;
/// Prior for the output-length EMA before any batch completes, tokens (the reference's).
pub const OUTPUT_TOKENS_PRIOR: f64 = 200.0;
/// Default capacity of the output-length sample.
pub const OUTPUT_SAMPLE_CAPACITY: usize = 4096;

/// What one completed batch contributes. Lengths are the true ones (not predictions).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchObservation {
    /// Requests in the batch; an observation with 0 is ignored.
    pub batch_size: u32,
    /// Sum of prompt tokens over the batch.
    pub prompt_tokens_sum: u64,
    /// Sum of generated tokens over the batch.
    pub output_tokens_sum: u64,
    /// Decode time between tokens the batch saw, ms.
    pub decode_tbt_ms: f64,
}

/// Running statistics for one scope (global, or one bin).
#[derive(Debug)]
pub struct BatchStats {
    /// EMA of per-batch mean prompt length, tokens; starts at the prior.
    prompt_tokens_ema: f64,
    /// EMA of per-batch mean output length, tokens; starts at the prior.
    output_tokens_ema: f64,
    /// EMA of decode TBT, ms; seeded by the first batch. Meaningless while `batches == 0`.
    decode_tbt_ms_ema: f64,
    /// EMA of batch size; seeded by the first batch. Meaningless while `batches == 0`.
    batch_size_ema: f64,
    /// Batches observed (empty ones excluded).
    batches: u64,
    /// Ring of output lengths; `len()` fixed at construction, never reallocated.
    samples: Box<[u32]>,
    /// Slots of `samples` filled. Invariant: `samples_len <= samples.len()`.
    samples_len: usize,
    /// Next slot to write. Invariant: `samples_next < samples.len()`.
    samples_next: usize,
    /// Output lengths ever recorded (saturating), so a caller can recompute the bin
    /// boundaries every N new samples.
    samples_recorded: u64,
}

impl BatchStats {
    /// Statistics with a sample ring of `sample_capacity` output lengths (>= 1), allocated
    /// here and never again.
    pub fn new(sample_capacity: usize) -> Self {
        assert!(sample_capacity > 0, "the output-length sample needs room");
        BatchStats {
            prompt_tokens_ema: PROMPT_TOKENS_PRIOR,
            output_tokens_ema: OUTPUT_TOKENS_PRIOR,
            decode_tbt_ms_ema: 0.0,
            batch_size_ema: 0.0,
            batches: 0,
            samples: vec![0; sample_capacity].into_boxed_slice(),
            samples_len: 0,
            samples_next: 0,
            samples_recorded: 0,
        }
    }

    /// Folds in one completed batch (Algorithm 7): each EMA moves `EMA_WEIGHT` of the way
    /// to the batch's value. The length EMAs start from the reference's priors (300 / 200),
    /// exactly as the reference does; TBT and batch size have no prior and are seeded by the
    /// first batch, so they are not biased towards 0.
    pub fn observe_batch(&mut self, batch: &BatchObservation) {
        if batch.batch_size == 0 {
            return;
        }
        debug_assert!(
            batch.decode_tbt_ms.is_finite() && batch.decode_tbt_ms >= 0.0,
            "decode TBT must be a finite non-negative ms value"
        );
        let n = f64::from(batch.batch_size);
        let w = EMA_WEIGHT;
        let blend = |ema: f64, x: f64| w * x + (1.0 - w) * ema;
        self.prompt_tokens_ema = blend(self.prompt_tokens_ema, batch.prompt_tokens_sum as f64 / n);
        self.output_tokens_ema = blend(self.output_tokens_ema, batch.output_tokens_sum as f64 / n);
        if self.batches == 0 {
            self.decode_tbt_ms_ema = batch.decode_tbt_ms;
            self.batch_size_ema = n;
        } else {
            self.decode_tbt_ms_ema = blend(self.decode_tbt_ms_ema, batch.decode_tbt_ms);
            self.batch_size_ema = blend(self.batch_size_ema, n);
        }
        self.batches = self.batches.saturating_add(1);
    }

    /// Records one request's observed output length in the sample ring, overwriting the
    /// oldest once full.
    pub fn record_output_tokens(&mut self, tokens: u32) {
        self.samples[self.samples_next] = tokens;
        self.samples_next += 1;
        if self.samples_next == self.samples.len() {
            self.samples_next = 0;
        }
        self.samples_len = (self.samples_len + 1).min(self.samples.len());
        self.samples_recorded = self.samples_recorded.saturating_add(1);
    }

    /// The sampled output lengths, in no particular order (what a quantile needs).
    pub fn output_samples(&self) -> &[u32] {
        &self.samples[..self.samples_len]
    }

    /// Capacity of the sample ring.
    pub fn sample_capacity(&self) -> usize {
        self.samples.len()
    }

    /// Output lengths recorded since construction (the ring keeps the newest).
    pub fn samples_recorded(&self) -> u64 {
        self.samples_recorded
    }

    /// Batches observed.
    pub fn batches_observed(&self) -> u64 {
        self.batches
    }

    /// EMA of prompt length, tokens (the prior before any batch).
    pub fn prompt_tokens_ema(&self) -> f64 {
        self.prompt_tokens_ema
    }

    /// EMA of output length, tokens (the prior before any batch).
    pub fn output_tokens_ema(&self) -> f64 {
        self.output_tokens_ema
    }

    /// `E[l_in + l_out]` for `MemoryModel::b_mem`; `None` until a batch completed, so the
    /// memory model's own default applies (500, equal to the two priors' sum).
    pub fn mean_tokens_per_request(&self) -> Option<f64> {
        (self.batches > 0).then_some(self.prompt_tokens_ema + self.output_tokens_ema)
    }

    /// EMA of decode TBT, ms; `None` until a batch completed.
    pub fn decode_tbt_ms_ema(&self) -> Option<f64> {
        (self.batches > 0).then_some(self.decode_tbt_ms_ema)
    }

    /// EMA of batch size; `None` until a batch completed.
    pub fn batch_size_ema(&self) -> Option<f64> {
        (self.batches > 0).then_some(self.batch_size_ema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(size: u32, prompt: u64, output: u64, tbt_ms: f64) -> BatchObservation {
        BatchObservation {
            batch_size: size,
            prompt_tokens_sum: prompt,
            output_tokens_sum: output,
            decode_tbt_ms: tbt_ms,
        }
    }

    #[test]
    fn no_statistics_until_a_batch_completes() {
        let s = BatchStats::new(8);
        assert_eq!(s.mean_tokens_per_request(), None);
        assert_eq!(s.decode_tbt_ms_ema(), None);
        assert_eq!(s.batch_size_ema(), None);
        assert_eq!(
            (s.prompt_tokens_ema(), s.output_tokens_ema()),
            (300.0, 200.0)
        );
        assert!(s.output_samples().is_empty());
    }

    #[test]
    fn emas_follow_algorithm_7() {
        let mut s = BatchStats::new(8);
        // 4 requests, prompts sum 400 (mean 100), outputs sum 2,000 (mean 500), TBT 6 ms.
        s.observe_batch(&batch(4, 400, 2_000, 6.0));
        // prompt 0.2 x 100 + 0.8 x 300 = 260; output 0.2 x 500 + 0.8 x 200 = 260.
        assert!((s.prompt_tokens_ema() - 260.0).abs() < 1e-9);
        assert!((s.output_tokens_ema() - 260.0).abs() < 1e-9);
        assert!((s.mean_tokens_per_request().unwrap() - 520.0).abs() < 1e-9);
        assert_eq!(s.decode_tbt_ms_ema(), Some(6.0));
        assert_eq!(s.batch_size_ema(), Some(4.0));
        // 2 requests, mean prompt 10, mean output 60, TBT 11 ms.
        s.observe_batch(&batch(2, 20, 120, 11.0));
        // prompt 2 + 208 = 210; output 12 + 208 = 220; TBT 2.2 + 4.8 = 7; size 0.4 + 3.2 = 3.6.
        assert!((s.prompt_tokens_ema() - 210.0).abs() < 1e-9);
        assert!((s.output_tokens_ema() - 220.0).abs() < 1e-9);
        assert!((s.decode_tbt_ms_ema().unwrap() - 7.0).abs() < 1e-9);
        assert!((s.batch_size_ema().unwrap() - 3.6).abs() < 1e-9);
        // An empty batch changes nothing.
        s.observe_batch(&batch(0, 0, 0, 100.0));
        assert_eq!(s.batches_observed(), 2);
    }

    #[test]
    fn sample_ring_keeps_the_newest_values() {
        let mut s = BatchStats::new(3);
        s.record_output_tokens(10);
        s.record_output_tokens(20);
        assert_eq!(s.output_samples(), &[10, 20]);
        s.record_output_tokens(30);
        s.record_output_tokens(40); // overwrites 10
        assert_eq!(s.output_samples(), &[40, 20, 30]);
        assert_eq!(s.samples_recorded(), 4);
        assert_eq!(s.sample_capacity(), 3);
    }
}
