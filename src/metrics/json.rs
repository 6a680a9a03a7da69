//! The /metrics/json page: a snapshot and the HTTP counters as one JSON object for
//! dashboards and scripts (latency percentiles in ms, throughput, per-worker state).
//!
//! Runs on io threads and allocates the returned value; never on the engine thread. The
//! wall-clock time for `timestamp` is passed in: nothing here reads a clock. Figures shared
//! with the Prometheus page come from `derived`, so both pages agree.

use super::derived::{
    ns_to_ms, ns_to_seconds, quantile_ms, rejected_total, request_outcomes, shown_workers,
    throughput_rps, utilization_ratio, NANOS_PER_MS_F64,
};
use super::http_stats::{Endpoint, HttpStats, STATUS_SLOTS, STATUS_SLOT_LABELS};
use super::timestamp::rfc3339_utc_from_unix_ms;
use crate::core::request::{class_index, Priority, BUCKET_LABELS};
use crate::core::strategy::auto::AutoSnapshot;
use crate::core::FlushReason;
use crate::runtime::Snapshot;
use serde_json::{json, Map, Value};

/// `Content-Type` of the rendered page.
pub const CONTENT_TYPE: &str = "application/json";

/// The page for `snapshot` and `http`, stamped with `now_unix_ms` (wall clock, ms since the
/// Unix epoch).
pub fn render(snapshot: &Snapshot, http: &HttpStats, now_unix_ms: u64) -> Value {
    let stats = &snapshot.stats;
    let latency = &snapshot.latency;
    json!({
        "timestamp": rfc3339_utc_from_unix_ms(now_unix_ms),
        "uptime_seconds": ns_to_seconds(snapshot.at_ns),
        "strategy": snapshot.strategy.as_str(),
        "draining": snapshot.draining,
        "queue_depth": snapshot.queued,
        "queue_depth_by_class": queue_depth_by_class(snapshot),
        "live_requests": snapshot.live_requests,
        "latency_p50_ms": quantile_ms(latency, 0.5),
        "latency_p90_ms": quantile_ms(latency, 0.9),
        "latency_p99_ms": quantile_ms(latency, 0.99),
        "latency_p999_ms": quantile_ms(latency, 0.999),
        "latency_mean_ms": latency.mean() / NANOS_PER_MS_F64,
        "latency_by_priority": latency_by_priority(snapshot),
        "observed_p99_ms": snapshot.observed_p99_ns.map(ns_to_ms),
        "token_latency": token_latency(snapshot),
        "prefix_cache": prefix_cache(snapshot),
        "queue_wait_mean_ms": stats.queue_wait.mean_ns() / NANOS_PER_MS_F64,
        "throughput_rps": throughput_rps(stats.completed, snapshot.at_ns),
        "batches_formed": stats.batches_formed,
        "avg_batch_size": stats.avg_batch_size(),
        "requests": requests(snapshot),
        "flush_reasons": flush_reasons(snapshot),
        "workers": workers(snapshot),
        "backends": backends(snapshot),
        "http": http_json(http),
    })
}

/// Continuous batching's per-token figures since start, in ms:
/// `{"ttft": {"count": n, "mean_ms": x, "p50_ms": x, "p90_ms": x, "p99_ms": x}, "tpot": {...}}`
/// (zeros while nothing was recorded, e.g. in request-level mode). `tools/sim_vs_live.sh`
/// compares these with `abe simulate --mode continuous`.
fn token_latency(snapshot: &Snapshot) -> Value {
    let figures = |h: &hdrhistogram::Histogram<u64>| {
        json!({
            "count": h.len(),
            "mean_ms": if h.is_empty() { 0.0 } else { h.mean() / NANOS_PER_MS_F64 },
            "p50_ms": quantile_ms(h, 0.5),
            "p90_ms": quantile_ms(h, 0.9),
            "p99_ms": quantile_ms(h, 0.99),
        })
    };
    json!({ "ttft": figures(&snapshot.ttft), "tpot": figures(&snapshot.tpot) })
}

