//! The fixed-capacity request table and intrusive FIFO lists threaded through it.
//!
//! Every admitted request lives in one slot of [`RequestTable`] from admission until its final
//! answer. Slots are linked into at most one [`Fifo`] at a time through their `next`/`prev`
//! fields, so queues cost no memory of their own and never allocate. The table reserves its
//! memory once in `new` (`queue_capacity`) and writes a slot only when a request first
//! needs it: freed slots are reused first, then the next never-used one, so the slots
//! written are the most ever live at once, and a large idle queue costs no resident memory.
//! Nothing here may allocate after `new`.

use super::request::{RequestMeta, Ticket};

/// Sentinel for "no slot" in links.
pub const NIL: u32 = u32::MAX;

/// Where a slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// On the free list.
    Free,
    /// Waiting in a queue.
    Queued,
    /// Part of a batch handed to a worker.
    Dispatched,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    meta: RequestMeta,
    /// Bumped every time the slot is freed, so old tickets go stale.
    generation: u32,
    state: SlotState,
    /// Next slot in the FIFO (or the free list), `NIL` at the tail.
    next: u32,
    /// Previous slot in the FIFO, `NIL` at the head. Unused on the free list.
    prev: u32,
    /// Opaque tag the owner may set (queue id, bin, batch id).
    tag: u32,
}

/// Fixed-capacity slab of request slots with a free list.
///
/// Invariant: `free_len + live == slots.len() <= capacity`, where `live` counts slots not
/// `Free` and `free_len` the slots on the free list; slots at `slots.len()..capacity` are
/// reserved, never written.
pub struct RequestTable {
    slots: Vec<Slot>,
    capacity: u32,
    free_head: u32,
    free_len: u32,
}

impl RequestTable {
    /// A table with room for `capacity` requests (at least 1), its memory reserved and none
    /// of it written.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        assert!(capacity < NIL as usize, "queue_capacity too large");
        RequestTable {
            slots: Vec::with_capacity(capacity),
            capacity: capacity as u32,
            free_head: NIL,
            free_len: 0,
        }
    }

    /// Total number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Slots in use.
    pub fn live(&self) -> usize {
        self.slots.len() - self.free_len as usize
    }

    /// Takes a free slot for `meta`, or `None` when the table is full.
    pub fn insert(&mut self, meta: RequestMeta) -> Option<Ticket> {
        let index = if self.free_head != NIL {
            let index = self.free_head;
            let slot = &self.slots[index as usize];
            debug_assert_eq!(slot.state, SlotState::Free);
            self.free_head = slot.next;
            self.free_len -= 1;
            index
        } else if self.slots.len() < self.capacity as usize {
            // The next never-used slot: within the reserved capacity, no allocation.
            self.slots.push(Slot {
                meta,
                generation: 0,
                state: SlotState::Free,
                next: NIL,
                prev: NIL,
                tag: 0,
            });
            (self.slots.len() - 1) as u32
        } else {
            return None;
        };
        let slot = &mut self.slots[index as usize];
        slot.meta = meta;
        slot.state = SlotState::Dispatched; // not in any list until pushed
        slot.next = NIL;
        slot.prev = NIL;
        slot.tag = 0;
        Some(Ticket {
            index,
            generation: slot.generation,
        })
    }

    /// Frees the slot of `ticket`. Returns false (and changes nothing) for a stale ticket.
    /// The slot must not be linked in a FIFO.
    pub fn remove(&mut self, ticket: Ticket) -> bool {
        if !self.is_live(ticket) {
            return false;
        }
        let free_head = self.free_head;
        let slot = &mut self.slots[ticket.index as usize];
        debug_assert_ne!(
            slot.state,
            SlotState::Queued,
            "free a queued slot: unlink first"
        );
        slot.generation = slot.generation.wrapping_add(1);
        slot.state = SlotState::Free;
        slot.next = free_head;
        slot.prev = NIL;
        self.free_head = ticket.index;
        self.free_len += 1;
        true
    }

    /// True when `ticket` names a slot that is still in use by that request.
    pub fn is_live(&self, ticket: Ticket) -> bool {
        match self.slots.get(ticket.index as usize) {
            Some(s) => s.state != SlotState::Free && s.generation == ticket.generation,
            None => false,
        }
    }

    /// The ticket currently held by slot `index` (must be live).
    pub fn ticket_at(&self, index: u32) -> Ticket {
        let s = &self.slots[index as usize];
        debug_assert_ne!(s.state, SlotState::Free);
        Ticket {
            index,
            generation: s.generation,
        }
    }

    /// The ticket of slot `index` while it holds a request (None when free or out of range).
    pub fn ticket_if_live(&self, index: u32) -> Option<Ticket> {
        let s = self.slots.get(index as usize)?;
        (s.state != SlotState::Free).then_some(Ticket {
            index,
            generation: s.generation,
        })
    }

    /// Metadata of slot `index`.
    pub fn meta(&self, index: u32) -> &RequestMeta {
        &self.slots[index as usize].meta
    }

    /// State of slot `index`.
    pub fn state(&self, index: u32) -> SlotState {
        self.slots[index as usize].state
    }

    /// Marks slot `index` as dispatched (it must not be linked in a FIFO).
    pub fn set_dispatched(&mut self, index: u32) {
        let s = &mut self.slots[index as usize];
        debug_assert_ne!(s.state, SlotState::Free);
        s.state = SlotState::Dispatched;
    }

    /// Owner tag of slot `index`.
    pub fn tag(&self, index: u32) -> u32 {
        self.slots[index as usize].tag
    }

    /// Sets the owner tag of slot `index`.
    pub fn set_tag(&mut self, index: u32, tag: u32) {
        self.slots[index as usize].tag = tag;
    }

    /// The slot after `index` in its FIFO (`NIL` at the tail). `index` must be queued.
    pub fn next_in_fifo(&self, index: u32) -> u32 {
        let s = &self.slots[index as usize];
        debug_assert_eq!(s.state, SlotState::Queued);
        s.next
    }
}

