//! The per-second history behind `/metrics/history` and the dashboard: a bounded ring of
//! [`Second`]s, written once a second by the history thread ([`sampler`]) from the
//! snapshots the engine already publishes, read by io threads.
//!
//! Memory is bounded by `metrics.history_retention` (one entry per second, the ring is
//! allocated at start and the oldest entry makes room for the newest). The engine never
//! touches any of this: the sampler reads its published snapshot like any /metrics reader,
//! so a slow or stuck reader here can never slow the engine. Readers hold the ring's lock
//! only to clone the entries they return.

pub mod sampler;
pub mod second;

pub use second::Second;

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Mutex;

/// The ring of seconds, oldest first.
pub struct History {
    /// At most `capacity` entries; `capacity` entries are reserved at start.
    ring: Mutex<VecDeque<Second>>,
    capacity: usize,
}

impl History {
    /// A ring keeping `retention_s` seconds (at least 10, so the 10 s window always fits).
    pub fn new(retention_s: usize) -> History {
        let capacity = retention_s.max(10);
        History {
            ring: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    /// Seconds kept at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends the newest second, dropping the oldest when full.
    pub fn push(&self, second: Second) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(second);
    }

    /// The newest `seconds` entries (all kept when `None`), oldest first.
    pub fn last(&self, seconds: Option<usize>) -> Vec<Second> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let n = seconds.unwrap_or(ring.len()).min(ring.len());
        ring.iter().skip(ring.len() - n).cloned().collect()
    }

    /// `GET /metrics/history?seconds=N`: `{"retention_seconds", "seconds": [...]}`.
    pub fn render(&self, seconds: Option<usize>) -> Value {
        json!({
            "retention_seconds": self.capacity,
            "seconds": self.last(seconds),
        })
    }

    /// Rates over the newest `window_s` seconds (fewer if less is kept): what
    /// `/metrics/json` shows beside its totals since start.
    pub fn window(&self, window_s: usize) -> Value {
        window(&self.last(Some(window_s)))
    }
}