/// Continuous batching with prefix caching: `{"query_tokens": n, "hit_tokens": n,
/// "hit_rate": x, "evicted_blocks": n}` since start; `null` where no prefix cache runs.
fn prefix_cache(snapshot: &Snapshot) -> Value {
    match snapshot.continuous.as_ref().and_then(|c| c.prefix) {
        None => Value::Null,
        Some(p) => json!({
            "query_tokens": p.query_tokens,
            "hit_tokens": p.hit_tokens,
            "hit_rate": p.hit_rate(),
            "evicted_blocks": p.evicted_blocks,
        }),
    }
}

/// `{"critical": {"completed": n, "p50_ms": x, "p99_ms": x}, "high": {...}, ...}`, highest
/// priority first.
fn latency_by_priority(snapshot: &Snapshot) -> Value {
    let mut by_priority = Map::new();
    for priority in Priority::HIGHEST_FIRST {
        let h = &snapshot.latency_by_priority[priority.index()];
        by_priority.insert(
            priority.as_str().to_string(),
            json!({
                "completed": h.len(),
                "p50_ms": quantile_ms(h, 0.5),
                "p99_ms": quantile_ms(h, 0.99),
            }),
        );
    }
    Value::Object(by_priority)
}

/// `{"critical": {"128": n, ..., "inf": n}, "high": {...}, ...}`, highest priority first.
fn queue_depth_by_class(snapshot: &Snapshot) -> Value {
    let mut by_priority = Map::new();
    for priority in Priority::HIGHEST_FIRST {
        let mut by_bucket = Map::new();
        for (bucket, label) in BUCKET_LABELS.iter().enumerate() {
            let depth = snapshot.queued_by_class[class_index(priority, bucket)];
            by_bucket.insert((*label).to_string(), depth.into());
        }
        by_priority.insert(priority.as_str().to_string(), Value::Object(by_bucket));
    }
    Value::Object(by_priority)
}

/// Admissions, failures and refusals: the outcome counts plus their totals.
fn requests(snapshot: &Snapshot) -> Value {
    let mut map = Map::new();
    map.insert("admitted".into(), snapshot.stats.admitted.into());
    map.insert("failed".into(), snapshot.stats.failed.into());
    // Requests moved to another backend's core for a retry: counted once in admitted and
    // answered once, so admitted = completed + failed + live still (the chaos soak checks it).
    map.insert("readmitted".into(), snapshot.stats.readmitted.into());
    map.insert("rejected".into(), rejected_total(snapshot).into());
    for (outcome, n) in request_outcomes(snapshot) {
        map.insert(outcome.into(), n.into());
    }
    Value::Object(map)
}

/// `{"full": n, "timeout": n, ...}`.
fn flush_reasons(snapshot: &Snapshot) -> Value {
    let map = FlushReason::ALL
        .iter()
        .map(|r| {
            (
                r.as_str().to_string(),
                snapshot.stats.flush_reasons[r.index()].into(),
            )
        })
        .collect();
    Value::Object(map)
}

/// One object per worker of a slot that is not empty, in worker order.
fn workers(snapshot: &Snapshot) -> Value {
    let list = shown_workers(snapshot).map(|(id, w)| {
        json!({
            "id": id,
            "status": w.status.as_str(),
            "utilization": utilization_ratio(w.busy_ns, snapshot.at_ns),
            "busy_seconds": ns_to_seconds(w.busy_ns),
            "circuit": w.circuit.as_str(),
            "pending": w.pending,
            "batches_ok": w.batches_ok,
            "batches_failed": w.batches_failed,
        })
    });
    Value::Array(list.collect())
}

/// Each backend's routing state and counters, in config order.
fn backends(snapshot: &Snapshot) -> Value {
    let list = snapshot
        .backend_names
        .iter()
        .zip(&snapshot.backends)
        .enumerate()
        .filter(|(_, (_, b))| b.slot != crate::router::SlotState::Empty)
        .map(|(i, (name, b))| {
            json!({
                "name": name,
                "slot": b.slot.as_str(),
                "healthy": b.healthy,
                "circuit": b.circuit.as_str(),
                "pending_batches": b.pending_batches,
                "latency_ema_ms": b.latency_ema_ms,
                "routed": b.routed,
                "via_alias": b.via_alias,
                "via_fallback": b.via_fallback,
                "retried_away": b.retried_away,
                "failed": b.failed,
                "auto": snapshot.auto.get(i).map_or(Value::Null, auto_json),
            })
        });
    Value::Array(list.collect())
}

