//! The /metrics page: the runtime's published [`Snapshot`] and the server's [`HttpStats`]
//! as Prometheus text exposition format 0.0.4, clean under `promtool check metrics`.
//!
//! Rendering reads a snapshot the engine already published, so it runs on io threads and may
//! allocate; it must never run on the engine thread, and callers clone the snapshot out of
//! the engine's lock first rather than render while holding it. Every family has HELP and TYPE, counters end in `_total`, durations
//! are in seconds, and every label set is fixed (no label value comes from a client).

use super::derived::{
    approx_sum, ns_to_seconds, request_outcomes, shown_workers, utilization_ratio, CIRCUIT_STATES,
    NANOS_PER_SECOND_F64, WORKER_STATUSES,
};
use super::exposition::{family, histogram, sample, single, MetricType};
use super::http_stats::{Endpoint, Eviction, HttpStats, STATUS_SLOT_LABELS};
use crate::buckets::{BATCH_SIZE_BOUNDS, LATENCY_BOUNDS_NS, QUEUE_WAIT_BOUND_LOG2_NS};
use crate::build_info;
use crate::core::request::{class_index, Priority, BUCKET_LABELS};
use crate::core::stats::{WaitHistogram, WAIT_BUCKETS};
use crate::core::strategy::auto::AutoSnapshot;
use crate::core::strategy::StrategyKind;
use crate::core::FlushReason;
use crate::exec::embed::{EmbedStats, EmbedTotals};
use crate::runtime::Snapshot;
use hdrhistogram::Histogram;
use std::sync::Arc;

/// `Content-Type` of the rendered page.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const _: () =
    assert!(QUEUE_WAIT_BOUND_LOG2_NS[QUEUE_WAIT_BOUND_LOG2_NS.len() - 1] < WAIT_BUCKETS as u32);

/// Appends the whole page for `snapshot` and `http` to `out`.
pub fn render(snapshot: &Snapshot, http: &HttpStats, out: &mut String) {
    render_process(snapshot, out);
    render_queue(snapshot, out);
    render_requests(snapshot, out);
    render_latency_by_priority(snapshot, out);
    render_batches(snapshot, out);
    render_workers(snapshot, out);
    render_backends(snapshot, out);
    render_auto(snapshot, out);
    render_research(snapshot, out);
    render_continuous(snapshot, out);
    render_http(http, out);
}

/// Continuous batching: slots, KV cache, step composition, preemptions (only in that mode).
fn render_continuous(snapshot: &Snapshot, out: &mut String) {
    let Some(c) = &snapshot.continuous else {
        return;
    };
    let gauges = [
        (
            "abe_continuous_slots",
            "Continuous batching: slots over all replicas.",
            c.slots_total as u64,
        ),
        (
            "abe_continuous_active_slots",
            "Continuous batching: slots holding a request (prefilling or generating).",
            c.active_slots as u64,
        ),
        (
            "abe_continuous_kv_used_tokens",
            "Continuous batching: KV cache in use, in tokens, over all replicas.",
            c.kv_used_tokens,
        ),
        (
            "abe_continuous_kv_capacity_tokens",
            "Continuous batching: KV cache capacity, in tokens, over all replicas.",
            c.kv_capacity_tokens,
        ),
    ];
    for (name, help, value) in gauges {
        single(out, name, MetricType::Gauge, help, value);
    }
    let counters = [
        (
            "abe_continuous_steps_total",
            "Continuous batching: forward passes (ticks) run.",
            c.stats.steps,
        ),
        (
            "abe_continuous_decode_tokens_total",
            "Continuous batching: decode tokens over all steps.",
            c.stats.decode_tokens,
        ),
        (
            "abe_continuous_prefill_tokens_total",
            "Continuous batching: prompt tokens prefilled over all steps.",
            c.stats.prefill_tokens,
        ),
        (
            "abe_continuous_preemptions_total",
            "Continuous batching: requests preempted (KV cache exhausted) and recomputed.",
            c.stats.preemptions,
        ),
    ];
    for (name, help, value) in counters {
        single(out, name, MetricType::Counter, help, value);
    }
    if let Some(p) = &c.prefix {
        let counters = [
            (
                "abe_prefix_cache_query_tokens_total",
                "Prefix caching: prompt tokens looked up as requests took slots.",
                p.query_tokens,
            ),
            (
                "abe_prefix_cache_hit_tokens_total",
                "Prefix caching: prompt tokens found cached (their prefill was skipped).",
                p.hit_tokens,
            ),
            (
                "abe_prefix_cache_evicted_blocks_total",
                "Prefix caching: cached KV blocks evicted to make room.",
                p.evicted_blocks,
            ),
        ];
        for (name, help, value) in counters {
            single(out, name, MetricType::Counter, help, value);
        }
    }
    single(
        out,
        "abe_continuous_output_tokens_total",
        MetricType::Counter,
        "Continuous batching: output tokens of completed requests (rate() gives tokens/s).",
        c.output_tokens,
    );
    let name = "abe_time_to_first_token_seconds";
    family(
        out,
        name,
        MetricType::Histogram,
        "Continuous batching: arrival to first sampled token (sum approximated from mean x count).",
    );
    render_hdr_histogram(
        &snapshot.ttft,
        &LATENCY_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
        name,
        out,
    );
    let name = "abe_time_per_output_token_seconds";
    family(
        out,
        name,
        MetricType::Histogram,
        "Continuous batching: (last token - first token) / (tokens - 1) per request (sum approximated from mean x count).",
    );
    render_hdr_histogram(
        &snapshot.tpot,
        &LATENCY_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
        name,
        out,
    );
}

