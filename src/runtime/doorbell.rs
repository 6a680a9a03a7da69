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

/// Calls the wake in `slot`, if one was stored; false if none was.
#[cfg(not(feature = "loom"))]
fn call_wake(slot: &OnceSlot<Wake>) -> bool {
    slot.get().map(|wake| wake()).is_some()
}

/// Calls the wake in `slot`, if one was stored; false if none was.
#[cfg(feature = "loom")]
fn call_wake(slot: &OnceSlot<Wake>) -> bool {
    slot.get_cloned().map(|wake| wake()).is_some()
}

/// The sleeping half of the doorbell protocol, for consumers that sleep in something other
/// than `park` (an io thread sleeping in `epoll_wait`, woken by a mio `Waker`).
///
/// Consumer: [`SleepFlag::before_sleep`], re-check for work (do not sleep if any), sleep,
/// [`SleepFlag::after_sleep`]. Producer: publish, then wake only if
/// [`SleepFlag::take_sleeper`] says the consumer sleeps. Same fences as [`Doorbell`].
#[derive(Debug, Default)]
pub struct SleepFlag {
    sleeping: AtomicBool,
}

impl SleepFlag {
    /// A flag for a consumer that is awake.
    pub fn new() -> Self {
        SleepFlag {
            sleeping: AtomicBool::new(false),
        }
    }

    /// Consumer: announce the sleep. Re-check every source of work after this.
    pub fn before_sleep(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        // SeqCst fence: pairs with the producer's fence in `take_sleeper` (see module docs).
        fence(Ordering::SeqCst);
    }

    /// Consumer: awake again.
    pub fn after_sleep(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Producer, after publishing: true (once) if the consumer sleeps and must be woken.
    #[inline]
    pub fn take_sleeper(&self) -> bool {
        // SeqCst fence: orders our publish before the load of `sleeping`.
        fence(Ordering::SeqCst);
        // compare_exchange rather than swap: the same meaning (a failed CAS writes nothing),
        // and loom checks it correctly (loom 0.7 lets a swap's read and write straddle a
        // racing store, tokio-rs/loom#254, which shows up as a false lost wake-up).
        self.sleeping.load(Ordering::Relaxed)
            && self
                .sleeping
                .compare_exchange(true, false, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// How a sleeping consumer that does not park is woken (an event loop's poll waker).
pub type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// One consumer's doorbell, shared by all its producers.
pub struct Doorbell {
    /// Set while the consumer is (about to be) parked.
    sleeping: SleepFlag,
    /// The consumer thread, bound once by the consumer before its first wait.
    consumer: OnceSlot<Thread>,
    /// Set instead of `consumer` by a consumer that sleeps in a poll ([`Doorbell::bind_wake`]).
    wake: OnceSlot<Wake>,
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
            sleeping: SleepFlag::new(),
            consumer: OnceSlot::new(),
            wake: OnceSlot::new(),
        }
    }

    /// Binds the calling thread as the consumer. Call once, from the consumer, before `wait`.
    pub fn bind_current(&self) {
        let _ = self.consumer.set(super::sync::current_thread());
    }

    /// Producer side: call after publishing work. Cheap when the consumer is awake.
    #[inline]
    pub fn ring(&self) {
        if self.sleeping.take_sleeper() && !call_wake(&self.wake) {
            unpark_in(&self.consumer);
        }
    }

    /// Binds `wake` as the way to wake the consumer, which sleeps in something other than
    /// `park` (see [`Doorbell::sleep_with`]). Call once, from the consumer, before it sleeps.
    pub fn bind_wake(&self, wake: Wake) {
        let _ = self.wake.set(wake);
    }

    /// Consumer side, for a consumer bound with [`Doorbell::bind_wake`]: `sleep` must
    /// re-check every source of work, and sleep (until the wake or a timeout) only if none.
    pub fn sleep_with(&self, sleep: impl FnOnce()) {
        self.sleeping.before_sleep();
        sleep();
        self.sleeping.after_sleep();
    }

    /// Consumer side: park for at most `timeout` unless `has_work()` says there is work.
    /// Returns early on a ring, a timeout, or a spurious wake-up; the caller re-polls.
    pub fn wait(&self, timeout: Duration, has_work: impl Fn() -> bool) {
        self.sleeping.before_sleep();
        if !has_work() {
            park_timeout(timeout);
        }
        self.sleeping.after_sleep();
    }
}
