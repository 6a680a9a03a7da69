//! A bounded lock-free single-producer single-consumer ring.
//!
//! Every cross-thread hand-off of requests, batches and results goes through one of these.
//! It is written over `runtime::sync` (rather than taken from the ringbuf crate) so that
//! loom checks this exact code. A full ring gives the item back (`Err(item)`): the caller
//! turns that into backpressure, never a block and never a drop. No allocation after `new`.

use super::sync::{Arc, AtomicUsize, Ordering, UnsafeCell};
use std::mem::MaybeUninit;

/// Pads to a cache line so head and tail do not false-share.
#[repr(align(64))]
struct CachePadded<T>(T);

/// Shared state of one ring.
///
/// Invariants: `head` and `tail` are free-running counters (wrapping); `tail - head` is in
/// `0..=capacity`; slots `head..tail` (mod capacity) hold initialised values, the rest do not.
/// Only the producer stores `tail`, only the consumer stores `head`.
struct Shared<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
}

// SAFETY: the ring moves `T` values between exactly two threads; slot access is serialised
// by the head/tail protocol (a slot is written only by the producer while outside
// `head..tail`, read only by the consumer while inside), so `T: Send` suffices.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above; `&Shared` is shared by the producer and the consumer handles, which
// never touch the same slot at the same time.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Both handles are gone (this is the last Arc), so no other thread touches the ring.
        let mut head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Relaxed);
        while head != tail {
            let slot = &self.slots[head & self.mask];
            // SAFETY: slots in `head..tail` are initialised (ring invariant) and each is
            // dropped once, here, as `head` advances past it.
            slot.with_mut(|p| unsafe { (*p).assume_init_drop() });
            head = head.wrapping_add(1);
        }
    }
}

/// Creates a ring holding at least `capacity` items (rounded up to a power of two, min 2).
pub fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.max(2).next_power_of_two();
    let slots = (0..cap)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect::<Vec<_>>()
        .into_boxed_slice();
    let shared = Arc::new(Shared {
        slots,
        mask: cap - 1,
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(AtomicUsize::new(0)),
    });
    (
        Producer {
            shared: shared.clone(),
            tail: 0,
            cached_head: 0,
        },
        Consumer {
            shared,
            head: 0,
            cached_tail: 0,
        },
    )
}

/// The writing end. Owned by exactly one thread at a time.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Our own copy of `shared.tail` (only we store it).
    tail: usize,
    /// Last `head` we read; may be stale (behind), which only makes us think the ring is
    /// fuller than it is.
    cached_head: usize,
}

/// The reading end. Owned by exactly one thread at a time.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Our own copy of `shared.head` (only we store it).
    head: usize,
    /// Last `tail` we read; may be stale (behind), which only makes us think the ring is
    /// emptier than it is.
    cached_tail: usize,
}

impl<T> Producer<T> {
    /// Ring capacity.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Appends `item`, or gives it back when the ring is full.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        let cap = self.capacity();
        if self.tail.wrapping_sub(self.cached_head) == cap {
            // Acquire: the consumer's reads of the slots it released happen before we reuse
            // them.
            self.cached_head = self.shared.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.cached_head) == cap {
                return Err(item);
            }
        }
        let slot = &self.shared.slots[self.tail & self.shared.mask];
        // SAFETY: `tail` is outside `head..tail`, so the consumer does not read this slot and
        // it holds no initialised value (it was moved out or never written).
        slot.with_mut(|p| unsafe { (*p).write(item) });
        self.tail = self.tail.wrapping_add(1);
        // Release: the slot write above is visible to a consumer that sees the new tail.
        self.shared.tail.0.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Free slots as far as the producer knows (refreshes its view of `head`).
    pub fn free_slots(&mut self) -> usize {
        self.cached_head = self.shared.head.0.load(Ordering::Acquire);
        self.capacity() - self.tail.wrapping_sub(self.cached_head)
    }
}

impl<T> Consumer<T> {
    /// Ring capacity.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Takes the oldest item, if any.
    pub fn pop(&mut self) -> Option<T> {
        if self.head == self.cached_tail {
            // Acquire: pairs with the producer's Release store of tail, so the slot's
            // contents are visible.
            self.cached_tail = self.shared.tail.0.load(Ordering::Acquire);
            if self.head == self.cached_tail {
                return None;
            }
        }
        let slot = &self.shared.slots[self.head & self.shared.mask];
        // SAFETY: `head` is inside `head..tail`, so the slot is initialised, and the producer
        // will not write it until we publish a head past it; we move the value out once.
        let item = slot.with(|p| unsafe { (*p).assume_init_read() });
        self.head = self.head.wrapping_add(1);
        // Release: our read of the slot happens before the producer reuses it.
        self.shared.head.0.store(self.head, Ordering::Release);
        Some(item)
    }

    /// True when nothing is visible to the consumer right now.
    pub fn is_empty(&self) -> bool {
        self.head == self.shared.tail.0.load(Ordering::Acquire)
    }

    /// Items visible to the consumer right now.
    pub fn len(&self) -> usize {
        self.shared
            .tail
            .0
            .load(Ordering::Acquire)
            .wrapping_sub(self.head)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn full_ring_gives_the_item_back_and_order_is_fifo() {
        let (mut p, mut c) = ring::<u32>(4);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(99), Err(99));
        assert_eq!(c.len(), 4);
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        let got: Vec<u32> = std::iter::from_fn(|| c.pop()).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(c.is_empty());
    }

    #[test]
    fn items_left_in_a_dropped_ring_are_dropped_once() {
        let marker = std::sync::Arc::new(());
        {
            let (mut p, c) = ring(8);
            for _ in 0..5 {
                p.push(marker.clone()).unwrap();
            }
            drop(c);
            assert_eq!(std::sync::Arc::strong_count(&marker), 6);
        }
        assert_eq!(std::sync::Arc::strong_count(&marker), 1);
    }

    #[test]
    fn two_threads_move_a_million_items_without_loss_or_reordering() {
        let (mut p, mut c) = ring::<u64>(64);
        let n = 1_000_000u64;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                match p.push(i) {
                    Ok(()) => i += 1,
                    Err(_) => std::thread::yield_now(),
                }
            }
        });
        let mut expect = 0;
        while expect < n {
            match c.pop() {
                Some(v) => {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
    }
}
