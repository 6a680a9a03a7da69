//! The simulation report: per-run metrics computed from a [`RunOutput`] and the whole report
//! that `--json` writes. The table printed on stdout is in [`super::table`].
//!
//! Determinism rule: every field is a function of (seed, scenario, options). No wall-clock
//! time, host name, path of an output file or anything else from the machine goes in here;
//! fields serialise in declaration order, so the same inputs give byte-identical JSON.
//! Definitions: throughput is completed requests over the makespan (first arrival to last
//! completion, virtual time); SLA attainment is completed-within-SLA over requests offered,
//! so refused and failed requests count as misses.

use super::cluster::{ClusterOutput, ClusterRouting};
use super::driver::RunOutput;
use super::series::TimeSeries;
use super::settings::EngineSettings;
use super::sweep::{mode_of, SweepKey};
use super::tokens::TokenRecord;
use crate::core::{FlushReason, Priority};
use crate::exec::latency::LatencyModel;
use serde::Serialize;

/// Latency percentiles of completed requests, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// End-to-end latency of one priority class, ms, and its counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PriorityLatency {
    pub priority: String,
    pub offered: u64,
    pub completed: u64,
    /// Failed (timeouts) or refused at admission.
    pub failed: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

/// Batches by why they were released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FlushCounts {
    pub full: u64,
    pub timeout: u64,
    pub critical: u64,
    pub max_wait: u64,
    pub idle_worker: u64,
    pub drain: u64,
}

/// One sweep parameter's value in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamValue {
    pub key: String,
    pub value: f64,
}

/// The metrics of one (strategy, sweep point) run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    pub strategy: String,
    /// `strategy` plus the sweep point, e.g. `fixed bins=4`.
    pub label: String,
    pub params: Vec<ParamValue>,
    /// Fingerprint of the request sequence this run was offered, in offer order.
    pub request_digest: String,
    pub requests_offered: u64,
    pub admitted: u64,
    /// Refused at admission because the queue was full.
    pub rejected_queue_full: u64,
    /// Batches the memory check of `dynamic`/`multi_bin` cut short (KV-memory limit hits).
    pub memory_limit_hits: u64,
    pub completed: u64,
    /// Answered with an error (queue timeout, batch timeout).
    pub failed: u64,
    pub expired_in_queue: u64,
    pub unfinished: u64,
    pub makespan_s: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub total_tokens_per_s: f64,
    pub latency_ms: LatencySummary,
    /// One entry per priority class offered, highest first.
    pub latency_ms_by_priority: Vec<PriorityLatency>,
    pub queue_wait_ms_mean: f64,
    pub sla_attainment: f64,
    pub batches: u64,
    pub mean_batch_size: f64,
    /// `[size, batches]` for every batch size that occurred.
    pub batch_sizes: Vec<[u64; 2]>,
    pub worker_utilisation: f64,
    pub flush_reasons: FlushCounts,
    pub series_truncated: bool,
    /// Continuous batching runs only: what continuous batching is judged by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continuous: Option<ContinuousMetrics>,
    /// Routed continuous runs only: the replicas behind the router.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
}

/// A routed continuous run's cluster: every replica, the hit rate against the one-big-cache
/// reference, the load imbalance (see [`super::cluster`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterReport {
    /// The routing strategy (`round_robin`, `least_loaded`, ...).
    pub routing: String,
    /// Prompt tokens found cached over prompt tokens looked up, all replicas.
    pub hit_rate: f64,
    /// The same requests through one LRU cache of the whole cluster's KV capacity, in
    /// arrival order, timing-free (see `docs/routing.md`).
    pub reference_hit_rate: f64,
    /// `hit_rate / reference_hit_rate` (0 when the reference hit nothing).
    pub hit_rate_of_reference: f64,
    /// The busiest replica's busy time over the mean (1: even).
    pub imbalance: f64,
    /// The trace's ideal reuse (an unbounded cache): no routing can beat it.
    pub unbounded_hit_rate: f64,
    pub replicas: Vec<ReplicaReport>,
}

