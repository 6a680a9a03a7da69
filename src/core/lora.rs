//! LoRA adapter slots of one replica (continuous) or worker (request-level): vLLM's
//! `--max-loras`, the adapters a forward pass can apply at once.
//!
//! An adapter is a small integer ([`AdapterId`]; 0 is the base model, which needs no slot).
//! A replica holds at most `max_loras` adapters resident; a resident adapter with no
//! running request stays loaded (cached) until its slot is wanted by another. Taking a slot
//! for an adapter that is not resident is a load, which the latency model charges
//! (`lora_load_ms`). An adapter unloaded, or an id handed to a new adapter, is forgotten
//! ([`LoraSlots::forget`]): its slot empties once nothing runs there, so a reused id starts
//! non-resident. Fixed arrays only: nothing here allocates, and nothing here knows an
//! adapter's name (`router::lora` does).

/// An adapter by number; [`BASE_MODEL`] is none.
pub type AdapterId = u16;

/// The base model: no adapter, no slot.
pub const BASE_MODEL: AdapterId = 0;

/// Most adapter slots a replica can have (`max_loras` is checked against it).
pub const MAX_LORAS_MOST: usize = 16;

/// Ids below this fit an [`AdapterSet`] (`[lora] max_lora_adapters` is checked below it).
pub const ADAPTER_IDS: usize = 4096;

/// A set of adapters as bits (published in the engine's snapshot: `Copy`, no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterSet([u64; ADAPTER_IDS / 64]);

impl Default for AdapterSet {
    fn default() -> Self {
        AdapterSet([0; ADAPTER_IDS / 64])
    }
}

impl AdapterSet {
    /// Adds `a` ([`BASE_MODEL`] and ids past [`ADAPTER_IDS`] are not adapters: ignored).
    pub fn insert(&mut self, a: AdapterId) {
        let i = usize::from(a);
        if a != BASE_MODEL && i < ADAPTER_IDS {
            self.0[i / 64] |= 1 << (i % 64);
        }
    }

    pub fn clear(&mut self) {
        self.0 = [0; ADAPTER_IDS / 64];
    }

    pub fn contains(&self, a: AdapterId) -> bool {
        let i = usize::from(a);
        i < ADAPTER_IDS && self.0[i / 64] >> (i % 64) & 1 == 1
    }

    /// The adapters, by id.
    pub fn iter(&self) -> impl Iterator<Item = AdapterId> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    (w * 64 + b) as AdapterId
                })
            })
        })
    }
}

/// What [`LoraSlots::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The request needs no slot (base model).
    Base,
    /// The adapter was resident: slot `0`.
    Resident(u8),
    /// The adapter was loaded into slot `0` (a load the step pays for).
    Loaded(u8),
}

impl Acquired {
    /// The slot taken, if any.
    pub fn slot(self) -> Option<u8> {
        match self {
            Acquired::Base => None,
            Acquired::Resident(k) | Acquired::Loaded(k) => Some(k),
        }
    }
}

/// The adapter slots of one replica.
#[derive(Clone, Copy, Debug)]
pub struct LoraSlots {
    /// Per slot, the adapter resident there ([`BASE_MODEL`]: empty). Only `..len` is used.
    ids: [AdapterId; MAX_LORAS_MOST],
    /// Per slot, requests using it now. Invariant: 0 for an empty slot.
    users: [u32; MAX_LORAS_MOST],
    /// Per slot, when it was last acquired (on `clock`), for least-recently-used eviction.
    used_at: [u64; MAX_LORAS_MOST],
    /// Per slot, its adapter was forgotten while requests ran there: the slot empties when
    /// the last of them is released, and no new request joins it. Invariant: only set on a
    /// slot with users.
    forgotten: [bool; MAX_LORAS_MOST],
    /// `max_loras`.
    len: u8,
    clock: u64,
}

impl LoraSlots {
    /// `max_loras` slots, all empty (`1..=MAX_LORAS_MOST`).
    pub fn new(max_loras: usize) -> LoraSlots {
        assert!(
            (1..=MAX_LORAS_MOST).contains(&max_loras),
            "max_loras must be in 1..={MAX_LORAS_MOST}"
        );
        LoraSlots {
            ids: [BASE_MODEL; MAX_LORAS_MOST],
            users: [0; MAX_LORAS_MOST],
            used_at: [0; MAX_LORAS_MOST],
            forgotten: [false; MAX_LORAS_MOST],
            len: max_loras as u8,
            clock: 0,
        }
    }

    /// `max_loras`.
    pub fn max_loras(&self) -> usize {
        usize::from(self.len)
    }

