//! Backends that come and go while abe serves: the control plane over the engine's backend
//! slots (`router::slots`). The admin API (`POST`/`DELETE`/`GET /admin/backends`), a reload
//! (`SIGHUP`, `POST /admin/reload`, in [`reload`]) and DNS discovery ([`discovery`]) all
//! change backends through [`LiveBackends`]: it fills an upstream slot's address (its
//! [`UpstreamSlot`]) and then asks the engine, by a control message, to make the slot
//! active or to drain it. The engine marks a drained slot empty once it holds nothing; the
//! snapshot says which state each slot is in.
//!
//! What lives here: the slot table as the control plane sees it (each slot's config, its
//! client cell, what was last asked of it) behind one mutex, taken by admin calls, the
//! reload and the discovery threads, never by the engine. What must never happen here: a
//! change the engine has to allocate for (slots are fixed at start), a slot filled again
//! while it still holds requests, or a refused change that changes something.

pub mod discovery;
pub mod reload;
pub mod thread;

use crate::config::{Config, ConfigError};
use crate::exec::upstream::UpstreamSlot;
use crate::router::{
    BackendConfig, BackendId, BackendKindName, DiscoveryPlan, Registry, Router, SlotState,
};
use crate::runtime::tables::{EngineTables, TablesAnswer};
use crate::runtime::{Handle, Snapshot};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Re-reads the config (file, environment, flags) as at start, for a reload.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// How long a table swap waits for the engine's answer (it answers within a turn; only a
/// stopping engine does not).
const SWAP_TIMEOUT: Duration = Duration::from_secs(5);

/// The control plane over the backend slots. See the module doc.
pub struct LiveBackends {
    handle: Arc<Handle>,
    /// Every slot; its lock also serialises table swaps (taken first, before `names`).
    slots: Mutex<Vec<Slot>>,
    /// `[routing.aliases]` and `[routing.fallbacks]` as running (the tables' names).
    names: Mutex<Names>,
    /// The `discovery` tables, as expanded at start (their slots are fixed).
    plans: Vec<DiscoveryPlan>,
    /// How a reload reads the config again; `None`: abe was started without one.
    source: Mutex<Option<ConfigSource>>,
    /// The config as running: the start's, with what reloads applied. A reload is judged
    /// against it.
    running: Mutex<Config>,
    /// The io threads' router copy: the engine's tables, published after the engine took
    /// them (so an io thread never resolves to an id the engine lacks).
    io_router: Mutex<Arc<Router>>,
    /// Bumped after each `io_router` change; io threads compare it once per turn.
    io_generation: AtomicU64,
    /// The kind every spare slot runs (`upstream` in request batching, `sim` in
    /// continuous), `None` without spare slots.
    spare_kind: Option<BackendKindName>,
    /// The live thread's job queue (`thread`); `None` until it runs, and after it stopped.
    jobs: Mutex<Option<std::sync::mpsc::Sender<thread::Job>>>,
    /// The upstream health checker's board, when there is one: a slot at a new address (or
    /// with a new backend) counts healthy until its first probe, as every backend at start,
    /// not as the old address last answered.
    health: Mutex<Option<Arc<crate::exec::health::HealthBoard>>>,
}

/// Aliases and fallbacks as running.
#[derive(Clone, Debug, Default, PartialEq)]
struct Names {
    aliases: BTreeMap<String, String>,
    fallbacks: BTreeMap<String, Vec<String>>,
}

/// One backend slot as the control plane sees it.
struct Slot {
    /// As it runs: `base_url` is the address the slot holds now.
    config: BackendConfig,
    /// An `upstream` slot's client cell (shared with its workers and the health checker).
    upstream: Option<UpstreamSlot>,
    /// What was last asked of the engine: `Active`, or `Draining` (the engine then goes on
    /// to `Empty` by itself).
    asked: SlotState,
    /// The `seq` of the last ask; the snapshot's `slot_seq` equal to it means the engine
    /// took that ask (so an `Empty` beside it is the end of that drain, not an older one).
    seq: u32,
    /// A discovery slot's address (kept while it drains, so an address that comes back
    /// takes its old slot again).
    address: Option<SocketAddr>,
    /// Index into `plans` of the discovery table it belongs to.
    plan: Option<usize>,
    /// Reserved at start for a backend the config did not have (`router::slots`).
    spare: bool,
    /// A move asked while the slot held requests: the table to take (new `base_url` or
    /// `api_key`) once its drain is over ([`LiveBackends::settle`]).
    moving: Option<BackendConfig>,
}

