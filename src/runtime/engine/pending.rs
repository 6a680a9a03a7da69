//! The engine's pending table: each admitted request's payload and reply target from
//! admission to its answer, by table index, in one segment per lane (a backend's core in
//! request-level batching; the one scheduler in continuous batching).
//!
//! A table index is `lane << slot_bits | slot`, where `slot` is the core's own table slot
//! (`core::Ticket::index`), so a lane and its local slot come back with a shift and a mask.
//! Each segment reserves its lane's `queue_capacity` at start and is filled only as far as
//! the highest slot its core has used: the cores hand out slots lowest first and reuse freed
//! ones first (`core::table`), so the table holds what was in flight at the peak, not every
//! lane's whole queue (24 lanes of 10,000 slots were 79 MB resident at idle).
//!
//! What must never happen here: an allocation after [`PendingTable::new`] (a segment grows
//! only within the capacity it reserved), or a slot read before [`PendingTable::take_place`]
//! wrote it (indexing a slot never taken panics).

use super::routing::RouteState;
use crate::core::{Nanos, Priority, RequestMeta};
use crate::exec::Work;
use crate::runtime::messages::Reply;
use std::ops::{Index, IndexMut};

/// A request the engine holds between admission and its answer, by table index.
pub(super) struct PendingSlot {
    /// The client went away: cancel at the next opportunity.
    pub(super) cancelled: bool,
    pub(super) work: Option<Work>,
    pub(super) reply: Option<Reply>,
    pub(super) submitter: u16,
    /// Continuous batching: when the first output token was sampled (0: not yet).
    pub(super) first_token_ns: Nanos,
    /// When the request left the queue (request-level: its first dispatch; continuous:
    /// its first admission into a slot); 0: not yet.
    pub(super) dispatched_ns: Nanos,
    /// The client asked for a stream (token events wanted).
    pub(super) stream: bool,
    /// A token event reached the submitter: the request may no longer move to another
    /// backend (the client has seen part of this backend's answer).
    pub(super) tokens_sent: bool,
    /// What the request asked for, and when it arrived (`meta.arrival_ns`).
    pub(super) meta: RequestMeta,
    /// Request-level batching: where the request went.
    pub(super) route: RouteState,
    /// Request-level batching: the batch slot (`core::BatchId`) of the batch that took the
    /// request out with a direct-reply target (the worker may answer it itself);
    /// `u32::MAX` when none.
    pub(super) direct_batch: u32,
}

impl PendingSlot {
    /// A slot that holds no request.
    fn empty() -> PendingSlot {
        PendingSlot {
            cancelled: false,
            work: None,
            reply: None,
            submitter: 0,
            first_token_ns: 0,
            dispatched_ns: 0,
            stream: false,
            tokens_sent: false,
            meta: RequestMeta::new(Priority::Normal, crate::core::Kind::Completion, 0, 0, 0),
            route: RouteState::NONE,
            direct_batch: u32::MAX,
        }
    }
}

/// Whether `lanes` lanes of up to `places` queue places each fit the table index: a lane
/// takes `places` rounded up to a power of two, and `u32::MAX` stays a sentinel. The
/// config checks this before the engine is built (`config::settings`).
pub fn places_fit(places: usize, lanes: usize) -> bool {
    let per_lane = places
        .max(1)
        .checked_next_power_of_two()
        .map_or(u64::MAX, |p| p as u64);
    (lanes.max(1) as u64).saturating_mul(per_lane) <= u64::from(u32::MAX)
}

/// How table indexes split into a lane and its slot: the low `slot_bits` bits are the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PendingLayout {
    slot_bits: u32,
}

impl PendingLayout {
    /// The layout for lanes of these capacities: as many slot bits as the largest needs.
    /// Panics when the lanes do not fit a 32-bit index below `u32::MAX` (a sentinel); the
    /// config's bounds on `queue_capacity` keep any accepted config far inside.
    pub(super) fn for_lanes(capacities: &[usize]) -> PendingLayout {
        let largest = capacities.iter().copied().max().unwrap_or(1).max(1);
        let lanes = capacities.len().max(1);
        assert!(
            places_fit(largest, lanes),
            "{lanes} lanes of {largest} queue places do not fit the engine's table index"
        );
        PendingLayout {
            slot_bits: usize::BITS - (largest - 1).leading_zeros(),
        }
    }

    /// The table index of lane `lane`'s slot 0.
    pub(super) fn base(self, lane: usize) -> u32 {
        (lane as u32) << self.slot_bits
    }

    /// The lane of table index `index`, and the slot within it.
    #[inline]
    pub(super) fn lane_of(self, index: u32) -> (usize, u32) {
        (
            (index >> self.slot_bits) as usize,
            index & ((1u32 << self.slot_bits) - 1),
        )
    }
}

/// The pending table: a segment per lane, each filled to the highest slot used so far.
pub(super) struct PendingTable {
    segments: Vec<Vec<PendingSlot>>,
    layout: PendingLayout,
}