/// Controller state of the `dynamic` and `multi_bin` strategies.
fn render_research(snapshot: &Snapshot, out: &mut String) {
    let r = &snapshot.research;
    let gauges = [
        (
            "abe_dynamic_batch_size_memory_limit",
            "dynamic/multi_bin: memory-constrained batch size b_mem (Algorithm 1).",
            r.b_mem,
        ),
        (
            "abe_dynamic_batch_size_sla_limit",
            "dynamic/multi_bin: SLA-constrained batch size b_SLA (Algorithm 2).",
            r.b_sla,
        ),
        (
            "abe_dynamic_batch_size_interval_low",
            "dynamic/multi_bin: lower end of the SLA controller's batch-size interval.",
            r.b_low,
        ),
        (
            "abe_dynamic_batch_size_interval_high",
            "dynamic/multi_bin: upper end of the SLA controller's batch-size interval.",
            r.b_high,
        ),
    ];
    for (name, help, value) in gauges {
        single(out, name, MetricType::Gauge, help, u64::from(value));
    }
    if let Some(tbt_ms) = r.tbt_ms_ema {
        single(
            out,
            "abe_dynamic_decode_tbt_seconds",
            MetricType::Gauge,
            "dynamic/multi_bin: EMA of decode time between tokens seen by the SLA controller.",
            tbt_ms / 1000.0,
        );
    }
    single(
        out,
        "abe_dynamic_memory_limit_hits_total",
        MetricType::Counter,
        "dynamic/multi_bin: batches cut short by the memory check (Algorithm 3).",
        r.memory_limit_hits,
    );
    single(
        out,
        "abe_multibin_boundary_recomputes_total",
        MetricType::Counter,
        "multi_bin: times the bin boundaries were recomputed from observed lengths.",
        r.boundary_recomputes,
    );
    let name = "abe_multibin_queue_depth";
    family(
        out,
        name,
        MetricType::Gauge,
        "multi_bin: requests waiting per bin (bins by predicted output length).",
    );
    for bin in 0..r.bins {
        let label = bin.to_string();
        sample(
            out,
            name,
            &[("bin", label.as_str())],
            r.bin_lens[bin] as u64,
        );
    }
    let name = "abe_multibin_bin_upper_tokens";
    family(
        out,
        name,
        MetricType::Gauge,
        "multi_bin: exclusive upper bound of each bin, in predicted output tokens.",
    );
    for bin in 0..r.bins {
        let label = bin.to_string();
        sample(
            out,
            name,
            &[("bin", label.as_str())],
            u64::from(r.bin_upper_tokens[bin]),
        );
    }
}

/// Build, uptime, draining, strategy.
fn render_process(snapshot: &Snapshot, out: &mut String) {
    let name = "abe_build_info";
    family(
        out,
        name,
        MetricType::Gauge,
        "Build of the running abe; always 1.",
    );
    let labels = [
        ("version", build_info::VERSION),
        ("revision", build_info::GIT_REVISION),
        ("profile", build_info::PROFILE),
    ];
    sample(out, name, &labels, 1u64);
    single(
        out,
        "abe_uptime_seconds",
        MetricType::Gauge,
        "Engine clock at the last published snapshot: seconds since the runtime started.",
        ns_to_seconds(snapshot.at_ns),
    );
    single(
        out,
        "abe_draining",
        MetricType::Gauge,
        "1 while the engine drains for shutdown and refuses new requests, else 0.",
        snapshot.draining,
    );
    let name = "abe_strategy";
    let help = "Flush strategy in use: 1 for the active strategy, 0 for the others.";
    family(out, name, MetricType::Gauge, help);
    for kind in StrategyKind::ALL {
        sample(
            out,
            name,
            &[("strategy", kind.as_str())],
            kind == snapshot.strategy,
        );
    }
}

/// Queue depth per class, live requests, queue wait, observed p99.
fn render_queue(snapshot: &Snapshot, out: &mut String) {
    let name = "abe_queue_depth";
    let help = "Requests waiting to be batched, by priority and token bucket \
                (bucket: upper bound of estimated tokens; inf: larger).";
    family(out, name, MetricType::Gauge, help);
    for priority in Priority::HIGHEST_FIRST {
        for (bucket, bucket_label) in BUCKET_LABELS.iter().enumerate() {
            let depth = snapshot.queued_by_class[class_index(priority, bucket)];
            let labels = [("priority", priority.as_str()), ("bucket", *bucket_label)];
            sample(out, name, &labels, depth);
        }
    }
    single(
        out,
        "abe_live_requests",
        MetricType::Gauge,
        "Requests admitted and not yet answered (queued or in a batch).",
        snapshot.live_requests,
    );
    let name = "abe_queue_wait_seconds";
    let help = "Time requests waited in the queue before dispatch. Bounds are powers of two \
                in ns; a wait of exactly a bound counts in the next bucket.";
    family(out, name, MetricType::Histogram, help);
    render_wait_histogram(&snapshot.stats.queue_wait, name, out);
    let name = "abe_observed_p99_seconds";
    let help = "p99 end-to-end latency over the latency-aware strategy's recent window; \
                absent until a request completes.";
    family(out, name, MetricType::Gauge, help);
    if let Some(p99_ns) = snapshot.observed_p99_ns {
        sample(out, name, &[], ns_to_seconds(p99_ns));
    }
}

/// Writes the core's log2 queue-wait histogram with the merged bounds.
fn render_wait_histogram(waits: &WaitHistogram, name: &str, out: &mut String) {
    let count: u64 = waits.counts.iter().sum();
    debug_assert_eq!(count, waits.count, "bucket counts must add up to the total");
    // Bucket i holds waits in [2^(i-1), 2^i) ns, so every wait in buckets 0..=k is < 2^k ns.
    let cumulative = QUEUE_WAIT_BOUND_LOG2_NS.iter().map(|&k| {
        let below: u64 = waits.counts[..=k as usize].iter().sum();
        (
            ns_to_seconds(WaitHistogram::bucket_upper_ns(k as usize)),
            below,
        )
    });
    histogram(
        out,
        name,
        &[],
        cumulative,
        count,
        ns_to_seconds(waits.sum_ns),
    );
}

/// Admissions, outcomes, end-to-end latency.
fn render_requests(snapshot: &Snapshot, out: &mut String) {
    single(
        out,
        "abe_requests_admitted_total",
        MetricType::Counter,
        "Requests accepted into the engine.",
        snapshot.stats.admitted,
    );
    let name = "abe_requests_total";
    let help = "Requests by final outcome: completed, a failure reason (expired, \
                batch_timeout, worker_error, cancelled, aborted, failed_other), or a \
                refusal before admission (rejected_full, rejected_draining, rejected_busy).";
    family(out, name, MetricType::Counter, help);
    for (outcome, n) in request_outcomes(snapshot) {
        sample(out, name, &[("outcome", outcome)], n);
    }
    let name = "abe_request_duration_seconds";
    let help = "End-to-end latency of completed requests, request received (first byte read) to answer. _sum is \
                approximated from an hdrhistogram (3 significant digits).";
    family(out, name, MetricType::Histogram, help);
    render_hdr_histogram(
        &snapshot.latency,
        &LATENCY_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
        name,
        out,
    );
}

