//! How a telemetry event looks on the wire: an SSE event (`event: <kind>` and one `data:`
//! line of JSON), framed as one HTTP/1.1 chunk so the io thread copies it as is.
//!
//! Runs on the events thread only; allocates freely.

use crate::runtime::telemetry::{TelemetryEvent, EVENTS_PER_WINDOW, SAMPLE_WINDOW_NS};
use serde_json::json;
use std::io::Write;

/// `text` as one chunk: size line, bytes, CRLF.
pub fn chunk(text: &[u8], out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{:x}\r\n", text.len());
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// One SSE event of `kind` with `data`, chunked.
fn sse(kind: &str, data: &serde_json::Value, out: &mut Vec<u8>) {
    let text = format!("event: {kind}\ndata: {data}\n\n");
    chunk(text.as_bytes(), out);
}

/// Appends `event` rendered and framed to `out`.
pub fn render_event(event: &TelemetryEvent, out: &mut Vec<u8>) {
    let ms = |ns: u64| ns as f64 / 1e6;
    match *event {
        TelemetryEvent::Batch {
            at_ns,
            backend,
            worker,
            size,
            tokens,
            strategy,
            reason,
        } => sse(
            "batch",
            &json!({
                "at_ms": ms(at_ns),
                "backend": backend,
                "worker": worker,
                "size": size,
                "tokens": tokens,
                "strategy": strategy.as_str(),
                "reason": reason.as_str(),
            }),
            out,
        ),
        TelemetryEvent::Tick {
            at_ns,
            replica,
            entries,
            decode_tokens,
            prefill_tokens,
        } => sse(
            "tick",
            &json!({
                "at_ms": ms(at_ns),
                "replica": replica,
                "entries": entries,
                "decode_tokens": decode_tokens,
                "prefill_tokens": prefill_tokens,
            }),
            out,
        ),
        TelemetryEvent::Hold {
            at_ns,
            backend,
            queued,
            expected_joiners,
            joiners_within_horizon,
            planned_wait_ns,
            reason,
        } => sse(
            "hold",
            &json!({
                "at_ms": ms(at_ns),
                "backend": backend,
                "queued": queued,
                "expected_joiners": expected_joiners,
                "joiners_within_horizon": joiners_within_horizon,
                "planned_wait_ms": ms(planned_wait_ns),
                "reason": reason.as_str(),
            }),
            out,
        ),
        TelemetryEvent::Request {
            at_ns,
            priority,
            ok,
            latency_ns,
            ttft_ns,
            queue_wait_ns,
            completion_tokens,
            cached_tokens,
        } => {
            let mut v = json!({
                "at_ms": ms(at_ns),
                "priority": priority.as_str(),
                "outcome": if ok { "completed" } else { "failed" },
                "latency_ms": ms(latency_ns),
                "queue_wait_ms": (queue_wait_ns > 0).then(|| ms(queue_wait_ns)),
                "ttft_ms": (ttft_ns > 0).then(|| ms(ttft_ns)),
                "completion_tokens": completion_tokens,
            });
            // Only where a prefix cache runs (continuous batching with prefix caching), as
            // in the answer's usage.
            if let Some(cached) = cached_tokens {
                v["cached_tokens"] = json!(cached);
            }
            sse("request", &v, out)
        }
    }
}

/// The first event a subscriber gets: what it will see and at what rate.
pub fn hello() -> Vec<u8> {
    let per_second = EVENTS_PER_WINDOW as u64 * 1_000_000_000 / SAMPLE_WINDOW_NS;
    let mut out = Vec::new();
    sse(
        "hello",
        &json!({
            "kinds": ["batch", "tick", "request", "hold", "stats"],
            "sampling": format!(
                "at most {EVENTS_PER_WINDOW} batch/tick events, {EVENTS_PER_WINDOW} request \
                 events and {EVENTS_PER_WINDOW} hold events per {} ms ({per_second}/s each); \
                 the rest are counted in stats.sampled_out",
                SAMPLE_WINDOW_NS / 1_000_000
            ),
            "max_per_second_per_kind": per_second,
        }),
        &mut out,
    );
    out
}

/// The once-a-second `stats` event.
pub fn stats(sampled_out: u64, queue_full: u64, dropped_for_you: u64) -> Vec<u8> {
    let mut out = Vec::new();
    sse(
        "stats",
        &json!({
            "sampled_out": sampled_out,
            "engine_queue_full": queue_full,
            "dropped_for_you": dropped_for_you,
        }),
        &mut out,
    );
    out
}
