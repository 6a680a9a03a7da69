//! One submitter's way into the engine: an SPSC ring per class, and a ready bitmask saying
//! which rings were pushed into since the engine last looked, so an idle submitter costs
//! the engine one RMW per turn instead of a look at every ring.
//!
//! Protocol (modelled in `loom-tests/tests/intake.rs` and, with the gate, `drain.rs`):
//! - submitter ([`IntakeTx::push`]): push into ring `c`, then set bit `c` (Release);
//! - engine ([`IntakeRx::take_ready`]): swap the mask to 0 (Acquire) and keep the bits in
//!   `unread`; pop from the unread classes; a bit leaves `unread` only when its ring was
//!   found empty. So a push is either seen through its bit or still marked.
//! - waiting: the engine's doorbell re-check is [`IntakeRx::any`]; the submitter rings
//!   after its push ([`submit`]).
//!
//! [`submit`] is the submitter's half of the submit/drain handshake (gate, push, leave,
//! ring); [`drained`] the engine's exit check. Nothing here allocates after [`intake`].

use super::doorbell::Doorbell;
use super::gate::Gate;
use super::ring::{ring, Consumer, Producer};
use super::sync::{Arc, AtomicBool, AtomicU32, Ordering};

/// State the two ends share.
struct Shared {
    /// Bit `c`: ring `c` was pushed into since the engine last took the mask.
    ready: AtomicU32,
    /// The submitter is gone (set once, by [`IntakeTx::close`]); no push follows.
    closed: AtomicBool,
}

/// The submitter's end.
pub struct IntakeTx<T> {
    rings: Vec<Producer<T>>,
    shared: Arc<Shared>,
}

/// The engine's end.
pub struct IntakeRx<T> {
    rings: Vec<Consumer<T>>,
    shared: Arc<Shared>,
    /// Engine-local: classes that may still hold items (taken from `ready`, not yet found
    /// empty).
    unread: u32,
}

/// An intake of `classes` rings (at most 32) of at least `capacity` items each.
pub fn intake<T>(classes: usize, capacity: usize) -> (IntakeTx<T>, IntakeRx<T>) {
    assert!(classes <= 32, "the ready mask has 32 bits");
    let shared = Arc::new(Shared {
        ready: AtomicU32::new(0),
        closed: AtomicBool::new(false),
    });
    let (producers, consumers) = (0..classes).map(|_| ring(capacity)).unzip();
    (
        IntakeTx {
            rings: producers,
            shared: shared.clone(),
        },
        IntakeRx {
            rings: consumers,
            shared,
            unread: 0,
        },
    )
}

/// Why [`submit`] did not push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The gate is closed (the runtime is draining or stopped).
    Closed,
    /// The class's ring is full: the engine is behind.
    Full,
}

/// The submitter's half of the submit/drain handshake: enter `gate`; if it is open, build
/// the item with `make` (its class and the item) and push it; leave the gate; ring `bell`
/// (after leaving, so an engine waiting for the gate to empty wakes as well).
#[inline]
pub fn submit<T>(
    gate: &Gate,
    bell: &Doorbell,
    tx: &mut IntakeTx<T>,
    make: impl FnOnce() -> (usize, T),
) -> Result<(), Refused> {
    let result = match gate.enter() {
        None => Err(Refused::Closed),
        Some(pass) => {
            let (class, item) = make();
            let pushed = tx.push(class, item).map_err(|_| Refused::Full);
            drop(pass);
            pushed
        }
    };
    bell.ring();
    result
}

/// The engine's drain-exit check over the gate and its intakes: closed, nobody inside, and
/// (read after that) nothing left in any ring.
pub fn drained<'a, T: 'a>(gate: &Gate, intakes: impl IntoIterator<Item = &'a IntakeRx<T>>) -> bool {
    gate.is_closed_and_empty() && intakes.into_iter().all(|rx| !rx.any())
}

impl<T> IntakeTx<T> {
    /// Pushes `item` into ring `class`; gives it back if the ring is full.
    #[inline]
    pub fn push(&mut self, class: usize, item: T) -> Result<(), T> {
        self.rings[class].push(item)?;
        // Release: the push above is visible to an engine that takes this bit (Acquire).
        self.shared.ready.fetch_or(1 << class, Ordering::Release);
        Ok(())
    }

    /// Marks this end gone: the engine may reuse its place once the rings are empty. Call
    /// after the last push (dropping does it too).
    pub fn close(&mut self) {
        // Release: every push before this is visible to an engine that sees the flag.
        self.shared.closed.store(true, Ordering::Release);
    }
}

impl<T> Drop for IntakeTx<T> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<T> IntakeRx<T> {
    /// Takes the classes pushed into since the last look; returns every class that may
    /// hold items.
    #[inline]
    pub fn take_ready(&mut self) -> u32 {
        // Acquire: pairs with the submitter's Release fetch_or after its push.
        self.unread |= self.shared.ready.swap(0, Ordering::Acquire);
        self.unread
    }

    /// Pops from the lowest class in `mask` that has an item, among those taken by
    /// [`IntakeRx::take_ready`]; a class found empty leaves the unread set.
    #[inline]
    pub fn pop(&mut self, mask: u32) -> Option<T> {
        let mut classes = self.unread & mask;
        while classes != 0 {
            let class = classes.trailing_zeros() as usize;
            if let Some(item) = self.rings[class].pop() {
                return Some(item);
            }
            self.unread &= !(1 << class);
            classes &= classes - 1;
        }
        None
    }

    /// Anything pushed that has not been popped, as far as the bitmask shows: the engine's
    /// re-check before it sleeps, and the last part of its drain-exit check.
    #[inline]
    pub fn any(&self) -> bool {
        // Relaxed: in the doorbell re-check the SeqCst fences order this load (see
        // `doorbell`); in the exit check the gate's Acquire load before it does.
        self.unread != 0 || self.shared.ready.load(Ordering::Relaxed) != 0
    }

    /// The submitter closed its end, and nothing it pushed is left: its place can go to
    /// another submitter.
    pub fn is_closed_and_empty(&self) -> bool {
        // Acquire: pairs with `close`, so every push before it is visible to the checks.
        self.shared.closed.load(Ordering::Acquire) && self.rings.iter().all(|r| r.is_empty())
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn pops_the_lowest_ready_class_first_and_forgets_a_class_only_when_empty() {
        let (mut tx, mut rx) = intake::<u32>(4, 2);
        assert!(!rx.any());
        tx.push(2, 20).unwrap();
        tx.push(1, 10).unwrap();
        tx.push(1, 11).unwrap();
        assert_eq!(tx.push(1, 12), Err(12), "full ring gives the item back");
        assert!(rx.any());
        assert_eq!(rx.take_ready(), 0b110);
        assert_eq!(rx.pop(0b0100), Some(20), "the mask limits the classes");
        assert_eq!(rx.pop(!0), Some(10));
        assert_eq!(rx.pop(!0), Some(11));
        assert!(rx.any(), "class 2 not yet found empty");
        assert_eq!(rx.pop(!0), None);
        assert!(!rx.any());
    }

    #[test]
    fn a_closed_intake_is_reusable_only_once_drained() {
        let (mut tx, mut rx) = intake::<u32>(2, 2);
        tx.push(0, 1).unwrap();
        drop(tx);
        assert!(!rx.is_closed_and_empty(), "an item is left");
        rx.take_ready();
        assert_eq!(rx.pop(!0), Some(1));
        assert!(rx.is_closed_and_empty());
    }
}