/// End-to-end latency per priority class: one histogram series per class, every class
/// always present (p50 and p99 per class by `histogram_quantile`).
fn render_latency_by_priority(snapshot: &Snapshot, out: &mut String) {
    let name = "abe_request_duration_by_priority_seconds";
    let help = "End-to-end latency of completed requests by priority class, request received to \
                answer (the classes of abe_request_duration_seconds). _sum is approximated \
                from an hdrhistogram (3 significant digits).";
    family(out, name, MetricType::Histogram, help);
    for p in crate::core::Priority::HIGHEST_FIRST {
        let h = &snapshot.latency_by_priority[p.index()];
        let cumulative = cumulative_counts(h, &LATENCY_BOUNDS_NS);
        let buckets = LATENCY_BOUNDS_NS
            .iter()
            .zip(cumulative)
            .map(|(&b, c)| (b as f64 / NANOS_PER_SECOND_F64, c));
        histogram(
            out,
            name,
            &[("priority", p.as_str())],
            buckets,
            h.len(),
            approx_sum(h) / NANOS_PER_SECOND_F64,
        );
    }
}

/// Batch sizes and flush reasons.
fn render_batches(snapshot: &Snapshot, out: &mut String) {
    let name = "abe_batch_size_requests";
    family(
        out,
        name,
        MetricType::Histogram,
        "Requests per batch handed to a worker.",
    );
    render_hdr_histogram(&snapshot.batch_size, &BATCH_SIZE_BOUNDS, 1.0, name, out);
    let name = "abe_batches_total";
    let help = "Batches handed to workers, by the reason the batch was released.";
    family(out, name, MetricType::Counter, help);
    for reason in FlushReason::ALL {
        let n = snapshot.stats.flush_reasons[reason.index()];
        sample(out, name, &[("reason", reason.as_str())], n);
    }
}

/// Writes an hdrhistogram with fixed `bounds` (in the histogram's unit), each bound and the
/// sum divided by `per_exported_unit` (1e9 for ns to seconds; dividing keeps 30 s at "30").
fn render_hdr_histogram(
    h: &Histogram<u64>,
    bounds: &[u64],
    per_exported_unit: f64,
    name: &str,
    out: &mut String,
) {
    let cumulative = cumulative_counts(h, bounds);
    let buckets = bounds
        .iter()
        .zip(cumulative)
        .map(|(&b, c)| (b as f64 / per_exported_unit, c));
    histogram(
        out,
        name,
        &[],
        buckets,
        h.len(),
        approx_sum(h) / per_exported_unit,
    );
}

/// Cumulative count of `h` at each of the ascending `bounds`. A value counts at a bound when
/// the two are in the same hdrhistogram bucket or the value's bucket is lower (so a value
/// recorded exactly at a bound counts at that bound; resolution is 3 significant digits).
pub(super) fn cumulative_counts(h: &Histogram<u64>, bounds: &[u64]) -> Vec<u64> {
    debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
    let mut counts = vec![0u64; bounds.len()];
    for v in h.iter_recorded() {
        let lowest_ns = h.lowest_equivalent(v.value_iterated_to());
        let first = bounds.partition_point(|&b| b < lowest_ns);
        if let Some(c) = counts.get_mut(first) {
            *c += v.count_at_value();
        }
    }
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    counts
}

/// Per-worker status, circuit, utilisation, busy time, pending and finished batches, for the
/// workers of every backend slot that is not empty (an empty slot's workers wait for a
/// backend to fill it: series of theirs would only be noise, 11 a worker, and an upstream
/// slot has 64). `abe_workers` counts every worker thread.
fn render_workers(snapshot: &Snapshot, out: &mut String) {
    let shown: Vec<_> = shown_workers(snapshot).collect();
    single(
        out,
        "abe_workers",
        MetricType::Gauge,
        "Worker threads.",
        snapshot.workers.len(),
    );
    let name = "abe_worker_status";
    family(
        out,
        name,
        MetricType::Gauge,
        "Worker status: 1 for the current one, 0 for the others.",
    );
    for (id, w) in &shown {
        for status in WORKER_STATUSES {
            sample(
                out,
                name,
                &[("worker", id), ("status", status.as_str())],
                w.status == status,
            );
        }
    }
    let name = "abe_worker_circuit_state";
    let help = "Worker circuit breaker state: 1 for the current one, 0 for the others.";
    family(out, name, MetricType::Gauge, help);
    for (id, w) in &shown {
        for state in CIRCUIT_STATES {
            sample(
                out,
                name,
                &[("worker", id), ("state", state.as_str())],
                w.circuit == state,
            );
        }
    }
    let name = "abe_worker_utilization_ratio";
    let help = "Fraction of the time since start a worker had at least one batch pending.";
    family(out, name, MetricType::Gauge, help);
    for (id, w) in &shown {
        sample(
            out,
            name,
            &[("worker", id)],
            utilization_ratio(w.busy_ns, snapshot.at_ns),
        );
    }
    let name = "abe_worker_busy_seconds_total";
    let help = "Time a worker had at least one batch pending (rate() gives recent utilisation).";
    family(out, name, MetricType::Counter, help);
    for (id, w) in &shown {
        sample(out, name, &[("worker", id)], ns_to_seconds(w.busy_ns));
    }
    let name = "abe_worker_pending_batches";
    family(
        out,
        name,
        MetricType::Gauge,
        "Batches handed to a worker and not yet returned.",
    );
    for (id, w) in &shown {
        sample(out, name, &[("worker", id)], w.pending);
    }
    let name = "abe_worker_batches_total";
    family(
        out,
        name,
        MetricType::Counter,
        "Batches a worker finished, by result (ok, failed).",
    );
    for (id, w) in &shown {
        sample(out, name, &[("worker", id), ("result", "ok")], w.batches_ok);
        sample(
            out,
            name,
            &[("worker", id), ("result", "failed")],
            w.batches_failed,
        );
    }
}

