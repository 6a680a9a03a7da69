//! vLLM's metric surface on the /metrics page: the V1 `vllm:*` families (and the V0 names
//! its published Grafana dashboard still queries) for what abe has, each labelled
//! `model_name`, so dashboards, gateways and autoscalers built for vLLM read abe unchanged.
//!
//! Same rules as `prometheus.rs` (io threads only, from a published snapshot, fixed label
//! sets; no label value comes from a client: `model_name` is the served model from the
//! config). One difference is deliberate: vLLM's names contain `:`, which `promtool check
//! metrics` reports as reserved for recording rules; `tools/promtool_check.sh` accepts that
//! one complaint for `vllm:` names and nothing else.
//!
//! Where abe's figure differs from vLLM's definition, the HELP line says how.

use super::derived::{approx_sum, NANOS_PER_SECOND_F64};
use super::exposition::{family, histogram, sample, MetricType};
use super::prometheus::cumulative_counts;
use crate::buckets::{
    E2E_BOUNDS_NS, PHASE_TIME_BOUNDS_NS, QUEUE_WAIT_BOUND_LOG2_NS, TOKEN_COUNT_BOUNDS,
    TPOT_BOUNDS_NS,
};
use crate::core::stats::WaitHistogram;
use crate::runtime::snapshot::{BoundedCounts, FinishedReason};
use crate::runtime::Snapshot;
use hdrhistogram::Histogram;

/// Every `vllm:*` family this module writes (the test of the Grafana dashboard fixture and
/// the promtool script read it).
pub const FAMILIES: [&str; 22] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:lora_requests_info",
];

/// Appends the `vllm:*` families for `snapshot`, labelled `model_name`.
pub fn render(snapshot: &Snapshot, model_name: &str, out: &mut String) {
    let m = [("model_name", model_name)];
    let running = snapshot.live_requests.saturating_sub(snapshot.queued);
    gauge(
        out,
        &m,
        "vllm:num_requests_running",
        "Requests in a batch at a worker (request-level) or holding a slot (continuous).",
        running as f64,
    );
    gauge(
        out,
        &m,
        "vllm:num_requests_waiting",
        "Requests admitted and waiting to be batched or to get a slot.",
        snapshot.queued as f64,
    );
    let kv = snapshot
        .continuous
        .as_ref()
        .filter(|c| c.kv_capacity_tokens > 0)
        .map_or(0.0, |c| {
            c.kv_used_tokens as f64 / c.kv_capacity_tokens as f64
        });
    gauge(
        out,
        &m,
        "vllm:kv_cache_usage_perc",
        "KV cache in use, 0 to 1 (continuous batching; 0 in request-level batching, \
         which keeps no KV cache).",
        kv,
    );
    gauge(
        out,
        &m,
        "vllm:gpu_cache_usage_perc",
        "vLLM V0's name for vllm:kv_cache_usage_perc (its published Grafana dashboard \
         still reads it); the same value.",
        kv,
    );
    let f = &snapshot.finished;
    let preemptions = snapshot
        .continuous
        .as_ref()
        .map_or(0, |c| c.stats.preemptions);
    counter(
        out,
        &m,
        "vllm:num_preemptions_total",
        "Requests preempted (KV cache exhausted) and recomputed (continuous batching).",
        preemptions,
    );
    // vLLM counts both in tokens; 0 where no prefix cache runs (request-level batching).
    let prefix = snapshot
        .continuous
        .as_ref()
        .and_then(|c| c.prefix)
        .unwrap_or_default();
    counter(
        out,
        &m,
        "vllm:prefix_cache_queries_total",
        "Prefix cache: prompt tokens looked up (continuous batching with prefix caching).",
        prefix.query_tokens,
    );
    counter(
        out,
        &m,
        "vllm:prefix_cache_hits_total",
        "Prefix cache: prompt tokens found cached.",
        prefix.hit_tokens,
    );
    counter(
        out,
        &m,
        "vllm:prompt_tokens_total",
        "Prompt tokens of answered requests.",
        f.prompt_tokens.sum,
    );
    counter(
        out,
        &m,
        "vllm:generation_tokens_total",
        "Output tokens of answered completions.",
        f.generation_tokens.sum,
    );
    let name = "vllm:request_success_total";
    family(
        out,
        name,
        MetricType::Counter,
        "Requests answered, by finish reason (abort: failed or cancelled after admission).",
    );
    for reason in FinishedReason::ALL {
        let labels = [
            ("model_name", model_name),
            ("finished_reason", reason.as_str()),
        ];
        sample(out, name, &labels, f.by_reason[reason.index()]);
    }
    hdr(
        out,
        &m,
        "vllm:e2e_request_latency_seconds",
        "End-to-end latency of completed requests, request received (first byte read) to answer.",
        &snapshot.latency,
        &E2E_BOUNDS_NS,
    );
    queue_time(out, &m, &snapshot.stats.queue_wait);
    bounded(
        out,
        &m,
        "vllm:time_to_first_token_seconds",
        "Arrival to the first token sent (streams), or to the answer when it comes whole.",
        &f.prefill_ns,
        &PHASE_TIME_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
    );
    for (name, help) in [
        (
            "vllm:time_per_output_token_seconds",
            "Continuous batching: (last token - first token) / (tokens - 1) per request.",
        ),
        (
            "vllm:inter_token_latency_seconds",
            "vLLM V1's name for the same per-request inter-token latency.",
        ),
    ] {
        hdr(out, &m, name, help, &snapshot.tpot, &TPOT_BOUNDS_NS);
    }
    let token_histograms = [
        (
            "vllm:request_prompt_tokens",
            "Prompt tokens per answered request.",
            &f.prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Output tokens per answered completion.",
            &f.generation_tokens,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "max_tokens asked for per answered completion.",
            &f.max_tokens,
        ),
        (
            "vllm:request_params_max_tokens",
            "vLLM V1's name for the same max_tokens histogram.",
            &f.max_tokens,
        ),
    ];
    for (name, help, counts) in token_histograms {
        bounded(out, &m, name, help, counts, &TOKEN_COUNT_BOUNDS, 1.0);
    }
    bounded(
        out,
        &m,
        "vllm:request_prefill_time_seconds",
        "Arrival to first token or answer (unlike vLLM, includes queue time: abe does not \
         stamp when a request is scheduled).",
        &f.prefill_ns,
        &PHASE_TIME_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
    );
    bounded(
        out,
        &m,
        "vllm:request_decode_time_seconds",
        "First token to answer (0 when the answer came whole).",
        &f.decode_ns,
        &PHASE_TIME_BOUNDS_NS,
        NANOS_PER_SECOND_F64,
    );
}

