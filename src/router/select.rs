//! The routing decision: requested model -> its backends -> healthy with a closed circuit
//! -> capable (context length, vision, tools, JSON mode) -> if none, the alias target, then
//! the fallback chain, each through the same filters -> the strategy picks one.
//!
//! [`Router`] owns the registry, the resolver, the strategy, one round-robin cursor per
//! model, a seeded RNG and a scratch buffer of candidates sized at build for the model with
//! the most backends; for `prefix_aware`, one approximate prefix index per backend (fixed
//! capacity, allocated when the strategy is chosen) and a scratch of matches beside the
//! candidates. A request's affinity (prompt block names, session key, an exact cache view)
//! comes in by reference with the decision ([`Router::route_name_with`]). A decision ([`Router::route`]) takes `&mut self`: it reuses that
//! scratch, so it needs no lock and allocates nothing; only a failed decision allocates, to
//! build its error message. Nothing here may read a clock, do I/O, call out, or allocate on
//! the success path (`benches/router.rs` counts allocations to hold it to that).

use super::affinity::{least_work, pick_prefix, pick_session, Affinity, PrefixConfig, RequestWork};
use super::error::{
    ContextShortfall, MissingCapabilities, ModelOutcome, RouteError, RouterConfigError, TriedModel,
    Unavailable,
};
use super::prefix_index::{PrefixIndex, PrefixSearch};
use super::registry::{BackendConfig, BackendId, ModelId, Registry};
use super::requirements::Requirements;
use super::resolve::{NameId, Resolver, Routable};
use super::strategy::{pick, Candidate, Strategy, UnknownStrategy, Weights};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// `max_retries` when `[routing]` does not set it.
pub const MAX_RETRIES_DEFAULT: u32 = 2;

/// The `[routing]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// `smart`, `round_robin`, `least_loaded`, `power_of_two`, `priority_only`, `random`,
    /// `prefix_aware` or `session`; anything else means `smart` with a warning.
    pub strategy: String,
    /// `[routing.weights]`, for `smart`; must sum to 100.
    pub weights: Weights,
    /// `[routing.aliases]`: alias -> model. Single level.
    pub aliases: BTreeMap<String, String>,
    /// `[routing.fallbacks]`: model -> models to try in order. Single level.
    pub fallbacks: BTreeMap<String, Vec<String>>,
    /// How many other backends a failed batch is retried on (read by the executor).
    pub max_retries: u32,
    /// `[routing.prefix]`: `prefix_aware`'s thresholds and its index's bound.
    pub prefix: PrefixConfig,
    /// Empty backend slots reserved at start for backends the config does not have
    /// (`router::slots`); unset: [`super::slots::spare_slots_default`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spare_backend_slots: Option<u32>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            strategy: Strategy::Smart.as_str().into(),
            weights: Weights::default(),
            aliases: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
            max_retries: MAX_RETRIES_DEFAULT,
            prefix: PrefixConfig::default(),
            spare_backend_slots: None,
        }
    }
}

/// How the chosen backend's model relates to the model the request named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The request named the served model itself.
    Direct,
    /// The request named an alias of the served model.
    Alias { alias: NameId },
    /// The requested model (or its alias target) could not serve; this is a model of its
    /// fallback chain.
    Fallback { from: NameId },
}

/// What a request needs, once its model name is resolved: plain data an io thread hands to
/// the engine with the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Need {
    pub estimated_tokens: u32,
    pub needs: super::capabilities::Capabilities,
    /// The LoRA adapter the request names (`core::lora::BASE_MODEL`: none).
    pub adapter: crate::core::lora::AdapterId,
}

impl Need {
    pub fn of(req: &Requirements<'_>) -> Need {
        Need {
            estimated_tokens: req.estimated_tokens,
            needs: req.needs,
            adapter: req.adapter,
        }
    }

    /// As requirements for [`Router::pick_excluding`] (the model is decided already).
    pub fn requirements(&self) -> Requirements<'static> {
        Requirements {
            model: "",
            estimated_tokens: self.estimated_tokens,
            needs: self.needs,
            adapter: self.adapter,
        }
    }
}