impl PendingTable {
    /// A table for lanes of these capacities (one lane of one slot when none), with every
    /// segment's memory reserved and none of it written.
    pub(super) fn new(capacities: &[usize]) -> PendingTable {
        let layout = PendingLayout::for_lanes(capacities);
        let segments = if capacities.is_empty() {
            vec![Vec::with_capacity(1)]
        } else {
            capacities
                .iter()
                .map(|&c| Vec::with_capacity(c.max(1)))
                .collect()
        };
        PendingTable { segments, layout }
    }

    /// How indexes split into lanes and slots.
    #[cfg(test)]
    fn layout(&self) -> PendingLayout {
        self.layout
    }

    /// Every slot written so far with its table index (free ones included).
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &PendingSlot)> {
        let layout = self.layout;
        self.segments.iter().enumerate().flat_map(move |(l, seg)| {
            seg.iter()
                .enumerate()
                .map(move |(i, s)| (layout.base(l) | i as u32, s))
        })
    }

    /// Slots written so far (the table's resident size, in slots).
    #[cfg(test)]
    fn written(&self) -> usize {
        self.segments.iter().map(Vec::len).sum()
    }
}

impl Index<usize> for PendingTable {
    type Output = PendingSlot;

    /// The slot at table index `index`, which must have been written.
    #[inline]
    fn index(&self, index: usize) -> &PendingSlot {
        let (lane, slot) = self.layout.lane_of(index as u32);
        &self.segments[lane][slot as usize]
    }
}

impl IndexMut<usize> for PendingTable {
    /// The slot at table index `index`, which must have been written (taken by
    /// [`PendingTable::take_place`]).
    #[inline]
    fn index_mut(&mut self, index: usize) -> &mut PendingSlot {
        let (lane, slot) = self.layout.lane_of(index as u32);
        &mut self.segments[lane][slot as usize]
    }
}

impl PendingTable {
    /// The slot at table index `index` for a request being admitted there, writing empty
    /// slots up to it first when its lane's segment has not reached it yet (within the
    /// capacity the segment reserved: no allocation).
    #[inline]
    pub(super) fn take_place(&mut self, index: u32) -> &mut PendingSlot {
        let (lane, slot) = self.layout.lane_of(index);
        if slot as usize >= self.segments[lane].len() {
            self.write_up_to(lane, slot as usize);
        }
        &mut self.segments[lane][slot as usize]
    }

    /// Writes empty slots in lane `lane` up to `slot`: once per slot in the table's life,
    /// so kept off the inlined path.
    #[cold]
    #[inline(never)]
    fn write_up_to(&mut self, lane: usize, slot: usize) {
        let seg = &mut self.segments[lane];
        assert!(
            slot < seg.capacity(),
            "pending slot {slot} beyond its lane's queue capacity"
        );
        seg.resize_with(slot + 1, PendingSlot::empty);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_split_into_lane_and_slot_and_back() {
        let layout = PendingLayout::for_lanes(&[10_000, 10_000, 3]);
        for (lane, slot) in [(0, 0), (0, 9_999), (1, 0), (1, 9_999), (2, 2)] {
            let index = layout.base(lane) | slot;
            assert_eq!(layout.lane_of(index), (lane, slot));
        }
        assert_eq!(PendingLayout::for_lanes(&[1]).lane_of(5), (5, 0));
        // 16,384 is 14 bits of slots: indexes of the second lane start there.
        assert_eq!(PendingLayout::for_lanes(&[16_384, 1]).base(1), 16_384);
        assert_eq!(PendingLayout::for_lanes(&[16_385, 1]).base(1), 32_768);
    }

    #[test]
    #[should_panic(expected = "do not fit")]
    fn lanes_that_overflow_the_index_are_refused() {
        PendingLayout::for_lanes(&vec![1 << 20; 4096]);
    }

    #[test]
    fn only_slots_up_to_the_highest_used_are_written_and_memory_is_reserved_once() {
        let mut table = PendingTable::new(&[10_000, 10_000]);
        let layout = table.layout();
        let reserved: Vec<_> = table.segments.iter().map(|s| s.as_ptr()).collect();
        assert_eq!(table.written(), 0);
        let index = layout.base(1) | 2;
        table.take_place(index).submitter = 7;
        assert_eq!(table.written(), 3, "slots 0-2 of lane 1");
        assert_eq!(table[index as usize].submitter, 7);
        assert_eq!(table[(index - 1) as usize].submitter, 0, "written empty");
        table.take_place(layout.base(0)).stream = true;
        assert_eq!(table.written(), 4);
        let listed: Vec<u32> = table.iter().map(|(i, _)| i).collect();
        assert_eq!(listed, vec![0, index - 2, index - 1, index]);
        for s in 0..10_000u32 {
            table.take_place(layout.base(1) | s).cancelled = false;
        }
        let now: Vec<_> = table.segments.iter().map(|s| s.as_ptr()).collect();
        assert_eq!(
            reserved, now,
            "filling a lane to its capacity never moves it"
        );
    }

    #[test]
    #[should_panic(expected = "beyond its lane's queue capacity")]
    fn a_slot_past_the_lanes_capacity_is_refused() {
        // Lanes of 3 places take 2 bits of index: index 3 is lane 0's slot 3, one past its
        // last place.
        let mut table = PendingTable::new(&[3, 3]);
        table.take_place(2).cancelled = true;
        table.take_place(3).cancelled = true;
    }
}