/// Why a change was refused (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no backend named '{0}' (GET /admin/backends lists them)")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "no free slot for a new backend '{0}': every spare slot holds a backend or is still \
         draining; raise routing.spare_backend_slots (the slots are reserved at start, so \
         this needs a restart), or remove a backend that was added and wait for it to empty"
    )]
    NoSlot(String),
    #[error(
        "backend '{name}': {keys} cannot change while abe runs (only base_url and api_key can); \
         keep them as they are, or remove it and add it under a new name"
    )]
    Fixed { name: String, keys: String },
    #[error("backend '{name}' is filled by discovery of '{dns}': change its DNS records instead")]
    Discovered { name: String, dns: String },
    #[error("the engine's control queue is full, or the engine is stopping; try again")]
    Busy,
}

/// What an add did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Added {
    /// The slot was asked to be active (at once).
    Active,
    /// The slot held requests at its old address: it drains there, and takes the new
    /// address once empty (requests keep the address they were routed to).
    Moving,
}

/// A backend as `GET /admin/backends` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BackendView {
    pub name: String,
    pub kind: BackendKindName,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// What the engine last published: `active`, `draining` or `empty`.
    pub state: &'static str,
    /// What was last asked: `active` or `draining` (ahead of `state` for up to a snapshot).
    pub requested: &'static str,
    pub priority: u32,
    pub max_concurrent_batches: u32,
    pub models: Vec<String>,
    /// The DNS name a discovery slot follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery: Option<String>,
    /// A spare slot (reserved at start for a backend the config did not have).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub spare: bool,
    /// The address a move waits to take once the drain at the old one is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moving_to: Option<String>,
}

impl LiveBackends {
    /// The control plane over `backends` (the expanded list the router was built from,
    /// index for index), with each `upstream` one's client cell. Discovery slots and
    /// `spare` ones start empty (the caller built the router with them so); `io_router`
    /// is the io threads' copy of the router.
    pub fn new(
        handle: Arc<Handle>,
        backends: &[BackendConfig],
        upstream: Vec<Option<UpstreamSlot>>,
        plans: Vec<DiscoveryPlan>,
        running: Config,
        io_router: Arc<Router>,
    ) -> LiveBackends {
        assert_eq!(
            backends.len(),
            upstream.len(),
            "a cell (or none) per backend"
        );
        let mut slots: Vec<Slot> = backends
            .iter()
            .zip(upstream)
            .map(|(config, upstream)| Slot {
                config: config.clone(),
                upstream,
                asked: if config.spare {
                    SlotState::Draining
                } else {
                    SlotState::Active
                },
                seq: 0,
                address: None,
                plan: None,
                spare: config.spare,
                moving: None,
            })
            .collect();
        for (p, plan) in plans.iter().enumerate() {
            for &b in &plan.slots {
                slots[b].asked = SlotState::Draining;
                slots[b].plan = Some(p);
            }
        }
        let spare_kind = backends.iter().find(|b| b.spare).map(|b| b.kind);
        let names = Names {
            aliases: running.routing.aliases.clone(),
            fallbacks: running.routing.fallbacks.clone(),
        };
        LiveBackends {
            handle,
            slots: Mutex::new(slots),
            names: Mutex::new(names),
            plans,
            source: Mutex::new(None),
            running: Mutex::new(running),
            io_router: Mutex::new(io_router),
            io_generation: AtomicU64::new(0),
            spare_kind,
            jobs: Mutex::new(None),
            health: Mutex::new(None),
        }
    }

