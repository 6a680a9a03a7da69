//! The one switch between std and loom primitives for every cross-thread protocol.
//!
//! Production code in `runtime` takes atomics, cells, `Arc`, and park/unpark from here
//! (as `runtime::sync`), so `loom-tests/` (built with the `loom` feature) model-checks
//! the real code, not a copy. Never import atomics from std directly anywhere in `runtime`
//! (ring, doorbell, gate, intake, submitter, engine, worker, telemetry): a cross-thread flag
//! or counter that bypasses this module is one loom cannot see. It lives at the crate root,
//! below `exec`, because the executors' `stop` flag (set by the engine at a drain's abort
//! and when it returns, read by executors cutting abandoned work short) is one of them.
//! Nothing here may depend on the rest of the crate.

#[cfg(feature = "loom")]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(feature = "loom")]
pub use loom::sync::{Arc, Mutex};
#[cfg(feature = "loom")]
pub use loom::thread::{current as current_thread, Thread};

#[cfg(not(feature = "loom"))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(feature = "loom"))]
pub use std::sync::{Arc, Mutex};
#[cfg(not(feature = "loom"))]
pub use std::thread::{current as current_thread, Thread};

/// Parks the current thread until unparked or `timeout` passes. Under loom there is no
/// timed park: the model parks until unparked, so a lost wake-up shows up as a deadlock.
#[cfg(not(feature = "loom"))]
pub fn park_timeout(timeout: std::time::Duration) {
    std::thread::park_timeout(timeout);
}

/// Parks the current thread until unparked (loom: timeouts never fire in a model).
#[cfg(feature = "loom")]
pub fn park_timeout(_timeout: std::time::Duration) {
    loom::thread::park();
}

/// An `UnsafeCell` with loom's closure API, so both builds share one call shape.
#[cfg(feature = "loom")]
pub use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` behind loom's `with`/`with_mut` API.
#[cfg(not(feature = "loom"))]
#[derive(Debug)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(feature = "loom"))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a shared raw pointer to the contents.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a mutable raw pointer to the contents.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A slot written once (by the thread that owns it) and read by others afterwards.
#[cfg(not(feature = "loom"))]
pub type OnceSlot<T> = std::sync::OnceLock<T>;

/// Loom stand-in for `OnceLock`: a mutex-guarded option, good enough inside a model.
#[cfg(feature = "loom")]
#[derive(Debug, Default)]
pub struct OnceSlot<T>(loom::sync::Mutex<Option<T>>);

#[cfg(feature = "loom")]
impl<T: Clone> OnceSlot<T> {
    /// An empty slot.
    pub fn new() -> Self {
        OnceSlot(loom::sync::Mutex::new(None))
    }
    /// Stores `value` if the slot is empty.
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut g = self.0.lock().unwrap();
        if g.is_some() {
            return Err(value);
        }
        *g = Some(value);
        Ok(())
    }
    /// A clone of the value, if set.
    pub fn get_cloned(&self) -> Option<T> {
        self.0.lock().unwrap().clone()
    }
}

/// Unparks the thread stored in `slot`, if one was stored.
#[cfg(not(feature = "loom"))]
pub fn unpark_in(slot: &OnceSlot<Thread>) {
    if let Some(t) = slot.get() {
        t.unpark();
    }
}

/// Unparks the thread stored in `slot`, if one was stored.
#[cfg(feature = "loom")]
pub fn unpark_in(slot: &OnceSlot<Thread>) {
    if let Some(t) = slot.get_cloned() {
        t.unpark();
    }
}
