//! The backend registry: every backend abe can route to (a local `sim` worker pool, a local
//! `embed` model, or a remote OpenAI-compatible `upstream`), the models each serves with their capabilities,
//! and each backend's live state (health, circuit, pending batches, latency EMA).
//!
//! Built once from the `[[backends]]` tables ([`BackendConfig`]) and validated with errors
//! that name the backend, the model and the key. Ids are dense (`0..len`), so live state is
//! a plain `Vec` indexed by [`BackendId`], owned and updated by the engine thread through
//! `&mut self` methods. Nothing here may take a lock, read a clock, do I/O, or allocate
//! after [`Registry::build`]: health probes and latency measurements happen elsewhere and
//! are handed in as values.

use super::capabilities::Capabilities;
use super::error::RouterConfigError;
use super::requirements::Requirements;
pub use super::slot::SlotState;
use crate::core::circuit::CircuitState;
use crate::core::lora::{AdapterId, AdapterSet};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// Weight of a new latency sample in the EMA: `ema = ema + ALPHA * (sample - ema)`.
/// 0.2 follows a shift in about five samples and smooths single outliers.
pub const LATENCY_EMA_ALPHA: f64 = 0.2;

/// `priority` of a backend whose table does not set it: the middle of the range the smart
/// score distinguishes (0..=100).
pub const PRIORITY_DEFAULT: u32 = 50;

/// `max_concurrent_batches` of a `sim` backend whose table does not set it, and of a spare
/// slot (an `embed` backend's is 1, an `upstream` backend's
/// [`UPSTREAM_CONCURRENT_BATCHES_DEFAULT`]: `config::KindDefaults`).
pub const MAX_CONCURRENT_BATCHES_DEFAULT: u32 = 4;

/// `max_concurrent_batches` of an `upstream` backend whose table does not set it: requests
/// in flight to it at once (one worker thread each; without prompt arrays a batch is one
/// request, [`Backend::alone`]). A server that batches for itself (vLLM, SGLang,
/// llama.cpp with parallel slots) serves more at once the more it is sent: at 4, abe in
/// front of a continuous-batching server served 0.39x of what the server served its clients
/// directly (BENCHMARKS.md, "Upstream defaults"). 64 is also the connections each backend's
/// pool keeps alive.
pub const UPSTREAM_CONCURRENT_BATCHES_DEFAULT: u32 = 64;

/// `max_concurrent_batches` of a backend of `kind` whose table does not set it (and of a
/// spare slot of that kind): [`MAX_CONCURRENT_BATCHES_DEFAULT`] for `sim`,
/// [`UPSTREAM_CONCURRENT_BATCHES_DEFAULT`] for `upstream`, 1 for `embed` (one forward pass
/// already uses every core; `config::KindDefaults` says why).
pub const fn concurrent_batches_default(kind: BackendKindName) -> u32 {
    match kind {
        BackendKindName::Sim => MAX_CONCURRENT_BATCHES_DEFAULT,
        BackendKindName::Upstream => UPSTREAM_CONCURRENT_BATCHES_DEFAULT,
        BackendKindName::Embed => 1,
    }
}

/// Dense index of a backend: `0..registry.len()`, in `[[backends]]` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub(crate) u32);

impl BackendId {
    /// The first backend (a placeholder value for tables filled later).
    pub const FIRST: BackendId = BackendId(0);

    /// The backend at `index` in `[[backends]]` order.
    pub const fn from_index(index: usize) -> BackendId {
        BackendId(index as u32)
    }

    /// As an index into per-backend arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Dense index of a model some backend serves: `0..registry.model_count()`, in order of
/// first appearance in `[[backends]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub(crate) u32);

impl ModelId {
    /// The model at `index` of the registry.
    pub const fn from_index(index: usize) -> ModelId {
        ModelId(index as u32)
    }

    /// As an index into per-model arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// `kind` of a `[[backends]]` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKindName {
    /// A local pool of simulated workers (the `sim` executor).
    Sim,
    /// A remote OpenAI-compatible server (the `upstream` executor).
    Upstream,
    /// A sentence-transformers model run on this machine's CPU (the `embed` executor; needs
    /// abe built with `--features embed`).
    Embed,
}

/// An API key. Its `Debug` and its serialised form are redacted (`"<redacted>"`), so
/// configs and registries can be logged and `abe config show` never prints the key.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// What `Debug` and `Serialize` show instead of the key.
    pub const REDACTED: &'static str = "<redacted>";
}

impl Serialize for ApiKey {
    /// Always `"<redacted>"`: a serialised config is for people to read, never a way to
    /// carry the key somewhere else.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(Self::REDACTED)
    }
}

impl ApiKey {
    /// A key from its text.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the `Authorization: Bearer` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({})", Self::REDACTED)
    }
}

/// One `[[backends.models]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name requests use (`"model"` in the request body).
    pub name: String,
    /// Longest request, in estimated tokens, this model takes on this backend. Required
    /// for `sim` and `upstream`; an `embed` model's defaults to its directory's longest
    /// input (`Config::check` reads `sentence_bert_config.json`'s `max_seq_length`, else
    /// `config.json`'s `max_position_embeddings`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// What it can do beyond text; all `false` when omitted.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// LoRA adapters served on this model (`"name"` or `{ name, path }`), loaded at start;
    /// requests name one as their `model` (`router::lora`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<super::lora::AdapterConfig>,
}