    /// The health checker's board (see the field).
    pub fn set_health_board(&self, board: Arc<crate::exec::health::HealthBoard>) {
        *lock(&self.health) = Some(board);
    }

    /// Slot `b` holds another address or backend from now on: healthy until probed.
    fn forget_health(&self, b: usize) {
        if let Some(board) = lock(&self.health).as_ref() {
            board.set(b, true);
        }
    }

    /// Where a reload reads the config from.
    pub fn set_source(&self, source: ConfigSource) {
        *lock(&self.source) = Some(source);
    }

    /// The discovery tables (the discovery threads follow one each).
    pub fn plans(&self) -> &[DiscoveryPlan] {
        &self.plans
    }

    /// The io threads' router copy with its generation, when newer than `seen`.
    #[inline]
    pub fn io_router_if_newer(&self, seen: u64) -> Option<(u64, Arc<Router>)> {
        // Acquire: pairs with the Release bump after the copy was stored.
        let generation = self.io_generation.load(Ordering::Acquire);
        if generation == seen {
            return None;
        }
        Some((generation, lock(&self.io_router).clone()))
    }

    /// Every backend slot, in `BackendId` order, with its published state.
    pub fn list(&self) -> Vec<BackendView> {
        let snap = self.handle.snapshot();
        let slots = lock(&self.slots);
        slots
            .iter()
            .enumerate()
            .map(|(b, s)| BackendView {
                name: s.config.name.clone(),
                kind: s.config.kind,
                base_url: s.config.base_url.clone(),
                state: snap
                    .backends
                    .get(b)
                    .map_or(SlotState::Active, |c| c.slot)
                    .as_str(),
                requested: s.asked.as_str(),
                priority: s.config.priority,
                max_concurrent_batches: s.config.max_concurrent_batches,
                models: s.config.models.iter().map(|m| m.name.clone()).collect(),
                discovery: s.plan.map(|p| self.plans[p].discovery.dns.clone()),
                spare: s.spare,
                moving_to: s.moving.as_ref().and_then(|m| m.base_url.clone()),
            })
            .collect()
    }

    /// Removes backend `name`: nothing new is routed to it; what it holds finishes, then
    /// its slot is empty (a move waiting for that drain is dropped). Removing a removed
    /// backend changes nothing.
    pub fn remove(&self, name: &str) -> Result<(), LiveError> {
        let mut slots = lock(&self.slots);
        let b = find(&slots, name)?;
        if let Some(p) = slots[b].plan {
            return Err(LiveError::Discovered {
                name: name.into(),
                dns: self.plans[p].discovery.dns.clone(),
            });
        }
        self.ask(&mut slots, b, SlotState::Draining)?;
        slots[b].moving = None;
        Ok(())
    }

    /// Adds backend `config` (a `[[backends]]` table):
    /// - into the slot of the same name, which must hold the same kind, models, priority
    ///   and workers (only the address and key may differ). A new address is taken at once
    ///   by an empty slot; a slot holding requests drains at its old address and takes the
    ///   new one once empty ([`Added::Moving`]): requests finish where they were routed.
    /// - else into a free spare slot (its kind and workers are fixed at start): the
    ///   engine's tables are swapped so the slot serves the new name and models, then it
    ///   is asked to be active. No free spare slot: [`LiveError::NoSlot`]. A name a spare
    ///   slot holds, removed and drained, takes its slot again with whatever table.
    ///
    /// Refused changes change nothing (the client is pointed back, the tables kept).
    pub fn add(&self, config: &BackendConfig) -> Result<Added, LiveError> {
        self.add_as(config, true)
    }

    /// [`Self::add`] of a table that leaves `max_concurrent_batches` out (the admin API's
    /// JSON without the key): it takes the workers of the slot it goes to.
    pub fn add_with_the_slots_workers(&self, config: &BackendConfig) -> Result<Added, LiveError> {
        self.add_as(config, false)
    }

