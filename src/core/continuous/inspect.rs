//! What drivers, the router and metrics read of the continuous scheduler: settings,
//! counters, queue and slot occupancy, KV in use, prefix-cache counters and cached
//! prefixes, the step running on a replica.
//!
//! Read-only (`&self`): nothing here changes the scheduler or allocates.

use super::{Continuous, ContinuousConfig, ContinuousStats, StepEntries};
use crate::core::prefix::{BlockHash, PrefixStats};
use crate::core::request::Ticket;

impl Continuous {
    /// Settings.
    pub fn config(&self) -> &ContinuousConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &ContinuousStats {
        &self.stats
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting_len
    }

    /// Replica groups.
    pub fn groups(&self) -> usize {
        self.group_waiting.len()
    }

    /// The group `replica` belongs to.
    pub fn group_of(&self, replica: usize) -> usize {
        self.replica_group[replica]
    }

    /// The entries of the step running on `replica` (empty when none is): valid from the
    /// [`StepAction::Step`](super::StepAction::Step) that started it until
    /// [`Self::complete_step_with`].
    pub fn step_entries(&self, replica: usize) -> StepEntries<'_> {
        StepEntries {
            rep: &self.replicas[replica],
        }
    }

    /// Slots in use on `replica`.
    pub fn active_slots(&self, replica: usize) -> usize {
        self.replicas[replica].active
    }

    /// KV tokens in use on `replica`: prompt prefilled + generated over active slots; with
    /// prefix caching, the blocks running sequences hold (shared ones once) times their
    /// size. Cached blocks no sequence holds are free: they are evicted when needed.
    pub fn kv_used(&self, replica: usize) -> u64 {
        let rep = &self.replicas[replica];
        match &rep.cache {
            Some(c) => u64::from(c.used()) * u64::from(self.cfg.block_tokens),
            None => rep.kv_used,
        }
    }

    /// Prefix-cache counters of `replica` (all zero without prefix caching).
    pub fn prefix_stats_of(&self, replica: usize) -> PrefixStats {
        let rep = &self.replicas[replica];
        PrefixStats {
            evicted_blocks: rep.cache.as_ref().map_or(0, |c| c.evicted),
            ..rep.prefix
        }
    }

    /// Prefix-cache counters over every replica.
    pub fn prefix_stats(&self) -> PrefixStats {
        let mut s = PrefixStats::default();
        for r in 0..self.replicas.len() {
            s.add(&self.prefix_stats_of(r));
        }
        s
    }

    /// How many leading names of `names` are cached on `replica` now (held by a running
    /// sequence or free but still named); 0 without prefix caching. O(hits); no side effect
    /// (the router asks this of every candidate, nothing is held or refreshed).
    pub fn cached_prefix_blocks(&self, replica: usize, names: &[BlockHash]) -> u32 {
        let Some(cache) = &self.replicas[replica].cache else {
            return 0;
        };
        names
            .iter()
            .take_while(|&&name| cache.lookup(name).is_some())
            .count() as u32
    }

    /// [`Self::cached_prefix_blocks`], the most over the replicas of `group`.
    pub fn group_cached_prefix_blocks(&self, group: usize, names: &[BlockHash]) -> u32 {
        (0..self.replicas.len())
            .filter(|&r| self.replica_group[r] == group)
            .map(|r| self.cached_prefix_blocks(r, names))
            .max()
            .unwrap_or(0)
    }

    /// KV blocks of `replica` with prefix caching (0 without).
    pub fn kv_blocks(&self, replica: usize) -> u64 {
        self.replicas[replica]
            .cache
            .as_ref()
            .map_or(0, |c| u64::from(c.blocks()))
    }

    /// True once `begin_drain` (or `abort_all`) was called.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Capacity of the request table (waiting + active), for the driver's own tables.
    pub fn table_capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Nothing waiting, nothing active, no step out.
    pub fn is_idle(&self) -> bool {
        self.waiting_len == 0 && self.replicas.iter().all(|r| !r.busy && r.active == 0)
    }

    /// The ticket of table slot `index` while it holds a request.
    pub fn ticket_of(&self, index: u32) -> Option<Ticket> {
        self.table.ticket_if_live(index)
    }

    /// Is a step running on `replica`?
    pub fn is_busy(&self, replica: usize) -> bool {
        self.replicas[replica].busy
    }

    /// Total slots over all replicas.
    pub fn slots_total(&self) -> usize {
        self.replicas.len() * self.cfg.max_slots
    }

    /// Requests waiting in group `group` (its queues, preempted ones included).
    pub fn waiting_in_group(&self, group: usize) -> usize {
        self.group_waiting[group]
    }
}