/// LoRA affinity (as the inference gateway's LoRA-affinity scorer, weighed against load as
/// its queue scorer does): when some candidates hold `adapter` resident (the exact view says
/// so: the engine's own replicas) and the least busy of them has at most
/// [`LORA_AFFINITY_SLACK_BATCHES`] more batches in flight than the least busy candidate,
/// only they stay; the strategy then picks among them by its own rule. Otherwise (no view,
/// none holds it, or they are busier) every candidate stays and one of them loads it: a hot
/// adapter spreads over the backends instead of queueing on the first that loaded it.
fn prefer_lora_resident(
    scratch: &mut Vec<Candidate>,
    adapter: crate::core::lora::AdapterId,
    affinity: &Affinity<'_>,
) {
    let Some(view) = affinity.exact else {
        return;
    };
    let resident = |c: &Candidate| view.adapter_resident(c.backend, adapter) == Some(true);
    let Some(resident_least) = scratch
        .iter()
        .filter(|c| resident(c))
        .map(|c| c.pending_batches)
        .min()
    else {
        return;
    };
    let all_least = scratch.iter().map(|c| c.pending_batches).min().unwrap_or(0);
    if resident_least <= all_least.saturating_add(LORA_AFFINITY_SLACK_BATCHES) {
        scratch.retain(resident);
    }
}

/// How many more batches in flight a backend holding the request's adapter may have than
/// the least busy candidate and still be preferred: loading an adapter costs about one
/// batch's time (`lora_load_ms`, 10 ms by default, against batches of tens of ms), so one
/// batch more is worth waiting behind and more is not.
pub const LORA_AFFINITY_SLACK_BATCHES: u32 = 1;

/// A routing decision: which backend, for which served model, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub backend: BackendId,
    /// The model the backend is asked for (what goes in the upstream request's `model`).
    pub model: ModelId,
    pub via: Via,
    /// What the request adds to the chosen backend's work in flight, prompt-token
    /// equivalents ([`RequestWork::on`]: its prompt tokens not cached there, as far as the
    /// router knows, plus its expected output). A caller that feeds work passes it to
    /// [`Registry::work_started`] when the request is admitted and to
    /// [`Registry::work_finished`] when it leaves.
    pub work: u64,
}

/// The `[routing]` settings a running router takes from a reload ([`Router::set_live_routing`]):
/// plain data, so it crosses to the engine in a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRouting {
    pub strategy: Strategy,
    pub weights: Weights,
    pub max_retries: u32,
    /// All but `max_tracked_blocks` (the indexes' size, fixed at build).
    pub prefix: PrefixConfig,
}

/// Routes requests to backends. See the module doc.
#[derive(Debug)]
pub struct Router {
    pub(super) registry: Registry,
    pub(super) resolver: Resolver,
    strategy: Strategy,
    weights: Weights,
    max_retries: u32,
    /// Round-robin position per model, by `ModelId`.
    pub(super) cursors: Vec<u64>,
    rng: SmallRng,
    /// Eligible candidates of the model being routed. Cleared at the start of every
    /// filtering; capacity `registry.offers_per_model_max()`, fixed at build, and never
    /// exceeded (a model has at most that many offers), so pushing never reallocates.
    scratch: Vec<Candidate>,
    /// `prefix_aware`: how many leading blocks of the prompt each candidate in `scratch`
    /// holds; same fixed capacity, cleared at each such decision.
    matched: Vec<u32>,
    /// Beside `matched`: whether an exact [`CacheView`](super::affinity::CacheView) said so (then nothing is recorded
    /// in the approximate index); same fixed capacity.
    matched_exact: Vec<bool>,
    /// Beside `scratch`: each candidate's longest-prefix search; same fixed capacity.
    searches: Vec<PrefixSearch>,
    prefix: PrefixConfig,
    /// One approximate prefix index per backend, by `BackendId`, of
    /// `prefix.max_tracked_blocks` each: empty until the strategy is `prefix_aware`, then
    /// `None` for the backends whose cache is known exactly (`cache_exact`).
    indexes: Vec<Option<PrefixIndex>>,
    /// Per backend, by `BackendId`: its cache is answered by the caller's exact
    /// [`CacheView`](super::affinity::CacheView) ([`Router::set_cache_exact`]), so it gets no
    /// approximate index.
    cache_exact: Vec<bool>,
    /// `session`: each backend's rendezvous key (a hash of its name), by `BackendId`.
    pub(super) backend_keys: Vec<u64>,
    /// The work of the last pick's request on the backend it picked ([`Decision::work`]).
    last_work: u64,
}