/// One `[[backends]]` table, as written in the config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Unique name; appears in metrics and in the routing response header.
    pub name: String,
    /// `sim`, `upstream` or `embed`.
    pub kind: BackendKindName,
    /// `upstream` only: where the OpenAI-compatible API lives (`http://host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `upstream` only, optional: sent as `Authorization: Bearer <key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ApiKey>,
    /// `embed` only: a sentence-transformers model directory (config.json,
    /// model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_dir: Option<String>,
    /// `embed` only: an input longer than the model's max_seq_length is cut to it, as
    /// sentence-transformers does (`true`, the default), or refused with a 400 (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Lower is preferred (0 is best; the smart score stops telling apart above 100).
    #[serde(default = "priority_default")]
    pub priority: u32,
    /// Batches this backend may run at once; at least 1.
    #[serde(default = "max_concurrent_batches_default")]
    pub max_concurrent_batches: u32,
    /// Whether one completions request may carry an array of prompts. Unset: `true` for
    /// `sim`, `false` for `upstream` (not every server accepts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_array: Option<bool>,
    /// The models it serves; at least one.
    pub models: Vec<ModelConfig>,
    /// `upstream` only, instead of `base_url`: follow a DNS name; every address it resolves
    /// to becomes a backend of its own (see [`super::slots`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<super::discovery::Discovery>,
    /// Set by abe, never by a file: a spare slot not yet filled (`routing.spare_backend_slots`,
    /// see [`super::slots`]). It serves no models, so its table needs none.
    #[serde(skip)]
    pub spare: bool,
}

fn priority_default() -> u32 {
    PRIORITY_DEFAULT
}

fn max_concurrent_batches_default() -> u32 {
    MAX_CONCURRENT_BATCHES_DEFAULT
}

impl BackendConfig {
    /// The backend abe serves when no `[[backends]]` is configured: one `sim` pool serving
    /// `model` with every capability.
    pub fn default_sim(model: &str, context_length: u32) -> BackendConfig {
        BackendConfig {
            name: "sim".into(),
            kind: BackendKindName::Sim,
            base_url: None,
            api_key: None,
            model_dir: None,
            truncate: None,
            priority: 0,
            max_concurrent_batches: MAX_CONCURRENT_BATCHES_DEFAULT,
            prompt_array: None,
            models: vec![ModelConfig {
                name: model.into(),
                context_length: Some(context_length),
                capabilities: Capabilities {
                    vision: true,
                    tools: true,
                    json_mode: true,
                },
                adapters: Vec::new(),
            }],
            discovery: None,
            spare: false,
        }
    }
}

/// Where a backend's work runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Local simulated workers.
    Sim,
    /// A remote OpenAI-compatible server.
    Upstream {
        /// Without a trailing `/`.
        base_url: String,
        api_key: Option<ApiKey>,
    },
    /// A sentence-transformers model on this machine.
    Embed {
        model_dir: std::path::PathBuf,
        /// Inputs longer than the model's max_seq_length are cut (else refused).
        truncate: bool,
    },
}

/// A backend's static description (never changes after build).
#[derive(Clone, Debug)]
pub struct Backend {
    name: Box<str>,
    kind: BackendKind,
    priority: u32,
    max_concurrent_batches: u32,
    accepts_prompt_array: bool,
    /// The models it serves, in its table's order.
    models: Box<[ModelId]>,
}

impl Backend {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn kind(&self) -> &BackendKind {
        &self.kind
    }
    /// Lower is preferred.
    pub fn priority(&self) -> u32 {
        self.priority
    }
    pub fn max_concurrent_batches(&self) -> u32 {
        self.max_concurrent_batches
    }
    /// One completions request may carry an array of prompts.
    pub fn accepts_prompt_array(&self) -> bool {
        self.accepts_prompt_array
    }
    /// Which of its requests go in a batch of their own (`core::CoreConfig::alone`). An
    /// `upstream` backend's executor sends a chat or a stream as a request of its own, and a
    /// plain completion too without prompt arrays, and answers the batch when the last is
    /// back, so a batch of several only holds each answer for the slowest (BENCHMARKS.md,
    /// "Upstream defaults"); the server behind it batches for itself. Its embeddings always
    /// batch: a batch of them goes as one input array. The other kinds run a batch as one.
    pub fn alone(&self) -> crate::core::Alone {
        match (&self.kind, self.accepts_prompt_array) {
            (BackendKind::Upstream { .. }, false) => crate::core::Alone::Completions,
            (BackendKind::Upstream { .. }, true) => crate::core::Alone::OwnRequests,
            _ => crate::core::Alone::Never,
        }
    }
    pub fn models(&self) -> &[ModelId] {
        &self.models
    }
}

/// One backend's offer of one model: what the routing hot loop reads, packed together.
/// `priority` is a copy of the backend's, so scoring touches one array less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub backend: BackendId,
    pub priority: u32,
    pub context_length: u32,
    /// An `embed` backend: its executor tokenizes each input and cuts it to the model's
    /// longest (`truncate`, the default, as sentence-transformers does) or refuses that one
    /// input with the exact token count (`truncate = false`), so the router's chars / 4
    /// estimate never judges an input's length for it (it could only disagree).
    pub length_checked_by_executor: bool,
    pub capabilities: Capabilities,
}

