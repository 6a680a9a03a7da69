//! Telemetry events the engine emits for `/events`: one per formed batch (request-level) or
//! tick (continuous), one per answered request, one per poll in which `auto` decided to hold
//! a partial batch. Plain `Copy` data pushed into a bounded
//! lock-free queue in [`Shared`](super::Shared); the `abe-events` thread
//! (`metrics::events`) takes them from there and fans them out to subscribers.
//!
//! The engine side never allocates, never blocks and never waits for anyone: a push that
//! finds the queue full drops the event and counts it. Under load the engine samples: at
//! most [`EVENTS_PER_WINDOW`] events of each kind per [`SAMPLE_WINDOW_NS`] (200 batch or
//! tick events, 200 request events and 200 hold events a second); the rest are counted as sampled out, so a
//! subscriber can tell what it did not see.

use super::sync::{AtomicU64, Ordering};
use crate::core::strategy::auto::HoldReason;
use crate::core::strategy::StrategyKind;
use crate::core::{FlushReason, Nanos, Priority};
use crossbeam_queue::ArrayQueue;

/// Length of a sampling window (ns).
pub const SAMPLE_WINDOW_NS: Nanos = 100_000_000;

/// Events of one kind emitted per window at most (the stated rate: 200 per second).
pub const EVENTS_PER_WINDOW: u32 = 20;

/// Events the queue holds between the engine and the events thread (a second of the
/// sampled rate of both kinds, with room to spare).
pub const QUEUE_CAPACITY: usize = 1024;

/// One telemetry event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TelemetryEvent {
    /// Request-level batching: a batch handed to a worker.
    Batch {
        at_ns: Nanos,
        backend: u16,
        worker: u16,
        size: u32,
        /// Estimated tokens (prompt + max_tokens) over the batch.
        tokens: u64,
        /// The strategy in force and why it flushed: its decision.
        strategy: StrategyKind,
        reason: FlushReason,
    },
    /// Continuous batching: one forward pass started.
    Tick {
        at_ns: Nanos,
        replica: u16,
        entries: u32,
        decode_tokens: u32,
        prefill_tokens: u32,
    },
    /// `auto` held a partial batch instead of dispatching it (the last hold of a poll).
    Hold {
        at_ns: Nanos,
        backend: u16,
        /// Requests held.
        queued: u32,
        /// Joiners expected by the end of the hold, and within the rule's horizon.
        expected_joiners: f64,
        joiners_within_horizon: f64,
        /// How long it plans to hold (a new arrival or completion decides again sooner).
        planned_wait_ns: Nanos,
        reason: HoldReason,
    },
    /// A request answered.
    Request {
        at_ns: Nanos,
        priority: Priority,
        ok: bool,
        latency_ns: Nanos,
        /// Arrival to first token sent (0: the answer came whole, or it failed first).
        ttft_ns: Nanos,
        /// Arrival to leaving the queue (first dispatch, or first admission into a slot);
        /// 0: it never left the queue (timed out, cancelled or refused there).
        queue_wait_ns: Nanos,
        completion_tokens: u32,
        /// Prompt tokens found in the prefix cache (`usage.prompt_tokens_details
        /// .cached_tokens`); `None` where no prefix cache runs or the request failed.
        cached_tokens: Option<u32>,
    },
}

/// What the events queue lost, as counters (shared: the engine adds, readers read).
#[derive(Debug, Default)]
pub struct TelemetryCounters {
    /// Events the engine chose not to emit (over the sampling rate).
    pub sampled_out: AtomicU64,
    /// Events dropped because the queue to the events thread was full.
    pub queue_full: AtomicU64,
}

/// The engine's end: the sampling windows and the queue.
pub struct TelemetryTx {
    window_start_ns: Nanos,
    /// Events emitted in this window: batches/ticks, requests, holds.
    emitted: [u32; 3],
    /// Counted locally and added to the shared counters once per window (one atomic add
    /// per window, not per event).
    sampled_out: u64,
    queue_full: u64,
}

impl Default for TelemetryTx {
    fn default() -> Self {
        TelemetryTx::new()
    }
}

impl TelemetryTx {
    pub const fn new() -> TelemetryTx {
        TelemetryTx {
            window_start_ns: 0,
            emitted: [0; 3],
            sampled_out: 0,
            queue_full: 0,
        }
    }

    /// Emits `event` at `now` if this window's rate allows and the queue has room.
    #[inline]
    pub fn emit(
        &mut self,
        now: Nanos,
        event: TelemetryEvent,
        queue: &ArrayQueue<TelemetryEvent>,
        counters: &TelemetryCounters,
    ) {
        if now.saturating_sub(self.window_start_ns) >= SAMPLE_WINDOW_NS {
            self.window_start_ns = now;
            self.emitted = [0; 3];
            self.flush(counters);
        }
        let kind = match event {
            TelemetryEvent::Batch { .. } | TelemetryEvent::Tick { .. } => 0,
            TelemetryEvent::Request { .. } => 1,
            TelemetryEvent::Hold { .. } => 2,
        };
        if self.emitted[kind] >= EVENTS_PER_WINDOW {
            self.sampled_out += 1;
            return;
        }
        self.emitted[kind] += 1;
        if queue.push(event).is_err() {
            self.queue_full += 1;
        }
    }

    /// Adds the local counts to the shared counters.
    pub fn flush(&mut self, counters: &TelemetryCounters) {
        // Relaxed: independent counters, they publish no other data.
        if self.sampled_out > 0 {
            counters
                .sampled_out
                .fetch_add(std::mem::take(&mut self.sampled_out), Ordering::Relaxed);
        }
        if self.queue_full > 0 {
            counters
                .queue_full
                .fetch_add(std::mem::take(&mut self.queue_full), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(at_ns: Nanos) -> TelemetryEvent {
        TelemetryEvent::Request {
            at_ns,
            priority: Priority::Normal,
            ok: true,
            latency_ns: 1,
            ttft_ns: 0,
            queue_wait_ns: 0,
            completion_tokens: 1,
            cached_tokens: None,
        }
    }

    #[test]
    fn at_most_the_stated_rate_per_kind_and_the_rest_counted() {
        let queue = ArrayQueue::new(QUEUE_CAPACITY);
        let counters = TelemetryCounters::default();
        let mut tx = TelemetryTx::new();
        for i in 0..100 {
            tx.emit(1 + i, request(i), &queue, &counters);
        }
        assert_eq!(queue.len(), EVENTS_PER_WINDOW as usize);
        // The next window opens: the 80 sampled out are published, 20 more go through.
        for i in 0..30 {
            tx.emit(SAMPLE_WINDOW_NS + 1 + i, request(i), &queue, &counters);
        }
        assert_eq!(queue.len(), 2 * EVENTS_PER_WINDOW as usize);
        assert_eq!(counters.sampled_out.load(Ordering::Relaxed), 80);
        tx.flush(&counters);
        assert_eq!(counters.sampled_out.load(Ordering::Relaxed), 90);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let queue = ArrayQueue::new(4);
        let counters = TelemetryCounters::default();
        let mut tx = TelemetryTx::new();
        for i in 0..10 {
            tx.emit(1, request(i), &queue, &counters);
        }
        tx.flush(&counters);
        assert_eq!(queue.len(), 4);
        assert_eq!(counters.queue_full.load(Ordering::Relaxed), 6);
    }
}