/// `auto`'s state in one backend lane: fitted cost (ms), arrival rate, decisions, last hold.
fn auto_json(a: &AutoSnapshot) -> Value {
    json!({
        "cost_fixed_ms": a.cost.a_ns / NANOS_PER_MS_F64,
        "cost_per_request_ms": a.cost.b_ns / NANOS_PER_MS_F64,
        "cost_per_token_ms": a.cost.c_ns_per_token / NANOS_PER_MS_F64,
        "cost_samples": a.cost.samples,
        "arrival_rate_per_s": a.arrival_rate_per_s,
        "arrival_burstiness": a.arrival_burstiness,
        "echo_fraction": a.echo_fraction,
        "decisions": {"dispatch": a.dispatched_now, "hold": a.held},
        "last_wait_ms": ns_to_ms(a.last_wait_ns),
        "expected_joiners": a.last_expected_arrivals,
        "window_ms": ns_to_ms(a.window_ns),
    })
}

/// Connections, bytes, and responses per endpoint (codes with no responses are left out).
fn http_json(http: &HttpStats) -> Value {
    let mut responses = Map::new();
    for endpoint in Endpoint::ALL {
        let by_code: Map<String, Value> = (0..STATUS_SLOTS)
            .map(|slot| {
                (
                    STATUS_SLOT_LABELS[slot],
                    http.responses_in_slot(endpoint, slot),
                )
            })
            .filter(|&(_, n)| n > 0)
            .map(|(code, n)| (code.to_string(), n.into()))
            .collect();
        responses.insert(endpoint.as_str().to_string(), Value::Object(by_code));
    }
    json!({
        "connections_open": http.connections_open(),
        "connections_accepted": http.connections_accepted(),
        "connections_refused": http.connections_refused(),
        "connections_closed": http.connections_closed(),
        "connections_evicted": crate::metrics::http_stats::Eviction::ALL
            .iter()
            .map(|&why| (why.as_str().to_string(), http.evictions(why).into()))
            .collect::<serde_json::Map<String, Value>>(),
        "bytes_in": http.bytes_in(),
        "bytes_out": http.bytes_out(),
        "responses": responses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::circuit::CircuitState;
    use crate::core::pool::WorkerStatus;
    use crate::core::strategy::StrategyKind;

    fn busy_snapshot() -> Snapshot {
        let mut snap = Snapshot::new(2, StrategyKind::QueueDepth);
        snap.at_ns = 4_000_000_000;
        snap.queued = 7;
        snap.queued_by_class[class_index(Priority::High, 1)] = 7;
        snap.stats.admitted = 120;
        snap.stats.completed = 100;
        snap.stats.failed = 3;
        snap.stats.expired = 2;
        snap.stats.cancelled = 1;
        snap.stats.rejected_full = 5;
        snap.rejected_busy = 1;
        snap.stats.batches_formed = 25;
        snap.stats.batched_requests = 100;
        snap.stats.flush_reasons[FlushReason::Full.index()] = 20;
        snap.stats.flush_reasons[FlushReason::Timeout.index()] = 5;
        for ms in 1..=100u64 {
            snap.latency.record(ms * 1_000_000).unwrap();
        }
        snap.workers[1].status = WorkerStatus::Unhealthy;
        snap.workers[1].circuit = CircuitState::Open;
        snap.workers[1].busy_ns = 1_000_000_000;
        snap.workers[1].pending = 2;
        snap.workers[1].batches_failed = 5;
        snap
    }

    #[test]
    fn summary_fields() {
        let http = HttpStats::new();
        let v = render(&busy_snapshot(), &http, 1_700_000_000_123);
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["strategy"], "queue_depth");
        assert_eq!(v["queue_depth"], 7);
        assert_eq!(v["queue_depth_by_class"]["high"]["512"], 7);
        assert_eq!(v["queue_depth_by_class"]["low"]["inf"], 0);
        assert_eq!(v["throughput_rps"], 25.0);
        assert_eq!(v["batches_formed"], 25);
        assert_eq!(v["avg_batch_size"], 4.0);
        assert_eq!(v["uptime_seconds"], 4.0);
        assert_eq!(v["draining"], false);
        assert_eq!(v["observed_p99_ms"], Value::Null);
    }

    #[test]
    fn latency_percentiles_are_in_milliseconds() {
        let v = render(&busy_snapshot(), &HttpStats::new(), 0);
        // 1..=100 ms recorded once each; hdrhistogram answers with the bucket's highest
        // equivalent value, within 0.1 %.
        for (key, want_ms) in [
            ("latency_p50_ms", 50.0),
            ("latency_p90_ms", 90.0),
            ("latency_p99_ms", 99.0),
            ("latency_p999_ms", 100.0),
        ] {
            let got = v[key].as_f64().unwrap();
            assert!((got - want_ms).abs() <= want_ms * 1e-3, "{key}: {got}");
        }
    }

    #[test]
    fn token_latency_is_in_milliseconds() {
        let mut snap = Snapshot::new(1, StrategyKind::Fixed);
        for ms in 1..=100u64 {
            snap.ttft.record(ms * 1_000_000).unwrap();
            snap.tpot.record(ms * 100_000).unwrap();
        }
        let v = render(&snap, &HttpStats::new(), 0);
        let t = &v["token_latency"];
        assert_eq!(t["ttft"]["count"], 100);
        let p50 = t["ttft"]["p50_ms"].as_f64().unwrap();
        assert!((p50 - 50.0).abs() <= 0.05, "{p50}");
        let mean = t["tpot"]["mean_ms"].as_f64().unwrap();
        assert!((mean - 5.05).abs() <= 0.01, "{mean}");
        let empty = render(&Snapshot::new(1, StrategyKind::Fixed), &HttpStats::new(), 0);
        assert_eq!(empty["token_latency"]["tpot"]["p50_ms"].as_f64(), Some(0.0));
        assert_eq!(
            empty["token_latency"]["ttft"]["mean_ms"].as_f64(),
            Some(0.0)
        );
    }

    #[test]
    fn empty_snapshot_reports_zeros_not_nulls() {
        let v = render(&Snapshot::new(1, StrategyKind::Fixed), &HttpStats::new(), 0);
        for key in [
            "latency_p50_ms",
            "latency_p99_ms",
            "latency_p999_ms",
            "throughput_rps",
            "avg_batch_size",
            "latency_mean_ms",
            "queue_wait_mean_ms",
        ] {
            assert_eq!(v[key].as_f64(), Some(0.0), "{key}");
        }
        assert_eq!(v["workers"][0]["utilization"].as_f64(), Some(0.0));
        assert_eq!(
            v["latency_by_priority"]["critical"]["p99_ms"].as_f64(),
            Some(0.0)
        );
        assert_eq!(v["latency_by_priority"]["low"]["completed"], 0);
    }

    #[test]
    fn requests_and_flush_reasons() {
        let v = render(&busy_snapshot(), &HttpStats::new(), 0);
        let r = &v["requests"];
        assert_eq!(r["admitted"], 120);
        assert_eq!(r["completed"], 100);
        assert_eq!(r["failed"], 3);
        assert_eq!(r["expired"], 2);
        assert_eq!(r["cancelled"], 1);
        assert_eq!(r["failed_other"], 0);
        assert_eq!(r["rejected_full"], 5);
        assert_eq!(r["rejected_busy"], 1);
        assert_eq!(r["rejected"], 6);
        assert_eq!(v["flush_reasons"]["full"], 20);
        assert_eq!(v["flush_reasons"]["timeout"], 5);
        assert_eq!(v["flush_reasons"]["drain"], 0);
        assert_eq!(
            v["flush_reasons"].as_object().unwrap().len(),
            FlushReason::COUNT
        );
    }

    #[test]
    fn workers_are_listed_in_order() {
        let v = render(&busy_snapshot(), &HttpStats::new(), 0);
        let w = v["workers"].as_array().unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[0]["id"], "worker-0");
        assert_eq!(w[0]["status"], "idle");
        assert_eq!(w[0]["circuit"], "closed");
        assert_eq!(w[1]["id"], "worker-1");
        assert_eq!(w[1]["status"], "unhealthy");
        assert_eq!(w[1]["circuit"], "open");
        assert_eq!(w[1]["utilization"], 0.25);
        assert_eq!(w[1]["pending"], 2);
        assert_eq!(w[1]["batches_ok"], 0);
        assert_eq!(w[1]["batches_failed"], 5);
    }

    #[test]
    fn http_counters() {
        let http = HttpStats::new();
        http.record_response(Endpoint::ChatCompletions, 200);
        http.record_response(Endpoint::ChatCompletions, 429);
        http.record_response(Endpoint::ChatCompletions, 418);
        http.connection_opened();
        http.connection_refused();
        http.add_bytes_in(10);
        http.add_bytes_out(20);
        let v = render(&busy_snapshot(), &http, 0);
        let h = &v["http"];
        assert_eq!(h["responses"]["chat_completions"]["200"], 1);
        assert_eq!(h["responses"]["chat_completions"]["429"], 1);
        assert_eq!(h["responses"]["chat_completions"]["other"], 1);
        assert_eq!(
            h["responses"]["chat_completions"]
                .as_object()
                .unwrap()
                .len(),
            3
        );
        assert_eq!(h["responses"]["embeddings"], json!({}));
        assert_eq!(h["responses"].as_object().unwrap().len(), Endpoint::COUNT);
        assert_eq!(h["connections_open"], 1);
        assert_eq!(h["connections_refused"], 1);
        assert_eq!(
            (h["bytes_in"].clone(), h["bytes_out"].clone()),
            (json!(10), json!(20))
        );
    }

    #[test]
    fn backends_carry_auto_state_per_lane() {
        use crate::core::strategy::auto::cost::Cost;
        let mut snap = busy_snapshot();
        snap.backend_names = vec!["gpu-a".into(), "gpu-b".into()];
        snap.backends = vec![Default::default(); 2];
        snap.auto = vec![Default::default(); 2];
        snap.auto[1] = AutoSnapshot {
            cost: Cost {
                a_ns: 10_000_000.0,
                b_ns: 2_000_000.0,
                c_ns_per_token: 500.0,
                samples: 64,
                outliers: 0,
            },
            arrival_rate_per_s: 125.5,
            arrival_burstiness: 2.25,
            echo_fraction: 0.75,
            dispatched_now: 9,
            held: 4,
            last_wait_ns: 3_500_000,
            last_expected_arrivals: 2.5,
            window_ns: 1_250_000,
        };
        let v = render(&snap, &HttpStats::new(), 0);
        let a = &v["backends"][1]["auto"];
        assert_eq!(a["cost_fixed_ms"], 10.0);
        assert_eq!(a["cost_per_request_ms"], 2.0);
        assert_eq!(a["cost_per_token_ms"], 0.0005);
        assert_eq!(a["cost_samples"], 64);
        assert_eq!(a["arrival_rate_per_s"], 125.5);
        assert_eq!(a["arrival_burstiness"], 2.25);
        assert_eq!(a["echo_fraction"], 0.75);
        assert_eq!(a["decisions"], json!({"dispatch": 9, "hold": 4}));
        assert_eq!(a["last_wait_ms"], 3.5);
        assert_eq!(a["expected_joiners"], 2.5);
        assert_eq!(a["window_ms"], 1.25);
        assert_eq!(a.as_object().unwrap().len(), 11);
        assert_eq!(v["backends"][0]["auto"]["cost_samples"], 0);
        // Continuous batching has no lanes: `auto` is null.
        snap.auto.clear();
        let v = render(&snap, &HttpStats::new(), 0);
        assert_eq!(v["backends"][0]["auto"], Value::Null);
    }

    #[test]
    fn page_serializes() {
        let text = render(&busy_snapshot(), &HttpStats::new(), 0).to_string();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["strategy"], "queue_depth");
    }
}
