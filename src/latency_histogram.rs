//! The range every latency histogram of abe shares, written once: the engine's published
//! quantiles (`runtime::snapshot`), a simulation report (`sim`) and `abe loadgen`'s
//! measured latencies and send lag. 1 µs to 30 days, 3 significant digits, in ns (virtual
//! or measured): below about 2 ms a value is resolved to 512 ns, above it to 0.1 %; a
//! simulated backlog can hold a request for days, so the top is far past any live latency.
//!
//! Only the bounds live here; what is recorded, and when, belongs to the recorders. The
//! fixed Prometheus buckets of `/metrics` are [`crate::buckets`], not these.

use hdrhistogram::Histogram;

/// Smallest latency the histograms resolve, ns; smaller values count in the lowest bucket.
pub const LATENCY_MIN_NS: u64 = 1_000;

/// Largest latency the histograms resolve, ns (30 days); larger values are clamped.
pub const LATENCY_MAX_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// An empty histogram of ns latencies over the shared range (fixed size: never resizes).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LATENCY_MIN_NS, LATENCY_MAX_NS, 3)
        .expect("static histogram bounds are valid")
}
