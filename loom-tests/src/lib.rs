//! Shared helpers for the loom models in `tests/`; the models themselves live there.
//!
//! Everything here exists only with the `loom` feature; a plain build of this crate is empty.
//! Run the models with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --features loom-tests/loom
//! ```
//!
//! (tools/test.sh adds `abe/testing,abe/embed` to the features, so that the build reuses the
//! test build's dependencies: loom-tests/Cargo.toml.)

/// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set. Unbounded exploration of
/// even these small models takes far longer than CI allows; 2 finds the classic
/// lost-wake-up and publish-ordering bugs (tokio and crossbeam use the same bound).
#[cfg(feature = "loom")]
pub const DEFAULT_MAX_PREEMPTIONS: usize = 2;

/// Runs `f` under loom with the environment's settings (`LOOM_MAX_PREEMPTIONS`,
/// `LOOM_MAX_BRANCHES`, ...), falling back to [`DEFAULT_MAX_PREEMPTIONS`], so a bare
/// `cargo test` with the feature cannot run unbounded by accident.
///
/// # Panics
///
/// When loom finds a failing execution (the model's own panic, a deadlock, a leak or a
/// causality violation), and when the model explored only one execution (nothing raced).
#[cfg(feature = "loom")]
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_MAX_PREEMPTIONS);
    }
    // A plain std counter, outside the model: loom runs executions one after another on
    // this thread, so Relaxed is enough and loom does not track it.
    let executions = Arc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let executions = executions.load(Ordering::Relaxed);
    // Shown with `--nocapture`; a model that explores a single execution checks nothing.
    println!(
        "loom explored {executions} executions (preemption bound {:?})",
        builder.preemption_bound
    );
    assert!(executions > 1, "the model has no interleavings to explore");
}
