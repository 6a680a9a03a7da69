//! Per-worker circuit breaker: closed -> open after N consecutive failures -> half-open after
//! the recovery timeout (one probe batch) -> closed on success, open again on failure.
//!
//! Time is passed in; the breaker never reads a clock.

use super::request::Nanos;

/// Circuit breaker state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    /// Lower-case name for metrics and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

/// Circuit breaker settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitParams {
    /// Consecutive failures that open the circuit (spec default 5).
    pub failure_threshold: u32,
    /// How long an open circuit stays open before a probe is allowed (spec default 30 s).
    pub recovery_ns: Nanos,
}

impl Default for CircuitParams {
    fn default() -> Self {
        CircuitParams {
            failure_threshold: 5,
            recovery_ns: 30_000_000_000,
        }
    }
}

/// One worker's breaker.
///
/// Invariant: `probe_in_flight` only while `HalfOpen`.
#[derive(Clone, Copy, Debug)]
pub struct CircuitBreaker {
    state: CircuitState,
    consecutive_failures: u32,
    opened_at_ns: Nanos,
    probe_in_flight: bool,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            state: CircuitState::Closed,
            consecutive_failures: 0,
            opened_at_ns: 0,
            probe_in_flight: false,
        }
    }
}

impl CircuitBreaker {
    /// Current state, moving open -> half-open when the recovery time has passed.
    pub fn state(&mut self, now: Nanos, params: &CircuitParams) -> CircuitState {
        if self.state == CircuitState::Open
            && now.saturating_sub(self.opened_at_ns) >= params.recovery_ns
        {
            self.state = CircuitState::HalfOpen;
            self.probe_in_flight = false;
        }
        self.state
    }

    /// State as last computed (no transition).
    pub fn last_state(&self) -> CircuitState {
        self.state
    }

    /// When an open circuit becomes half-open (for the driver's next deadline).
    pub fn reopens_at(&self, params: &CircuitParams) -> Option<Nanos> {
        (self.state == CircuitState::Open)
            .then(|| self.opened_at_ns.saturating_add(params.recovery_ns))
    }

    /// May a batch be sent now? Half-open admits exactly one probe at a time.
    pub fn can_execute(&mut self, now: Nanos, params: &CircuitParams) -> bool {
        self.state(now, params);
        self.allows_dispatch()
    }

    /// May a batch be sent, judged on the state as last advanced by [`Self::state`]?
    pub fn allows_dispatch(&self) -> bool {
        match self.state {
            CircuitState::Closed => true,
            CircuitState::Open => false,
            CircuitState::HalfOpen => !self.probe_in_flight,
        }
    }

    /// A batch was sent (call only after `can_execute` said yes).
    pub fn on_dispatch(&mut self) {
        if self.state == CircuitState::HalfOpen {
            self.probe_in_flight = true;
        }
    }

    /// A batch succeeded: failures reset, a half-open circuit closes.
    pub fn record_success(&mut self) {
        self.consecutive_failures = 0;
        if self.state == CircuitState::HalfOpen {
            self.state = CircuitState::Closed;
            self.probe_in_flight = false;
        }
    }

    /// A batch failed at `now`: a failed probe reopens; enough failures in a row open.
    pub fn record_failure(&mut self, now: Nanos, params: &CircuitParams) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let open = match self.state {
            CircuitState::HalfOpen => true,
            CircuitState::Closed => self.consecutive_failures >= params.failure_threshold,
            CircuitState::Open => true,
        };
        if open {
            self.state = CircuitState::Open;
            self.opened_at_ns = now;
            self.probe_in_flight = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn opens_after_five_failures_probes_after_thirty_seconds_and_closes_on_success() {
        let p = CircuitParams::default();
        let mut c = CircuitBreaker::default();
        for i in 0..4 {
            c.record_failure(i, &p);
            assert_eq!(c.state(i, &p), CircuitState::Closed);
        }
        c.record_failure(10 * S, &p);
        assert_eq!(c.state(10 * S, &p), CircuitState::Open);
        assert!(!c.can_execute(39 * S, &p));
        assert_eq!(c.reopens_at(&p), Some(40 * S));
        assert!(c.can_execute(40 * S, &p));
        assert_eq!(c.state(40 * S, &p), CircuitState::HalfOpen);
        c.on_dispatch();
        assert!(!c.can_execute(40 * S, &p), "only one probe at a time");
        c.record_success();
        assert_eq!(c.state(41 * S, &p), CircuitState::Closed);
        assert!(c.can_execute(41 * S, &p));
    }

    #[test]
    fn a_failed_probe_reopens_for_another_full_recovery_period() {
        let p = CircuitParams::default();
        let mut c = CircuitBreaker::default();
        for _ in 0..5 {
            c.record_failure(0, &p);
        }
        assert!(c.can_execute(30 * S, &p));
        c.on_dispatch();
        c.record_failure(31 * S, &p);
        assert_eq!(c.state(31 * S, &p), CircuitState::Open);
        assert!(!c.can_execute(60 * S, &p));
        assert!(c.can_execute(61 * S, &p));
    }

    #[test]
    fn a_success_resets_the_consecutive_count() {
        let p = CircuitParams::default();
        let mut c = CircuitBreaker::default();
        for _ in 0..4 {
            c.record_failure(0, &p);
        }
        c.record_success();
        for _ in 0..4 {
            c.record_failure(0, &p);
        }
        assert_eq!(c.state(0, &p), CircuitState::Closed);
    }
}