    /// [`Self::add`]; `workers_given`: false takes the slot's `max_concurrent_batches`.
    fn add_as(&self, config: &BackendConfig, workers_given: bool) -> Result<Added, LiveError> {
        if config.spare {
            return Err(LiveError::Invalid(
                "a spare slot's table cannot be added".into(),
            ));
        }
        Registry::build(std::slice::from_ref(config))
            .map_err(|e| LiveError::Invalid(e.to_string()))?;
        let mut slots = lock(&self.slots);
        let Ok(b) = find(&slots, &config.name) else {
            return self.fill_spare(&mut slots, config, workers_given);
        };
        let mut config = config.clone();
        if !workers_given {
            config.max_concurrent_batches = slots[b].config.max_concurrent_batches;
        }
        let config = &config;
        if let Some(p) = slots[b].plan {
            return Err(LiveError::Discovered {
                name: config.name.clone(),
                dns: self.plans[p].discovery.dns.clone(),
            });
        }
        let fixed = fixed_keys_differ(&slots[b].config, config);
        if !fixed.is_empty() && slots[b].spare && Self::drained(&self.handle.snapshot(), &slots, b)
        {
            // A backend added in a spare slot, removed and drained: the slot takes the
            // name's new table whole (other models, kind of the spare slots, priority).
            return self.fill_slot(&mut slots, Some(b), config, workers_given);
        }
        if !fixed.is_empty() {
            return Err(LiveError::Fixed {
                name: config.name.clone(),
                keys: fixed.join(", "),
            });
        }
        let moved = slots[b].config.base_url != config.base_url
            || slots[b].config.api_key != config.api_key;
        if !moved {
            self.ask(&mut slots, b, SlotState::Active)?;
            slots[b].moving = None;
            return Ok(Added::Active);
        }
        if Self::drained(&self.handle.snapshot(), &slots, b) {
            self.move_now(&mut slots, b, config)?;
            return Ok(Added::Active);
        }
        // Requests are queued or running at the old address: they finish there.
        self.ask(&mut slots, b, SlotState::Draining)?;
        slots[b].moving = Some(config.clone());
        tracing::info!(backend = %config.name, base_url = ?config.base_url,
            "backend moving: draining at its old address first");
        Ok(Added::Moving)
    }

    /// Points empty slot `b` at `config`'s address and asks it to be active; refused, the
    /// client points back where it did.
    fn move_now(
        &self,
        slots: &mut [Slot],
        b: usize,
        config: &BackendConfig,
    ) -> Result<(), LiveError> {
        let was = (
            slots[b].config.base_url.clone(),
            slots[b].config.api_key.clone(),
        );
        retarget(
            &slots[b],
            config.base_url.as_deref(),
            config.api_key.as_ref(),
        );
        if let Err(e) = self.ask(slots, b, SlotState::Active) {
            retarget(&slots[b], was.0.as_deref(), was.1.as_ref());
            return Err(e);
        }
        if was.0 != config.base_url {
            self.forget_health(b);
        }
        let slot = &mut slots[b];
        slot.config.base_url = config.base_url.clone();
        slot.config.api_key = config.api_key.clone();
        slot.moving = None;
        tracing::info!(backend = %config.name, base_url = ?config.base_url, "backend moved");
        Ok(())
    }

    /// `add` of a name no slot has: into a free spare slot, see [`LiveBackends::add`].
    fn fill_spare(
        &self,
        slots: &mut [Slot],
        config: &BackendConfig,
        workers_given: bool,
    ) -> Result<Added, LiveError> {
        let snap = self.handle.snapshot();
        let free = (0..slots.len()).find(|&b| {
            slots[b].spare && slots[b].moving.is_none() && Self::drained(&snap, slots, b)
        });
        self.fill_slot(slots, free, config, workers_given)
    }

