//! What the `embed` executor's forward passes cost in padding: counters its workers add to
//! and `/metrics` reads.
//!
//! A forward pass is padded to its longest input, so every pass computes `inputs x longest`
//! token positions of which only the real tokens are wanted. The gap is the padding waste
//! that length buckets, `max_batch_tokens` and the worker's split by length (`split`) are
//! there to keep small.
//! Plain relaxed atomic counters: each is a monotonic total read for display, no other
//! memory depends on its value, and the worker never waits on a reader.

use std::sync::atomic::{AtomicU64, Ordering};

/// Totals over every forward pass of one `embed` backend (all its workers).
#[derive(Debug, Default)]
pub struct EmbedStats {
    forward_passes: AtomicU64,
    inputs: AtomicU64,
    /// Tokens of the inputs themselves (special tokens included, after truncation).
    tokens_real: AtomicU64,
    /// Token positions computed: `inputs x longest` per pass, so always >= `tokens_real`.
    tokens_padded: AtomicU64,
    /// Inputs longer than the model's max_seq_length, cut to it.
    inputs_truncated: AtomicU64,
    forward_ns: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbedTotals {
    pub forward_passes: u64,
    pub inputs: u64,
    pub tokens_real: u64,
    pub tokens_padded: u64,
    pub inputs_truncated: u64,
    pub forward_ns: u64,
}

impl EmbedTotals {
    /// Share of computed positions that were padding (0 when nothing ran).
    pub fn padding_ratio(&self) -> f64 {
        if self.tokens_padded == 0 {
            0.0
        } else {
            (self.tokens_padded - self.tokens_real) as f64 / self.tokens_padded as f64
        }
    }
}

impl EmbedStats {
    /// Adds one forward pass over `inputs` inputs of `tokens_real` tokens, padded to
    /// `longest` each, `truncated` of them cut, which took `forward_ns`.
    pub fn record(
        &self,
        inputs: u64,
        tokens_real: u64,
        longest: u64,
        truncated: u64,
        forward_ns: u64,
    ) {
        debug_assert!(tokens_real <= inputs * longest);
        // Relaxed: independent monotonic totals (see the module doc).
        self.forward_passes.fetch_add(1, Ordering::Relaxed);
        self.inputs.fetch_add(inputs, Ordering::Relaxed);
        self.tokens_real.fetch_add(tokens_real, Ordering::Relaxed);
        self.tokens_padded
            .fetch_add(inputs * longest, Ordering::Relaxed);
        self.inputs_truncated
            .fetch_add(truncated, Ordering::Relaxed);
        self.forward_ns.fetch_add(forward_ns, Ordering::Relaxed);
    }

    /// The counters now (each read on its own: a pass may be half counted).
    pub fn totals(&self) -> EmbedTotals {
        // Relaxed: display only (see the module doc).
        EmbedTotals {
            forward_passes: self.forward_passes.load(Ordering::Relaxed),
            inputs: self.inputs.load(Ordering::Relaxed),
            tokens_real: self.tokens_real.load(Ordering::Relaxed),
            tokens_padded: self.tokens_padded.load(Ordering::Relaxed),
            inputs_truncated: self.inputs_truncated.load(Ordering::Relaxed),
            forward_ns: self.forward_ns.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_positions_computed_minus_real_tokens() {
        let s = EmbedStats::default();
        assert_eq!(s.totals().padding_ratio(), 0.0);
        s.record(2, 10, 8, 0, 1_000); // 16 positions, 10 real
        s.record(1, 4, 4, 1, 500); // 4 positions, 4 real
        let t = s.totals();
        assert_eq!(t.forward_passes, 2);
        assert_eq!(t.inputs, 3);
        assert_eq!(t.tokens_real, 14);
        assert_eq!(t.tokens_padded, 20);
        assert_eq!(t.inputs_truncated, 1);
        assert!((t.padding_ratio() - 0.3).abs() < 1e-12);
    }
}