/// One replica of a routed run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaReport {
    /// Requests the router sent it (admitted).
    pub requests: u64,
    /// Busy time over the makespan.
    pub busy_fraction: f64,
    /// Time-averaged KV tokens in use over its capacity, over the makespan.
    pub kv_use: f64,
    /// Its prefix cache's hit rate.
    pub hit_rate: f64,
}

impl ClusterReport {
    fn new(c: &ClusterOutput, busy_ns: &[u64], makespan_ns: u64) -> ClusterReport {
        let mut total = crate::core::prefix::PrefixStats::default();
        for r in &c.replicas {
            total.add(&r.prefix);
        }
        let span = makespan_ns as f64;
        let share = |x: f64| if span > 0.0 { x / span } else { 0.0 };
        let reference = c.reference.hit_rate();
        ClusterReport {
            routing: c.routing.map_or("", |r| r.as_str()).to_string(),
            hit_rate: total.hit_rate(),
            reference_hit_rate: reference,
            hit_rate_of_reference: if reference > 0.0 {
                total.hit_rate() / reference
            } else {
                0.0
            },
            imbalance: super::cluster::imbalance(busy_ns),
            unbounded_hit_rate: c.unbounded.hit_rate(),
            replicas: c
                .replicas
                .iter()
                .zip(busy_ns)
                .map(|(r, &busy)| ReplicaReport {
                    requests: r.requests,
                    busy_fraction: share(busy as f64),
                    kv_use: if c.kv_capacity_tokens > 0 {
                        share(r.kv_token_ns as f64 / c.kv_capacity_tokens as f64)
                    } else {
                        0.0
                    },
                    hit_rate: r.prefix.hit_rate(),
                })
                .collect(),
        }
    }
}

/// The token-level metrics of a continuous-batching run (see [`super::tokens`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContinuousMetrics {
    /// Time to first token, ms.
    pub ttft_ms: LatencySummary,
    /// Time per output token (per request: decode time after the first token over the
    /// tokens after it), ms.
    pub tpot_ms: LatencySummary,
    /// Inter-token latency (every gap between two tokens of a request), ms.
    pub itl_ms: LatencySummary,
    pub ttft_target_ms: f64,
    pub tpot_target_ms: f64,
    /// Completed requests meeting both targets, per second of makespan.
    pub goodput_rps: f64,
    /// Of requests offered, the share that met both targets.
    pub goodput_fraction: f64,
    pub steps: u64,
    /// Tokens (decode + prefill) per step.
    pub mean_tokens_per_step: f64,
    pub decode_tokens: u64,
    pub prefill_tokens: u64,
    pub preemptions: u64,
    /// Per replica.
    pub kv_capacity_tokens: u64,
    /// Time-averaged KV tokens in use over capacity, all replicas, over the makespan.
    pub kv_utilisation_mean: f64,
    /// Most KV tokens one replica held at the start of a step.
    pub kv_peak_tokens: u64,
    pub slots_total: u64,
    /// Time-averaged active slots over all slots, over the makespan.
    pub slot_occupancy_mean: f64,
    /// Prefix caching's lookups (absent when it is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheMetrics>,
}

/// What prefix caching found over a run, in prompt tokens (vLLM's units).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PrefixCacheMetrics {
    /// Prompt tokens looked up as requests took slots (a preempted request is looked up
    /// again when it comes back).
    pub query_tokens: u64,
    /// Of those, tokens found cached: their prefill was skipped.
    pub hit_tokens: u64,
    /// `hit_tokens / query_tokens`.
    pub hit_rate: f64,
    /// Cached blocks evicted to make room.
    pub evicted_blocks: u64,
}

/// Percentiles and mean of a ns histogram, ms (zeros when empty).
fn summary(h: &hdrhistogram::Histogram<u64>, sum_ns: u128) -> LatencySummary {
    let n = h.len();
    if n == 0 {
        return LatencySummary::default();
    }
    let q = |p: f64| ns_to_ms(h.value_at_quantile(p) as f64);
    LatencySummary {
        mean: ns_to_ms(sum_ns as f64 / n as f64),
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
        p99_9: q(0.999),
        max: ns_to_ms(h.max() as f64),
    }
}