/// A router in the same state, with its own scratch buffer of the same fixed capacity (a
/// derived clone would copy the buffer's contents and shrink its capacity to them),
/// approximate prefix indexes included (megabytes per backend: a thread that only
/// resolves and describes wants [`Router::lookup_copy`]).
impl Clone for Router {
    fn clone(&self) -> Self {
        let mut r = self.lookup_copy();
        r.indexes.clone_from(&self.indexes);
        r
    }
}

impl Router {
    /// The same router without its approximate prefix indexes, for threads that resolve
    /// ([`lookup`](Self::lookup), [`precheck`](Self::precheck)), read the registry and
    /// [`describe`](Self::describe) decisions, never route by prefix (the io threads hold
    /// one). Under `prefix_aware` it would judge every backend without an exact view
    /// unmatched and record nothing.
    pub fn lookup_copy(&self) -> Router {
        Router {
            registry: self.registry.clone(),
            resolver: self.resolver.clone(),
            strategy: self.strategy,
            weights: self.weights,
            max_retries: self.max_retries,
            cursors: self.cursors.clone(),
            rng: self.rng.clone(),
            scratch: Vec::with_capacity(self.scratch.capacity()),
            matched: Vec::with_capacity(self.matched.capacity()),
            matched_exact: Vec::with_capacity(self.matched_exact.capacity()),
            searches: Vec::with_capacity(self.searches.capacity()),
            prefix: self.prefix,
            indexes: Vec::new(),
            cache_exact: self.cache_exact.clone(),
            backend_keys: self.backend_keys.clone(),
            last_work: self.last_work,
        }
    }
}

impl Router {
    /// Builds the registry from `[[backends]]` and the router from `[routing]`.
    /// `seed` seeds the RNG of `power_of_two` and `random`. An unknown strategy name is not
    /// an error: `smart` is used and the warning comes back for the caller to log.
    pub fn build(
        backends: &[BackendConfig],
        routing: &RoutingConfig,
        seed: u64,
    ) -> Result<(Router, Option<UnknownStrategy>), RouterConfigError> {
        let registry = Registry::build(backends)?;
        Router::with_registry(registry, routing, seed)
    }

    /// As [`build`](Self::build), from a registry already built.
    pub fn with_registry(
        registry: Registry,
        routing: &RoutingConfig,
        seed: u64,
    ) -> Result<(Router, Option<UnknownStrategy>), RouterConfigError> {
        routing.weights.validate()?;
        routing.prefix.validate()?;
        let (strategy, warning) = Strategy::from_name(&routing.strategy);
        let resolver = Resolver::build(&registry, &routing.aliases, &routing.fallbacks)?;
        // Candidates of one model: at most one offer per backend slot, whatever tables a
        // reload swaps in later (`router::tables`), so the buffers never grow.
        let candidates_max = registry.len().max(registry.offers_per_model_max());
        let mut router = Router {
            cursors: vec![0; registry.model_count()],
            scratch: Vec::with_capacity(candidates_max),
            matched: Vec::with_capacity(candidates_max),
            matched_exact: Vec::with_capacity(candidates_max),
            searches: Vec::with_capacity(candidates_max),
            prefix: routing.prefix,
            indexes: Vec::new(),
            cache_exact: vec![false; registry.len()],
            backend_keys: registry
                .backends()
                .map(|(_, b)| super::affinity::backend_key(b.name()))
                .collect(),
            last_work: 0,
            resolver,
            strategy,
            weights: routing.weights,
            max_retries: routing.max_retries,
            rng: SmallRng::seed_from_u64(seed),
            registry,
        };
        router.set_strategy(strategy);
        Ok((router, warning))
    }

    /// Picks a backend for a request, or says exactly why none can take it.
    ///
    /// Takes `&mut self` because it reuses the router's scratch buffer and advances its
    /// round-robin cursor and RNG: the engine thread owns the router and calls this with no
    /// lock and no allocation (errors excepted).
    pub fn route(&mut self, req: &Requirements<'_>) -> Result<Decision, RouteError> {
        self.route_with(req, &Affinity::NONE)
    }

    /// As [`route`](Self::route), with the request's affinity (`prefix_aware`, `session`).
    pub fn route_with(
        &mut self,
        req: &Requirements<'_>,
        affinity: &Affinity<'_>,
    ) -> Result<Decision, RouteError> {
        let name = self.lookup(req.model)?;
        self.route_name_with(name, &Need::of(req), affinity)
    }

