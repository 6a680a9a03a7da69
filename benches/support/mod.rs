//! What the bench binaries share: whether criterion is measuring or only running each
//! bench once as a smoke test.
//!
//! `cargo bench` (and the tools that run a bench binary by hand) pass `--bench`; the test
//! suite's `cargo test --all-targets` passes nothing, and criterion then runs each bench
//! once. A bench whose set-up is heavy (a million simulated requests, a batch of 64 through
//! the model in a debug build) uses [`measuring`] to run a smaller case in that pass: the
//! same code and the same checks, without minutes of the suite. Nothing measured may
//! depend on it.

/// True when criterion measures (`--bench` on the command line); false in the test
/// suite's single pass.
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}