/// Appends `vllm:lora_requests_info` as vLLM writes it: one series whose labels are
/// `max_lora` and the running and waiting adapters' names, comma-separated, and whose
/// value is when it was written (seconds since the epoch, `now_s`; a gateway's LoRA
/// affinity scorer takes the newest series). `name_of` names an adapter id; adapters
/// unloaded since the snapshot are left out. Written only while some adapter exists
/// (`any`), as vLLM writes it only with LoRA enabled. Adapter names come from the config
/// or the admin-gated load endpoint; the exposition escapes them.
pub fn render_lora(
    snapshot: &Snapshot,
    max_loras: usize,
    any: bool,
    name_of: impl Fn(u16) -> Option<String>,
    now_s: f64,
    out: &mut String,
) {
    let l = &snapshot.lora;
    if !any && l.running.iter().next().is_none() && l.waiting.iter().next().is_none() {
        return;
    }
    let names = |set: &crate::core::lora::AdapterSet| {
        set.iter()
            .filter_map(&name_of)
            .collect::<Vec<_>>()
            .join(",")
    };
    let (running, waiting) = (names(&l.running), names(&l.waiting));
    let max_lora = max_loras.to_string();
    gauge(
        out,
        &[
            ("max_lora", &max_lora),
            ("running_lora_adapters", &running),
            ("waiting_lora_adapters", &waiting),
        ],
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        now_s,
    );
}

fn gauge(out: &mut String, labels: &[(&str, &str)], name: &str, help: &str, value: f64) {
    family(out, name, MetricType::Gauge, help);
    sample(out, name, labels, value);
}

fn counter(out: &mut String, labels: &[(&str, &str)], name: &str, help: &str, value: u64) {
    family(out, name, MetricType::Counter, help);
    sample(out, name, labels, value);
}