    /// The name a request's model resolves to, or the 400 (empty) / 404 (unknown) error.
    pub fn lookup(&self, model: &str) -> Result<NameId, RouteError> {
        // The usual name first: a configured name is never blank, so it needs no trim.
        if let Some(id) = self.resolver.lookup_first(model) {
            return Ok(id);
        }
        if model.trim().is_empty() {
            return Err(RouteError::EmptyModel);
        }
        self.resolver
            .lookup(model)
            .ok_or_else(|| RouteError::ModelNotFound {
                model: model.to_string(),
                alias_target: None,
            })
    }

    /// The errors that do not depend on live state, judged without changing anything (an io
    /// thread holds a read-only router for this): unknown model, capability mismatch, a
    /// fallback chain none of whose models could ever serve. `Ok` means some backend could
    /// take the request when healthy; [`route_name`](Self::route_name) picks it.
    pub fn precheck(&self, req: &Requirements<'_>) -> Result<(NameId, Need), RouteError> {
        let name = self.lookup(req.model)?;
        let need = Need::of(req);
        if self.any_candidate_takes(name, req, false) {
            return Ok((name, need));
        }
        let mut err = self.explain_static(name, req);
        if let RouteError::ModelNotFound { model, .. } = &mut err {
            // Keep the spelling the client used.
            req.model.clone_into(model);
        }
        Err(err)
    }

    /// Routes a request whose model name was resolved already ([`lookup`](Self::lookup) or
    /// [`precheck`](Self::precheck)). No allocation unless it fails.
    pub fn route_name(&mut self, name: NameId, need: &Need) -> Result<Decision, RouteError> {
        self.route_name_with(name, need, &Affinity::NONE)
    }

    /// As [`route_name`](Self::route_name), with the request's affinity: its prompt's block
    /// names and an exact cache view for `prefix_aware`, its session key for `session`
    /// (other strategies ignore it). Under `prefix_aware`, the chosen backend's approximate
    /// index records the names unless the exact view answered for it.
    pub fn route_name_with(
        &mut self,
        name: NameId,
        need: &Need,
        affinity: &Affinity<'_>,
    ) -> Result<Decision, RouteError> {
        let req = &need.requirements();
        if let Some(model) = self.resolver.served(name) {
            if let Some(backend) = self.pick_excluding_with(model, req, &[], affinity) {
                return Ok(Decision {
                    backend,
                    model,
                    via: Via::Direct,
                    work: self.last_work,
                });
            }
        }
        if let Some(model) = self
            .resolver
            .alias_for(name, req.adapter)
            .and_then(|t| self.resolver.served(t))
        {
            if let Some(backend) = self.pick_excluding_with(model, req, &[], affinity) {
                return Ok(Decision {
                    backend,
                    model,
                    via: Via::Alias { alias: name },
                    work: self.last_work,
                });
            }
        }
        let chain_len = self.resolver.chain_for_adapter(name, req.adapter).len();
        for i in 0..chain_len {
            let fallback = self.resolver.chain_for_adapter(name, req.adapter)[i];
            if let Some(model) = self.resolver.served(fallback) {
                if let Some(backend) = self.pick_excluding_with(model, req, &[], affinity) {
                    return Ok(Decision {
                        backend,
                        model,
                        via: Via::Fallback { from: name },
                        work: self.last_work,
                    });
                }
            }
        }
        Err(self.explain(name, req))
    }

    /// Picks a backend of `model` for a request whose model was resolved already (at
    /// admission) now that the work is dispatched: same filters, fresh state. `None` when
    /// none is eligible any more.
    pub fn pick(&mut self, model: ModelId, req: &Requirements<'_>) -> Option<BackendId> {
        self.pick_excluding(model, req, &[])
    }

    /// As [`pick`](Self::pick), skipping backends that already failed this request (for a
    /// retry on the next candidate).
    pub fn pick_excluding(
        &mut self,
        model: ModelId,
        req: &Requirements<'_>,
        exclude: &[BackendId],
    ) -> Option<BackendId> {
        self.pick_excluding_with(model, req, exclude, &Affinity::NONE)
    }