impl Offer {
    /// This offer could take `req`, whatever its backend's live state: the context is long
    /// enough (or the executor judges length) and every capability it needs is there.
    #[inline]
    pub fn capable(&self, req: &Requirements<'_>) -> bool {
        self.fits(req.estimated_tokens) && self.capabilities.covers(req.needs)
    }

    /// A request of `estimated_tokens` is not too long for it (an embeddings request is
    /// checked one input at a time, as the executor runs it).
    #[inline]
    pub fn fits(&self, estimated_tokens: u32) -> bool {
        self.length_checked_by_executor || self.context_length >= estimated_tokens
    }
}

/// A backend's live state. Starts healthy with a closed circuit, nothing pending and no
/// latency measured; changed only through [`Registry`]'s methods.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackendState {
    healthy: bool,
    circuit: CircuitState,
    /// Batches dispatched and not yet finished.
    pending_batches: u32,
    /// Work routed here and not yet finished, in prompt-token equivalents (each request's
    /// [`Decision::work`](super::Decision::work), added by [`Registry::work_started`] and
    /// taken off by [`Registry::work_finished`]); 0 when the caller does not feed it.
    pending_work: u64,
    /// `None` until the first measurement; then finite and `>= 0`.
    latency_ema_ms: Option<f64>,
    /// Whether the backend takes new work at all (it may be draining or an empty slot).
    slot: SlotState,
}

impl BackendState {
    const INITIAL: BackendState = BackendState {
        healthy: true,
        circuit: CircuitState::Closed,
        pending_batches: 0,
        pending_work: 0,
        latency_ema_ms: None,
        slot: SlotState::Active,
    };

    pub fn healthy(&self) -> bool {
        self.healthy
    }
    pub fn circuit(&self) -> CircuitState {
        self.circuit
    }
    pub fn pending_batches(&self) -> u32 {
        self.pending_batches
    }
    pub fn pending_work(&self) -> u64 {
        self.pending_work
    }
    pub fn latency_ema_ms(&self) -> Option<f64> {
        self.latency_ema_ms
    }
    /// Active, draining or empty.
    pub fn slot(&self) -> SlotState {
        self.slot
    }
    /// May receive new work: an active slot, healthy, circuit closed.
    #[inline]
    pub fn routable(&self) -> bool {
        self.healthy && matches!(self.circuit, CircuitState::Closed) && self.slot.is_active()
    }
}

/// A model some backend serves: its name and where its offers sit in `Registry::offers`.
#[derive(Clone, Debug)]
struct ModelEntry {
    name: Box<str>,
    /// `offers[start..end]` are this model's, in `[[backends]]` order.
    start: u32,
    end: u32,
}

/// Every backend and model, with live state. See the module doc.
#[derive(Clone, Debug)]
pub struct Registry {
    /// By `BackendId`.
    backends: Vec<Backend>,
    /// By `BackendId`; the only part that changes after build.
    state: Vec<BackendState>,
    /// By `ModelId`.
    models: Vec<ModelEntry>,
    /// Grouped by model (see `ModelEntry`), then in backend order.
    offers: Vec<Offer>,
    backend_ids: HashMap<Box<str>, BackendId>,
    model_ids: HashMap<Box<str>, ModelId>,
    /// Largest `offers(model).len()`: what a scratch buffer of candidates must hold.
    offers_per_model_max: usize,
    /// By `BackendId`: the configured LoRA adapters its models list (ids as
    /// `router::lora::configured` numbers them).
    lora_listed: Vec<AdapterSet>,
    /// Every configured adapter. One loaded at run time (not configured) runs on every
    /// backend of its base model.
    lora_configured: AdapterSet,
    /// The configured adapters (name, base model) by id - 1, fixed at start.
    lora_adapters: Vec<(Box<str>, Box<str>)>,
}

impl Registry {
    /// May `backend` serve requests of LoRA adapter `adapter`? Always for the base model
    /// and for adapters loaded at run time (on every backend of their base model); a
    /// configured adapter only where a model lists it.
    #[inline]
    pub fn lora_eligible(&self, backend: BackendId, adapter: AdapterId) -> bool {
        adapter == crate::core::lora::BASE_MODEL
            || !self.lora_configured.contains(adapter)
            || self.lora_listed[backend.index()].contains(adapter)
    }

    /// Validates every table and builds the registry. An empty list is allowed (every
    /// request is then a 404); the caller substitutes [`BackendConfig::default_sim`] when
    /// the config has no `[[backends]]`.
    pub fn build(configs: &[BackendConfig]) -> Result<Registry, RouterConfigError> {
        Registry::build_after(configs, None)
    }

