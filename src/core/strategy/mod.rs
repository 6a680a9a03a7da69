//! Request-level batching strategies: when a partial batch is released, and how big a batch
//! is. Three families live here, each owning no queue (the core's class queues, or the
//! `multi_bin` bins, hold every request), so switching strategy at run time cannot lose or
//! reorder a request:
//! - timeouts (`fixed`, `queue_depth`, `latency_aware`): a pure function of the queue depth,
//!   the observed p99 and their parameters (the Go spec's `Strategy.CalculateTimeout`),
//!   in [`timeout_ms`];
//! - `auto` ([`auto`]): learned models of the executor's cost and of the arrivals, asked by
//!   the core at each poll whether a group should go now or be held;
//! - the research strategies `dynamic` and `multi_bin` (all of them in [`research`]: the
//!   algorithms, their state in the core, their config table, their tests): a batch size
//!   from the KV-memory model and the SLA controller, released whenever a worker is free.
//!
//! A new strategy: a [`StrategyKind`] variant (and its name in `as_str` and `ALL`; the config,
//! the admin endpoint and `abe simulate` take every name from there), its rule in a file of
//! its own here, and its branch where the core decides (`Core::due_group` for a release
//! rule, `Core::dispatch_research` for a batch-size rule). Nothing here reads a clock or
//! allocates.

mod fixed;
mod latency_aware;
mod queue_depth;

pub mod auto;
pub mod research;

pub use fixed::fixed_timeout_ms;
pub use latency_aware::latency_aware_timeout_ms;
pub use queue_depth::queue_depth_timeout_ms;

use std::fmt;
use std::str::FromStr;

/// Which strategy decides flush timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    /// Learns the executor's batch cost and the arrivals to expect, and holds a partial
    /// batch only while that pays (see [`auto`]); otherwise work-conserving.
    Auto,
    /// Flush at `max_wait_ms` or `max_batch_size`.
    Fixed,
    /// Timeout falls linearly from `max_wait_ms` to `min_wait_ms` as the queue deepens.
    QueueDepth,
    /// The queue-depth timeout scaled by observed p99 against a target.
    LatencyAware,
    /// Pang et al.: batch size `min(b_mem, b_SLA)` from the KV-memory model and the SLA
    /// controller, FIFO, released whenever a worker is free (Algorithms 1-3).
    Dynamic,
    /// Guldogan et al.: `dynamic` plus K bins by predicted output length, one bin per batch
    /// (Algorithms 1-7).
    MultiBin,
}

impl StrategyKind {
    /// Every strategy, in the order they are listed to users.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::Auto,
        StrategyKind::Fixed,
        StrategyKind::QueueDepth,
        StrategyKind::LatencyAware,
        StrategyKind::Dynamic,
        StrategyKind::MultiBin,
    ];

    /// `dynamic` or `multi_bin`: batch size from the memory model and SLA controller,
    /// released when a worker is free, rather than a flush timeout.
    pub const fn is_research(self) -> bool {
        matches!(self, StrategyKind::Dynamic | StrategyKind::MultiBin)
    }

    /// Wire and config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            StrategyKind::Auto => "auto",
            StrategyKind::Fixed => "fixed",
            StrategyKind::QueueDepth => "queue_depth",
            StrategyKind::LatencyAware => "latency_aware",
            StrategyKind::Dynamic => "dynamic",
            StrategyKind::MultiBin => "multi_bin",
        }
    }

    /// Comma-separated list of valid names, for error messages.
    pub fn valid_names() -> String {
        Self::ALL.map(|k| k.as_str()).join(", ")
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A strategy name that abe does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy '{name}': valid strategies are {valid}")]
pub struct UnknownStrategy {
    pub name: String,
    pub valid: String,
}

crate::core::names::serde_by_name!(StrategyKind);

impl FromStr for StrategyKind {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownStrategy {
                name: s.to_string(),
                valid: Self::valid_names(),
            })
    }
}

/// Parameters shared by the request-level strategies (the Go spec's `batching` keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StrategyParams {
    /// Longest flush timeout (fixed window; queue_depth at shallow queues). Spec default 100.
    pub max_wait_ms: f64,
    /// Shortest flush timeout (queue_depth at deep queues). Spec default 5.
    pub min_wait_ms: f64,
    /// Queue depth at or below which queue_depth waits `max_wait_ms`. Spec default 10.
    pub queue_depth_low: u32,
    /// Queue depth at or above which queue_depth waits `min_wait_ms`. Spec default 100.
    pub queue_depth_high: u32,
    /// latency_aware's p99 target in milliseconds.
    pub target_p99_ms: f64,
}

impl Default for StrategyParams {
    fn default() -> Self {
        StrategyParams {
            max_wait_ms: 100.0,
            min_wait_ms: 5.0,
            queue_depth_low: 10,
            queue_depth_high: 100,
            target_p99_ms: 100.0,
        }
    }
}

/// The flush timeout in milliseconds for `kind` at `queue_depth`, given the observed p99
/// (`None` while nothing has completed yet: latency_aware then uses its base timeout).
pub fn timeout_ms(
    kind: StrategyKind,
    params: &StrategyParams,
    queue_depth: usize,
    observed_p99_ms: Option<f64>,
) -> f64 {
    match kind {
        StrategyKind::Fixed => fixed_timeout_ms(params),
        StrategyKind::QueueDepth => queue_depth_timeout_ms(params, queue_depth),
        StrategyKind::LatencyAware => {
            let base = queue_depth_timeout_ms(params, queue_depth);
            match observed_p99_ms {
                Some(p99) => latency_aware_timeout_ms(base, p99, params.target_p99_ms),
                None => base,
            }
        }
        // Work-conserving: a batch goes whenever a worker is free; no flush timer.
        StrategyKind::Dynamic | StrategyKind::MultiBin => 0.0,
        // No timer of its own: it decides per poll (the core asks `auto::Auto::decide`).
        StrategyKind::Auto => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_lists_valid_ones() {
        for k in StrategyKind::ALL {
            assert_eq!(k.as_str().parse::<StrategyKind>().unwrap(), k);
        }
        let e = "fastest".parse::<StrategyKind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown strategy 'fastest': valid strategies are auto, fixed, queue_depth, latency_aware, dynamic, multi_bin"
        );
    }

    #[test]
    fn latency_aware_without_observations_uses_the_queue_depth_timeout() {
        let p = StrategyParams::default();
        assert_eq!(
            timeout_ms(StrategyKind::LatencyAware, &p, 55, None),
            queue_depth_timeout_ms(&p, 55)
        );
        assert_eq!(timeout_ms(StrategyKind::Fixed, &p, 1000, Some(1.0)), 100.0);
    }
}