    /// The slot holding `a` for new requests (a forgotten one, still draining, does not).
    fn resident_slot(&self, a: AdapterId) -> Option<usize> {
        (0..self.max_loras()).find(|&k| self.ids[k] == a && !self.forgotten[k])
    }

    /// The slot a load of a non-resident adapter would take: an empty one, else the least
    /// recently used one nobody uses; `None` when every slot is in use.
    fn victim(&self) -> Option<usize> {
        let n = self.max_loras();
        if let Some(k) = self.ids[..n].iter().position(|&id| id == BASE_MODEL) {
            return Some(k);
        }
        (0..n)
            .filter(|&k| self.users[k] == 0)
            .min_by_key(|&k| self.used_at[k])
    }

    /// Could a request of adapter `a` run now (resident, or a slot it could load into)?
    pub fn can_take(&self, a: AdapterId) -> bool {
        a == BASE_MODEL || self.resident_slot(a).is_some() || self.victim().is_some()
    }

    /// Is adapter `a` resident?
    pub fn is_resident(&self, a: AdapterId) -> bool {
        a != BASE_MODEL && self.resident_slot(a).is_some()
    }

    /// One more user of adapter `a`; `None` (nothing changed) when `a` is not resident and
    /// every slot is in use.
    pub fn acquire(&mut self, a: AdapterId) -> Option<Acquired> {
        if a == BASE_MODEL {
            return Some(Acquired::Base);
        }
        self.clock += 1;
        let (k, loaded) = match self.resident_slot(a) {
            Some(k) => (k, false),
            None => (self.victim()?, true),
        };
        self.ids[k] = a;
        self.users[k] += 1;
        self.used_at[k] = self.clock;
        Some(if loaded {
            Acquired::Loaded(k as u8)
        } else {
            Acquired::Resident(k as u8)
        })
    }

    /// One user fewer of slot `k` (from [`Acquired::slot`]); the adapter stays resident,
    /// unless it was forgotten and this was its last user.
    pub fn release(&mut self, k: u8) {
        let k = usize::from(k);
        debug_assert!(self.users[k] > 0, "release matches an acquire");
        self.users[k] -= 1;
        if self.users[k] == 0 && self.forgotten[k] {
            self.forgotten[k] = false;
            self.ids[k] = BASE_MODEL;
        }
    }

    /// Forgets adapter `a` (unloaded, or its id handed to a new adapter): a slot holding it
    /// with nothing running empties now; one with running requests empties when the last
    /// is released, and takes no new request meanwhile. The next request of `a` loads it.
    pub fn forget(&mut self, a: AdapterId) {
        if a == BASE_MODEL {
            return;
        }
        for k in 0..self.max_loras() {
            if self.ids[k] != a {
                continue;
            }
            if self.users[k] == 0 {
                self.ids[k] = BASE_MODEL;
            } else {
                self.forgotten[k] = true;
            }
        }
    }

    /// Adapters with a running request (once per slot: a forgotten adapter still draining
    /// and its reloaded id may both run).
    pub fn running(&self) -> impl Iterator<Item = AdapterId> + '_ {
        (0..self.max_loras())
            .filter(|&k| self.users[k] > 0)
            .map(|k| self.ids[k])
    }
}

/// The distinct adapters of a batch being formed (request-level), at most `max_loras`.
#[derive(Clone, Copy, Debug)]
pub struct BatchAdapters {
    ids: [AdapterId; MAX_LORAS_MOST],
    len: u8,
    max: u8,
}

impl BatchAdapters {
    /// An empty set for batches of at most `max_loras` adapters.
    pub fn new(max_loras: usize) -> BatchAdapters {
        assert!((1..=MAX_LORAS_MOST).contains(&max_loras));
        BatchAdapters {
            ids: [BASE_MODEL; MAX_LORAS_MOST],
            len: 0,
            max: max_loras as u8,
        }
    }

    /// The adapters so far.
    pub fn as_slice(&self) -> &[AdapterId] {
        &self.ids[..usize::from(self.len)]
    }

    /// Could a request of adapter `a` join the batch?
    pub fn fits(&self, a: AdapterId) -> bool {
        a == BASE_MODEL || self.len < self.max || self.as_slice().contains(&a)
    }

    /// Adds a request of adapter `a` (which [`Self::fits`]).
    pub fn add(&mut self, a: AdapterId) {
        debug_assert!(self.fits(a));
        if a != BASE_MODEL && !self.as_slice().contains(&a) {
            self.ids[usize::from(self.len)] = a;
            self.len += 1;
        }
    }
}