/// Rates and latency over `seconds` (consecutive entries of the ring).
pub fn window(seconds: &[Second]) -> Value {
    let span_s: f64 = seconds.iter().map(|s| s.interval_s).sum();
    let total = |f: &dyn Fn(&Second) -> u64| seconds.iter().map(f).sum::<u64>();
    let rate = |n: u64| if span_s > 0.0 { n as f64 / span_s } else { 0.0 };
    let completed = total(&|s| s.outcome("completed"));
    let failed = total(&|s| {
        s.outcomes
            .iter()
            .filter(|(name, _)| *name != "completed" && !name.starts_with("rejected"))
            .map(|(_, n)| n)
            .sum()
    });
    let rejected = total(&|s| {
        s.outcomes
            .iter()
            .filter(|(name, _)| name.starts_with("rejected"))
            .map(|(_, n)| n)
            .sum()
    });
    let latency_count = total(&|s| s.latency_ms.count);
    // Means combine exactly; quantiles of the window are the worst second's (an upper
    // bound: the seconds' histograms are not kept).
    let latency_mean_ms = if latency_count == 0 {
        0.0
    } else {
        seconds
            .iter()
            .map(|s| s.latency_ms.mean * s.latency_ms.count as f64)
            .sum::<f64>()
            / latency_count as f64
    };
    let worst = |f: &dyn Fn(&Second) -> f64| seconds.iter().map(f).fold(0.0, f64::max);
    let batches = total(&|s| s.batch_size.batches);
    json!({
        "seconds": span_s,
        "completed_rps": rate(completed),
        "failed_rps": rate(failed),
        "rejected_rps": rate(rejected),
        "admitted_rps": rate(total(&|s| s.admitted)),
        "batches_per_second": rate(batches),
        "prompt_tokens_per_second": rate(total(&|s| s.prompt_tokens)),
        "generation_tokens_per_second": rate(total(&|s| s.generation_tokens)),
        "latency_mean_ms": latency_mean_ms,
        "latency_p99_ms_max": worst(&|s| s.latency_ms.p99),
        "worker_utilization": seconds.last().map_or(0.0, |s| {
            if s.workers.is_empty() {
                0.0
            } else {
                seconds
                    .iter()
                    .flat_map(|s| s.workers.iter().map(|w| w.utilization))
                    .sum::<f64>()
                    / (seconds.len() * s.workers.len()) as f64
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::strategy::StrategyKind;
    use crate::core::Priority;
    use crate::runtime::Snapshot;

    /// Snapshots one second apart: 10 completions at 4 ms and 10 at 8 ms (critical), a
    /// batch of 20, one worker busy half the second, 3 requests waiting.
    fn pair() -> (Snapshot, Snapshot) {
        let prev = Snapshot::new(1, StrategyKind::Fixed);
        let mut cur = prev.clone();
        cur.at_ns = 1_000_000_000;
        cur.stats.completed = 20;
        cur.stats.admitted = 23;
        cur.stats.batches_formed = 1;
        cur.stats.batched_requests = 20;
        cur.batch_size.record(20).unwrap();
        for (ns, n) in [(4_000_000, 10), (8_000_000, 10)] {
            cur.latency.record_n(ns, n).unwrap();
            cur.latency_by_priority[Priority::Critical.index()]
                .record_n(ns, n)
                .unwrap();
        }
        cur.workers[0].busy_ns = 500_000_000;
        cur.queued = 3;
        cur.queued_by_class[crate::core::request::class_index(Priority::Low, 0)] = 3;
        (prev, cur)
    }

    #[test]
    fn a_second_holds_what_changed_between_two_snapshots() {
        let (prev, cur) = pair();
        let s = Second::between(&prev, &cur, 42);
        assert_eq!(s.unix_ms, 42);
        assert_eq!(s.interval_s, 1.0);
        assert_eq!(s.outcome("completed"), 20);
        assert_eq!(s.completed_rps, 20.0);
        assert_eq!(s.latency_ms.count, 20);
        assert!((s.latency_ms.p50 - 4.0).abs() < 0.01, "{:?}", s.latency_ms);
        assert!((s.latency_ms.p99 - 8.0).abs() < 0.01, "{:?}", s.latency_ms);
        assert_eq!(s.latency_by_priority_ms[0].0, "critical");
        assert_eq!(s.latency_by_priority_ms[0].1.count, 20);
        assert_eq!(s.latency_by_priority_ms[3].1.count, 0);
        assert_eq!(s.queue_depth_by_priority[3], ("low", 3));
        assert_eq!(s.batch_size.batches, 1);
        assert_eq!(s.batch_size.mean, 20.0);
        assert_eq!(s.workers[0].utilization, 0.5);
        // The next second, nothing happened: counts are deltas, not totals.
        let mut later = cur.clone();
        later.at_ns = 2_000_000_000;
        let s = Second::between(&cur, &later, 43);
        assert_eq!(s.outcome("completed"), 0);
        assert_eq!(s.latency_ms.count, 0);
        assert_eq!(s.workers[0].utilization, 0.0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["outcomes"]["completed"], 0);
        assert_eq!(json["queue_depth_by_priority"]["low"], 3);
    }

    #[test]
    fn a_continuous_second_holds_the_prefix_cache_tokens_it_looked_up_and_hit() {
        use crate::core::prefix::PrefixStats;
        use crate::runtime::snapshot::ContinuousSnapshot;
        let (mut prev, mut cur) = pair();
        let stats = |query_tokens, hit_tokens| PrefixStats {
            query_tokens,
            hit_tokens,
            evicted_blocks: 0,
        };
        prev.continuous = Some(ContinuousSnapshot {
            prefix: Some(stats(1_000, 200)),
            ..ContinuousSnapshot::default()
        });
        cur.continuous = Some(ContinuousSnapshot {
            prefix: Some(stats(1_500, 600)),
            ..ContinuousSnapshot::default()
        });
        let s = Second::between(&prev, &cur, 0);
        let p = s.continuous.unwrap().prefix_cache.unwrap();
        assert_eq!(
            (p.query_tokens, p.hit_tokens),
            (500, 400),
            "deltas, not totals"
        );
        assert_eq!(p.hit_rate, Some(0.8));
        // A quiet second has no hit rate (a gap in the chart), not 0 %.
        let s = Second::between(&cur, &cur, 0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["continuous"]["prefix_cache"]["query_tokens"], 0);
        assert!(
            json["continuous"]["prefix_cache"]["hit_rate"].is_null(),
            "{json}"
        );
        // Prefix caching off: no prefix_cache at all.
        cur.continuous.as_mut().unwrap().prefix = None;
        let s = Second::between(&prev, &cur, 0);
        assert_eq!(s.continuous.unwrap().prefix_cache, None);
    }

    #[test]
    fn the_ring_keeps_only_its_retention_and_windows_average_over_it() {
        let (prev, cur) = pair();
        let history = History::new(10);
        let second = Second::between(&prev, &cur, 0);
        for i in 0..25 {
            let mut s = second.clone();
            s.unix_ms = i;
            history.push(s);
        }
        let all = history.last(None);
        assert_eq!(all.len(), 10);
        assert_eq!(all[0].unix_ms, 15, "the oldest went first");
        assert_eq!(history.last(Some(3)).len(), 3);
        assert_eq!(history.last(Some(3))[2].unix_ms, 24);
        assert_eq!(history.last(Some(100)).len(), 10);
        let w = history.window(10);
        assert_eq!(w["completed_rps"], 20.0);
        assert_eq!(w["seconds"], 10.0);
        assert!((w["latency_mean_ms"].as_f64().unwrap() - 6.0).abs() < 0.01);
        let empty = History::new(5).window(1);
        assert_eq!(empty["completed_rps"], 0.0);
        assert_eq!(History::new(5).capacity(), 10, "room for the 10 s window");
    }
}
