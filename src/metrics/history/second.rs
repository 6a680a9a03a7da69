//! One second of history: what changed between two published snapshots, reduced to the
//! figures the dashboard plots (rates by outcome, latency quantiles overall and per
//! priority, queue depth per class, batch sizes, flush reasons, workers, backends,
//! continuous-mode slots / KV / TTFT / TPOT / prefix-cache hits, tokens).
//!
//! A pure function of two snapshots and the wall clock passed in: no clock reads, no shared
//! state. Runs on the history thread, never on the engine thread; it may allocate.

use crate::core::prefix::PrefixStats;
use crate::core::request::{class_index, Priority, BUCKET_LABELS};
use crate::core::FlushReason;
use crate::metrics::derived::{request_outcomes, utilization_ratio, OUTCOME_COUNT};
use crate::runtime::Snapshot;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Quantiles (ms) of what a histogram in ns gained over the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Quantiles {
    /// Values recorded in the interval.
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Quantiles {
    /// Of `cur - prev` (both cumulative since start), divided by `per_unit` (1e6: ns to ms).
    fn between(prev: &Histogram<u64>, cur: &Histogram<u64>, per_unit: f64) -> Quantiles {
        if cur.len() <= prev.len() {
            return Quantiles::default();
        }
        let mut d = cur.clone();
        if d.subtract(prev).is_err() {
            // Not a suffix of `cur` (cannot happen for one engine's snapshots): the totals.
            d = cur.clone();
        }
        let q = |x| d.value_at_quantile(x) as f64 / per_unit;
        Quantiles {
            count: d.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            mean: d.mean() / per_unit,
        }
    }
}

/// One worker over the interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WorkerSecond {
    /// Busy fraction of the interval, 0 to 1.
    pub utilization: f64,
    pub status: &'static str,
    pub circuit: &'static str,
    pub pending: u32,
}

/// One backend at the end of the interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendSecond {
    /// Its name from the config.
    pub name: String,
    pub healthy: bool,
    pub circuit: &'static str,
    pub pending_batches: u32,
    pub latency_ema_ms: Option<f64>,
    /// Requests routed here in the interval.
    pub routed: u64,
}

/// Continuous batching over the interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ContinuousSecond {
    pub slots_total: usize,
    pub active_slots: usize,
    pub kv_used_tokens: u64,
    pub kv_capacity_tokens: u64,
    pub steps: u64,
    pub decode_tokens: u64,
    pub prefill_tokens: u64,
    pub preemptions: u64,
    pub ttft_ms: Quantiles,
    pub tpot_ms: Quantiles,
    /// `None` (JSON `null`) where prefix caching is off.
    pub prefix_cache: Option<PrefixSecond>,
}

/// The prefix cache over the interval, in vLLM's units (tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PrefixSecond {
    /// Prompt tokens looked up at slot admission in the interval.
    pub query_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
    /// `hit_tokens / query_tokens`; `None` (JSON `null`) when nothing was looked up, so a
    /// quiet second is a gap in the dashboard's chart, not a 0 % hit rate.
    pub hit_rate: Option<f64>,
}

impl PrefixSecond {
    /// What `cur` (cumulative since start) gained over `prev`.
    fn between(prev: &PrefixStats, cur: &PrefixStats) -> PrefixSecond {
        let query_tokens = cur.query_tokens.saturating_sub(prev.query_tokens);
        let hit_tokens = cur.hit_tokens.saturating_sub(prev.hit_tokens);
        debug_assert!(hit_tokens <= query_tokens, "every hit token was looked up");
        PrefixSecond {
            query_tokens,
            hit_tokens,
            hit_rate: (query_tokens > 0).then(|| hit_tokens as f64 / query_tokens as f64),
        }
    }
}

/// Batch sizes formed in the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BatchSecond {
    pub batches: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: u64,
}