impl LoraSlots {
    /// Makes a batch's adapters resident for its dispatch (request-level: nothing is held
    /// between batches); how many had to be loaded.
    #[inline]
    pub fn load_batch(&mut self, adapters: &BatchAdapters) -> u32 {
        debug_assert!(adapters.as_slice().len() <= self.max_loras());
        if adapters.as_slice().is_empty() {
            // The base model alone (every batch when no adapter is configured): nothing to
            // make resident, and no call (the walk below cost ~40 instructions a batch).
            return 0;
        }
        self.load_adapters(adapters)
    }

    /// [`Self::load_batch`] for a batch with adapters.
    fn load_adapters(&mut self, adapters: &BatchAdapters) -> u32 {
        let mut loads = 0;
        let mut taken = [0u8; MAX_LORAS_MOST];
        // Resident adapters first, so a load never evicts one the batch needs.
        let resident = adapters.as_slice().iter().filter(|&&a| self.is_resident(a));
        let missing = adapters
            .as_slice()
            .iter()
            .filter(|&&a| !self.is_resident(a));
        let order: smallvec::SmallVec<[AdapterId; MAX_LORAS_MOST]> =
            resident.chain(missing).copied().collect();
        for (i, &a) in order.iter().enumerate() {
            let got = self
                .acquire(a)
                .expect("a batch holds at most max_loras adapters, and none is in use");
            loads += u32::from(matches!(got, Acquired::Loaded(_)));
            taken[i] = got.slot().expect("an adapter takes a slot");
        }
        for &k in &taken[..order.len()] {
            self.release(k);
        }
        loads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slot_holds_one_adapter_at_a_time_and_caches_it() {
        let mut s = LoraSlots::new(1);
        assert_eq!(s.acquire(BASE_MODEL), Some(Acquired::Base));
        assert_eq!(s.acquire(7), Some(Acquired::Loaded(0)));
        assert_eq!(s.acquire(7), Some(Acquired::Resident(0)));
        assert!(!s.can_take(8));
        assert_eq!(s.acquire(8), None, "the slot is in use");
        s.release(0);
        s.release(0);
        assert!(s.is_resident(7), "an idle adapter stays loaded");
        assert_eq!(s.acquire(7), Some(Acquired::Resident(0)), "no second load");
        s.release(0);
        assert_eq!(s.acquire(8), Some(Acquired::Loaded(0)));
        assert!(!s.is_resident(7));
        assert_eq!(s.running().collect::<Vec<_>>(), [8]);
    }

    #[test]
    fn adapter_sets_hold_ids_once_and_skip_the_base_model() {
        let mut s = AdapterSet::default();
        for a in [3, 70, 3, BASE_MODEL, 4095] {
            s.insert(a);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), [3, 70, 4095]);
        assert!(s.contains(70) && !s.contains(BASE_MODEL));
        s.clear();
        assert_eq!(s.iter().count(), 0);
    }

    #[test]
    fn the_least_recently_used_idle_adapter_is_evicted() {
        let mut s = LoraSlots::new(2);
        let a = s.acquire(1).unwrap().slot().unwrap();
        let b = s.acquire(2).unwrap().slot().unwrap();
        s.release(a);
        s.release(b);
        let again = s.acquire(1).unwrap().slot().unwrap();
        s.release(again);
        assert_eq!(
            s.acquire(3),
            Some(Acquired::Loaded(b)),
            "2 was used longest ago"
        );
        assert!(s.is_resident(1));
    }

    #[test]
    fn a_forgotten_adapter_is_loaded_again_even_when_its_slot_was_busy() {
        let mut s = LoraSlots::new(1);
        let k = s.acquire(5).unwrap().slot().unwrap();
        s.release(k);
        s.forget(5);
        assert!(
            !s.is_resident(5),
            "an idle forgotten adapter leaves at once"
        );
        assert_eq!(
            s.acquire(5),
            Some(Acquired::Loaded(0)),
            "its id loads again"
        );

        // Forgotten while a request runs: the slot drains, then empties.
        s.forget(5);
        assert!(!s.is_resident(5));
        assert!(!s.can_take(5), "a new request of the id waits for the slot");
        assert_eq!(s.acquire(6), None);
        assert_eq!(
            s.running().collect::<Vec<_>>(),
            [5],
            "the old request runs on"
        );
        s.release(0);
        assert_eq!(s.running().count(), 0);
        assert_eq!(s.acquire(5), Some(Acquired::Loaded(0)), "charged a load");
        s.release(0);
        assert_eq!(
            s.acquire(5),
            Some(Acquired::Resident(0)),
            "then cached as usual"
        );

        // Forgetting another adapter, or the base model, changes nothing.
        s.release(0);
        s.forget(9);
        s.forget(BASE_MODEL);
        assert!(s.is_resident(5));
    }
}