impl ContinuousMetrics {
    fn new(t: &TokenRecord, offered: u64, makespan_ns: u64) -> ContinuousMetrics {
        let span = makespan_ns as f64;
        let share = |area: u128, capacity: u64| {
            if span > 0.0 && capacity > 0 {
                area as f64 / (span * capacity as f64)
            } else {
                0.0
            }
        };
        ContinuousMetrics {
            ttft_ms: summary(&t.ttft_ns, t.ttft_sum_ns),
            tpot_ms: summary(&t.tpot_ns, t.tpot_sum_ns),
            itl_ms: summary(&t.itl_ns, t.itl_sum_ns),
            ttft_target_ms: ns_to_ms(t.ttft_target_ns as f64),
            tpot_target_ms: ns_to_ms(t.tpot_target_ns as f64),
            goodput_rps: per_s(t.goodput_met, span / 1e9),
            goodput_fraction: if offered == 0 {
                0.0
            } else {
                t.goodput_met as f64 / offered as f64
            },
            steps: t.steps,
            mean_tokens_per_step: if t.steps == 0 {
                0.0
            } else {
                (t.decode_tokens + t.prefill_tokens) as f64 / t.steps as f64
            },
            decode_tokens: t.decode_tokens,
            prefill_tokens: t.prefill_tokens,
            preemptions: t.preemptions,
            kv_capacity_tokens: t.kv_capacity_tokens,
            kv_utilisation_mean: share(t.kv_token_ns, t.kv_capacity_tokens * t.replicas),
            kv_peak_tokens: t.kv_peak_tokens,
            slots_total: t.slots_per_replica * t.replicas,
            slot_occupancy_mean: share(t.slot_ns, t.slots_per_replica * t.replicas),
            prefix_cache: t.prefix.map(|p| PrefixCacheMetrics {
                query_tokens: p.query_tokens,
                hit_tokens: p.hit_tokens,
                hit_rate: p.hit_rate(),
                evicted_blocks: p.evicted_blocks,
            }),
        }
    }
}

/// A whole simulation: what ran and every run's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub requests: u64,
    /// Fingerprint of the generated request sequence (before any oracle pre-binning).
    pub request_digest: String,
    pub sla_ms: f64,
    pub window_s: f64,
    pub latency: LatencyModel,
    pub engine: EngineSettings,
    pub strategies: Vec<String>,
    pub sweep: Vec<SweepAxis>,
    pub runs: Vec<RunReport>,
    /// Per-run time series, parallel to `runs` (CSV and charts; not in the JSON).
    #[serde(skip)]
    pub series: Vec<TimeSeries>,
}

/// One swept key and its values.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepAxis {
    pub key: String,
    pub values: Vec<f64>,
}

fn ns_to_ms(ns: f64) -> f64 {
    ns / 1e6
}

fn per_s(count: u64, span_s: f64) -> f64 {
    if span_s > 0.0 {
        count as f64 / span_s
    } else {
        0.0
    }
}