    /// As [`build`](Self::build), keeping `prior`'s model ids: its models come first, in
    /// its order, even those no table serves any more (they then have no offers), so a
    /// `ModelId` handed out by `prior` means the same model in the result. What a running
    /// router's next tables are built with (`router::tables`).
    pub fn build_after(
        configs: &[BackendConfig],
        prior: Option<&Registry>,
    ) -> Result<Registry, RouterConfigError> {
        let mut backends = Vec::with_capacity(configs.len());
        let mut backend_ids = HashMap::with_capacity(configs.len());
        let mut model_ids: HashMap<Box<str>, ModelId> = HashMap::new();
        let mut model_names: Vec<Box<str>> = Vec::new();
        for m in prior.map_or(&[][..], |p| &p.models[..]) {
            model_ids.insert(m.name.clone(), ModelId(dense(model_names.len(), "models")?));
            model_names.push(m.name.clone());
        }
        // (model, offer) pairs in backend order; grouped by model below.
        let mut pairs: Vec<(ModelId, Offer)> = Vec::new();

        for (i, cfg) in configs.iter().enumerate() {
            let backend = validate_backend(i, cfg)?;
            let id = BackendId(dense(backends.len(), "[[backends]]")?);
            if backend_ids.insert(backend.name.clone(), id).is_some() {
                return Err(RouterConfigError::Backend {
                    backend: cfg.name.clone(),
                    key: "name",
                    why: "another [[backends]] table has the same name; names must be unique"
                        .into(),
                });
            }
            let length_checked_by_executor = matches!(backend.kind, BackendKind::Embed { .. });
            let mut served = Vec::with_capacity(cfg.models.len());
            for (j, m) in cfg.models.iter().enumerate() {
                let context_length = validate_model(cfg, j, m)?;
                let model = match model_ids.get(m.name.as_str()) {
                    Some(&id) => id,
                    None => {
                        let id = ModelId(dense(model_names.len(), "models")?);
                        model_ids.insert(m.name.as_str().into(), id);
                        model_names.push(m.name.as_str().into());
                        id
                    }
                };
                if served.contains(&model) {
                    return Err(RouterConfigError::Model {
                        backend: cfg.name.clone(),
                        model: m.name.clone(),
                        key: "name",
                        why: "listed twice for this backend; keep one [[backends.models]] \
                              table per model"
                            .into(),
                    });
                }
                served.push(model);
                pairs.push((
                    model,
                    Offer {
                        backend: id,
                        priority: cfg.priority,
                        context_length,
                        length_checked_by_executor,
                        capabilities: m.capabilities,
                    },
                ));
            }
            backends.push(Backend {
                models: served.into_boxed_slice(),
                ..backend
            });
        }

        // Stable sort keeps backend order within a model: ties in every strategy go to the
        // backend listed first.
        pairs.sort_by_key(|&(model, _)| model);
        let mut models: Vec<ModelEntry> = model_names
            .into_iter()
            .map(|name| ModelEntry {
                name,
                start: 0,
                end: 0,
            })
            .collect();
        let offers: Vec<Offer> = pairs.iter().map(|&(_, o)| o).collect();
        let offers_len = dense(offers.len(), "offers")?;
        let mut at = 0u32;
        let mut offers_per_model_max = 0;
        for (m, entry) in models.iter_mut().enumerate() {
            entry.start = at;
            while at < offers_len && pairs[at as usize].0.index() == m {
                at += 1;
            }
            entry.end = at;
            offers_per_model_max = offers_per_model_max.max((entry.end - entry.start) as usize);
            debug_assert!(
                entry.end > entry.start || m < prior.map_or(0, |p| p.models.len()),
                "every model has an offer, but one a prior registry had"
            );
        }
        debug_assert_eq!(at, offers_len);

        let mut lora_listed = vec![AdapterSet::default(); backends.len()];
        let mut lora_configured = AdapterSet::default();
        let adapter_error = |why: String| RouterConfigError::Backend {
            backend: configs.first().map(|b| b.name.clone()).unwrap_or_default(),
            key: "models.adapters",
            why,
        };
        let configured =
            super::lora::configured(configs).map_err(|e| adapter_error(e.to_string()))?;
        // The configured adapters' ids are fixed at start (the io threads' name table
        // numbers them so): tables built for a running router keep `prior`'s ids by name,
        // and refuse an adapter the start config did not list or one moved to another
        // base model. An adapter no table lists any more keeps its id, served nowhere.
        let mut lora_adapters: Vec<(Box<str>, Box<str>)> =
            prior.map_or_else(Vec::new, |p| p.lora_adapters.clone());
        for c in &configured {
            let at = match lora_adapters.iter().position(|(n, _)| **n == *c.name) {
                Some(i) if *lora_adapters[i].1 != *c.base => {
                    return Err(adapter_error(format!(
                        "LoRA adapter '{}' has served base model '{}' since start; it cannot move \
                         to '{}' while abe serves (restart to change it)",
                        c.name, lora_adapters[i].1, c.base
                    )))
                }
                Some(i) => i,
                None if prior.is_some() => {
                    return Err(adapter_error(format!(
                        "LoRA adapter '{}' is new: the adapters a config lists are fixed at start \
                         (restart, or load it at run time with POST /v1/load_lora_adapter)",
                        c.name
                    )))
                }
                None => {
                    lora_adapters.push((c.name.as_str().into(), c.base.as_str().into()));
                    lora_adapters.len() - 1
                }
            };
            let id = AdapterId::try_from(at + 1).unwrap_or(AdapterId::MAX);
            for &b in &c.backends {
                lora_listed[b].insert(id);
            }
        }
        for i in 0..lora_adapters.len() {
            lora_configured.insert(AdapterId::try_from(i + 1).unwrap_or(AdapterId::MAX));
        }
        Ok(Registry {
            lora_listed,
            lora_configured,
            lora_adapters,
            state: vec![BackendState::INITIAL; backends.len()],
            backends,
            models,
            offers,
            backend_ids,
            model_ids,
            offers_per_model_max,
        })
    }

