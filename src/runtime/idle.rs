//! Idle policies: what a runtime thread does when a poll found no work.
//!
//! `spin` never sleeps (lowest latency, burns a core); `park` parks at once; `adaptive`
//! (default) yields the CPU for up to `spin_us`, then parks on its doorbell until the next
//! deadline or a ring. It yields rather than spins because on these 2-core machines a spinning
//! engine takes the core the io thread and the client need: measured with wrk at c=8, a
//! 20 us busy-spin cost 26 us of CPU per request, yielding 17 us, parking at once 18 us.
//! The io threads follow the same policy while they wait for completions (see
//! `server::io_thread`); the engine and workers while their rings are empty.

use super::doorbell::Doorbell;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// How an idle thread waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// Busy-poll forever.
    Spin,
    /// Yield for `spin_us`, then park.
    #[default]
    Adaptive,
    /// Park at once.
    Park,
}

impl IdlePolicy {
    /// Config name.
    pub const fn as_str(self) -> &'static str {
        match self {
            IdlePolicy::Spin => "spin",
            IdlePolicy::Adaptive => "adaptive",
            IdlePolicy::Park => "park",
        }
    }
}

impl fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IdlePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spin" => Ok(IdlePolicy::Spin),
            "adaptive" => Ok(IdlePolicy::Adaptive),
            "park" => Ok(IdlePolicy::Park),
            _ => Err(format!(
                "unknown idle policy '{s}': valid policies are spin, adaptive, park"
            )),
        }
    }
}

crate::core::names::serde_by_name!(IdlePolicy);

/// Longest single park, so a thread re-checks its state (shutdown flags) at least this often
/// (workers: [`WORKER_MAX_PARK`]).
pub const MAX_PARK: Duration = Duration::from_millis(100);

/// Longest single park of a worker thread ([`Idler::parking_at_most`]). A worker needs no
/// re-check: its jobs ring its doorbell and its exit comes with an unpark. An idle worker
/// woken every [`MAX_PARK`] cost ~0.1 % of a core each: 5.6 % for the 576 workers of a
/// front with one `upstream` table and its spare slots, 64 workers each (BENCHMARKS.md,
/// "Upstream defaults").
pub const WORKER_MAX_PARK: Duration = Duration::from_secs(2);

/// Per-thread idle state: how long we have been idle.
pub struct Idler {
    policy: IdlePolicy,
    spin: Duration,
    idle_since: Option<Instant>,
    /// Longest single park.
    max_park: Duration,
}

impl Idler {
    /// An idler with `policy`, spinning up to `spin` before parking (adaptive only).
    pub fn new(policy: IdlePolicy, spin: Duration) -> Self {
        Idler {
            policy,
            spin,
            idle_since: None,
            max_park: MAX_PARK,
        }
    }

    /// This idler, parking for at most `max_park` at a time instead of [`MAX_PARK`].
    pub fn parking_at_most(self, max_park: Duration) -> Self {
        Idler { max_park, ..self }
    }

    /// Whether waiting for work gives the core away (`adaptive`: a yield between polls).
    /// A thread that found work polls once more before such a wait (`server::io_thread`).
    pub fn yields(&self) -> bool {
        self.policy == IdlePolicy::Adaptive
    }

    /// The last poll did work: reset the spin budget.
    #[inline]
    pub fn busy(&mut self) {
        self.idle_since = None;
    }

    /// The last poll did nothing: true if the thread should poll again rather than sleep
    /// (having spun or yielded here), false once the policy says sleep.
    pub fn keep_polling(&mut self, now: Instant) -> bool {
        match self.policy {
            IdlePolicy::Spin => {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                true
            }
            IdlePolicy::Park => false,
            IdlePolicy::Adaptive => {
                let since = *self.idle_since.get_or_insert(now);
                if now.duration_since(since) >= self.spin {
                    return false;
                }
                std::thread::yield_now();
                true
            }
        }
    }

    /// The last poll did nothing. Spin, or park on `bell` until `deadline` (or at most
    /// [`MAX_PARK`], or what [`Self::parking_at_most`] set), unless `has_work` says
    /// something arrived.
    pub fn idle(
        &mut self,
        now: Instant,
        deadline: Option<Instant>,
        bell: &Doorbell,
        has_work: impl Fn() -> bool,
    ) {
        if self.keep_polling(now) {
            return;
        }
        let timeout = deadline
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(self.max_park)
            .min(self.max_park);
        if timeout.is_zero() {
            return;
        }
        bell.wait(timeout, has_work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_keeps_polling_for_its_spin_budget_then_sleeps_until_busy_again() {
        let t0 = Instant::now();
        let mut idler = Idler::new(IdlePolicy::Adaptive, Duration::from_micros(20));
        assert!(idler.keep_polling(t0));
        assert!(idler.keep_polling(t0 + Duration::from_micros(19)));
        assert!(!idler.keep_polling(t0 + Duration::from_micros(20)));
        // Work resets the budget, counted from the next idle poll.
        idler.busy();
        assert!(idler.keep_polling(t0 + Duration::from_micros(100)));
        assert!(!idler.keep_polling(t0 + Duration::from_micros(121)));
    }

    #[test]
    fn spin_always_polls_and_park_never_does() {
        let t0 = Instant::now();
        let mut spin = Idler::new(IdlePolicy::Spin, Duration::ZERO);
        let mut park = Idler::new(IdlePolicy::Park, Duration::from_secs(1));
        for us in [0, 1_000_000, 10_000_000] {
            assert!(spin.keep_polling(t0 + Duration::from_micros(us)));
            assert!(!park.keep_polling(t0 + Duration::from_micros(us)));
        }
    }

    #[test]
    fn only_adaptive_gives_the_core_away_between_polls() {
        // The io thread looks once more before such a wait; a spin keeps the core and a
        // park's sleeping poll returns at once for what arrived.
        let idler = |p| Idler::new(p, Duration::from_micros(20));
        assert!(idler(IdlePolicy::Adaptive).yields());
        assert!(!idler(IdlePolicy::Spin).yields());
        assert!(!idler(IdlePolicy::Park).yields());
    }
}
