//! `GET /events`: the engine's telemetry as a Server-Sent Events stream.
//!
//! The engine pushes sampled [`TelemetryEvent`]s into a bounded queue
//! (`runtime::telemetry`, where the sampling rate is stated). The `abe-events` thread here
//! ([`EventsThread`]) takes them, renders each once as an SSE event framed as an HTTP/1.1
//! chunk, and offers the bytes to every [`Subscriber`]: a bounded buffer per `/events`
//! connection that its io thread moves into the connection's write buffer. A subscriber
//! whose buffer is full (a slow reader) loses the event, and the loss is counted for it and
//! in total; nobody upstream ever waits for it. Once a second every subscriber also gets a
//! `stats` event with what was sampled out, dropped on the engine's queue, and dropped for
//! it.
//!
//! What must never happen here: anything that makes the engine wait (it only ever sees the
//! queue), or a buffer that grows with a slow client.

mod format;

pub use format::{chunk, render_event};

use crate::runtime::telemetry::TelemetryEvent;
use crate::runtime::Handle;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes a subscriber's buffer holds at most (about a second of the sampled rate).
pub const SUBSCRIBER_BUFFER_BYTES: usize = 256 * 1024;

/// Subscribers at once (more get 503).
pub const MAX_SUBSCRIBERS: usize = 32;

/// How often the events thread takes the engine's queue.
pub const PERIOD: Duration = Duration::from_millis(20);

/// One `/events` connection's pending bytes.
#[derive(Debug, Default)]
pub struct Subscriber {
    /// Framed SSE chunks not yet taken by the io thread; never above
    /// [`SUBSCRIBER_BUFFER_BYTES`].
    buf: Mutex<Vec<u8>>,
    /// Events this subscriber lost to a full buffer.
    dropped: AtomicU64,
}