    /// Number of backends.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Every backend with its id, in `[[backends]]` order.
    pub fn backends(&self) -> impl ExactSizeIterator<Item = (BackendId, &Backend)> + '_ {
        self.backends
            .iter()
            .enumerate()
            .map(|(i, b)| (BackendId(i as u32), b))
    }

    pub fn backend(&self, id: BackendId) -> &Backend {
        &self.backends[id.index()]
    }

    pub fn backend_id(&self, name: &str) -> Option<BackendId> {
        self.backend_ids.get(name).copied()
    }

    /// Number of distinct models served.
    pub fn model_count(&self) -> usize {
        self.models.len()
    }

    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.model_ids.get(name).copied()
    }

    pub fn model_name(&self, id: ModelId) -> &str {
        &self.models[id.index()].name
    }

    /// The model's name, `None` for an id this registry does not have (one handed out by
    /// newer tables than a lookup copy holds: see `router::tables`).
    pub fn try_model_name(&self, id: ModelId) -> Option<&str> {
        self.models.get(id.index()).map(|m| &*m.name)
    }

    /// Takes `next`'s backends, models and offers (built by [`build_after`](Self::build_after)
    /// over the same number of slots) and gives it this registry's; the live state stays.
    /// Moves only: nothing is allocated or freed here.
    pub fn adopt_tables(&mut self, next: &mut Registry) {
        assert_eq!(self.len(), next.len(), "the slots are fixed at start");
        std::mem::swap(&mut self.backends, &mut next.backends);
        std::mem::swap(&mut self.models, &mut next.models);
        std::mem::swap(&mut self.offers, &mut next.offers);
        std::mem::swap(&mut self.backend_ids, &mut next.backend_ids);
        std::mem::swap(&mut self.model_ids, &mut next.model_ids);
        std::mem::swap(
            &mut self.offers_per_model_max,
            &mut next.offers_per_model_max,
        );
        // Same ids (`build_after` keeps the prior's), new backends listing them.
        std::mem::swap(&mut self.lora_listed, &mut next.lora_listed);
        std::mem::swap(&mut self.lora_configured, &mut next.lora_configured);
        std::mem::swap(&mut self.lora_adapters, &mut next.lora_adapters);
    }

    /// The model's offers, one per backend serving it, in backend order.
    #[inline]
    pub fn offers(&self, model: ModelId) -> &[Offer] {
        let e = &self.models[model.index()];
        &self.offers[e.start as usize..e.end as usize]
    }

    /// The backends serving a model, in backend order.
    pub fn backends_for(&self, model: ModelId) -> impl ExactSizeIterator<Item = BackendId> + '_ {
        self.offers(model).iter().map(|o| o.backend)
    }

    /// The most backends any one model has.
    pub fn offers_per_model_max(&self) -> usize {
        self.offers_per_model_max
    }

    #[inline]
    pub fn state(&self, id: BackendId) -> &BackendState {
        &self.state[id.index()]
    }

    /// The health checker's verdict.
    pub fn set_healthy(&mut self, id: BackendId, healthy: bool) {
        self.state[id.index()].healthy = healthy;
    }

    /// The backend's slot changed state (added, removed, drained: see [`super::slots`]).
    /// Only [`SlotState::Active`] is routable; the router forgets nothing else here.
    pub fn set_slot(&mut self, id: BackendId, slot: SlotState) {
        self.state[id.index()].slot = slot;
    }

    /// The backend's circuit breaker moved.
    pub fn set_circuit(&mut self, id: BackendId, circuit: CircuitState) {
        self.state[id.index()].circuit = circuit;
    }

    /// A batch was dispatched to the backend.
    pub fn batch_started(&mut self, id: BackendId) {
        let s = &mut self.state[id.index()];
        s.pending_batches = s.pending_batches.saturating_add(1);
    }

    /// A batch dispatched to the backend finished (either way).
    pub fn batch_finished(&mut self, id: BackendId) {
        let s = &mut self.state[id.index()];
        debug_assert!(
            s.pending_batches > 0,
            "batch_finished without batch_started"
        );
        s.pending_batches = s.pending_batches.saturating_sub(1);
    }

    /// A request estimated at `work` (its [`Decision::work`](super::Decision::work)) was
    /// admitted to the backend: `prefix_aware`'s balance rule counts it until
    /// [`work_finished`](Self::work_finished) takes the same amount off.
    pub fn work_started(&mut self, id: BackendId, work: u64) {
        let s = &mut self.state[id.index()];
        s.pending_work = s.pending_work.saturating_add(work);
    }

    /// A request admitted with `work` finished or failed (or moved to another backend).
    pub fn work_finished(&mut self, id: BackendId, work: u64) {
        let s = &mut self.state[id.index()];
        debug_assert!(s.pending_work >= work, "work_finished without work_started");
        s.pending_work = s.pending_work.saturating_sub(work);
    }

    /// Folds one measured latency into the backend's EMA. Negative or non-finite samples
    /// are a caller bug; they are clamped to 0 in release builds.
    pub fn record_latency_ms(&mut self, id: BackendId, sample_ms: f64) {
        debug_assert!(
            sample_ms.is_finite() && sample_ms >= 0.0,
            "latency sample {sample_ms}"
        );
        let sample = if sample_ms.is_finite() && sample_ms > 0.0 {
            sample_ms
        } else {
            0.0
        };
        let s = &mut self.state[id.index()];
        s.latency_ema_ms = Some(match s.latency_ema_ms {
            None => sample,
            Some(ema) => ema + LATENCY_EMA_ALPHA * (sample - ema),
        });
    }
}

