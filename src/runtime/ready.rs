//! Rings from several producers into one consumer, and the ready mask that says which of
//! them were pushed into since the consumer last looked: the engine's worker replies, so a
//! turn pops only the rings that have something and its doorbell re-check is one load, not
//! a look at every worker's ring (BENCHMARKS.md, "The hot path again").
//!
//! Protocol (modelled in `loom-tests/tests/ready.rs`; the same as `intake`'s, with one
//! producer per ring and all of them sharing one mask):
//! - producer ([`MarkedProducer::push`]): push into its ring, then set its group's bit
//!   (Release), then ring the consumer's doorbell (the caller's);
//! - consumer ([`ReadyMask::take`], then [`pop_marked`]): swap the mask to 0 (Acquire), then
//!   pop every ring of each group taken until it is empty. A push whose bit the swap missed
//!   set it after the swap, so the next `take` sees it: nothing is stranded. A bit may name a
//!   ring already emptied (its push was popped in the turn the bit came late): a look that
//!   finds nothing.
//! - waiting: the consumer's doorbell re-check is [`ReadyMask::any`].
//!
//! Ring `i` belongs to group `i % 64`. Nothing here allocates after construction.

use super::ring::Producer;
use super::sync::{Arc, AtomicU64, Ordering};

/// Groups in a mask (its bits); rings beyond share a group with ring `i % GROUPS`.
pub const GROUPS: usize = 64;

/// The mask the producers of one consumer share.
#[derive(Debug, Default)]
pub struct ReadyMask {
    /// Bit `g`: a ring of group `g` was pushed into since the consumer last took the mask.
    bits: AtomicU64,
}

impl ReadyMask {
    /// A mask with nothing marked.
    pub fn new() -> Self {
        ReadyMask {
            bits: AtomicU64::new(0),
        }
    }

    /// Consumer: takes the groups marked since the last take (and clears them). Pop every
    /// ring of each group until it is empty before taking again.
    #[inline]
    pub fn take(&self) -> u64 {
        // Acquire: pairs with the producer's Release fetch_or after its push, so the pushed
        // items are visible to the pops that follow.
        self.bits.swap(0, Ordering::Acquire)
    }

    /// Consumer: anything marked and not yet taken (the doorbell re-check).
    #[inline]
    pub fn any(&self) -> bool {
        // Relaxed: in the doorbell re-check the SeqCst fences order this load against the
        // producer's mark (see `doorbell`), as `IntakeRx::any` does.
        self.bits.load(Ordering::Relaxed) != 0
    }
}

/// The rings of group `group` among `rings` rings: `group`, `group + GROUPS`, ...
#[inline]
pub fn group_rings(group: u32, rings: usize) -> impl Iterator<Item = usize> {
    (group as usize..rings).step_by(GROUPS)
}

/// Consumer: calls `pop_all(i)` for every ring `i` (of `rings`) in `groups`, what
/// [`ReadyMask::take`] just returned; `pop_all` pops ring `i` until it is empty and says
/// whether it popped anything. Returns whether any call did. The engine's reply drain and
/// its loom model (`loom-tests/tests/ready.rs`) both walk the groups through here, so the
/// model checks this walk.
#[inline]
pub fn pop_marked(groups: u64, rings: usize, mut pop_all: impl FnMut(usize) -> bool) -> bool {
    let mut popped = false;
    let mut groups = groups;
    while groups != 0 {
        let group = groups.trailing_zeros();
        groups &= groups - 1;
        for i in group_rings(group, rings) {
            popped |= pop_all(i);
        }
    }
    popped
}

/// A ring's writing end that marks its group in the consumer's mask after every push.
pub struct MarkedProducer<T> {
    ring: Producer<T>,
    mask: Arc<ReadyMask>,
    bit: u64,
}

impl<T> MarkedProducer<T> {
    /// `ring`, the `index`-th of those whose pushes `mask` tracks.
    pub fn new(ring: Producer<T>, mask: Arc<ReadyMask>, index: usize) -> Self {
        MarkedProducer {
            ring,
            mask,
            bit: 1 << (index % GROUPS),
        }
    }

    /// Appends `item` and marks the ring's group, or gives the item back when the ring is
    /// full (nothing marked).
    #[inline]
    pub fn push(&mut self, item: T) -> Result<(), T> {
        self.ring.push(item)?;
        // Release: the push above is visible to a consumer that takes this bit (Acquire).
        self.mask.bits.fetch_or(self.bit, Ordering::Release);
        Ok(())
    }

    /// Free slots as far as the producer knows.
    pub fn free_slots(&mut self) -> usize {
        self.ring.free_slots()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::runtime::ring::ring;

    #[test]
    fn a_push_marks_its_group_until_taken_and_a_full_ring_marks_nothing() {
        let mask = Arc::new(ReadyMask::new());
        let (p0, mut c0) = ring::<u32>(2);
        let (p65, mut c65) = ring::<u32>(2);
        let mut p0 = MarkedProducer::new(p0, mask.clone(), 0);
        let mut p65 = MarkedProducer::new(p65, mask.clone(), 65);
        assert!(!mask.any());
        p65.push(7).unwrap();
        assert!(mask.any());
        assert_eq!(mask.take(), 0b10, "ring 65 is in group 1");
        assert!(!mask.any(), "taking clears the mask");
        assert_eq!(group_rings(1, 70).collect::<Vec<_>>(), vec![1, 65]);
        assert_eq!(c65.pop(), Some(7));
        p0.push(1).unwrap();
        p0.push(2).unwrap();
        assert_eq!(mask.take(), 0b1);
        assert_eq!(p0.push(3), Err(3), "full ring gives the item back");
        assert!(!mask.any(), "a refused push marks nothing");
        assert_eq!((c0.pop(), c0.pop(), c0.pop()), (Some(1), Some(2), None));
    }

    #[test]
    fn pop_marked_visits_every_ring_of_the_groups_taken_and_no_other() {
        let mut visited = Vec::new();
        // Groups 0 and 2 of 130 rings: rings 0, 64, 128 and 2, 66.
        let popped = pop_marked(0b101, 130, |i| {
            visited.push(i);
            i == 66
        });
        assert_eq!(visited, vec![0, 64, 128, 2, 66]);
        assert!(popped, "ring 66 popped something");
        assert!(!pop_marked(0b1, 130, |_| false), "nothing popped");
        assert!(!pop_marked(0, 130, |_| panic!("no group taken")));
    }
}
