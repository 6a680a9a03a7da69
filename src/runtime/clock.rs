//! The live runtime's clock: monotonic nanoseconds since the runtime started.
//!
//! The core never reads a clock; the engine reads this one and passes `now` in.

use crate::core::Nanos;
use std::time::{Duration, Instant};

/// Monotonic clock with an epoch at construction.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
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