fn dense(n: usize, what: &str) -> Result<u32, RouterConfigError> {
    u32::try_from(n).map_err(|_| RouterConfigError::Backend {
        backend: "*".into(),
        key: "models",
        why: format!("more than {} {what}", u32::MAX),
    })
}

fn validate_backend(i: usize, cfg: &BackendConfig) -> Result<Backend, RouterConfigError> {
    let backend_err = |key: &'static str, why: String| RouterConfigError::Backend {
        backend: if cfg.name.trim().is_empty() {
            format!("#{}", i + 1)
        } else {
            cfg.name.clone()
        },
        key,
        why,
    };
    if cfg.name.trim().is_empty() {
        return Err(backend_err(
            "name",
            "must not be empty; give every backend a unique name".into(),
        ));
    }
    if cfg.discovery.is_some() {
        return Err(backend_err(
            "discovery",
            "is expanded into backend slots before the registry is built \
             (router::slots::expand_discovery, which Config::check calls)"
                .into(),
        ));
    }
    if cfg.kind != BackendKindName::Embed && (cfg.model_dir.is_some() || cfg.truncate.is_some()) {
        return Err(backend_err(
            "model_dir",
            "model_dir and truncate are for kind = \"embed\" only; remove them or set \
             kind = \"embed\""
                .into(),
        ));
    }
    let kind = match cfg.kind {
        BackendKindName::Embed => {
            if cfg.base_url.is_some() || cfg.api_key.is_some() {
                return Err(backend_err(
                    "base_url",
                    "base_url and api_key are for kind = \"upstream\" only; remove them".into(),
                ));
            }
            if !cfg!(feature = "embed") {
                return Err(backend_err(
                    "kind",
                    "kind = \"embed\" needs abe built with the embed feature: \
                     cargo build --release --features embed"
                        .into(),
                ));
            }
            let Some(dir) = cfg.model_dir.as_deref().filter(|d| !d.trim().is_empty()) else {
                return Err(backend_err(
                    "model_dir",
                    "kind = \"embed\" needs model_dir, a sentence-transformers model \
                     directory (see docs/embeddings.md)"
                        .into(),
                ));
            };
            BackendKind::Embed {
                model_dir: dir.into(),
                truncate: cfg.truncate.unwrap_or(true),
            }
        }
        BackendKindName::Sim => {
            if cfg.base_url.is_some() || cfg.api_key.is_some() {
                return Err(backend_err(
                    "base_url",
                    "base_url and api_key are for kind = \"upstream\" only; remove them or \
                     set kind = \"upstream\""
                        .into(),
                ));
            }
            BackendKind::Sim
        }
        BackendKindName::Upstream => {
            let Some(url) = cfg.base_url.as_deref() else {
                return Err(backend_err(
                    "base_url",
                    "kind = \"upstream\" needs base_url, e.g. \"http://127.0.0.1:8000\"".into(),
                ));
            };
            let rest = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.trim_end_matches('/').is_empty()) {
                return Err(backend_err(
                    "base_url",
                    format!(
                        "\"{url}\" is not an http:// or https:// URL with a host, e.g. \
                         \"http://127.0.0.1:8000\""
                    ),
                ));
            }
            if cfg.api_key.as_ref().is_some_and(|k| k.expose().is_empty()) {
                return Err(backend_err(
                    "api_key",
                    "is empty; remove the key or set it".into(),
                ));
            }
            BackendKind::Upstream {
                base_url: url.trim_end_matches('/').to_string(),
                api_key: cfg.api_key.clone(),
            }
        }
    };
    if cfg.max_concurrent_batches == 0 {
        return Err(backend_err(
            "max_concurrent_batches",
            "must be at least 1".into(),
        ));
    }
    if cfg.models.is_empty() && !cfg.spare {
        return Err(backend_err(
            "models",
            "serves no models; add a [[backends.models]] table with name and context_length".into(),
        ));
    }
    Ok(Backend {
        name: cfg.name.as_str().into(),
        accepts_prompt_array: cfg.prompt_array.unwrap_or(matches!(kind, BackendKind::Sim)),
        kind,
        priority: cfg.priority,
        max_concurrent_batches: cfg.max_concurrent_batches,
        models: Box::new([]),
    })
}