/// Routing: each backend's health, circuit, load, latency and request counts.
fn render_backends(snapshot: &Snapshot, out: &mut String) {
    let names = &snapshot.backend_names;
    // An empty slot (a removed backend, drained; an unfilled discovery slot) has no series.
    let rows = || {
        names
            .iter()
            .zip(&snapshot.backends)
            .filter(|(_, b)| b.slot != crate::router::SlotState::Empty)
    };
    let name = "abe_backend_healthy";
    let help = "1 while a backend's last health probe succeeded (sim backends are always healthy).";
    family(out, name, MetricType::Gauge, help);
    for (n, b) in rows() {
        sample(out, name, &[("backend", n)], b.healthy);
    }
    let name = "abe_backend_draining";
    let help = "1 while a removed backend finishes what it holds (then its series go).";
    family(out, name, MetricType::Gauge, help);
    for (n, b) in rows() {
        let draining = b.slot == crate::router::SlotState::Draining;
        sample(out, name, &[("backend", n)], draining);
    }
    let name = "abe_backend_circuit_state";
    let help = "Backend circuit (from its workers' breakers): 1 for the current state.";
    family(out, name, MetricType::Gauge, help);
    for (n, b) in rows() {
        for state in CIRCUIT_STATES {
            sample(
                out,
                name,
                &[("backend", n), ("state", state.as_str())],
                b.circuit == state,
            );
        }
    }
    let name = "abe_backend_pending_batches";
    let help = "Batches dispatched to a backend and not yet back (the smart score's load).";
    family(out, name, MetricType::Gauge, help);
    for (n, b) in rows() {
        sample(out, name, &[("backend", n)], b.pending_batches);
    }
    let name = "abe_backend_latency_ema_seconds";
    let help = "Smoothed batch latency of a backend (the smart score's latency); absent before its first batch.";
    family(out, name, MetricType::Gauge, help);
    for (n, b) in rows() {
        if let Some(ms) = b.latency_ema_ms {
            sample(out, name, &[("backend", n)], ms / 1000.0);
        }
    }
    let name = "abe_backend_requests_total";
    let help = "Requests by backend and what happened: routed (first choice or retry), \
                via_alias, via_fallback, retried_away (moved to another backend after a failure), \
                failed (answered with this backend's error).";
    family(out, name, MetricType::Counter, help);
    for (n, b) in rows() {
        for (event, v) in [
            ("routed", b.routed),
            ("via_alias", b.via_alias),
            ("via_fallback", b.via_fallback),
            ("retried_away", b.retried_away),
            ("failed", b.failed),
        ] {
            sample(out, name, &[("backend", n), ("event", event)], v);
        }
    }
}

/// One of the embed counters: name, help, and its value in the totals.
type EmbedCounter = (&'static str, &'static str, fn(&EmbedTotals) -> u64);

/// Each `embed` backend's forward passes: inputs, real and padded tokens (a batch pads to
/// its longest input, so padded - real is computed and thrown away), truncated inputs and
/// forward time. Nothing when no backend is `embed`.
pub fn render_embed(backends: &[(Box<str>, Arc<EmbedStats>)], out: &mut String) {
    if backends.is_empty() {
        return;
    }
    let totals: Vec<(&str, EmbedTotals)> =
        backends.iter().map(|(n, s)| (&**n, s.totals())).collect();
    let counters: [EmbedCounter; 5] = [
        (
            "abe_embed_forward_passes_total",
            "Forward passes of an embed backend (one or more per batch: split by length).",
            |t| t.forward_passes,
        ),
        (
            "abe_embed_inputs_total",
            "Inputs embedded by an embed backend.",
            |t| t.inputs,
        ),
        (
            "abe_embed_tokens_total",
            "Real tokens of embedded inputs (special tokens included, after truncation).",
            |t| t.tokens_real,
        ),
        (
            "abe_embed_padded_tokens_total",
            "Token positions computed: inputs x longest input of the pass, per forward pass.",
            |t| t.tokens_padded,
        ),
        (
            "abe_embed_truncated_inputs_total",
            "Inputs longer than the model's max_seq_length, cut to it.",
            |t| t.inputs_truncated,
        ),
    ];
    for (name, help, get) in counters {
        family(out, name, MetricType::Counter, help);
        for (n, t) in &totals {
            sample(out, name, &[("backend", n)], get(t));
        }
    }
    let name = "abe_embed_padding_ratio";
    let help = "Share of computed token positions that were padding, since start (0 to 1).";
    family(out, name, MetricType::Gauge, help);
    for (n, t) in &totals {
        sample(out, name, &[("backend", n)], t.padding_ratio());
    }
    let name = "abe_embed_forward_seconds_total";
    let help = "Time spent in forward passes of an embed backend.";
    family(out, name, MetricType::Counter, help);
    for (n, t) in &totals {
        sample(out, name, &[("backend", n)], ns_to_seconds(t.forward_ns));
    }
}

/// One of `auto`'s per-backend gauges: name, help, and its value in a lane's snapshot.
type AutoGauge = (&'static str, &'static str, fn(&AutoSnapshot) -> f64);