/// A FIFO of table slots linked through the slots themselves. Copy-free, allocation-free.
///
/// Invariant: `len == 0` iff `head == NIL` iff `tail == NIL`; every linked slot is `Queued`.
#[derive(Clone, Copy, Debug)]
pub struct Fifo {
    head: u32,
    tail: u32,
    len: u32,
    /// Sum of `tokens_estimated` over the queued requests.
    tokens: u64,
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo {
            head: NIL,
            tail: NIL,
            len: 0,
            tokens: 0,
        }
    }
}

impl Fifo {
    /// Number of queued requests.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sum of estimated tokens over queued requests.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The oldest slot (front), if any.
    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// Appends slot `index` at the back.
    pub fn push_back(&mut self, table: &mut RequestTable, index: u32) {
        let tokens = {
            let s = &mut table.slots[index as usize];
            debug_assert_ne!(s.state, SlotState::Free);
            debug_assert_ne!(s.state, SlotState::Queued, "slot already queued");
            s.state = SlotState::Queued;
            s.next = NIL;
            s.prev = self.tail;
            s.meta.tokens_estimated
        };
        if self.tail == NIL {
            self.head = index;
        } else {
            table.slots[self.tail as usize].next = index;
        }
        self.tail = index;
        self.len += 1;
        self.tokens += u64::from(tokens);
    }

    /// Puts slot `index` at the front (used to return unused candidates and preempted work).
    pub fn push_front(&mut self, table: &mut RequestTable, index: u32) {
        let tokens = {
            let s = &mut table.slots[index as usize];
            debug_assert_ne!(s.state, SlotState::Free);
            debug_assert_ne!(s.state, SlotState::Queued, "slot already queued");
            s.state = SlotState::Queued;
            s.prev = NIL;
            s.next = self.head;
            s.meta.tokens_estimated
        };
        if self.head == NIL {
            self.tail = index;
        } else {
            table.slots[self.head as usize].prev = index;
        }
        self.head = index;
        self.len += 1;
        self.tokens += u64::from(tokens);
    }

    /// Removes and returns the front slot.
    pub fn pop_front(&mut self, table: &mut RequestTable) -> Option<u32> {
        let index = self.front()?;
        self.unlink(table, index);
        Some(index)
    }

