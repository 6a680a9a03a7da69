//! Keeps a forward pass's big buffers on the heap instead of fresh `mmap`s (glibc only).
//!
//! Every op of a pass allocates its output (candle's GEMMs and abe's fused ops alike): at
//! batch 64 x 16 tokens, buffers of 1.5-6 MiB, freed a moment later. glibc serves blocks
//! above its mmap threshold with `mmap` and trims the heap top above its trim threshold, so
//! each pass paid page faults and kernel page zeroing again (~9% of a `perf record` of the
//! pass). With the mmap threshold at its maximum (32 MiB on 64-bit) and trimming only above
//! 256 MiB, the freed pages are reused: the served batch-64 pass went from 102.3 / 103.8 ms to
//! 88.6 / 88.6 ms with the same settings from the environment (`MALLOC_MMAP_THRESHOLD_`,
//! `MALLOC_TRIM_THRESHOLD_`; criterion, 2026-11-24 20:15 UTC, 2 vCPUs, load 1.4-1.7; batch
//! 8 level at 15.6-16.4 ms), and 85.1 / 90.7 ms against 101.2 / 97.9 ms with this module
//! (20:17 UTC, load 1.4-1.8). The cost: up to 256 MiB of freed memory stays with the process.
//!
//! What must never happen here: a setting made per pass (once per process, at model load).

use std::sync::Once;

/// Largest mmap threshold glibc accepts on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`).
const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Free memory at the heap top kept before glibc gives it back.
const TRIM_THRESHOLD_BYTES: i32 = 256 << 20;

/// Sets glibc's thresholds once per process; elsewhere does nothing.
pub fn keep_big_buffers_on_the_heap() {
    static ONCE: Once = Once::new();
    ONCE.call_once(set);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set() {
    // SAFETY: mallopt takes two integers and only changes malloc's tuning parameters under
    // its own lock; no memory is passed. A refused value (return 0) leaves glibc's default.
    let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    // SAFETY: as above.
    let _ = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set() {}
