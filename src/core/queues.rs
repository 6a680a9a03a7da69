//! Which queue a queued request sits in: the class queues (priority x token bucket, with
//! the non-empty mask kept in step) or, under `multi_bin`, the bins; and `set_strategy`,
//! which moves every queued request between the two when it switches into or out of
//! `multi_bin`, and tells `auto` when it stops running (its models forget the time away).
//!
//! What must never happen here: a clock read, I/O, or an allocation (queues are intrusive
//! lists through the request table); a request lost or reordered when it moves.

use super::strategy::research::Research;
use super::strategy::StrategyKind;
use super::Core;

impl Core {
    /// Switches strategy. Nothing queued is lost: switching into or out of `multi_bin`
    /// moves every queued request between the class queues and the bins, in arrival order.
    pub fn set_strategy(&mut self, kind: StrategyKind) {
        if self.strategy == StrategyKind::Auto && kind != StrategyKind::Auto {
            self.auto.suspend();
        }
        let was_bins = self.strategy == StrategyKind::MultiBin;
        let to_bins = kind == StrategyKind::MultiBin;
        if was_bins && !to_bins {
            self.strategy = kind;
            self.research.use_bins(false);
            self.move_bins_to_classes();
        } else if !was_bins && to_bins {
            self.strategy = kind;
            self.research.use_bins(true);
            self.move_classes_to_bins();
        } else {
            self.strategy = kind;
        }
    }

    fn move_bins_to_classes(&mut self) {
        let k = self.research.cfg.bins;
        let queues = &mut self.queues;
        let mut mask = self.nonempty;
        Research::drain_in_arrival_order(&mut self.table, &mut self.research.bins[..k], |t, i| {
            let class = t.meta(i).class();
            queues[class].push_back(t, i);
            mask |= 1 << class;
        });
        self.nonempty = mask;
        self.research.queued = 0;
    }

    fn move_classes_to_bins(&mut self) {
        let research = &mut self.research;
        let mut moved = 0;
        Research::drain_in_arrival_order(&mut self.table, &mut self.queues, |t, i| {
            let bin = research.bin_for(t.meta(i));
            t.set_tag(i, bin as u32);
            research.bins[bin].push_back(t, i);
            moved += 1;
        });
        research.queued += moved;
        self.nonempty = 0;
    }

    /// Puts table slot `index` in the queue the current strategy uses.
    pub(super) fn enqueue(&mut self, index: u32) {
        if self.strategy == StrategyKind::MultiBin {
            let bin = self.research.bin_for(self.table.meta(index));
            self.table.set_tag(index, bin as u32);
            self.research.bins[bin].push_back(&mut self.table, index);
            self.research.queued += 1;
        } else {
            let class = self.table.meta(index).class();
            self.queues[class].push_back(&mut self.table, index);
            self.sync_class(class);
        }
    }

    /// Takes queued table slot `index` out of whichever queue holds it.
    pub(super) fn dequeue(&mut self, index: u32) {
        if self.strategy == StrategyKind::MultiBin {
            let bin = self.table.tag(index) as usize;
            self.research.bins[bin].unlink(&mut self.table, index);
            self.research.queued -= 1;
        } else {
            let class = self.table.meta(index).class();
            self.queues[class].unlink(&mut self.table, index);
            self.sync_class(class);
        }
    }

    /// Some queued request, from whichever queues the current strategy uses.
    pub(super) fn any_queued(&self) -> Option<u32> {
        if self.strategy == StrategyKind::MultiBin {
            let k = self.research.cfg.bins;
            self.research.bins[..k].iter().find_map(|q| q.front())
        } else {
            let class = self.nonempty.trailing_zeros() as usize;
            (self.nonempty != 0)
                .then(|| self.queues[class].front())
                .flatten()
        }
    }

    /// Keeps the non-empty mask in step with `queues[class]`.
    #[inline]
    pub(super) fn sync_class(&mut self, class: usize) {
        if self.queues[class].is_empty() {
            self.nonempty &= !(1 << class);
        } else {
            self.nonempty |= 1 << class;
        }
    }
}