    /// Fills spare slot `b` (free: empty, its last drain over) with `config`'s backend,
    /// with the slot's workers unless `workers_given`; `None`: no slot is free.
    fn fill_slot(
        &self,
        slots: &mut [Slot],
        b: Option<usize>,
        config: &BackendConfig,
        workers_given: bool,
    ) -> Result<Added, LiveError> {
        let Some(kind) = self.spare_kind else {
            return Err(LiveError::NoSlot(config.name.clone()));
        };
        if config.kind != kind {
            return Err(LiveError::Invalid(format!(
                "backend '{}': spare slots run kind = \"{}\" backends here ({} batching); \
                 a kind = \"{}\" backend needs its [[backends]] table at start",
                config.name,
                kind_name(kind),
                if kind == BackendKindName::Sim {
                    "continuous"
                } else {
                    "request"
                },
                kind_name(config.kind)
            )));
        }
        let Some(b) = b else {
            return Err(LiveError::NoSlot(config.name.clone()));
        };
        let workers = slots[b].config.max_concurrent_batches;
        let mut config = config.clone();
        if !workers_given {
            config.max_concurrent_batches = workers;
        }
        let config = &config;
        if config.max_concurrent_batches != workers {
            return Err(LiveError::Invalid(format!(
                "backend '{}': a spare slot runs max_concurrent_batches = {workers} (fixed at \
                 start); leave it unset or set {workers}",
                config.name
            )));
        }
        let mut next = config.clone();
        next.spare = false;
        let was = std::mem::replace(&mut slots[b].config, next);
        refill(&slots[b], config);
        let names = lock(&self.names).clone();
        if let Err(e) = self.swap_tables(slots, &names) {
            slots[b].config = was;
            refill(&slots[b], &slots[b].config);
            return Err(e);
        }
        if let Err(e) = self.ask(slots, b, SlotState::Active) {
            // Put the slot back as it was (its name too), so the refusal changes nothing.
            let back = std::mem::replace(&mut slots[b].config, was);
            refill(&slots[b], &slots[b].config);
            if self.swap_tables(slots, &names).is_err() {
                slots[b].config = back;
                refill(&slots[b], &slots[b].config);
                tracing::warn!(backend = %config.name,
                    "spare slot keeps the new name, empty: the engine is busy; add it again");
            }
            return Err(e);
        }
        self.forget_health(b);
        tracing::info!(backend = %config.name, slot = b, base_url = ?config.base_url,
            "new backend in a spare slot");
        Ok(Added::Active)
    }

