//! Models the bounded SPSC ring (`runtime::ring`) that carries every cross-thread hand-off.
//!
//! A producer and a consumer thread race on a capacity-2 ring, so "full", "empty" and slot
//! reuse all happen inside the model; loom's `UnsafeCell` tracking also checks that no slot
//! is read and written concurrently. What must hold: items arrive in order, none lost or
//! duplicated, a full ring gives the item back, and items left inside when both ends are
//! dropped are dropped exactly once (whichever thread drops the last end).
#![cfg(feature = "loom")]

use abe::runtime::ring::ring;
use abe::runtime::sync::{Arc, AtomicUsize, Ordering};
use loom::thread;
use loom_tests::model;

/// Ring capacity under loom: the smallest the ring allows.
const CAPACITY: usize = 2;

#[test]
fn spsc_handoff_through_a_full_ring_keeps_order_and_loses_nothing() {
    /// One more than the capacity, so the producer must wait for the consumer to free a
    /// slot and the first slot is reused.
    const ITEMS: u32 = 3;
    model(|| {
        let (mut tx, mut rx) = ring::<u32>(CAPACITY);
        assert_eq!(tx.capacity(), CAPACITY);

        let producer = thread::spawn(move || {
            for item in 0..ITEMS {
                let mut pending = item;
                while let Err(back) = tx.push(pending) {
                    assert_eq!(back, item, "a full ring must give the same item back");
                    pending = back;
                    thread::yield_now();
                }
            }
        });

        let mut received = Vec::with_capacity(ITEMS as usize);
        while received.len() < ITEMS as usize {
            match rx.pop() {
                Some(item) => received.push(item),
                None => thread::yield_now(),
            }
        }

        producer.join().unwrap();
        assert_eq!(
            received,
            (0..ITEMS).collect::<Vec<_>>(),
            "lost or reordered"
        );
        assert!(rx.pop().is_none(), "duplicated item");
        assert!(rx.is_empty());
        assert_eq!(rx.len(), 0);
    });
}

/// An item that counts its own drops, per id, so a double drop or a leak is visible.
struct Counted {
    id: usize,
    drops: Arc<[AtomicUsize; ITEMS_DROPPED]>,
}

/// Items the drop model creates: capacity + 1, so one push is refused.
const ITEMS_DROPPED: usize = CAPACITY + 1;

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn items_left_in_a_ring_are_dropped_exactly_once_when_both_ends_go() {
    model(|| {
        let drops: Arc<[AtomicUsize; ITEMS_DROPPED]> =
            Arc::new(std::array::from_fn(|_| AtomicUsize::new(0)));
        let (mut tx, mut rx) = ring::<Counted>(CAPACITY);

        let producer_drops = drops.clone();
        let producer = thread::spawn(move || {
            let mut refused = 0;
            for id in 0..ITEMS_DROPPED {
                let item = Counted {
                    id,
                    drops: producer_drops.clone(),
                };
                // A refused item comes back and is dropped here, by the producer.
                if tx.push(item).is_err() {
                    refused += 1;
                }
            }
            drop(tx);
            refused
        });

        // One pop attempt: it may see 0 or 1 items depending on the interleaving; the
        // rest stay in the ring for `Shared::drop`, which runs on whichever thread drops
        // the last end.
        let popped = rx.pop().map(|item| item.id);
        drop(rx);

        let refused = producer.join().unwrap();
        // Three pushes into two slots: one is refused unless the pop freed a slot first.
        assert!(refused <= 1, "only the third push can meet a full ring");
        assert!(
            popped.is_some() || refused == 1,
            "capacity {CAPACITY} accepted {ITEMS_DROPPED} items with nothing popped"
        );
        if let Some(id) = popped {
            assert_eq!(id, 0, "pop returned an item out of order");
        }
        for (id, count) in drops.iter().enumerate() {
            assert_eq!(
                count.load(Ordering::Relaxed),
                1,
                "item {id} dropped the wrong number of times (popped {popped:?}, refused {refused})"
            );
        }
    });
}