/// `auto`'s state per backend lane: its fitted batch cost, the arrival rate it sees, its
/// decisions and the last hold it chose (absent in continuous batching, which has no lanes).
/// Why a batch went is in `abe_batches_total{reason}`: `auto` dispatches with `idle_worker`
/// when waiting does not pay, `full` when a hold filled the batch, `max_wait` when a hold
/// reached a priority's max wait or a request's timeout.
fn render_auto(snapshot: &Snapshot, out: &mut String) {
    if snapshot.auto.is_empty() {
        return;
    }
    let rows = || {
        snapshot
            .backend_names
            .iter()
            .zip(&snapshot.auto)
            .zip(&snapshot.backends)
            .filter(|(_, b)| b.slot != crate::router::SlotState::Empty)
            .map(|(row, _)| row)
    };
    let gauges: [AutoGauge; 10] = [
        (
            "abe_auto_cost_fixed_seconds",
            "auto: fitted fixed cost a of a batch (service time = a + b x requests + c x tokens); 0 before the first batch.",
            |a| a.cost.a_ns / NANOS_PER_SECOND_F64,
        ),
        (
            "abe_auto_cost_per_request_seconds",
            "auto: fitted cost b of each request in a batch.",
            |a| a.cost.b_ns / NANOS_PER_SECOND_F64,
        ),
        (
            "abe_auto_cost_per_token_seconds",
            "auto: fitted cost c of each estimated token in a batch.",
            |a| a.cost.c_ns_per_token / NANOS_PER_SECOND_F64,
        ),
        (
            "abe_auto_cost_samples",
            "auto: completed batches the cost fit rests on (a sliding window).",
            |a| a.cost.samples as f64,
        ),
        (
            "abe_auto_arrival_rate_per_second",
            "auto: estimated arrival rate, requests per second over all classes.",
            |a| a.arrival_rate_per_s,
        ),
        (
            "abe_auto_arrival_burstiness",
            "auto: squared coefficient of variation of inter-arrival gaps, rate-weighted over classes (1 Poisson, above bursty, below regular).",
            |a| a.arrival_burstiness,
        ),
        (
            "abe_auto_echo_fraction",
            "auto: share of arrivals that answer a completion within one fixed cost a (about 1 - a / time between completions in a closed loop, near 0 in an open one).",
            |a| a.echo_fraction,
        ),
        (
            "abe_auto_last_wait_seconds",
            "auto: the wait its last hold chose (0 before the first hold).",
            |a| ns_to_seconds(a.last_wait_ns),
        ),
        (
            "abe_auto_expected_joiners",
            "auto: requests its last hold expected to join by the end of the wait.",
            |a| a.last_expected_arrivals,
        ),
        (
            "abe_auto_window_seconds",
            "auto: the window it holds an open loop's bursty arrivals to, chosen by replaying the recent arrivals (0: none in force).",
            |a| ns_to_seconds(a.window_ns),
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, MetricType::Gauge, help);
        for (n, a) in rows() {
            sample(out, name, &[("backend", n)], value(a));
        }
    }
    let name = "abe_auto_decisions_total";
    let help = "auto: decisions taken for a partial batch with a worker free for it: dispatch \
                now, or hold (a hold is decided afresh at every arrival, completion or deadline; \
                counted only while auto is the strategy).";
    family(out, name, MetricType::Counter, help);
    for (n, a) in rows() {
        for (decision, v) in [("dispatch", a.dispatched_now), ("hold", a.held)] {
            sample(out, name, &[("backend", n), ("decision", decision)], v);
        }
    }
}