/// An hdrhistogram in ns as a seconds histogram over `bounds_ns`.
fn hdr(
    out: &mut String,
    labels: &[(&str, &str)],
    name: &str,
    help: &str,
    h: &Histogram<u64>,
    bounds_ns: &[u64],
) {
    family(out, name, MetricType::Histogram, help);
    let cumulative = cumulative_counts(h, bounds_ns);
    let buckets = bounds_ns
        .iter()
        .zip(cumulative)
        .map(|(&b, c)| (b as f64 / NANOS_PER_SECOND_F64, c));
    histogram(
        out,
        name,
        labels,
        buckets,
        h.len(),
        approx_sum(h) / NANOS_PER_SECOND_F64,
    );
}

/// Fixed-bound counts, each bound and the sum divided by `per_unit`.
fn bounded<const N: usize>(
    out: &mut String,
    labels: &[(&str, &str)],
    name: &str,
    help: &str,
    counts: &BoundedCounts<N>,
    bounds: &[u64; N],
    per_unit: f64,
) {
    family(out, name, MetricType::Histogram, help);
    let buckets = counts
        .cumulative(bounds)
        .map(|(b, c)| (b as f64 / per_unit, c));
    histogram(
        out,
        name,
        labels,
        buckets,
        counts.count(),
        counts.sum as f64 / per_unit,
    );
}