impl RunReport {
    /// Metrics of one run.
    pub fn new(strategy: &str, params: Vec<ParamValue>, out: &RunOutput) -> RunReport {
        let r = &out.record;
        let start = r.first_arrival_ns.unwrap_or(0);
        let makespan_ns = r.last_completion_ns.saturating_sub(start);
        let makespan_s = makespan_ns as f64 / 1e9;
        let h = &r.latency_ns;
        let q = |p: f64| {
            if r.completed == 0 {
                0.0
            } else {
                ns_to_ms(h.value_at_quantile(p) as f64)
            }
        };
        let latency_ms = LatencySummary {
            mean: if r.completed == 0 {
                0.0
            } else {
                ns_to_ms(r.latency_sum_ns as f64 / r.completed as f64)
            },
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p99_9: q(0.999),
            max: if r.completed == 0 {
                0.0
            } else {
                ns_to_ms(h.max() as f64)
            },
        };
        let latency_ms_by_priority = Priority::HIGHEST_FIRST
            .iter()
            .filter_map(|&p| {
                let c = &r.by_priority[p.index()];
                (c.offered > 0).then(|| {
                    let q = |x: f64| {
                        if c.completed == 0 {
                            0.0
                        } else {
                            ns_to_ms(c.latency_ns.value_at_quantile(x) as f64)
                        }
                    };
                    PriorityLatency {
                        priority: p.as_str().to_string(),
                        offered: c.offered,
                        completed: c.completed,
                        failed: c.failed,
                        mean: if c.completed == 0 {
                            0.0
                        } else {
                            ns_to_ms(c.latency_sum_ns as f64 / c.completed as f64)
                        },
                        p50: q(0.5),
                        p99: q(0.99),
                    }
                })
            })
            .collect();
        let s = &out.stats;
        let flush = |f: FlushReason| s.flush_reasons[f.index()];
        let workers = out.busy_ns.len().max(1) as f64;
        let busy: u64 = out.busy_ns.iter().sum();
        let label = std::iter::once(strategy.to_string())
            .chain(params.iter().map(|p| {
                if p.key == SweepKey::Mode.as_str() {
                    format!("mode={}", mode_of(p.value).as_str())
                } else if p.key == SweepKey::Routing.as_str() {
                    let name = ClusterRouting::of_value(p.value).map_or("?", |r| r.as_str());
                    format!("routing={name}")
                } else {
                    format!("{}={}", p.key, p.value)
                }
            }))
            .collect::<Vec<_>>()
            .join(" ");
        RunReport {
            strategy: strategy.to_string(),
            label,
            params,
            request_digest: r.offered_digest.hex(),
            requests_offered: r.offered,
            admitted: r.admitted,
            rejected_queue_full: r.rejected_full,
            memory_limit_hits: out.memory_limit_hits,
            completed: r.completed,
            failed: r.failed,
            expired_in_queue: s.expired,
            unfinished: out.unfinished,
            makespan_s,
            throughput_rps: per_s(r.completed, makespan_s),
            output_tokens_per_s: per_s(r.output_tokens_completed, makespan_s),
            total_tokens_per_s: per_s(
                r.output_tokens_completed + r.prompt_tokens_completed,
                makespan_s,
            ),
            latency_ms,
            latency_ms_by_priority,
            queue_wait_ms_mean: if r.dispatched == 0 {
                0.0
            } else {
                ns_to_ms(r.queue_wait_sum_ns as f64 / r.dispatched as f64)
            },
            sla_attainment: if r.offered == 0 {
                0.0
            } else {
                r.sla_met as f64 / r.offered as f64
            },
            batches: s.batches_formed,
            mean_batch_size: s.avg_batch_size(),
            batch_sizes: r
                .batch_sizes
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(size, &n)| [size as u64, n])
                .collect(),
            worker_utilisation: if makespan_ns == 0 {
                0.0
            } else {
                (busy as f64 / (workers * makespan_ns as f64)).min(1.0)
            },
            flush_reasons: FlushCounts {
                full: flush(FlushReason::Full),
                timeout: flush(FlushReason::Timeout),
                critical: flush(FlushReason::Critical),
                max_wait: flush(FlushReason::MaxWait),
                idle_worker: flush(FlushReason::IdleWorker),
                drain: flush(FlushReason::Drain),
            },
            series_truncated: r.series.truncated,
            continuous: r
                .tokens
                .as_deref()
                .map(|t| ContinuousMetrics::new(t, r.offered, makespan_ns)),
            cluster: out
                .cluster
                .as_deref()
                .map(|c| ClusterReport::new(c, &out.busy_ns, makespan_ns)),
        }
    }
}

impl SimReport {
    /// Pretty JSON with a trailing newline. Deterministic.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("the report serialises");
        s.push('\n');
        s
    }
}