    /// Removes slot `index` (which must be in this FIFO) from anywhere in the list.
    pub fn unlink(&mut self, table: &mut RequestTable, index: u32) {
        let (prev, next, tokens) = {
            let s = &mut table.slots[index as usize];
            debug_assert_eq!(s.state, SlotState::Queued);
            let r = (s.prev, s.next, s.meta.tokens_estimated);
            s.prev = NIL;
            s.next = NIL;
            s.state = SlotState::Dispatched;
            r
        };
        if prev == NIL {
            debug_assert_eq!(self.head, index);
            self.head = next;
        } else {
            table.slots[prev as usize].next = next;
        }
        if next == NIL {
            debug_assert_eq!(self.tail, index);
            self.tail = prev;
        } else {
            table.slots[next as usize].prev = prev;
        }
        self.len -= 1;
        self.tokens -= u64::from(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::request::{Kind, Priority};

    fn meta(tokens: u32) -> RequestMeta {
        let mut m = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 0, 0);
        m.tokens_estimated = tokens;
        m
    }

    #[test]
    fn table_fills_to_capacity_then_refuses_and_stale_tickets_are_rejected() {
        let mut t = RequestTable::new(3);
        let a = t.insert(meta(1)).unwrap();
        let b = t.insert(meta(2)).unwrap();
        let c = t.insert(meta(3)).unwrap();
        assert!(t.insert(meta(4)).is_none());
        assert_eq!(t.live(), 3);
        assert!(t.remove(b));
        assert!(!t.remove(b), "double free must be refused");
        let d = t.insert(meta(5)).unwrap();
        assert_eq!(d.index, b.index);
        assert_ne!(d.generation, b.generation);
        assert!(!t.is_live(b));
        assert!(t.is_live(a) && t.is_live(c) && t.is_live(d));
    }

    #[test]
    fn slots_go_lowest_first_freed_ones_again_first_and_only_the_peak_is_written() {
        let mut t = RequestTable::new(10_000);
        let reserved = t.slots.as_ptr();
        let a = t.insert(meta(1)).unwrap();
        let b = t.insert(meta(2)).unwrap();
        let c = t.insert(meta(3)).unwrap();
        assert_eq!((a.index, b.index, c.index), (0, 1, 2));
        assert!(t.remove(a) && t.remove(c));
        // The last freed first, then the other freed one, then a never-used slot: the order
        // a free list threaded through all 10,000 slots at start gave.
        let order: Vec<u32> = (0..3).map(|i| t.insert(meta(i)).unwrap().index).collect();
        assert_eq!(order, vec![2, 0, 3]);
        assert_eq!(
            t.slots.len(),
            4,
            "four live at the peak: four slots written"
        );
        assert_eq!((t.live(), t.capacity()), (4, 10_000));
        while t.insert(meta(9)).is_some() {}
        assert_eq!(t.live(), 10_000);
        assert_eq!(t.slots.as_ptr(), reserved, "filled within what it reserved");
        assert!(!t.is_live(Ticket {
            index: 10_000,
            generation: 0
        }));
    }

    #[test]
    fn fifo_keeps_order_and_token_sums_through_front_pushes_and_unlinks() {
        let mut t = RequestTable::new(8);
        let mut q = Fifo::default();
        let ids: Vec<u32> = (0..5)
            .map(|i| t.insert(meta(10 + i)).unwrap().index)
            .collect();
        for &i in &ids {
            q.push_back(&mut t, i);
        }
        assert_eq!(q.len(), 5);
        assert_eq!(q.tokens(), 10 + 11 + 12 + 13 + 14);
        q.unlink(&mut t, ids[2]);
        let first = q.pop_front(&mut t).unwrap();
        assert_eq!(first, ids[0]);
        q.push_front(&mut t, first);
        let mut order = vec![];
        while let Some(i) = q.pop_front(&mut t) {
            order.push(i);
        }
        assert_eq!(order, vec![ids[0], ids[1], ids[3], ids[4]]);
        assert_eq!(q.tokens(), 0);
        assert!(q.is_empty());
    }
}