/// Everything the history keeps for one interval (about a second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Second {
    /// Wall clock at the end of the interval (ms since the Unix epoch).
    pub unix_ms: u64,
    /// Engine clock at the end of the interval (s since start).
    pub uptime_s: f64,
    /// Length of the interval (s): counts divided by it give rates.
    pub interval_s: f64,
    pub strategy: &'static str,
    /// Requests by final outcome in the interval, keyed as in /metrics' `abe_requests_total`.
    #[serde(serialize_with = "pairs")]
    pub outcomes: [(&'static str, u64); OUTCOME_COUNT],
    pub admitted: u64,
    /// Completed per second.
    pub completed_rps: f64,
    pub latency_ms: Quantiles,
    /// Highest priority first: critical, high, normal, low.
    #[serde(serialize_with = "pairs")]
    pub latency_by_priority_ms: [(&'static str, Quantiles); Priority::COUNT],
    /// Requests waiting at the end of the interval, per priority (highest first) and in all.
    #[serde(serialize_with = "pairs")]
    pub queue_depth_by_priority: [(&'static str, usize); Priority::COUNT],
    pub queue_depth: usize,
    pub live_requests: usize,
    pub batch_size: BatchSecond,
    #[serde(serialize_with = "pairs")]
    pub flush_reasons: [(&'static str, u64); FlushReason::COUNT],
    pub workers: Vec<WorkerSecond>,
    pub backends: Vec<BackendSecond>,
    pub continuous: Option<ContinuousSecond>,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
}

impl Second {
    /// What happened between `prev` and `cur` (published by the same engine, `cur` later).
    pub fn between(prev: &Snapshot, cur: &Snapshot, unix_ms: u64) -> Second {
        let elapsed_ns = cur.at_ns.saturating_sub(prev.at_ns);
        let interval_s = elapsed_ns as f64 / 1e9;
        let (po, co) = (request_outcomes(prev), request_outcomes(cur));
        let outcomes = std::array::from_fn(|i| (co[i].0, co[i].1.saturating_sub(po[i].1)));
        let completed = cur.stats.completed.saturating_sub(prev.stats.completed);
        let batches = cur
            .stats
            .batches_formed
            .saturating_sub(prev.stats.batches_formed);
        let batched = cur
            .stats
            .batched_requests
            .saturating_sub(prev.stats.batched_requests);
        let sizes = Quantiles::between(&prev.batch_size, &cur.batch_size, 1.0);
        let batch_size = BatchSecond {
            batches,
            mean: if batches == 0 {
                0.0
            } else {
                batched as f64 / batches as f64
            },
            p50: sizes.p50,
            p99: sizes.p99,
            max: if sizes.count == 0 {
                0
            } else {
                cur.batch_size.max()
            },
        };
        let workers = cur
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let before = prev.workers.get(i).map_or(0, |p| p.busy_ns);
                WorkerSecond {
                    utilization: utilization_ratio(w.busy_ns.saturating_sub(before), elapsed_ns),
                    status: w.status.as_str(),
                    circuit: w.circuit.as_str(),
                    pending: w.pending,
                }
            })
            .collect();
        let backends = cur
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| BackendSecond {
                name: cur.backend_names.get(i).cloned().unwrap_or_default(),
                healthy: b.healthy,
                circuit: b.circuit.as_str(),
                pending_batches: b.pending_batches,
                latency_ema_ms: b.latency_ema_ms,
                routed: b
                    .routed
                    .saturating_sub(prev.backends.get(i).map_or(0, |p| p.routed)),
            })
            .collect();
        let continuous = cur.continuous.as_ref().map(|c| {
            let p = prev.continuous.unwrap_or_default();
            ContinuousSecond {
                slots_total: c.slots_total,
                active_slots: c.active_slots,
                kv_used_tokens: c.kv_used_tokens,
                kv_capacity_tokens: c.kv_capacity_tokens,
                steps: c.stats.steps.saturating_sub(p.stats.steps),
                decode_tokens: c.stats.decode_tokens.saturating_sub(p.stats.decode_tokens),
                prefill_tokens: c
                    .stats
                    .prefill_tokens
                    .saturating_sub(p.stats.prefill_tokens),
                preemptions: c.stats.preemptions.saturating_sub(p.stats.preemptions),
                ttft_ms: Quantiles::between(&prev.ttft, &cur.ttft, 1e6),
                tpot_ms: Quantiles::between(&prev.tpot, &cur.tpot, 1e6),
                prefix_cache: c
                    .prefix
                    .map(|now| PrefixSecond::between(&p.prefix.unwrap_or_default(), &now)),
            }
        });
        let (pf, cf) = (&prev.finished, &cur.finished);
        Second {
            unix_ms,
            uptime_s: cur.at_ns as f64 / 1e9,
            interval_s,
            strategy: cur.strategy.as_str(),
            outcomes,
            admitted: cur.stats.admitted.saturating_sub(prev.stats.admitted),
            completed_rps: if interval_s > 0.0 {
                completed as f64 / interval_s
            } else {
                0.0
            },
            latency_ms: Quantiles::between(&prev.latency, &cur.latency, 1e6),
            latency_by_priority_ms: Priority::HIGHEST_FIRST.map(|p| {
                let i = p.index();
                (
                    p.as_str(),
                    Quantiles::between(
                        &prev.latency_by_priority[i],
                        &cur.latency_by_priority[i],
                        1e6,
                    ),
                )
            }),
            queue_depth_by_priority: Priority::HIGHEST_FIRST.map(|p| {
                let depth = (0..BUCKET_LABELS.len())
                    .map(|b| cur.queued_by_class[class_index(p, b)])
                    .sum();
                (p.as_str(), depth)
            }),
            queue_depth: cur.queued,
            live_requests: cur.live_requests,
            batch_size,
            flush_reasons: FlushReason::ALL.map(|r| {
                let i = r.index();
                (
                    r.as_str(),
                    cur.stats.flush_reasons[i].saturating_sub(prev.stats.flush_reasons[i]),
                )
            }),
            workers,
            backends,
            continuous,
            prompt_tokens: cf.prompt_tokens.sum.saturating_sub(pf.prompt_tokens.sum),
            generation_tokens: cf
                .generation_tokens
                .sum
                .saturating_sub(pf.generation_tokens.sum),
        }
    }

    /// Requests with `outcome` in the interval (0 for an unknown name).
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.outcomes
            .iter()
            .find(|(name, _)| *name == outcome)
            .map_or(0, |(_, n)| *n)
    }
}

/// `[(name, value), ...]` as a JSON object `{name: value, ...}` (names are fixed labels).
fn pairs<S: serde::Serializer, V: Serialize>(
    v: &[(&'static str, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(v.iter().map(|(k, v)| (k, v)))
}
