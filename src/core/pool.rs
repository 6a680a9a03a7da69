//! The core's view of the worker pool: pending batches, busy time, circuit breaker per worker.
//!
//! No threads here: the driver tells the core when a batch was sent and when it came back.

use super::circuit::{CircuitBreaker, CircuitParams, CircuitState};
use super::request::Nanos;

/// What a worker is doing, as reported in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerStatus {
    Idle,
    Busy,
    /// Its circuit is open or half-open.
    Unhealthy,
}

impl WorkerStatus {
    /// Lower-case name for metrics and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkerStatus::Idle => "idle",
            WorkerStatus::Busy => "busy",
            WorkerStatus::Unhealthy => "unhealthy",
        }
    }
}

/// One worker as the scheduler sees it.
///
/// Invariant: `pending <= max_inflight`; `busy_since_ns` is meaningful only while `pending > 0`.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerView {
    /// Batches handed over and not yet returned (including abandoned ones still running).
    pub pending: u32,
    /// Batches completed successfully.
    pub batches_ok: u64,
    /// Batches that failed or timed out.
    pub batches_failed: u64,
    /// Total time with at least one batch pending, up to the last transition to idle.
    pub busy_ns_total: Nanos,
    busy_since_ns: Nanos,
    pub circuit: CircuitBreaker,
}

impl WorkerView {
    /// Can this worker take a batch now?
    pub fn can_take(&mut self, now: Nanos, max_inflight: u32, params: &CircuitParams) -> bool {
        self.pending < max_inflight && self.circuit.can_execute(now, params)
    }

    /// Idle and healthy: the condition for `dispatch_when_idle`.
    pub fn is_idle(&mut self, now: Nanos, params: &CircuitParams) -> bool {
        self.pending == 0 && self.circuit.can_execute(now, params)
    }

    /// A batch was handed to this worker.
    pub fn on_dispatch(&mut self, now: Nanos) {
        if self.pending == 0 {
            self.busy_since_ns = now;
        }
        self.pending += 1;
        self.circuit.on_dispatch();
    }

    /// A batch came back (successfully or not).
    pub fn on_return(&mut self, now: Nanos) {
        debug_assert!(self.pending > 0);
        self.pending = self.pending.saturating_sub(1);
        if self.pending == 0 {
            self.busy_ns_total += now.saturating_sub(self.busy_since_ns);
        }
    }

    /// Busy time up to `now`, counting a batch still running.
    pub fn busy_ns(&self, now: Nanos) -> Nanos {
        if self.pending > 0 {
            self.busy_ns_total + now.saturating_sub(self.busy_since_ns)
        } else {
            self.busy_ns_total
        }
    }

    /// Status for metrics (does not advance the circuit).
    pub fn status(&self) -> WorkerStatus {
        match self.circuit.last_state() {
            CircuitState::Open | CircuitState::HalfOpen => WorkerStatus::Unhealthy,
            CircuitState::Closed if self.pending > 0 => WorkerStatus::Busy,
            CircuitState::Closed => WorkerStatus::Idle,
        }
    }
}
