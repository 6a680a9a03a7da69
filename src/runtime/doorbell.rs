//! The doorbell: how producers wake a consumer thread that parked because it had no work.
//!
//! Protocol (a Dekker handshake through two SeqCst fences):
//! - consumer: `sleeping = true`; fence; re-check every source of work; park only if none;
//!   `sleeping = false` after waking.
//! - producer: publish the work (Release); fence; if `sleeping`, clear it and unpark.
//!
//! Either the consumer's re-check sees the work, or the producer sees `sleeping` and unparks
//! (and an unpark before the park makes the park return at once). So a wake-up is never lost,
//! and producers pay only a fence and a load while the consumer is awake. loom-tests check
//! this. Never park without going through [`Doorbell::wait`].

use super::sync::{fence, park_timeout, unpark_in, AtomicBool, OnceSlot, Ordering, Thread};
use std::time::Duration;

/// One consumer's doorbell, shared by all its producers.
pub struct Doorbell {
    /// True while the consumer is (about to be) parked.
    sleeping: AtomicBool,
    /// The consumer thread, bound once by the consumer before its first wait.
    consumer: OnceSlot<Thread>,
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl Doorbell {
    /// A doorbell with no consumer bound yet.
    pub fn new() -> Self {
        Doorbell {
            sleeping: AtomicBool::new(false),
            consumer: OnceSlot::new(),
        }
    }

    /// Binds the calling thread as the consumer. Call once, from the consumer, before `wait`.
    pub fn bind_current(&self) {
        let _ = self.consumer.set(super::sync::current_thread());
    }

    /// Producer side: call after publishing work. Cheap when the consumer is awake.
    #[inline]
    pub fn ring(&self) {
        // SeqCst fence: orders our publish (an earlier Release store) before the load of
        // `sleeping`, pairing with the consumer's fence between its store and its re-check.
        fence(Ordering::SeqCst);
        // compare_exchange rather than swap: the same meaning (a failed CAS writes nothing),
        // and loom checks it correctly (loom 0.7 lets a swap's read and write straddle a racing
        // store, tokio-rs/loom#254, which shows up as a false lost wake-up).
        if self.sleeping.load(Ordering::Relaxed)
            && self
                .sleeping
                .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            unpark_in(&self.consumer);
        }
    }

    /// Consumer side: park for at most `timeout` unless `has_work()` says there is work.
    /// Returns early on a ring, a timeout, or a spurious wake-up; the caller re-polls.
    pub fn wait(&self, timeout: Duration, has_work: impl Fn() -> bool) {
        self.sleeping.store(true, Ordering::Relaxed);
        // SeqCst fence: our `sleeping = true` is ordered before the re-check below, pairing
        // with the producer's fence between its publish and its load of `sleeping`.
        fence(Ordering::SeqCst);
        if !has_work() {
            park_timeout(timeout);
        }
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// True while the consumer is parked or about to park (for tests and metrics).
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }
}