    /// As [`pick_excluding`](Self::pick_excluding), with the request's affinity (see
    /// [`route_name_with`](Self::route_name_with)).
    pub fn pick_excluding_with(
        &mut self,
        model: ModelId,
        req: &Requirements<'_>,
        exclude: &[BackendId],
        affinity: &Affinity<'_>,
    ) -> Option<BackendId> {
        self.fill_candidates(model, req, exclude);
        if self.scratch.is_empty() {
            return None;
        }
        if req.adapter != crate::core::lora::BASE_MODEL {
            prefer_lora_resident(&mut self.scratch, req.adapter, affinity);
        }
        let work = RequestWork {
            prompt_tokens: req.estimated_tokens,
            output_tokens: affinity.output_tokens,
        };
        // Without block names nothing is known cached: the whole prompt.
        self.last_work = work.on(0, 0, &self.prefix);
        let i = match self.strategy {
            Strategy::PrefixAware if !affinity.blocks.is_empty() => {
                return Some(self.pick_prefix_aware(affinity, &work));
            }
            Strategy::Session => pick_session(&self.scratch, affinity.session, &self.backend_keys),
            s => pick(
                s,
                &self.scratch,
                &self.weights,
                &mut self.cursors[model.index()],
                &mut self.rng,
            ),
        };
        Some(self.scratch[i].backend)
    }

    /// `prefix_aware` over the candidates in the scratch buffer (non-empty), for a prompt
    /// with block names: asks each candidate's match (the exact view first, else the
    /// approximate index), picks, and records the names in the chosen backend's index
    /// unless the exact view answered for it.
    fn pick_prefix_aware(&mut self, affinity: &Affinity<'_>, work: &RequestWork) -> BackendId {
        let blocks = affinity.blocks;
        debug_assert!(!self.scratch.is_empty() && !blocks.is_empty());
        // Saturates for a prompt past u32::MAX blocks (2^36 tokens; requests are bounded by
        // config far below that).
        let prompt_blocks = u32::try_from(blocks.len()).unwrap_or(u32::MAX);
        self.searches.clear();
        self.matched_exact.clear();
        let capacity = self.searches.capacity();
        for c in &self.scratch {
            let exact = affinity
                .exact
                .and_then(|v| v.cached_prefix_blocks(c.backend, blocks));
            debug_assert!(self.searches.len() < capacity, "searches sized at build");
            self.searches.push(match exact {
                Some(n) => PrefixSearch::answered(n.min(prompt_blocks)),
                None => PrefixSearch::new(blocks),
            });
            self.matched_exact.push(exact.is_some());
        }
        // The approximate indexes' searches in lockstep: one probe of each per round, so the
        // probes of a round are independent loads (about 8 rounds for 128 blocks). After a
        // round, a search that can no longer reach the longest match found so far (its
        // bound below it) stops: the pick reads only the longest matches (its ties
        // included) and the fallback's, whose search always runs to the end.
        let fallback = least_work(&self.scratch);
        let mut lead = self
            .searches
            .iter()
            .map(PrefixSearch::found)
            .max()
            .unwrap_or(0);
        let mut searching = true;
        while searching {
            searching = false;
            for (k, (search, c)) in self.searches.iter_mut().zip(&self.scratch).enumerate() {
                if search.done() {
                    continue;
                }
                if k != fallback && search.bound() < lead {
                    *search = PrefixSearch::answered(search.found());
                    continue;
                }
                searching |= match &self.indexes.get(c.backend.index()) {
                    Some(Some(ix)) => !search.step(ix, blocks),
                    // No index (an exact backend the view did not answer for, or a
                    // lookup copy): nothing known cached.
                    _ => {
                        *search = PrefixSearch::answered(0);
                        false
                    }
                };
                lead = lead.max(search.found());
            }
        }
        self.matched.clear();
        self.matched
            .extend(self.searches.iter().map(PrefixSearch::found));
        let i = pick_prefix(
            &self.scratch,
            &self.matched,
            prompt_blocks,
            work,
            &self.prefix,
        );
        let backend = self.scratch[i].backend;
        self.last_work = work.on(self.matched[i], prompt_blocks, &self.prefix);
        if !self.matched_exact[i] {
            if let Some(Some(ix)) = self.indexes.get_mut(backend.index()) {
                ix.insert_prompt(blocks);
            }
        }
        backend
    }

    /// Writes the eligible candidates of `model` into the scratch buffer.
    #[inline]
    fn fill_candidates(&mut self, model: ModelId, req: &Requirements<'_>, exclude: &[BackendId]) {
        self.scratch.clear();
        let capacity = self.scratch.capacity();
        for offer in self.registry.offers(model) {
            let state = self.registry.state(offer.backend);
            if !state.routable()
                || !offer.capable(req)
                || exclude.contains(&offer.backend)
                || !self.registry.lora_eligible(offer.backend, req.adapter)
            {
                continue;
            }
            debug_assert!(self.scratch.len() < capacity, "scratch sized at build");
            self.scratch.push(Candidate {
                backend: offer.backend,
                priority: offer.priority,
                pending_batches: state.pending_batches(),
                pending_work: state.pending_work(),
                // Unmeasured counts as 0 ms; `as` saturates (and maps NaN to 0).
                latency_ms: state.latency_ema_ms().map_or(0, |ms| ms as u32),
            });
        }
        debug_assert_eq!(self.scratch.capacity(), capacity, "no reallocation");
    }