impl Subscriber {
    /// Appends `bytes` (one whole event) if it fits; else counts a drop. True if kept.
    fn offer(&self, bytes: &[u8]) -> bool {
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() + bytes.len() > SUBSCRIBER_BUFFER_BYTES {
            drop(buf);
            // Relaxed: an independent counter.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        buf.extend_from_slice(bytes);
        true
    }

    /// Moves the pending bytes to the end of `out`; returns how many.
    pub fn take_into(&self, out: &mut Vec<u8>) -> usize {
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let n = buf.len();
        out.extend_from_slice(&buf);
        buf.clear();
        n
    }

    /// Events this subscriber lost.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// An `/events` response in a connection's slot: its subscriber, and whether the head is
/// out yet.
#[derive(Debug)]
pub struct EventsSlot {
    pub subscriber: Arc<Subscriber>,
    pub head_written: bool,
}

/// The subscribers, and what was delivered and lost in total.
#[derive(Debug, Default)]
pub struct EventHub {
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    /// Events offered to subscribers and kept.
    pub delivered: AtomicU64,
    /// Events subscribers lost to full buffers, in all (gone subscribers included).
    pub dropped: AtomicU64,
}

impl EventHub {
    /// A new subscriber, or `None` at [`MAX_SUBSCRIBERS`]. It starts with a `hello` event
    /// stating the sampling rate.
    pub fn subscribe(&self) -> Option<Arc<Subscriber>> {
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| Arc::strong_count(s) > 1);
        if subs.len() >= MAX_SUBSCRIBERS {
            return None;
        }
        let s = Arc::new(Subscriber::default());
        s.offer(&format::hello());
        subs.push(s.clone());
        Some(s)
    }

    /// Subscribers still connected.
    pub fn subscribers(&self) -> usize {
        let subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.iter().filter(|s| Arc::strong_count(s) > 1).count()
    }

    /// Offers one framed event to every subscriber; forgets the ones whose connection went.
    fn fan_out(&self, bytes: &[u8]) {
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| Arc::strong_count(s) > 1);
        for s in subs.iter() {
            // Relaxed: independent counters.
            if s.offer(bytes) {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A `stats` event per subscriber (each with its own drop count).
    fn stats(&self, sampled_out: u64, queue_full: u64) {
        let subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        for s in subs.iter() {
            let bytes = format::stats(sampled_out, queue_full, s.dropped());
            if !s.offer(&bytes) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes every event the engine queued and fans each out (rendered once).
    pub fn pump(&self, mut next: impl FnMut() -> Option<TelemetryEvent>, scratch: &mut Vec<u8>) {
        while let Some(e) = next() {
            scratch.clear();
            render_event(&e, scratch);
            self.fan_out(scratch);
        }
    }
}

/// The event stream's counters on the /metrics page (`lost`: the engine's sampled-out and
/// queue-full counts, from `Handle::telemetry_lost`).
pub fn render_prometheus(hub: &EventHub, lost: (u64, u64), out: &mut String) {
    use super::exposition::{family, sample, single, MetricType};
    single(
        out,
        "abe_events_subscribers",
        MetricType::Gauge,
        "Clients connected to GET /events.",
        hub.subscribers(),
    );
    single(
        out,
        "abe_events_sampled_out_total",
        MetricType::Counter,
        "Telemetry events the engine did not emit (over the stated rate: 200 per second per kind).",
        lost.0,
    );
    let name = "abe_events_dropped_total";
    family(
        out,
        name,
        MetricType::Counter,
        "Telemetry events lost: where=engine_queue (the queue to the events thread was full), \
         where=subscriber (a slow subscriber's buffer was full).",
    );
    sample(out, name, &[("where", "engine_queue")], lost.1);
    sample(
        out,
        name,
        &[("where", "subscriber")],
        hub.dropped.load(Ordering::Relaxed),
    );
    single(
        out,
        "abe_events_delivered_total",
        MetricType::Counter,
        "Telemetry events handed to subscribers (one per subscriber).",
        hub.delivered.load(Ordering::Relaxed),
    );
}

/// The `abe-events` thread.
pub struct EventsThread {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl EventsThread {
    /// Starts moving `handle`'s telemetry to `hub`'s subscribers.
    pub fn spawn(handle: Arc<Handle>, hub: Arc<EventHub>) -> std::io::Result<EventsThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("abe-events".into())
            .spawn(move || {
                let mut scratch = Vec::with_capacity(1024);
                let mut last_stats = Instant::now();
                // Acquire: pairs with the Release in `stop`.
                while !flag.load(Ordering::Acquire) {
                    // Without subscribers the queue is still emptied (the events are
                    // nobody's), so a later subscriber starts with fresh ones.
                    hub.pump(|| handle.pop_telemetry(), &mut scratch);
                    if last_stats.elapsed() >= Duration::from_secs(1) {
                        last_stats = Instant::now();
                        let (sampled_out, queue_full) = handle.telemetry_lost();
                        hub.stats(sampled_out, queue_full);
                    }
                    std::thread::park_timeout(PERIOD);
                }
            })?;
        Ok(EventsThread { stop, thread })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        // Release: the thread's Acquire load sees the flag after it wakes.
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{FlushReason, Priority};

    fn batch() -> TelemetryEvent {
        TelemetryEvent::Batch {
            at_ns: 1_500_000,
            backend: 0,
            worker: 1,
            size: 8,
            tokens: 900,
            strategy: crate::core::strategy::StrategyKind::Fixed,
            reason: FlushReason::Timeout,
        }
    }

    #[test]
    fn an_event_is_one_chunk_holding_one_sse_event() {
        let mut out = Vec::new();
        render_event(&batch(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let (size, rest) = text.split_once("\r\n").unwrap();
        let body = rest.strip_suffix("\r\n").unwrap();
        assert_eq!(usize::from_str_radix(size, 16).unwrap(), body.len());
        let data = body
            .strip_prefix("event: batch\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["size"], 8);
        assert_eq!(v["strategy"], "fixed");
        assert_eq!(v["reason"], FlushReason::Timeout.as_str());
        assert_eq!(v["at_ms"], 1.5);
        let mut out = Vec::new();
        render_event(
            &TelemetryEvent::Request {
                at_ns: 0,
                priority: Priority::High,
                ok: false,
                latency_ns: 2_000_000,
                ttft_ns: 0,
                queue_wait_ns: 0,
                completion_tokens: 0,
                cached_tokens: None,
            },
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\"outcome\":\"failed\""), "{text}");
        assert!(text.contains("\"ttft_ms\":null"), "{text}");
        assert!(!text.contains("cached_tokens"), "unknown: absent: {text}");
        let mut out = Vec::new();
        render_event(
            &TelemetryEvent::Request {
                at_ns: 0,
                priority: Priority::Normal,
                ok: true,
                latency_ns: 2_000_000,
                ttft_ns: 1_000_000,
                queue_wait_ns: 500_000,
                completion_tokens: 3,
                cached_tokens: Some(32),
            },
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\"cached_tokens\":32"), "{text}");
    }

    #[test]
    fn a_slow_subscriber_loses_events_and_they_are_counted_never_buffered() {
        let hub = EventHub::default();
        let slow = hub.subscribe().unwrap();
        let fast = hub.subscribe().unwrap();
        let mut sink = Vec::new();
        let mut scratch = Vec::new();
        let mut sent = 0u64;
        // Far more than a buffer holds; `fast` reads as it goes, `slow` never does.
        while sent < 20_000 {
            let mut left = 100;
            hub.pump(
                || {
                    left -= 1;
                    (left >= 0).then(batch)
                },
                &mut scratch,
            );
            sent += 100;
            sink.clear();
            fast.take_into(&mut sink);
        }
        assert_eq!(fast.dropped(), 0);
        assert!(slow.dropped() > 0);
        let mut held = Vec::new();
        slow.take_into(&mut held);
        assert!(held.len() <= SUBSCRIBER_BUFFER_BYTES);
        assert_eq!(
            hub.delivered.load(Ordering::Relaxed) + hub.dropped.load(Ordering::Relaxed),
            2 * sent
        );
        // A subscriber whose connection went is forgotten.
        drop(slow);
        assert_eq!(hub.subscribers(), 1);
    }

    #[test]
    fn subscribers_are_bounded() {
        let hub = EventHub::default();
        let subs: Vec<_> = (0..MAX_SUBSCRIBERS)
            .map(|_| hub.subscribe().unwrap())
            .collect();
        assert!(hub.subscribe().is_none());
        drop(subs);
        assert!(hub.subscribe().is_some());
    }
}
