//! LoRA adapters in the continuous scheduler: which waiting request a replica may admit
//! given its adapter slots (`lora_pick`, without head-of-line blocking but with a bounded
//! wait), taking the slot (`lora_acquire`), and the adapters running, waiting or resident
//! (for metrics and the router).
//!
//! What must never happen here: more distinct adapters running on a replica than
//! `max_loras`, an unbounded scan of the queue on a tick, or an allocation.

use super::replica::NO_LORA_SLOT;
use super::Continuous;
use crate::core::lora::{Acquired, BASE_MODEL};
use crate::core::table::NIL;

/// Most waiting requests admission looks past a request whose LoRA adapter cannot get a
/// slot (so a tick stays O(this) however long the queue is).
const LORA_SCAN_MOST: usize = 256;

impl Continuous {
    /// Does some replica of `group` hold `adapter` resident (running or cached)?
    pub fn group_adapter_resident(&self, group: usize, adapter: u16) -> bool {
        (0..self.replicas.len())
            .any(|r| self.replica_group[r] == group && self.adapter_resident(r, adapter))
    }

    /// The LoRA rule of admission: from `head` on (a queue of replica `r`'s group), the first
    /// waiting request `r` may admit now: a base-model request, or one whose adapter is
    /// resident or has a slot to load into (at most `max_loras` distinct adapters run at
    /// once). A request whose adapter cannot get a slot waits, and those behind it go on (no
    /// head-of-line blocking), each such pass counted against it. Once it has been passed
    /// `max_slots` times it fences the queue: no adapter request behind it is admitted (base
    /// requests still are) until its adapter gets a slot, which happens as soon as one
    /// adapter's running requests finish; so its wait is bounded by `max_slots` admissions
    /// and the longest running request. Looks at most [`LORA_SCAN_MOST`] requests.
    pub(super) fn lora_pick(&mut self, r: usize, head: u32) -> Option<u32> {
        let lora = &self.replicas[r].lora;
        let fence = self.cfg.max_slots as u32;
        let (mut i, mut fenced, mut looked) = (head, false, 0);
        while i != NIL && looked < LORA_SCAN_MOST {
            let a = self.table.meta(i).adapter;
            if a == BASE_MODEL || (!fenced && lora.can_take(a)) {
                break;
            }
            fenced |= self.lora_overtaken[i as usize] >= fence;
            i = self.table.next_in_fifo(i);
            looked += 1;
        }
        if i == NIL || looked == LORA_SCAN_MOST {
            return None;
        }
        let mut j = head;
        while j != i {
            let passed = &mut self.lora_overtaken[j as usize];
            *passed = passed.saturating_add(1);
            j = self.table.next_in_fifo(j);
        }
        Some(i)
    }

    /// Takes replica `r`'s LoRA slot for a request of `adapter` that [`Self::lora_pick`]
    /// chose: the slot (or [`NO_LORA_SLOT`]) and whether the adapter was loaded for it.
    pub(super) fn lora_acquire(&mut self, r: usize, adapter: u16) -> (u8, bool) {
        let acquired = self.replicas[r]
            .lora
            .acquire(adapter)
            .expect("lora_pick admits only requests whose adapter can get a slot");
        let loaded = matches!(acquired, Acquired::Loaded(_));
        self.stats.lora_loads += u64::from(loaded);
        (acquired.slot().unwrap_or(NO_LORA_SLOT), loaded)
    }

    /// Adds the adapters of running requests (every replica) to `running` and of waiting
    /// ones (every group) to `waiting`. O(waiting requests): for a snapshot, not per step.
    pub fn lora_adapters(
        &self,
        running: &mut crate::core::lora::AdapterSet,
        waiting: &mut crate::core::lora::AdapterSet,
    ) {
        for r in 0..self.replicas.len() {
            self.running_adapters(r).for_each(|a| running.insert(a));
        }
        for g in 0..self.groups() {
            self.waiting_adapters(g).for_each(|a| waiting.insert(a));
        }
    }

    /// Adapters with a running request on replica `r`.
    pub fn running_adapters(&self, r: usize) -> impl Iterator<Item = u16> + '_ {
        self.replicas[r].lora.running()
    }

    /// Is `adapter` resident on replica `r` (running or cached)?
    pub fn adapter_resident(&self, r: usize, adapter: u16) -> bool {
        self.replicas[r].lora.is_resident(adapter)
    }

    /// Forgets LoRA adapter `adapter` on every replica (unloaded, or its id handed to a new
    /// adapter): a slot empties once nothing runs there (`LoraSlots::forget`).
    pub fn forget_adapter(&mut self, adapter: u16) {
        self.replicas
            .iter_mut()
            .for_each(|r| r.lora.forget(adapter));
    }

    /// Adapters of the requests waiting in group `g` (repeats included), for metrics.
    pub fn waiting_adapters(&self, g: usize) -> impl Iterator<Item = u16> + '_ {
        self.waiting[g].iter().flat_map(move |q| {
            let mut i = q.front().unwrap_or(NIL);
            std::iter::from_fn(move || {
                (i != NIL).then(|| {
                    let a = self.table.meta(i).adapter;
                    i = self.table.next_in_fifo(i);
                    a
                })
            })
        })
    }
}