    /// As `explain`, judged as if every backend were healthy with a closed circuit.
    #[cold]
    fn explain_static(&self, name: NameId, req: &Requirements<'_>) -> RouteError {
        let mut healthy = self.registry.clone();
        for (id, _) in self.registry.backends() {
            healthy.set_healthy(id, true);
            healthy.set_circuit(id, crate::core::circuit::CircuitState::Closed);
        }
        let view = RouterView {
            registry: &healthy,
            resolver: &self.resolver,
        };
        view.explain(name, req)
    }

    /// Why a request for `name` needing `need` cannot be routed now, judged without routing
    /// it (cold path: allocates): for a request that has to leave its backend (the
    /// engine's evacuation of a lane whose circuit opened). `None` when some backend of one
    /// of its models could take it now.
    #[cold]
    pub fn explain_unroutable(&self, name: NameId, need: &Need) -> Option<RouteError> {
        let req = need.requirements();
        (!self.any_candidate_takes(name, &req, true)).then(|| self.explain(name, &req))
    }

    /// Some backend of a model `name` may be routed to ([`Resolver::candidates`]) has what
    /// `req` needs (capabilities, the LoRA adapter), and with `now`, is routable now
    /// (healthy, circuit closed, active).
    fn any_candidate_takes(&self, name: NameId, req: &Requirements<'_>, now: bool) -> bool {
        self.resolver.candidates(name, req.adapter).any(|model| {
            self.registry.offers(model).iter().any(|o| {
                o.capable(req)
                    && self.registry.lora_eligible(o.backend, req.adapter)
                    && (!now || self.registry.state(o.backend).routable())
            })
        })
    }

    /// The error for a request none of whose models could serve (cold path: allocates).
    #[cold]
    fn explain(&self, name: NameId, req: &Requirements<'_>) -> RouteError {
        RouterView {
            registry: &self.registry,
            resolver: &self.resolver,
        }
        .explain(name, req)
    }
}

/// The registry and resolver borrowed together, to explain a failed decision (possibly
/// against a copy of the registry with other live state).
struct RouterView<'a> {
    registry: &'a Registry,
    resolver: &'a Resolver,
}

