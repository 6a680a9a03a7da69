//! The live runtime's clock: monotonic nanoseconds since the runtime started.
//!
//! The core never reads a clock; the engine reads this one and passes `now` in.

use crate::core::Nanos;
use std::time::{Duration, Instant};

/// Monotonic clock with an epoch at construction.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
    /// The epoch as `CLOCK_MONOTONIC` nanoseconds (Linux), read just before `epoch`: a
    /// reading is then never behind [`Clock::reading`] of an instant taken before it (it
    /// may be ahead by the few nanoseconds between the two reads).
    #[cfg(target_os = "linux")]
    epoch_ns: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads `clock` with `clock_gettime` (Linux; through the vDSO, no syscall for the
/// monotonic and realtime clocks), or `None` if the kernel refuses it. The one place abe
/// calls it: the runtime's clock below and `api::unix_now`.
#[cfg(target_os = "linux")]
#[inline]
pub fn clock_gettime(clock: libc::clockid_t) -> Option<libc::timespec> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then_some(ts)
}

/// `CLOCK_MONOTONIC`, the clock `Instant` reads on Linux, in nanoseconds. Read directly,
/// a reading is the vDSO call and one multiply-add; `Instant::elapsed` adds a checked
/// subtraction of two timespecs and a `Duration` (~90 instructions a reading on the
/// engine's path, callgrind, where the engine reads the clock twice a batch).
#[cfg(target_os = "linux")]
#[inline]
fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux; a refusal would read as the epoch.
    let ts = clock_gettime(libc::CLOCK_MONOTONIC).unwrap_or(libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    });
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Clock {
            #[cfg(target_os = "linux")]
            epoch_ns: monotonic_ns(),
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub fn now(&self) -> Nanos {
        #[cfg(target_os = "linux")]
        {
            monotonic_ns().saturating_sub(self.epoch_ns) as Nanos
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.epoch.elapsed().as_nanos() as Nanos
        }
    }

    /// The `Instant` of a clock reading.
    pub fn instant(&self, at: Nanos) -> Instant {
        self.epoch + Duration::from_nanos(at)
    }

    /// The clock reading of `at` (0 for an instant before the epoch).
    pub fn reading(&self, at: Instant) -> Nanos {
        at.saturating_duration_since(self.epoch).as_nanos() as Nanos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_agree_with_the_instants_around_them() {
        let clock = Clock::new();
        for _ in 0..1000 {
            let before = Instant::now();
            let now = clock.now();
            let after = Instant::now();
            // Never behind an instant taken before it; ahead of one taken after it by at most
            // the gap between the epoch's two reads (generous: a wrong clock is off by far more).
            assert!(
                now >= clock.reading(before),
                "{now} behind {}",
                clock.reading(before)
            );
            assert!(now <= clock.reading(after) + 10_000_000);
            assert!(clock.reading(clock.instant(now)) == now);
        }
    }
}