/// The core's log2 queue-wait histogram (request-level batching) with abe's bounds.
fn queue_time(out: &mut String, labels: &[(&str, &str)], waits: &WaitHistogram) {
    let name = "vllm:request_queue_time_seconds";
    family(
        out,
        name,
        MetricType::Histogram,
        "Time requests waited in the queue before dispatch (request-level batching; \
         powers-of-two bounds in ns).",
    );
    let count: u64 = waits.counts.iter().sum();
    let cumulative = QUEUE_WAIT_BOUND_LOG2_NS.iter().map(|&k| {
        let below: u64 = waits.counts[..=k as usize].iter().sum();
        (
            WaitHistogram::bucket_upper_ns(k as usize) as f64 / NANOS_PER_SECOND_F64,
            below,
        )
    });
    histogram(
        out,
        name,
        labels,
        cumulative,
        count,
        waits.sum_ns as f64 / NANOS_PER_SECOND_F64,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::strategy::StrategyKind;
    use crate::exec::{FinishReason, Output};
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// A snapshot with a few answered requests in every vLLM family.
    fn busy() -> Snapshot {
        let mut snap = Snapshot::new(2, StrategyKind::Fixed);
        snap.queued = 3;
        snap.live_requests = 7;
        for (i, reason) in [FinishReason::Stop, FinishReason::Length]
            .into_iter()
            .enumerate()
        {
            let out = Output::Text {
                text: "x".into(),
                prompt_tokens: 10,
                completion_tokens: 4 + i as u32,
                finish_reason: reason,
                tool_calls: None,
                cached_tokens: None,
            };
            // Arrival at 1 ms, first token at 21 ms, answer at 51 ms.
            snap.finished
                .record_output(&out.summary(), 16, 1_000_000, 21_000_000, 51_000_000);
            snap.latency.record(50_000_000).unwrap();
            snap.tpot.record(10_000_000).unwrap();
        }
        snap.finished.record_abort();
        snap.stats.queue_wait.record(2_000_000);
        snap
    }

    fn page(snap: &Snapshot) -> String {
        let mut out = String::new();
        render(snap, "abe-sim", &mut out);
        render_lora(snap, 1, true, adapter_name, 1.7e9, &mut out);
        out
    }

    fn adapter_name(id: u16) -> Option<String> {
        (id < 4).then(|| format!("lora-{id}"))
    }

    #[test]
    fn the_lora_gauge_is_vllms_labels_with_a_timestamp() {
        let mut snap = busy();
        snap.lora.running.insert(1);
        snap.lora.running.insert(2);
        snap.lora.waiting.insert(3);
        snap.lora.waiting.insert(9); // unloaded since: left out
        let mut out = String::new();
        render_lora(&snap, 2, false, adapter_name, 1.7e9, &mut out);
        assert_line(
            &out,
            "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"lora-1,lora-2\",waiting_lora_adapters=\"lora-3\"} 1700000000",
        );
        let mut none = String::new();
        render_lora(&busy(), 2, false, adapter_name, 1.7e9, &mut none);
        assert!(
            none.is_empty(),
            "no adapter: no family, as vLLM without LoRA"
        );
    }

    fn assert_line(page: &str, line: &str) {
        assert!(
            page.lines().any(|l| l == line),
            "missing line {line:?} in:\n{page}"
        );
    }

    #[test]
    fn scheduler_state_tokens_and_finish_reasons() {
        let out = page(&busy());
        assert_line(&out, "vllm:num_requests_running{model_name=\"abe-sim\"} 4");
        assert_line(&out, "vllm:num_requests_waiting{model_name=\"abe-sim\"} 3");
        assert_line(&out, "vllm:prompt_tokens_total{model_name=\"abe-sim\"} 20");
        assert_line(
            &out,
            "vllm:generation_tokens_total{model_name=\"abe-sim\"} 9",
        );
        for (reason, n) in [("stop", 1), ("length", 1), ("abort", 1)] {
            assert_line(
                &out,
                &format!(
                    "vllm:request_success_total{{model_name=\"abe-sim\",finished_reason=\"{reason}\"}} {n}"
                ),
            );
        }
        assert_line(
            &out,
            "vllm:time_to_first_token_seconds_sum{model_name=\"abe-sim\"} 0.04",
        );
        assert_line(
            &out,
            "vllm:request_decode_time_seconds_sum{model_name=\"abe-sim\"} 0.06",
        );
        assert_line(
            &out,
            "vllm:e2e_request_latency_seconds_count{model_name=\"abe-sim\"} 2",
        );
        assert_line(
            &out,
            "vllm:request_queue_time_seconds_count{model_name=\"abe-sim\"} 1",
        );
    }

    #[test]
    fn kv_usage_is_a_ratio_in_continuous_mode() {
        let mut snap = busy();
        snap.continuous = Some(crate::runtime::snapshot::ContinuousSnapshot {
            kv_used_tokens: 250,
            kv_capacity_tokens: 1000,
            ..Default::default()
        });
        let out = page(&snap);
        assert_line(
            &out,
            "vllm:kv_cache_usage_perc{model_name=\"abe-sim\"} 0.25",
        );
        assert_line(
            &out,
            "vllm:gpu_cache_usage_perc{model_name=\"abe-sim\"} 0.25",
        );
    }

    #[test]
    fn every_family_is_listed_and_documented_once() {
        let out = page(&busy());
        let types: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(types, FAMILIES.to_vec());
    }

    /// The vendored list of the series vLLM's published Grafana dashboard queries
    /// (`tests/fixtures/vllm_grafana_series.txt`, source in its header): each one is on the
    /// page with a `model_name` label, in both batching modes.
    #[test]
    fn the_vllm_grafana_dashboard_finds_every_series() {
        let fixture = include_str!("../../tests/fixtures/vllm_grafana_series.txt");
        let series: Vec<&str> = fixture
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(series.len() >= 20, "fixture lost its lines");
        let mut continuous = busy();
        continuous.continuous = Some(Default::default());
        for snap in [Snapshot::new(1, StrategyKind::Fixed), busy(), continuous] {
            let out = page(&snap);
            for name in &series {
                let prefix = format!("{name}{{model_name=\"abe-sim\"");
                assert!(
                    out.lines().any(|l| l.starts_with(&prefix)),
                    "the dashboard's series {name} is missing from:\n{out}"
                );
            }
        }
    }

    /// promtool parses the page and its only complaint is the `:` vLLM's names carry.
    #[test]
    fn promtool_only_objects_to_the_colons() {
        let out = page(&busy());
        let child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("SKIPPED: promtool is not on PATH (Debian package `prometheus`)");
                return;
            }
            Err(e) => panic!("could not run promtool: {e}"),
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(out.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let mut complaints = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            complaints += 1;
            assert!(
                line.starts_with("vllm:") && line.ends_with("metric names should not contain ':'"),
                "promtool: {line}\n--- page ---\n{out}"
            );
        }
        assert_eq!(complaints, FAMILIES.len(), "{text}");
    }
}