impl RouterView<'_> {
    #[cold]
    fn explain(&self, name: NameId, req: &Requirements<'_>) -> RouteError {
        let r = &self.resolver;
        let alias = r.alias_for(name, req.adapter);
        let requested = r.name(name).to_string();
        let chain = r.chain_for_adapter(name, req.adapter);
        if !chain.is_empty() {
            let mut tried = Vec::with_capacity(chain.len() + 2);
            if r.served(name).is_some() || alias.is_none() {
                tried.push(self.tried(name, req));
            }
            if let Some(t) = alias {
                tried.push(self.tried(t, req));
            }
            tried.extend(chain.iter().map(|&f| self.tried(f, req)));
            return RouteError::FallbackChainExhausted { requested, tried };
        }
        let alias_name = alias.map(|_| requested.clone());
        let (model, alias_name) = match (r.served(name), alias.and_then(|t| r.served(t))) {
            (Some(m), _) => (m, None),
            (None, Some(m)) => (m, alias_name),
            (None, None) => {
                return RouteError::ModelNotFound {
                    model: requested,
                    alias_target: alias.map(|t| r.name(t).to_string()),
                }
            }
        };
        let model_name = self.registry.model_name(model).to_string();
        match self.outcome(model, req) {
            ModelOutcome::Missing(missing) => RouteError::CapabilityMismatch {
                model: model_name,
                alias: alias_name,
                missing,
            },
            ModelOutcome::NoHealthy(unavailable) => RouteError::NoHealthyBackend {
                model: model_name,
                alias: alias_name,
                unavailable,
            },
            ModelOutcome::NotServed => unreachable!("a served model has offers"),
        }
    }

    fn tried(&self, name: NameId, req: &Requirements<'_>) -> TriedModel {
        TriedModel {
            model: self.resolver.name(name).to_string(),
            outcome: self
                .resolver
                .served(name)
                .map_or(ModelOutcome::NotServed, |m| self.outcome(m, req)),
        }
    }

    /// Why no backend of `model` is eligible for `req`.
    ///
    /// Capability comes first, judged over every backend serving the model whatever its
    /// health: when none could ever take the request it is a 400 the client can act on;
    /// when some could but none of those is healthy with a closed circuit, a 503 counting
    /// just those.
    fn outcome(&self, model: ModelId, req: &Requirements<'_>) -> ModelOutcome {
        let offers = self.registry.offers(model);
        if offers.is_empty() {
            return ModelOutcome::NotServed;
        }
        if offers.iter().any(|o| o.capable(req)) {
            let mut unavailable = Unavailable {
                serving: 0,
                unhealthy: 0,
                circuit_not_closed: 0,
                removed: 0,
                without_adapter: 0,
            };
            for o in offers.iter().filter(|o| o.capable(req)) {
                let s = self.registry.state(o.backend);
                unavailable.serving += 1;
                if !self.registry.lora_eligible(o.backend, req.adapter) {
                    unavailable.without_adapter += 1;
                    continue;
                }
                debug_assert!(!s.routable(), "a capable routable backend would be picked");
                if !s.slot().is_active() {
                    unavailable.removed += 1;
                } else if !s.healthy() {
                    unavailable.unhealthy += 1;
                } else {
                    unavailable.circuit_not_closed += 1;
                }
            }
            return ModelOutcome::NoHealthy(unavailable);
        }
        let need = req.needs;
        let (mut any_vision, mut any_tools, mut any_json) = (false, false, false);
        let (mut all_vision, mut all_tools, mut all_json, mut all_context) =
            (true, true, true, true);
        let mut context_length_max = 0;
        let mut any_context = false;
        for o in offers {
            let c = o.capabilities;
            any_vision |= c.vision;
            any_tools |= c.tools;
            any_json |= c.json_mode;
            all_vision &= c.vision;
            all_tools &= c.tools;
            all_json &= c.json_mode;
            all_context &= o.fits(req.estimated_tokens);
            any_context |= o.fits(req.estimated_tokens);
            context_length_max = context_length_max.max(o.context_length);
        }
        let context = ContextShortfall {
            estimated_tokens: req.estimated_tokens,
            context_length_max,
        };
        let mut missing = MissingCapabilities {
            vision: need.vision && !any_vision,
            tools: need.tools && !any_tools,
            json_mode: need.json_mode && !any_json,
            context: (!any_context).then_some(context),
            no_single_backend: false,
        };
        if missing.names().next().is_none() {
            // Each requirement is met somewhere, never all on one backend: list the ones
            // some backend lacks.
            missing = MissingCapabilities {
                vision: need.vision && !all_vision,
                tools: need.tools && !all_tools,
                json_mode: need.json_mode && !all_json,
                context: (!all_context).then_some(context),
                no_single_backend: true,
            };
        }
        debug_assert!(missing.names().next().is_some());
        ModelOutcome::Missing(missing)
    }
}

