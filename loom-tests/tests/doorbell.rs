//! Models the doorbell handshake (`runtime::doorbell`) over the real SPSC ring.
//!
//! A consumer binds the doorbell, drains its ring(s), and waits with `has_work` = "a ring is
//! non-empty"; producers push and then `ring()`. Under loom `park_timeout` is a plain park,
//! so a lost wake-up is a deadlock the checker reports. What must hold: the consumer never
//! sleeps through published work, and it receives every item exactly once, in order.
//!
//! `Doorbell::ring` clears `sleeping` with `compare_exchange(true, false)`, not `swap`:
//! loom 0.7.3 does not enforce RMW atomicity against a concurrent plain store
//! (tokio-rs/loom#254), and with a swap these models report a false deadlock.
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::ring::{ring, Producer};
use abe::runtime::sync::Arc;
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Ring capacity under loom: the smallest the ring allows, so "full" is reachable.
const CAPACITY: usize = 2;
/// Timeout passed to `wait`; loom ignores it (parks until unparked).
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// Producer side as the runtime does it: publish, then ring. `CAPACITY` bounds `items`, so
/// the push never meets a full ring.
fn produce(mut tx: Producer<u32>, bell: &Doorbell, items: std::ops::Range<u32>) {
    for item in items {
        assert!(tx.push(item).is_ok(), "ring full below its capacity");
        bell.ring();
    }
}

#[test]
fn one_producer_no_lost_wake_up() {
    const ITEMS: u32 = 2;
    const _: () = assert!(ITEMS as usize <= CAPACITY);
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let (tx, mut rx) = ring::<u32>(CAPACITY);

        let consumer_bell = bell.clone();
        let consumer = thread::spawn(move || {
            consumer_bell.bind_current();
            let mut received = Vec::with_capacity(ITEMS as usize);
            while received.len() < ITEMS as usize {
                match rx.pop() {
                    Some(item) => received.push(item),
                    // `pop`'s borrow of `rx` ended with the match scrutinee, so the
                    // closure can borrow it shared for the re-check inside `wait`.
                    None => consumer_bell.wait(WAIT_TIMEOUT, || !rx.is_empty()),
                }
            }
            assert!(rx.pop().is_none(), "more items than were pushed");
            received
        });

        produce(tx, &bell, 0..ITEMS);

        let received = consumer.join().unwrap();
        assert_eq!(
            received,
            (0..ITEMS).collect::<Vec<_>>(),
            "lost or reordered"
        );
    });
}

/// Two producers, two rings, one doorbell: neither producer's wake-up is lost.
#[test]
fn two_producers_one_doorbell_no_lost_wake_up() {
    /// Items per producer (kept at 1: three threads already multiply the interleavings).
    const ITEMS_EACH: u32 = 1;
    /// Producer B's items, distinct from A's.
    const B_ITEMS: std::ops::Range<u32> = 100..100 + ITEMS_EACH;
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let (tx_a, mut rx_a) = ring::<u32>(CAPACITY);
        let (tx_b, mut rx_b) = ring::<u32>(CAPACITY);

        let consumer_bell = bell.clone();
        let consumer = thread::spawn(move || {
            consumer_bell.bind_current();
            let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
            while from_a.len() + from_b.len() < 2 * ITEMS_EACH as usize {
                // Drain both sources before deciding to sleep, as the engine does.
                let mut did_work = false;
                while let Some(item) = rx_a.pop() {
                    from_a.push(item);
                    did_work = true;
                }
                while let Some(item) = rx_b.pop() {
                    from_b.push(item);
                    did_work = true;
                }
                if !did_work {
                    consumer_bell.wait(WAIT_TIMEOUT, || !rx_a.is_empty() || !rx_b.is_empty());
                }
            }
            assert!(
                rx_a.pop().is_none() && rx_b.pop().is_none(),
                "duplicated items"
            );
            (from_a, from_b)
        });

        let bell_b = bell.clone();
        let producer_b = thread::spawn(move || produce(tx_b, &bell_b, B_ITEMS));
        produce(tx_a, &bell, 0..ITEMS_EACH);

        producer_b.join().unwrap();
        let (from_a, from_b) = consumer.join().unwrap();
        assert_eq!(from_a, (0..ITEMS_EACH).collect::<Vec<_>>());
        assert_eq!(from_b, B_ITEMS.collect::<Vec<_>>());
    });
}

/// An event loop's doorbell (`runtime::event_loop`): the consumer sleeps in something other
/// than `park` (a poll, modelled by a park the wake ends) and is woken through
/// `bind_wake`; two seats' producers ring the one doorbell. Neither wake-up is lost.
#[test]
fn a_consumer_woken_by_its_wake_misses_no_ring() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let (tx_a, mut rx_a) = ring::<u32>(CAPACITY);
        let (tx_b, mut rx_b) = ring::<u32>(CAPACITY);

        let consumer_bell = bell.clone();
        let consumer = thread::spawn(move || {
            let me = thread::current();
            consumer_bell.bind_wake(std::sync::Arc::new(move || me.unpark()));
            let mut received = Vec::new();
            while received.len() < 2 {
                let before = received.len();
                received.extend(rx_a.pop());
                received.extend(rx_b.pop());
                if received.len() == before {
                    consumer_bell.sleep_with(|| {
                        // The re-check after announcing the sleep, as `EventLoop::run` does.
                        if rx_a.is_empty() && rx_b.is_empty() {
                            thread::park();
                        }
                    });
                }
            }
            received.sort_unstable();
            received
        });

        let bell_b = bell.clone();
        let producer_b = thread::spawn(move || produce(tx_b, &bell_b, 100..101));
        produce(tx_a, &bell, 0..1);
        producer_b.join().unwrap();

        assert_eq!(consumer.join().unwrap(), vec![0, 100], "lost or duplicated");
    });
}