    /// Builds the engine's next tables from every slot's table and `names`, hands them to
    /// the engine, and once it took them publishes the io threads' copy and the metrics
    /// names. Refused (a slot that changes backend still holds requests, a table that
    /// does not check) or busy: nothing changed.
    fn swap_tables(&self, slots: &[Slot], names: &Names) -> Result<(), LiveError> {
        let base = lock(&self.io_router).clone();
        let configs: Vec<BackendConfig> = slots.iter().map(|s| s.config.clone()).collect();
        let tables = base
            .next_tables(&configs, &names.aliases, &names.fallbacks)
            .map_err(|e| LiveError::Invalid(e.to_string()))?;
        let io_copy = base.lookup_copy_with(tables.clone());
        match self
            .handle
            .swap_tables(EngineTables::new(tables), SWAP_TIMEOUT)
            .map_err(|_| LiveError::Busy)?
        {
            TablesAnswer::Taken => {}
            TablesAnswer::Refused(b) => {
                return Err(LiveError::Invalid(format!(
                    "backend slot '{}' still holds requests; try again once it is empty",
                    slots.get(b).map_or("?", |s| s.config.name.as_str())
                )))
            }
        }
        self.handle
            .set_backend_names(configs.iter().map(|c| c.name.clone()).collect());
        *lock(&self.io_router) = Arc::new(io_copy);
        // Release: an io thread that sees the bump sees the copy stored above.
        self.io_generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Aliases and fallbacks from now on (a reload): the engine's and io threads' tables
    /// are swapped. A pair that does not check is refused (nothing changes).
    pub fn set_names(
        &self,
        aliases: &BTreeMap<String, String>,
        fallbacks: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), LiveError> {
        let slots = lock(&self.slots);
        let next = Names {
            aliases: aliases.clone(),
            fallbacks: fallbacks.clone(),
        };
        if *lock(&self.names) == next {
            return Ok(());
        }
        self.swap_tables(&slots, &next)?;
        *lock(&self.names) = next;
        Ok(())
    }

    /// Finishes the moves whose drain is over (each takes its new address and becomes
    /// active). Called by the live thread every few tens of milliseconds.
    pub fn settle(&self) -> usize {
        let mut slots = lock(&self.slots);
        if slots.iter().all(|s| s.moving.is_none()) {
            return 0;
        }
        let snap = self.handle.snapshot();
        let mut moved = 0;
        for b in 0..slots.len() {
            let Some(next) = slots[b].moving.clone() else {
                continue;
            };
            if Self::drained(&snap, &slots, b) && self.move_now(&mut slots, b, &next).is_ok() {
                moved += 1;
            }
        }
        moved
    }

    /// Slot `b` holds nothing: not asked to be active, and the engine published `Empty`
    /// after taking the slot's last ask (its `seq`), so the `Empty` is not one from before
    /// that ask (a drain that has not begun, or is not over).
    fn drained(snap: &Snapshot, slots: &[Slot], b: usize) -> bool {
        let s = &slots[b];
        s.asked != SlotState::Active
            && snap
                .backends
                .get(b)
                .is_some_and(|c| c.slot == SlotState::Empty && c.slot_seq == s.seq)
    }

    /// One discovery round's answer for plan `plan`: slots whose address disappeared
    /// drain; a new address fills an empty slot (or takes back the draining slot it had).
    /// Returns how many slots it asked to change.
    pub fn apply_discovered(&self, plan: usize, addresses: &[SocketAddr]) -> usize {
        let snap = self.handle.snapshot();
        let mut slots = lock(&self.slots);
        let mine = self.plans[plan].slots.clone();
        let mut changed = 0;
        for &b in &mine {
            let gone = slots[b].address.is_none_or(|a| !addresses.contains(&a));
            if slots[b].asked == SlotState::Active && gone {
                tracing::info!(backend = %slots[b].config.name, address = ?slots[b].address,
                    "discovered address gone: draining");
                changed += usize::from(self.ask(&mut slots, b, SlotState::Draining).is_ok());
            }
        }
        for (i, &addr) in addresses.iter().enumerate() {
            if addresses[..i].contains(&addr) {
                continue;
            }
            if let Some(&b) = mine.iter().find(|&&b| slots[b].address == Some(addr)) {
                if slots[b].asked != SlotState::Active {
                    changed += usize::from(self.ask(&mut slots, b, SlotState::Active).is_ok());
                }
                continue;
            }
            // Free: its own last drain is over (not an `Empty` published before it).
            let free = mine
                .iter()
                .copied()
                .find(|&b| Self::drained(&snap, &slots, b));
            let Some(b) = free else {
                tracing::warn!(dns = %self.plans[plan].discovery.dns, address = %addr,
                    "discovered address left out: every slot is in use or still draining \
                     (raise discovery.max_addresses)");
                continue;
            };
            let url = format!("http://{addr}");
            let key = slots[b].config.api_key.clone();
            let config = BackendConfig {
                base_url: Some(url),
                ..slots[b].config.clone()
            };
            if self.move_now(&mut slots, b, &config).is_ok() {
                slots[b].address = Some(addr);
                tracing::info!(backend = %slots[b].config.name, address = %addr,
                    "discovered address added");
                changed += 1;
            }
            debug_assert_eq!(key, slots[b].config.api_key);
        }
        changed
    }

    /// Asks the engine to move slot `b` to `state` (a no-op when it was last asked that).
    fn ask(&self, slots: &mut [Slot], b: usize, state: SlotState) -> Result<(), LiveError> {
        if slots[b].asked == state {
            return Ok(());
        }
        let seq = slots[b].seq.wrapping_add(1);
        self.handle
            .set_slot(BackendId::from_index(b), state, seq)
            .map_err(|_| LiveError::Busy)?;
        slots[b].asked = state;
        slots[b].seq = seq;
        tracing::info!(backend = %slots[b].config.name, state = state.as_str(), "backend slot");
        Ok(())
    }
}

/// Makes an upstream slot's client `config`'s backend (name, address, key, prompt arrays);
/// nothing for other kinds.
fn refill(slot: &Slot, config: &BackendConfig) {
    if let (Some(cell), Some(url)) = (&slot.upstream, config.base_url.as_deref()) {
        cell.refill(crate::exec::upstream::UpstreamTarget {
            name: config.name.clone(),
            base_url: url.to_string(),
            api_key: config.api_key.as_ref().map(|k| k.expose().to_string()),
            prompt_array: config.prompt_array.unwrap_or(false),
        });
    }
}

/// Points an upstream slot's client at `url` (with `key`); nothing for other kinds.
fn retarget(slot: &Slot, url: Option<&str>, key: Option<&crate::router::ApiKey>) {
    if let (Some(cell), Some(url)) = (&slot.upstream, url) {
        cell.retarget(url, key.map(|k| k.expose().to_string()));
    }
}

fn kind_name(kind: BackendKindName) -> &'static str {
    match kind {
        BackendKindName::Sim => "sim",
        BackendKindName::Upstream => "upstream",
        BackendKindName::Embed => "embed",
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn find(slots: &[Slot], name: &str) -> Result<usize, LiveError> {
    slots
        .iter()
        .position(|s| s.config.name == name)
        .ok_or_else(|| LiveError::NotFound(name.into()))
}

/// The keys of a `[[backends]]` table that are fixed in a running slot (its lanes, its
/// registry entry) and differ between `running` and `next`.
pub fn fixed_keys_differ(running: &BackendConfig, next: &BackendConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if running.kind != next.kind {
        keys.push("kind");
    }
    if running.models != next.models {
        keys.push("models");
    }
    if running.priority != next.priority {
        keys.push("priority");
    }
    if running.max_concurrent_batches != next.max_concurrent_batches {
        keys.push("max_concurrent_batches");
    }
    if running.prompt_array != next.prompt_array {
        keys.push("prompt_array");
    }
    if running.model_dir != next.model_dir || running.truncate != next.truncate {
        keys.push("model_dir/truncate");
    }
    if running.discovery != next.discovery {
        keys.push("discovery");
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::strategy::StrategyKind;
    use crate::router::slots::spare_placeholder;
    use crate::runtime::snapshot::BackendSnapshot;

    fn slot(asked: SlotState, seq: u32) -> Slot {
        Slot {
            config: spare_placeholder("spare-0".into(), BackendKindName::Upstream),
            upstream: None,
            asked,
            seq,
            address: None,
            plan: None,
            spare: true,
            moving: None,
        }
    }

    fn published(slot: SlotState, slot_seq: u32) -> Snapshot {
        let mut snap = Snapshot::new(1, StrategyKind::Auto);
        snap.backends = vec![BackendSnapshot {
            slot,
            slot_seq,
            ..Default::default()
        }];
        snap
    }

    #[test]
    fn an_empty_slot_is_free_only_once_the_engine_took_the_last_ask() {
        // Started empty (discovery, spare): nothing asked yet, seq 0 both sides.
        assert!(LiveBackends::drained(
            &published(SlotState::Empty, 0),
            &[slot(SlotState::Draining, 0)],
            0
        ));
        // Asked active then draining again (seq 2) while the snapshot still shows the
        // `Empty` from before (seq 0): the slot may hold requests; not free.
        assert!(!LiveBackends::drained(
            &published(SlotState::Empty, 0),
            &[slot(SlotState::Draining, 2)],
            0
        ));
        // The engine took ask 2 and is still draining: not free.
        assert!(!LiveBackends::drained(
            &published(SlotState::Draining, 2),
            &[slot(SlotState::Draining, 2)],
            0
        ));
        // Its drain is over: free.
        assert!(LiveBackends::drained(
            &published(SlotState::Empty, 2),
            &[slot(SlotState::Draining, 2)],
            0
        ));
        // Asked active: never free, whatever was published.
        assert!(!LiveBackends::drained(
            &published(SlotState::Empty, 3),
            &[slot(SlotState::Active, 3)],
            0
        ));
    }
}