impl Router {
    /// Text for a response header saying which backend serves the request and why, e.g.
    /// `backend=gpu-a; model=mistral:7b; via=fallback; requested=claude-3-opus`. Formatting
    /// it writes straight into the caller's buffer.
    pub fn describe(&self, decision: &Decision) -> DecisionText<'_> {
        DecisionText {
            router: self,
            decision: *decision,
        }
    }

    /// The registry, to read backends, models and live state.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The registry, to update live state (health, circuit, pending batches, latency).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// Every model name a request can use now (served models, aliases of served models,
    /// names whose fallback chain has a served model), for `GET /v1/models`.
    pub fn routable(&self) -> impl Iterator<Item = (&str, Routable<'_>)> + '_ {
        self.resolver.routable()
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Switches strategy at run time; cursors and RNG carry on. Switching to
    /// `prefix_aware` the first time allocates its approximate indexes
    /// (`routing.prefix.max_tracked_blocks` per backend), empty.
    pub fn set_strategy(&mut self, strategy: Strategy) {
        self.strategy = strategy;
        if strategy == Strategy::PrefixAware && self.indexes.is_empty() {
            self.indexes = self
                .cache_exact
                .iter()
                .map(|&exact| (!exact).then(|| PrefixIndex::new(self.prefix.max_tracked_blocks)))
                .collect();
        }
    }

    /// Says that `backend`'s cache is always answered by the exact
    /// [`CacheView`](super::affinity::CacheView) passed with each decision (the engine's
    /// and the simulator's continuous replicas): its approximate index is dropped and never
    /// allocated, and a decision the view does not answer for counts it unmatched.
    pub fn set_cache_exact(&mut self, backend: BackendId) {
        self.cache_exact[backend.index()] = true;
        if let Some(slot) = self.indexes.get_mut(backend.index()) {
            *slot = None;
        }
    }

    /// The health checker's verdict on `backend`. A backend coming back from unhealthy may
    /// have restarted with an empty cache: its approximate index is cleared
    /// ([`forget_cached`](Self::forget_cached)).
    pub fn set_healthy(&mut self, backend: BackendId, healthy: bool) {
        let was = self.registry.state(backend).healthy();
        self.registry.set_healthy(backend, healthy);
        if healthy && !was {
            self.forget_cached(backend);
        }
    }

    /// `[routing.prefix]` as checked at build.
    pub fn prefix_config(&self) -> &PrefixConfig {
        &self.prefix
    }

    /// The approximate prefix index of `backend` (`None` until the strategy has been
    /// `prefix_aware`).
    pub fn prefix_index(&self, backend: BackendId) -> Option<&PrefixIndex> {
        self.indexes.get(backend.index()).and_then(Option::as_ref)
    }

    /// Forgets what the approximate index of `backend` recorded: call it when the backend
    /// restarted or dropped its cache (a health check seeing it come back).
    pub fn forget_cached(&mut self, backend: BackendId) {
        if let Some(Some(ix)) = self.indexes.get_mut(backend.index()) {
            ix.clear();
        }
    }

    /// Bytes the approximate prefix indexes hold (fixed once allocated).
    pub fn prefix_index_bytes(&self) -> usize {
        self.indexes.iter().flatten().map(PrefixIndex::bytes).sum()
    }

    pub fn weights(&self) -> Weights {
        self.weights
    }

    /// The `[routing]` settings a reload may change while abe runs.
    pub fn live_routing(&self) -> LiveRouting {
        LiveRouting {
            strategy: self.strategy,
            weights: self.weights,
            max_retries: self.max_retries,
            prefix: self.prefix,
        }
    }

    /// Takes [`LiveRouting`] from a reload (checked by `Config::check` first). The prefix
    /// indexes keep their size: `prefix.max_tracked_blocks` is kept as built. Switching to
    /// `prefix_aware` the first time allocates its indexes (see
    /// [`set_strategy`](Self::set_strategy)): a reload is not the hot path.
    pub fn set_live_routing(&mut self, live: LiveRouting) {
        self.weights = live.weights;
        self.max_retries = live.max_retries;
        self.prefix = PrefixConfig {
            max_tracked_blocks: self.prefix.max_tracked_blocks,
            ..live.prefix
        };
        self.set_strategy(live.strategy);
    }

    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    #[cfg(test)]
    pub(crate) fn scratch_identity(&self) -> (*const Candidate, usize) {
        (self.scratch.as_ptr(), self.scratch.capacity())
    }
}

/// A [`Decision`] as header text; see [`Router::describe`].
pub struct DecisionText<'a> {
    router: &'a Router,
    decision: Decision,
}

impl DecisionText<'_> {
    /// The text's pieces in order (no formatting machinery: the io thread writes this into
    /// every routed response).
    fn pieces(&self) -> [&str; 6] {
        let r = self.router;
        let d = self.decision;
        let (via, requested) = match d.via {
            Via::Direct => ("; via=direct", ""),
            Via::Alias { alias } => (
                "; via=alias; requested=",
                r.resolver.try_name(alias).unwrap_or("?"),
            ),
            Via::Fallback { from } => (
                "; via=fallback; requested=",
                r.resolver.try_name(from).unwrap_or("?"),
            ),
        };
        [
            "backend=",
            r.registry.backend(d.backend).name(),
            "; model=",
            // An io thread's copy may be a swap behind the engine's tables for a moment.
            r.registry.try_model_name(d.model).unwrap_or("?"),
            via,
            requested,
        ]
    }

    /// Appends the text to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        for piece in self.pieces() {
            out.extend_from_slice(piece.as_bytes());
        }
    }
}

impl fmt::Display for DecisionText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pieces().iter().try_for_each(|p| f.write_str(p))
    }
}
