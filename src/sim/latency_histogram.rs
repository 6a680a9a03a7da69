//! The range every latency histogram of a simulation report (and of `abe loadgen`) shares:
//! 1 µs to 30 days, 3 significant digits, in virtual (or measured) ns.
//!
//! Only the bounds live here; what is recorded, and when, belongs to `record` and `tokens`.

use hdrhistogram::Histogram;

/// Largest latency the histograms resolve, ns (30 days); larger values are clamped.
pub const LATENCY_MAX_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// An empty histogram of ns latencies over the shared range.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, LATENCY_MAX_NS, 3).expect("static histogram bounds are valid")
}