/// HTTP responses, connections, bytes.
fn render_http(http: &HttpStats, out: &mut String) {
    let name = "abe_http_responses_total";
    let help = "HTTP responses by endpoint and status code (code other: any untracked code).";
    family(out, name, MetricType::Counter, help);
    for endpoint in Endpoint::ALL {
        for (slot, code) in STATUS_SLOT_LABELS.iter().enumerate() {
            let labels = [("endpoint", endpoint.as_str()), ("code", *code)];
            sample(out, name, &labels, http.responses_in_slot(endpoint, slot));
        }
    }
    let counters = [
        (
            "abe_http_connections_accepted_total",
            "Connections accepted.",
            http.connections_accepted(),
        ),
        (
            "abe_http_connections_refused_total",
            "Connections refused because the connection limit was reached.",
            http.connections_refused(),
        ),
        (
            "abe_http_connections_closed_total",
            "Accepted connections closed.",
            http.connections_closed(),
        ),
        (
            "abe_http_received_bytes_total",
            "Bytes read from clients.",
            http.bytes_in(),
        ),
        (
            "abe_http_sent_bytes_total",
            "Bytes written to clients.",
            http.bytes_out(),
        ),
    ];
    for (name, help, value) in counters {
        single(out, name, MetricType::Counter, help, value);
    }
    let name = "abe_http_connections_evicted_total";
    let help = "Connections the server closed before the client was done, by reason \
                (idle_at_limit, slow_at_limit: room made for a new connection at the limit; \
                slow_request: below the minimum data rate after the grace period; read_timeout, \
                idle_timeout, write_stalled: a deadline passed).";
    family(out, name, MetricType::Counter, help);
    for why in Eviction::ALL {
        sample(out, name, &[("reason", why.as_str())], http.evictions(why));
    }
    single(
        out,
        "abe_http_connections_open",
        MetricType::Gauge,
        "Connections open now.",
        http.connections_open(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::circuit::CircuitState;
    use crate::core::pool::WorkerStatus;
    use crate::metrics::exposition_check::check;
    use crate::metrics::http_stats::STATUS_SLOTS;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    fn page(snapshot: &Snapshot, http: &HttpStats) -> String {
        let mut out = String::new();
        render(snapshot, http, &mut out);
        if let Err(e) = check(&out) {
            panic!("invalid exposition: {e}\n{out}");
        }
        out
    }

    fn assert_line(page: &str, line: &str) {
        assert!(
            page.lines().any(|l| l == line),
            "missing line {line:?} in\n{page}"
        );
    }

    #[test]
    fn embed_families_pass_the_exposition_check() {
        let mut out = String::new();
        render_embed(&[], &mut out);
        assert_eq!(out, "", "nothing without embed backends");
        let stats = Arc::new(EmbedStats::default());
        stats.record(4, 30, 10, 1, 2_500_000);
        render_embed(&[("minilm".into(), stats)], &mut out);
        if let Err(e) = check(&out) {
            panic!("invalid exposition: {e}\n{out}");
        }
        assert_line(&out, "abe_embed_tokens_total{backend=\"minilm\"} 30");
        assert_line(&out, "abe_embed_padded_tokens_total{backend=\"minilm\"} 40");
        assert_line(&out, "abe_embed_padding_ratio{backend=\"minilm\"} 0.25");
        assert_line(
            &out,
            "abe_embed_truncated_inputs_total{backend=\"minilm\"} 1",
        );
    }

    /// A snapshot with something in every family.
    fn busy_snapshot() -> Snapshot {
        let mut snap = Snapshot::new(2, StrategyKind::QueueDepth);
        snap.at_ns = 10_000_000_000;
        snap.backend_names = vec!["gpu-a".into(), "remote \"b\"".into()];
        snap.backends = vec![Default::default(); 2];
        snap.backends[0].latency_ema_ms = Some(12.5);
        snap.backends[0].routed = 7;
        snap.backends[1].healthy = false;
        snap.backends[1].circuit = CircuitState::Open;
        snap.backends[1].retried_away = 3;
        snap.queued_by_class[class_index(Priority::High, 2)] = 5;
        snap.queued_by_class[class_index(Priority::Critical, 0)] = 1;
        snap.queued = 6;
        snap.live_requests = 9;
        snap.observed_p99_ns = Some(42_000_000);
        snap.stats.admitted = 20;
        snap.stats.completed = 4;
        snap.stats.failed = 2;
        snap.stats.expired = 1;
        snap.stats.worker_errors = 1;
        snap.stats.rejected_draining = 3;
        snap.rejected_busy = 7;
        snap.stats.flush_reasons[FlushReason::MaxWait.index()] = 2;
        snap.stats.flush_reasons[FlushReason::Critical.index()] = 1;
        for wait_ns in [0, 900, 1024, 5_000, 1_000_000, 1 << 40] {
            snap.stats.queue_wait.record(wait_ns);
        }
        for latency_ns in [300_000, 1_000_000, 2_000_000, 2_000_000, 70_000_000_000] {
            snap.latency.record(latency_ns).unwrap();
        }
        for size in [1, 3, 3, 300] {
            snap.batch_size.record(size).unwrap();
        }
        snap.workers[0].busy_ns = 2_500_000_000;
        snap.workers[0].status = WorkerStatus::Busy;
        snap.workers[0].pending = 1;
        snap.workers[0].batches_ok = 3;
        snap.workers[1].circuit = CircuitState::HalfOpen;
        snap.workers[1].status = WorkerStatus::Unhealthy;
        snap.workers[1].batches_failed = 2;
        snap
    }

    fn busy_http() -> HttpStats {
        let http = HttpStats::new();
        http.record_response(Endpoint::Completions, 200);
        http.record_response(Endpoint::Completions, 200);
        http.record_response(Endpoint::Admin, 503);
        http.record_response(Endpoint::Other, 418);
        http.connection_opened();
        http.connection_opened();
        http.connection_closed();
        http.connection_refused();
        http.add_bytes_in(123);
        http.add_bytes_out(4567);
        http
    }

    #[test]
    fn latency_by_priority_has_every_class() {
        let mut snap = busy_snapshot();
        let critical = crate::core::Priority::Critical.index();
        snap.latency_by_priority[critical]
            .record(2_000_000)
            .unwrap();
        let out = page(&snap, &HttpStats::new());
        let name = "abe_request_duration_by_priority_seconds";
        assert_line(&out, &format!("{name}_count{{priority=\"critical\"}} 1"));
        assert_line(&out, &format!("{name}_count{{priority=\"low\"}} 0"));
        assert_line(
            &out,
            &format!("{name}_bucket{{priority=\"critical\",le=\"+Inf\"}} 1"),
        );
    }

    #[test]
    fn active_strategy_is_one_and_others_zero() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        assert_line(&out, "abe_strategy{strategy=\"queue_depth\"} 1");
        assert_line(&out, "abe_strategy{strategy=\"fixed\"} 0");
        assert_line(&out, "abe_strategy{strategy=\"latency_aware\"} 0");
    }

    #[test]
    fn queue_depth_has_every_class() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        assert_line(&out, "abe_queue_depth{priority=\"high\",bucket=\"1024\"} 5");
        assert_line(
            &out,
            "abe_queue_depth{priority=\"critical\",bucket=\"128\"} 1",
        );
        assert_line(&out, "abe_queue_depth{priority=\"low\",bucket=\"inf\"} 0");
        let classes = out
            .lines()
            .filter(|l| l.starts_with("abe_queue_depth{"))
            .count();
        assert_eq!(classes, crate::core::CLASS_COUNT);
        assert_line(&out, "abe_live_requests 9");
        assert_line(&out, "abe_observed_p99_seconds 0.042");
        assert_line(&out, "abe_draining 0");
        assert_line(&out, "abe_uptime_seconds 10");
    }

    #[test]
    fn latency_buckets_are_cumulative_seconds() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        let h = "abe_request_duration_seconds";
        assert_line(&out, &format!("{h}_bucket{{le=\"0.0005\"}} 1"));
        assert_line(&out, &format!("{h}_bucket{{le=\"0.001\"}} 2"));
        assert_line(&out, &format!("{h}_bucket{{le=\"0.0025\"}} 4"));
        assert_line(&out, &format!("{h}_bucket{{le=\"60\"}} 4"));
        assert_line(&out, &format!("{h}_bucket{{le=\"+Inf\"}} 5"));
        assert_line(&out, &format!("{h}_count 5"));
        let sum_line = out
            .lines()
            .find(|l| l.starts_with("abe_request_duration_seconds_sum "))
            .unwrap();
        let sum: f64 = sum_line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - 70.0053).abs() < 70.0053 * 1e-3, "{sum}");
    }

    #[test]
    fn batch_sizes_and_flush_reasons() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        assert_line(&out, "abe_batch_size_requests_bucket{le=\"1\"} 1");
        assert_line(&out, "abe_batch_size_requests_bucket{le=\"2\"} 1");
        assert_line(&out, "abe_batch_size_requests_bucket{le=\"4\"} 3");
        assert_line(&out, "abe_batch_size_requests_bucket{le=\"256\"} 3");
        assert_line(&out, "abe_batch_size_requests_bucket{le=\"+Inf\"} 4");
        assert_line(&out, "abe_batch_size_requests_sum 307");
        assert_line(&out, "abe_batches_total{reason=\"max_wait\"} 2");
        assert_line(&out, "abe_batches_total{reason=\"critical\"} 1");
        assert_line(&out, "abe_batches_total{reason=\"idle_worker\"} 0");
    }

    #[test]
    fn queue_wait_uses_power_of_two_bounds() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        let h = "abe_queue_wait_seconds";
        // 0 and 900 ns are below 2^10 ns; 1024 ns is exactly the bound, so it counts above.
        assert_line(&out, &format!("{h}_bucket{{le=\"0.000001024\"}} 2"));
        assert_line(&out, &format!("{h}_bucket{{le=\"0.000004096\"}} 3"));
        assert_line(&out, &format!("{h}_bucket{{le=\"0.000016384\"}} 4"));
        assert_line(&out, &format!("{h}_bucket{{le=\"0.001048576\"}} 5"));
        assert_line(&out, &format!("{h}_bucket{{le=\"68.719476736\"}} 5"));
        assert_line(&out, &format!("{h}_bucket{{le=\"+Inf\"}} 6"));
        assert_line(&out, &format!("{h}_count 6"));
        let buckets = out
            .lines()
            .filter(|l| l.starts_with("abe_queue_wait_seconds_bucket"))
            .count();
        assert_eq!(buckets, QUEUE_WAIT_BOUND_LOG2_NS.len() + 1);
    }

    #[test]
    fn outcomes_are_labelled() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        assert_line(&out, "abe_requests_admitted_total 20");
        assert_line(&out, "abe_requests_total{outcome=\"completed\"} 4");
        assert_line(&out, "abe_requests_total{outcome=\"expired\"} 1");
        assert_line(&out, "abe_requests_total{outcome=\"worker_error\"} 1");
        assert_line(&out, "abe_requests_total{outcome=\"failed_other\"} 0");
        assert_line(&out, "abe_requests_total{outcome=\"rejected_draining\"} 3");
        assert_line(&out, "abe_requests_total{outcome=\"rejected_busy\"} 7");
    }

    #[test]
    fn workers_report_utilisation_status_and_circuit() {
        let out = page(&busy_snapshot(), &HttpStats::new());
        assert_line(&out, "abe_workers 2");
        assert_line(
            &out,
            "abe_worker_utilization_ratio{worker=\"worker-0\"} 0.25",
        );
        assert_line(&out, "abe_worker_utilization_ratio{worker=\"worker-1\"} 0");
        assert_line(
            &out,
            "abe_worker_busy_seconds_total{worker=\"worker-0\"} 2.5",
        );
        assert_line(
            &out,
            "abe_worker_status{worker=\"worker-0\",status=\"busy\"} 1",
        );
        assert_line(
            &out,
            "abe_worker_status{worker=\"worker-0\",status=\"idle\"} 0",
        );
        assert_line(
            &out,
            "abe_worker_status{worker=\"worker-1\",status=\"unhealthy\"} 1",
        );
        assert_line(
            &out,
            "abe_worker_circuit_state{worker=\"worker-0\",state=\"closed\"} 1",
        );
        assert_line(
            &out,
            "abe_worker_circuit_state{worker=\"worker-1\",state=\"half_open\"} 1",
        );
        assert_line(
            &out,
            "abe_worker_circuit_state{worker=\"worker-1\",state=\"closed\"} 0",
        );
        assert_line(&out, "abe_worker_pending_batches{worker=\"worker-0\"} 1");
        assert_line(
            &out,
            "abe_worker_batches_total{worker=\"worker-0\",result=\"ok\"} 3",
        );
        assert_line(
            &out,
            "abe_worker_batches_total{worker=\"worker-1\",result=\"failed\"} 2",
        );
    }

    #[test]
    fn http_counters_cover_every_endpoint_and_code() {
        let out = page(&busy_snapshot(), &busy_http());
        assert_line(
            &out,
            "abe_http_responses_total{endpoint=\"completions\",code=\"200\"} 2",
        );
        assert_line(
            &out,
            "abe_http_responses_total{endpoint=\"admin\",code=\"503\"} 1",
        );
        assert_line(
            &out,
            "abe_http_responses_total{endpoint=\"other\",code=\"other\"} 1",
        );
        assert_line(
            &out,
            "abe_http_responses_total{endpoint=\"ready\",code=\"200\"} 0",
        );
        let series = out
            .lines()
            .filter(|l| l.starts_with("abe_http_responses_total{"))
            .count();
        assert_eq!(series, Endpoint::COUNT * STATUS_SLOTS);
        assert_line(&out, "abe_http_connections_accepted_total 2");
        assert_line(&out, "abe_http_connections_closed_total 1");
        assert_line(&out, "abe_http_connections_refused_total 1");
        assert_line(&out, "abe_http_connections_open 1");
        assert_line(
            &out,
            "abe_http_connections_evicted_total{reason=\"idle_at_limit\"} 0",
        );
        assert_line(&out, "abe_http_received_bytes_total 123");
        assert_line(&out, "abe_http_sent_bytes_total 4567");
    }

    #[test]
    fn empty_snapshot_is_valid_and_omits_the_unknown_p99() {
        let out = page(&Snapshot::new(0, StrategyKind::Fixed), &HttpStats::new());
        assert_line(&out, "abe_request_duration_seconds_bucket{le=\"+Inf\"} 0");
        assert_line(&out, "abe_request_duration_seconds_sum 0");
        assert_line(&out, "abe_workers 0");
        assert!(!out
            .lines()
            .any(|l| l.starts_with("abe_observed_p99_seconds ")));
    }

    #[test]
    fn research_controller_state_is_exported() {
        let mut snap = busy_snapshot();
        snap.research.b_mem = 76;
        snap.research.b_sla = 64;
        snap.research.tbt_ms_ema = Some(12.5);
        snap.research.bins = 2;
        snap.research.bin_lens[1] = 7;
        snap.research.bin_upper_tokens[0] = 100;
        let out = page(&snap, &busy_http());
        assert_line(&out, "abe_dynamic_batch_size_memory_limit 76");
        assert_line(&out, "abe_dynamic_batch_size_sla_limit 64");
        assert_line(&out, "abe_dynamic_decode_tbt_seconds 0.0125");
        assert_line(&out, "abe_multibin_queue_depth{bin=\"1\"} 7");
        assert_line(&out, "abe_multibin_bin_upper_tokens{bin=\"0\"} 100");
        check(&out).unwrap();
    }

    #[test]
    fn continuous_state_is_exported_and_promtool_clean() {
        let mut snap = busy_snapshot();
        snap.continuous = Some(crate::runtime::snapshot::ContinuousSnapshot {
            stats: crate::core::continuous::ContinuousStats {
                steps: 10,
                decode_tokens: 80,
                prefill_tokens: 512,
                preemptions: 1,
                ..Default::default()
            },
            slots_total: 32,
            active_slots: 5,
            kv_used_tokens: 1234,
            kv_capacity_tokens: 76_800,
            output_tokens: 90,
            prefix: None,
        });
        let _ = snap.ttft.record(25_000_000);
        let _ = snap.tpot.record(6_000_000);
        let out = page(&snap, &busy_http());
        assert_line(&out, "abe_continuous_active_slots 5");
        assert_line(&out, "abe_continuous_preemptions_total 1");
        assert_line(&out, "abe_continuous_output_tokens_total 90");
        assert_line(
            &out,
            "abe_time_to_first_token_seconds_bucket{le=\"0.025\"} 1",
        );
        assert_line(
            &out,
            "abe_time_per_output_token_seconds_bucket{le=\"0.01\"} 1",
        );
        check(&out).unwrap();
        if let Some(result) = promtool_check(&out) {
            assert!(
                result.status.success(),
                "{}",
                String::from_utf8_lossy(&result.stdout)
            );
        }
    }

    #[test]
    fn a_draining_backend_says_so_and_an_empty_one_has_no_series() {
        let mut snap = busy_snapshot();
        snap.backends[0].slot = crate::router::SlotState::Draining;
        let out = page(&snap, &busy_http());
        assert_line(&out, "abe_backend_draining{backend=\"gpu-a\"} 1");
        assert_line(&out, "abe_backend_draining{backend=\"remote \\\"b\\\"\"} 0");
        snap.backends[0].slot = crate::router::SlotState::Empty;
        let out = page(&snap, &busy_http());
        assert!(!out.contains("backend=\"gpu-a\""), "{out}");
        assert!(out.contains("abe_backend_healthy{backend=\"remote"));
        check(&out).unwrap();
    }

    #[test]
    fn every_family_is_documented_once() {
        let out = page(&busy_snapshot(), &busy_http());
        let summary = check(&out).unwrap();
        let helps = out.lines().filter(|l| l.starts_with("# HELP ")).count();
        let types = out.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!((helps, types), (summary.families, summary.families));
        // 28 engine and HTTP families (evictions among them) + latency by priority + 6 of
        // routing (draining among them) + 8 of the research controllers (a ninth, the
        // decode-TBT gauge, appears once the SLA controller has an observation).
        assert_eq!(summary.families, 43);
    }

    #[test]
    fn backends_report_health_circuit_latency_and_counts() {
        let out = page(&busy_snapshot(), &busy_http());
        assert_line(&out, "abe_backend_healthy{backend=\"gpu-a\"} 1");
        assert_line(&out, "abe_backend_healthy{backend=\"remote \\\"b\\\"\"} 0");
        assert_line(
            &out,
            "abe_backend_circuit_state{backend=\"remote \\\"b\\\"\",state=\"open\"} 1",
        );
        assert_line(
            &out,
            "abe_backend_latency_ema_seconds{backend=\"gpu-a\"} 0.0125",
        );
        assert!(!out.contains("abe_backend_latency_ema_seconds{backend=\"remote"));
        assert_line(
            &out,
            "abe_backend_requests_total{backend=\"gpu-a\",event=\"routed\"} 7",
        );
        assert_line(
            &out,
            "abe_backend_requests_total{backend=\"remote \\\"b\\\"\",event=\"retried_away\"} 3",
        );
    }

    /// `busy_snapshot` with `auto`'s state in both lanes: known values in the first, the
    /// prior (nothing learned yet) in the second.
    fn auto_snapshot() -> Snapshot {
        use crate::core::strategy::auto::{cost::Cost, AutoSnapshot};
        let mut snap = busy_snapshot();
        snap.auto = vec![Default::default(); 2];
        snap.auto[0] = AutoSnapshot {
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
        snap
    }

    #[test]
    fn auto_state_is_exported_per_backend() {
        let out = page(&auto_snapshot(), &busy_http());
        for line in [
            "abe_auto_cost_fixed_seconds{backend=\"gpu-a\"} 0.01",
            "abe_auto_cost_per_request_seconds{backend=\"gpu-a\"} 0.002",
            "abe_auto_cost_per_token_seconds{backend=\"gpu-a\"} 0.0000005",
            "abe_auto_cost_samples{backend=\"gpu-a\"} 64",
            "abe_auto_arrival_rate_per_second{backend=\"gpu-a\"} 125.5",
            "abe_auto_arrival_burstiness{backend=\"gpu-a\"} 2.25",
            "abe_auto_echo_fraction{backend=\"gpu-a\"} 0.75",
            "abe_auto_last_wait_seconds{backend=\"gpu-a\"} 0.0035",
            "abe_auto_expected_joiners{backend=\"gpu-a\"} 2.5",
            "abe_auto_window_seconds{backend=\"gpu-a\"} 0.00125",
            "abe_auto_decisions_total{backend=\"gpu-a\",decision=\"dispatch\"} 9",
            "abe_auto_decisions_total{backend=\"gpu-a\",decision=\"hold\"} 4",
            // The second lane has learned nothing: zeros, not absent.
            "abe_auto_cost_fixed_seconds{backend=\"remote \\\"b\\\"\"} 0",
            "abe_auto_cost_samples{backend=\"remote \\\"b\\\"\"} 0",
            "abe_auto_decisions_total{backend=\"remote \\\"b\\\"\",decision=\"hold\"} 0",
        ] {
            assert_line(&out, line);
        }
        let families = |page: &str| {
            page.lines()
                .filter(|l| l.starts_with("# TYPE abe_auto_"))
                .count()
        };
        assert_eq!(families(&out), 11);
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("abe_auto_decisions_total{"))
                .count(),
            4,
            "2 backends x dispatch, hold"
        );
        check(&out).unwrap();
        if let Some(result) = promtool_check(&out) {
            assert!(
                result.status.success() && result.stderr.is_empty(),
                "{}{}",
                String::from_utf8_lossy(&result.stdout),
                String::from_utf8_lossy(&result.stderr)
            );
        }
        // Continuous batching has no lanes: no auto families at all.
        assert_eq!(families(&page(&busy_snapshot(), &busy_http())), 0);
    }

    /// Runs `promtool check metrics` on `text`; `None` when promtool is not installed.
    fn promtool_check(text: &str) -> Option<std::process::Output> {
        let child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("could not run promtool: {e}"),
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        Some(child.wait_with_output().unwrap())
    }

    #[test]
    fn promtool_accepts_the_page() {
        let pages = [
            page(&busy_snapshot(), &busy_http()),
            page(
                &Snapshot::new(1, StrategyKind::LatencyAware),
                &HttpStats::new(),
            ),
        ];
        for text in pages {
            let Some(output) = promtool_check(&text) else {
                eprintln!(
                    "SKIPPED promtool_accepts_the_page: promtool is not on PATH \
                     (install Debian's `prometheus` package to run it)"
                );
                return;
            };
            assert!(
                output.status.success() && output.stderr.is_empty(),
                "promtool check metrics failed ({}):\n{}{}\n--- page ---\n{text}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            );
        }
    }
}