/// Checks one `[[backends.models]]` table; its context length.
fn validate_model(
    cfg: &BackendConfig,
    j: usize,
    m: &ModelConfig,
) -> Result<u32, RouterConfigError> {
    let model_err = |key: &'static str, why: &str| RouterConfigError::Model {
        backend: cfg.name.clone(),
        model: if m.name.trim().is_empty() {
            format!("#{}", j + 1)
        } else {
            m.name.clone()
        },
        key,
        why: why.into(),
    };
    if m.name.trim().is_empty() {
        return Err(model_err(
            "name",
            "must not be empty; it is what requests put in \"model\"",
        ));
    }
    match m.context_length {
        Some(0) => Err(model_err(
            "context_length",
            "must be at least 1 (tokens the model accepts, e.g. 8192)",
        )),
        Some(c) => Ok(c),
        None if cfg.kind == BackendKindName::Embed => Err(model_err(
            "context_length",
            "is missing: an embed model's is read from its model_dir by Config::check; \
             set it when building a router from tables directly",
        )),
        None => Err(model_err(
            "context_length",
            "is missing: set the longest request the model takes, in tokens (e.g. 8192)",
        )),
    }
}

/// A `sim` backend for the router's tests, serving `models` as (name, context length,
/// capabilities), with the default `max_concurrent_batches`.
#[cfg(test)]
pub(crate) fn sim_backend(
    name: &str,
    priority: u32,
    models: &[(&str, u32, Capabilities)],
) -> BackendConfig {
    BackendConfig {
        name: name.into(),
        kind: BackendKindName::Sim,
        base_url: None,
        api_key: None,
        model_dir: None,
        truncate: None,
        priority,
        max_concurrent_batches: MAX_CONCURRENT_BATCHES_DEFAULT,
        prompt_array: None,
        discovery: None,
        spare: false,
        models: models
            .iter()
            .map(|&(n, c, capabilities)| ModelConfig {
                name: n.into(),
                context_length: Some(c),
                capabilities,
                adapters: Vec::new(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::sim_backend as sim;
    use super::*;

    #[test]
    fn parses_backends_tables_from_toml() {
        #[derive(Deserialize)]
        struct File {
            backends: Vec<BackendConfig>,
        }
        let f: File = toml::from_str(
            r#"
            [[backends]]
            name = "gpu-a"
            kind = "upstream"
            base_url = "http://10.0.0.1:8000/"
            api_key = "sk-secret"
            priority = 1
            max_concurrent_batches = 8
            prompt_array = true
            [[backends.models]]
            name = "llama3:8b"
            context_length = 8192
            capabilities = { tools = true, json_mode = true }
            [[backends.models]]
            name = "llava"
            context_length = 4096
            capabilities = { vision = true }

            [[backends]]
            name = "local"
            kind = "sim"
            [[backends.models]]
            name = "llama3:8b"
            context_length = 2048
            "#,
        )
        .expect("valid toml");
        let r = Registry::build(&f.backends).expect("valid registry");
        assert_eq!(r.len(), 2);
        assert_eq!(r.model_count(), 2);
        let a = r.backend(r.backend_id("gpu-a").unwrap());
        assert_eq!(a.priority(), 1);
        assert!(a.accepts_prompt_array());
        match a.kind() {
            BackendKind::Upstream { base_url, api_key } => {
                assert_eq!(base_url, "http://10.0.0.1:8000");
                assert_eq!(api_key.as_ref().unwrap().expose(), "sk-secret");
            }
            k => panic!("{k:?}"),
        }
        assert!(
            !format!("{a:?}").contains("sk-secret"),
            "api key is redacted"
        );
        let local = r.backend(r.backend_id("local").unwrap());
        assert_eq!(local.priority(), PRIORITY_DEFAULT);
        assert_eq!(
            local.max_concurrent_batches(),
            MAX_CONCURRENT_BATCHES_DEFAULT
        );
        assert!(
            local.accepts_prompt_array(),
            "sim accepts arrays by default"
        );
        let llama = r.model_id("llama3:8b").unwrap();
        let ids: Vec<_> = r.backends_for(llama).collect();
        assert_eq!(
            ids,
            [BackendId(0), BackendId(1)],
            "backend order within a model"
        );
        assert_eq!(r.offers(llama)[1].context_length, 2048);
        assert!(
            r.offers(r.model_id("llava").unwrap())[0]
                .capabilities
                .vision
        );
        assert_eq!(r.offers_per_model_max(), 2);
    }

    #[test]
    fn unknown_keys_and_kinds_are_rejected_by_serde() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct File {
            backends: Vec<BackendConfig>,
        }
        let e =
            toml::from_str::<File>("[[backends]]\nname='a'\nkind='grpc'\nmodels=[]\n").unwrap_err();
        assert!(e.to_string().contains("upstream"), "{e}");
        let e =
            toml::from_str::<File>("[[backends]]\nname='a'\nkind='sim'\nprioriti=1\nmodels=[]\n")
                .unwrap_err();
        assert!(e.to_string().contains("prioriti"), "{e}");
    }

    fn build_err(cfgs: &[BackendConfig]) -> String {
        Registry::build(cfgs).unwrap_err().to_string()
    }

    #[test]
    fn embed_backends_need_a_model_dir_and_keep_their_keys_to_themselves() {
        let caps = Capabilities::default();
        let mut e = sim("e", 0, &[("minilm", 512, caps)]);
        e.kind = BackendKindName::Embed;
        let err = build_err(&[e.clone()]);
        if cfg!(feature = "embed") {
            assert!(err.contains("'e'") && err.contains("model_dir"), "{err}");
        } else {
            assert!(err.contains("--features embed"), "{err}");
        }
        e.model_dir = Some("/models/minilm".into());
        if cfg!(feature = "embed") {
            let r = Registry::build(&[e.clone()]).unwrap();
            assert_eq!(
                r.backend(BackendId(0)).kind(),
                &BackendKind::Embed {
                    model_dir: "/models/minilm".into(),
                    truncate: true
                }
            );
        }
        let mut s = sim("s", 0, &[("m", 10, caps)]);
        s.truncate = Some(false);
        let err = build_err(&[s]);
        assert!(
            err.contains("'s'") && err.contains("\"embed\" only"),
            "{err}"
        );
        e.base_url = Some("http://x".into());
        assert!(build_err(&[e]).contains("upstream"));
    }

    #[test]
    fn validation_names_backend_model_and_key() {
        let caps = Capabilities::default();
        let ok = sim("a", 0, &[("m", 10, caps)]);

        let e = build_err(&[ok.clone(), ok.clone()]);
        assert!(
            e.contains("'a'") && e.contains("name") && e.contains("unique"),
            "{e}"
        );

        let e = build_err(&[sim("", 0, &[("m", 10, caps)])]);
        assert!(e.contains("'#1'") && e.contains("name"), "{e}");

        let e = build_err(&[sim("a", 0, &[])]);
        assert!(e.contains("'a'") && e.contains("models"), "{e}");

        let e = build_err(&[sim("a", 0, &[("m", 0, caps)])]);
        assert!(
            e.contains("'a'") && e.contains("'m'") && e.contains("context_length"),
            "{e}"
        );

        let e = build_err(&[sim("a", 0, &[("m", 1, caps), ("m", 2, caps)])]);
        assert!(e.contains("'m'") && e.contains("twice"), "{e}");

        let e = build_err(&[sim("a", 0, &[("", 1, caps)])]);
        assert!(e.contains("'#1'") && e.contains("name"), "{e}");

        let mut up = ok.clone();
        up.kind = BackendKindName::Upstream;
        let e = build_err(&[up.clone()]);
        assert!(
            e.contains("'a'") && e.contains("base_url") && e.contains("http://"),
            "{e}"
        );
        up.base_url = Some("ftp://x".into());
        assert!(build_err(&[up.clone()]).contains("ftp://x"));
        up.base_url = Some("http://".into());
        assert!(build_err(&[up.clone()]).contains("base_url"));
        up.base_url = Some("https://h:1".into());
        up.api_key = Some(ApiKey::new(""));
        assert!(build_err(&[up.clone()]).contains("api_key"));

        let mut s = ok.clone();
        s.base_url = Some("http://h".into());
        let e = build_err(&[s]);
        assert!(e.contains("base_url") && e.contains("upstream"), "{e}");

        let mut s = ok;
        s.max_concurrent_batches = 0;
        let e = build_err(&[s]);
        assert!(e.contains("max_concurrent_batches"), "{e}");
    }

    #[test]
    fn api_keys_serialise_redacted() {
        let mut b = sim("a", 0, &[("m", 10, Capabilities::default())]);
        b.kind = BackendKindName::Upstream;
        b.base_url = Some("http://h:1".into());
        b.api_key = Some(ApiKey::new("sk-secret"));
        let text = toml::to_string(&b).unwrap();
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(text.contains("api_key = \"<redacted>\""), "{text}");
        assert!(!text.contains("prompt_array"), "unset options are left out");
    }

    #[test]
    fn empty_registry_is_allowed() {
        let r = Registry::build(&[]).unwrap();
        assert!(r.is_empty());
        assert_eq!(r.model_count(), 0);
        assert_eq!(r.offers_per_model_max(), 0);
    }

    #[test]
    fn default_sim_serves_one_model_with_every_capability() {
        let r = Registry::build(&[BackendConfig::default_sim("abe-sim", 4096)]).unwrap();
        let m = r.model_id("abe-sim").unwrap();
        let o = r.offers(m)[0];
        assert!(o.capabilities.vision && o.capabilities.tools && o.capabilities.json_mode);
        assert_eq!(o.context_length, 4096);
    }

    #[test]
    fn live_state_updates_through_methods() {
        let mut r = Registry::build(&[sim("a", 0, &[("m", 10, Capabilities::default())])]).unwrap();
        let a = BackendId(0);
        assert!(r.state(a).routable());
        assert_eq!(r.state(a).latency_ema_ms(), None);
        r.set_healthy(a, false);
        assert!(!r.state(a).routable());
        r.set_healthy(a, true);
        r.set_circuit(a, CircuitState::HalfOpen);
        assert!(!r.state(a).routable(), "half-open takes no new routed work");
        r.set_circuit(a, CircuitState::Closed);
        r.batch_started(a);
        r.batch_started(a);
        r.batch_finished(a);
        assert_eq!(r.state(a).pending_batches(), 1);
        r.record_latency_ms(a, 100.0);
        assert_eq!(r.state(a).latency_ema_ms(), Some(100.0));
        r.record_latency_ms(a, 200.0);
        assert_eq!(r.state(a).latency_ema_ms(), Some(120.0));
    }
}
