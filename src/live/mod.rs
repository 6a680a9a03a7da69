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

use crate::config::{Config, ConfigError};
use crate::exec::upstream::UpstreamSlot;
use crate::router::{
    BackendConfig, BackendId, BackendKindName, DiscoveryPlan, Registry, SlotState,
};
use crate::runtime::Handle;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Re-reads the config (file, environment, flags) as at start, for a reload.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// The control plane over the backend slots. See the module doc.
pub struct LiveBackends {
    handle: Arc<Handle>,
    slots: Mutex<Vec<Slot>>,
    /// The `discovery` tables, as expanded at start (their slots are fixed).
    plans: Vec<DiscoveryPlan>,
    /// How a reload reads the config again; `None`: abe was started without one.
    source: Mutex<Option<ConfigSource>>,
    /// The config as running: the start's, with what reloads applied. A reload is judged
    /// against it.
    running: Mutex<Config>,
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
    /// A discovery slot's address (kept while it drains, so an address that comes back
    /// takes its old slot again).
    address: Option<SocketAddr>,
    /// Index into `plans` of the discovery table it belongs to.
    plan: Option<usize>,
}

/// Why a change was refused (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no backend named '{0}' (GET /admin/backends lists them)")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "no slot for a backend named '{0}': abe keeps a slot for every [[backends]] table it \
         started with (and max_addresses per discovery table); add the table to the config \
         and restart, or re-add a backend that was removed"
    )]
    NoSlot(String),
    #[error(
        "backend '{name}': {keys} cannot change while abe runs (only base_url and api_key can); \
         keep them as they are, or restart"
    )]
    Fixed { name: String, keys: String },
    #[error("backend '{name}' is filled by discovery of '{dns}': change its DNS records instead")]
    Discovered { name: String, dns: String },
    #[error("the engine's control queue is full; try again")]
    Busy,
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
}

impl LiveBackends {
    /// The control plane over `backends` (the expanded list the router was built from,
    /// index for index), with each `upstream` one's client cell. Discovery slots start
    /// empty (the caller built the router with them so).
    pub fn new(
        handle: Arc<Handle>,
        backends: &[BackendConfig],
        upstream: Vec<Option<UpstreamSlot>>,
        plans: Vec<DiscoveryPlan>,
        running: Config,
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
                asked: SlotState::Active,
                address: None,
                plan: None,
            })
            .collect();
        for (p, plan) in plans.iter().enumerate() {
            for &b in &plan.slots {
                slots[b].asked = SlotState::Draining;
                slots[b].plan = Some(p);
            }
        }
        LiveBackends {
            handle,
            slots: Mutex::new(slots),
            plans,
            source: Mutex::new(None),
            running: Mutex::new(running),
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
            })
            .collect()
    }

    /// Removes backend `name`: nothing new is routed to it; what it holds finishes, then
    /// its slot is empty. Removing a removed backend changes nothing.
    pub fn remove(&self, name: &str) -> Result<(), LiveError> {
        let mut slots = lock(&self.slots);
        let b = find(&slots, name)?;
        if let Some(p) = slots[b].plan {
            return Err(LiveError::Discovered {
                name: name.into(),
                dns: self.plans[p].discovery.dns.clone(),
            });
        }
        self.ask(&mut slots, b, SlotState::Draining)
    }

    /// Adds backend `config` (a `[[backends]]` table): into the slot of the same name,
    /// which must hold the same kind, models, priority and workers (only the address and
    /// key may differ). Its client is pointed at the new address before the slot takes
    /// work. Adding a backend that is active with the same table changes nothing.
    pub fn add(&self, config: &BackendConfig) -> Result<(), LiveError> {
        Registry::build(std::slice::from_ref(config))
            .map_err(|e| LiveError::Invalid(e.to_string()))?;
        let mut slots = lock(&self.slots);
        let b = match find(&slots, &config.name) {
            Ok(b) => b,
            Err(_) => return Err(LiveError::NoSlot(config.name.clone())),
        };
        if let Some(p) = slots[b].plan {
            return Err(LiveError::Discovered {
                name: config.name.clone(),
                dns: self.plans[p].discovery.dns.clone(),
            });
        }
        let fixed = fixed_keys_differ(&slots[b].config, config);
        if !fixed.is_empty() {
            return Err(LiveError::Fixed {
                name: config.name.clone(),
                keys: fixed.join(", "),
            });
        }
        let slot = &mut slots[b];
        let moved =
            slot.config.base_url != config.base_url || slot.config.api_key != config.api_key;
        if moved {
            if let (Some(cell), Some(url)) = (&slot.upstream, config.base_url.as_deref()) {
                cell.retarget(url, config.api_key.as_ref().map(|k| k.expose().to_string()));
            }
            slot.config.base_url = config.base_url.clone();
            slot.config.api_key = config.api_key.clone();
            tracing::info!(backend = %config.name, base_url = ?config.base_url, "backend moved");
        }
        self.ask(&mut slots, b, SlotState::Active)
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
            // Free: not asked to be active, and the engine says it holds nothing.
            let free = mine.iter().copied().find(|&b| {
                slots[b].asked != SlotState::Active
                    && snap
                        .backends
                        .get(b)
                        .is_some_and(|c| c.slot == SlotState::Empty)
            });
            let Some(b) = free else {
                tracing::warn!(dns = %self.plans[plan].discovery.dns, address = %addr,
                    "discovered address left out: every slot is in use or still draining \
                     (raise discovery.max_addresses)");
                continue;
            };
            let url = format!("http://{addr}");
            let slot = &mut slots[b];
            if let Some(cell) = &slot.upstream {
                cell.retarget(
                    &url,
                    slot.config.api_key.as_ref().map(|k| k.expose().to_string()),
                );
            }
            slot.config.base_url = Some(url);
            slot.address = Some(addr);
            tracing::info!(backend = %slot.config.name, address = %addr, "discovered address added");
            changed += usize::from(self.ask(&mut slots, b, SlotState::Active).is_ok());
        }
        changed
    }

    /// Asks the engine to move slot `b` to `state` (a no-op when it was last asked that).
    fn ask(&self, slots: &mut [Slot], b: usize, state: SlotState) -> Result<(), LiveError> {
        if slots[b].asked == state {
            return Ok(());
        }
        self.handle
            .set_slot(BackendId::from_index(b), state)
            .map_err(|_| LiveError::Busy)?;
        slots[b].asked = state;
        tracing::info!(backend = %slots[b].config.name, state = state.as_str(), "backend slot");
        Ok(())
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
