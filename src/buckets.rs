//! The bucket bounds of every fixed-bucket histogram abe exports (the Prometheus `le`
//! labels of `/metrics`, abe's and the `vllm:*` families), written once.
//!
//! The engine records into the per-request ones (`runtime::snapshot`'s bounded counts);
//! `metrics` renders them all. Constants only: nothing here depends on the rest of the
//! crate, and a bound changes in this file or nowhere. Every list is strictly ascending
//! (checked at compile time below).

/// Upper bounds (ns) of the end-to-end latency buckets: 0.5 ms to 60 s.
pub const LATENCY_BOUNDS_NS: [u64; 16] = [
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// Upper bounds of the batch-size buckets (requests per batch).
pub const BATCH_SIZE_BOUNDS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Queue-wait bucket bounds as powers of two in ns, every second log2 bucket of the core's
/// `WaitHistogram` (`core::stats`): 2^10 ns (1.024 us) to 2^36 ns (68.7 s), a factor of 4 apart.
pub const QUEUE_WAIT_BOUND_LOG2_NS: [u32; 14] =
    [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36];

/// vLLM V1's `vllm:e2e_request_latency_seconds` buckets, in ns.
pub const E2E_BOUNDS_NS: [u64; 21] = [
    300_000_000,
    500_000_000,
    800_000_000,
    1_000_000_000,
    1_500_000_000,
    2_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    15_000_000_000,
    20_000_000_000,
    30_000_000_000,
    40_000_000_000,
    50_000_000_000,
    60_000_000_000,
    120_000_000_000,
    240_000_000_000,
    480_000_000_000,
    960_000_000_000,
    1_920_000_000_000,
    7_680_000_000_000,
];

/// vLLM V1's `vllm:time_per_output_token_seconds` buckets, in ns (from 10 ms), with abe's
/// 1 ms and 5 ms below them (a simulated decode step is a few ms).
pub const TPOT_BOUNDS_NS: [u64; 21] = [
    1_000_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    75_000_000,
    100_000_000,
    150_000_000,
    200_000_000,
    300_000_000,
    400_000_000,
    500_000_000,
    750_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    7_500_000_000,
    10_000_000_000,
    20_000_000_000,
    40_000_000_000,
    80_000_000_000,
];

/// Upper bounds of the per-request token-count buckets (vLLM's 1-2-5 series up to 100k).
pub const TOKEN_COUNT_BOUNDS: [u64; 16] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
];

/// Upper bounds (ns) of the per-request prefill / decode time buckets: vLLM's
/// `request_*_time_seconds` buckets from 0.3 s, with abe's sub-second range below them
/// (a simulated step is milliseconds).
pub const PHASE_TIME_BOUNDS_NS: [u64; 20] = [
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    300_000_000,
    500_000_000,
    800_000_000,
    1_000_000_000,
    1_500_000_000,
    2_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    15_000_000_000,
    20_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// Strictly ascending, so every value falls in one bucket and `le` labels never repeat.
const fn ascending(bounds: &[u64]) -> bool {
    let mut i = 1;
    while i < bounds.len() {
        if bounds[i - 1] >= bounds[i] {
            return false;
        }
        i += 1;
    }
    true
}

const _: () = assert!(ascending(&LATENCY_BOUNDS_NS));
const _: () = assert!(ascending(&BATCH_SIZE_BOUNDS));
const _: () = assert!(ascending(&E2E_BOUNDS_NS));
const _: () = assert!(ascending(&TPOT_BOUNDS_NS));
const _: () = assert!(ascending(&TOKEN_COUNT_BOUNDS));
const _: () = assert!(ascending(&PHASE_TIME_BOUNDS_NS));
