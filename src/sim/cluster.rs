//! The simulator at cluster scale: `workers` continuous replicas, each its own backend, behind
//! the live router ([`crate::router::Router`], the same code `abe serve` routes with), and the
//! one-big-cache reference a router's hit rate is measured against.
//!
//! With `[routing] strategy` set (or the sweep key `routing`), every replica is its own group
//! of the scheduler ([`Continuous::with_groups`]) and its own `sim` backend `replica-<i>` of
//! the router; each arrival is routed with its prompt's KV block names (computed into a
//! scratch buffer sized before the loop) and an exact [`CacheView`] over the scheduler, then
//! admitted to the chosen replica. The router's load is live: a routed request counts on its
//! backend from admission until it finishes or fails (`batch_started` / `batch_finished`),
//! which is what continuous mode counts live (requests waiting for or holding a slot).
//!
//! Session keys (`session`): the simulated requests carry none, so a request's key is the
//! name of its first trace block (Mooncake's first `hash_id`, chained from the root), which
//! in Mooncake's conversation traces names the conversation's opening context: every turn of
//! a conversation has the same key. A request without trace blocks has no key (least loaded).
//!
//! Never here: an allocation per routed request, a clock read, or anything that is not a
//! function of (seed, scenario, options).

use super::prefix::PrefixArena;
use super::workload::SimRequest;
use super::SimError;
use crate::core::continuous::Continuous;
use crate::core::prefix::{BlockHash, PrefixStats};
use crate::core::Nanos;
use crate::router::{
    Affinity, BackendConfig, BackendId, CacheView, NameId, Need, PrefixConfig, Router,
    RoutingConfig,
};
use serde::{Deserialize, Serialize};

/// The routing strategies the simulator puts in front of its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterRouting {
    RoundRobin,
    LeastLoaded,
    PowerOfTwo,
    PrefixAware,
    Session,
}

impl ClusterRouting {
    /// Every strategy, in the order listed to users; a sweep value is an index into it.
    pub const ALL: [ClusterRouting; 5] = [
        ClusterRouting::RoundRobin,
        ClusterRouting::LeastLoaded,
        ClusterRouting::PowerOfTwo,
        ClusterRouting::PrefixAware,
        ClusterRouting::Session,
    ];

    /// The router's name for it (`routing.strategy`).
    pub const fn as_str(self) -> &'static str {
        match self {
            ClusterRouting::RoundRobin => "round_robin",
            ClusterRouting::LeastLoaded => "least_loaded",
            ClusterRouting::PowerOfTwo => "power_of_two",
            ClusterRouting::PrefixAware => "prefix_aware",
            ClusterRouting::Session => "session",
        }
    }

    /// By name, as in a scenario or a sweep.
    pub fn from_name(name: &str) -> Option<ClusterRouting> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Its index in [`Self::ALL`] (its sweep value).
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&r| r == self).expect("in ALL")
    }

    /// The strategy a sweep value stands for (`None` out of range).
    pub fn of_value(v: f64) -> Option<ClusterRouting> {
        (v.is_finite() && v.fract() == 0.0 && v >= 0.0)
            .then(|| Self::ALL.get(v as usize).copied())
            .flatten()
    }
}

/// A scenario's `[routing]` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioRouting {
    pub strategy: ClusterRouting,
    /// `[routing.prefix]`, as in `abe serve`'s config; absent: [`prefix_config`]'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixConfig>,
}

/// `prefix_aware`'s thresholds for simulated replicas of `max_slots` slots when the
/// scenario sets none: the router's defaults, but `balance_abs_threshold` = one backend's
/// concurrent sequences, the rule its default is derived by (docs/routing.md: past that
/// many requests above the least loaded backend the request queues for a slot there, and a
/// slot turnover costs more than any prefill saved). A live backend is 4 replicas of 16
/// slots (64); a simulated backend is one replica.
pub fn prefix_config(max_slots: usize) -> PrefixConfig {
    PrefixConfig {
        balance_abs_threshold: u32::try_from(max_slots).unwrap_or(u32::MAX),
        ..PrefixConfig::default()
    }
}

/// The model every simulated replica serves (the router needs a name; requests name it).
const MODEL: &str = "sim";

/// What one replica did over a routed run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaOutput {
    /// Requests routed (and admitted) to it.
    pub requests: u64,
    /// Sum over its steps of KV tokens in use at the step's start times the step's length.
    pub kv_token_ns: u128,
    pub prefix: PrefixStats,
}

/// What a routed run measured beside the usual: per replica, and the reference's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterOutput {
    pub routing: Option<ClusterRouting>,
    pub replicas: Vec<ReplicaOutput>,
    pub kv_capacity_tokens: u64,
    /// The one-big-cache reference's prefix counters (filled by the caller).
    pub reference: PrefixStats,
    /// The same with an unbounded cache: the trace's ideal reuse, a strict bound.
    pub unbounded: PrefixStats,
}

/// The scheduler's replicas as the router's exact cache view: backend `i` is replica `i`.
struct SchedView<'a>(&'a Continuous);

impl CacheView for SchedView<'_> {
    fn cached_prefix_blocks(&self, backend: BackendId, blocks: &[BlockHash]) -> Option<u32> {
        Some(self.0.cached_prefix_blocks(backend.index(), blocks))
    }

    fn adapter_resident(&self, backend: BackendId, adapter: u16) -> Option<bool> {
        Some(self.0.adapter_resident(backend.index(), adapter))
    }
}

/// The router in front of the replicas and the buffers a decision uses.
pub struct SimCluster {
    router: Router,
    model: NameId,
    /// The routed request's KV block names; capacity the most any request of the sequence
    /// has, so filling it never reallocates.
    blocks: Vec<BlockHash>,
    block_tokens: u32,
    session: bool,
}

impl SimCluster {
    /// A router of `replicas` sim backends (`replica-0`, ...) with `routing`, seeded with
    /// `seed`, and a block buffer for the largest prompt of `requests`.
    pub fn new(
        routing: ClusterRouting,
        prefix: PrefixConfig,
        replicas: usize,
        requests: &[SimRequest],
        arena: &PrefixArena,
        block_tokens: u32,
        seed: u64,
    ) -> Result<SimCluster, SimError> {
        let backends: Vec<BackendConfig> = (0..replicas)
            .map(|i| BackendConfig {
                name: format!("replica-{i}"),
                // Load is counted by the driver, one a routed request; no cap.
                max_concurrent_batches: u32::MAX,
                ..BackendConfig::default_sim(MODEL, u32::MAX)
            })
            .collect();
        let cfg = RoutingConfig {
            strategy: routing.as_str().into(),
            prefix,
            ..RoutingConfig::default()
        };
        let (router, warning) = Router::build(&backends, &cfg, seed)
            .map_err(|e| SimError::invalid("routing", e.to_string()))?;
        debug_assert!(
            warning.is_none(),
            "every ClusterRouting is a router strategy"
        );
        let mut router = router;
        for i in 0..replicas {
            let id = router.registry().backend_id(&format!("replica-{i}"));
            assert_eq!(id, Some(BackendId::from_index(i)), "backend i is replica i");
            // The scheduler answers for every replica's cache: no approximate index.
            router.set_cache_exact(BackendId::from_index(i));
        }
        let model = router
            .lookup(MODEL)
            .map_err(|e| SimError::invalid("routing", e.to_string()))?;
        let most = requests
            .iter()
            .filter(|r| r.prefix.len > 0)
            .map(|r| arena.block_count(r.prefix, r.prompt_tokens, block_tokens))
            .max()
            .unwrap_or(0);
        Ok(SimCluster {
            router,
            model,
            blocks: Vec::with_capacity(most as usize),
            block_tokens,
            session: routing == ClusterRouting::Session,
        })
    }

    /// Routes `req` (its block names, its session key, its predicted output, its LoRA
    /// `adapter`: a replica holding it resident is preferred); returns the
    /// replica and the work the router costs it at there ([`crate::router::Decision::work`]).
    /// The caller passes both to [`Self::started`] once admitted and to [`Self::finished`]
    /// when it leaves.
    pub fn route(
        &mut self,
        sched: &Continuous,
        req: &SimRequest,
        arena: &PrefixArena,
        adapter: crate::core::lora::AdapterId,
    ) -> (usize, u64) {
        self.blocks.clear();
        if req.prefix.len > 0 {
            let n = arena.block_count(req.prefix, req.prompt_tokens, self.block_tokens);
            debug_assert!(
                n as usize <= self.blocks.capacity(),
                "sized before the loop"
            );
            self.blocks.extend(
                (0..n).map(|i| arena.block_hash_for(req.prefix, self.block_tokens, i, adapter)),
            );
        }
        let session =
            (self.session && req.prefix.len > 0).then(|| arena.chains[req.prefix.start as usize]);
        let view = SchedView(sched);
        let affinity = Affinity {
            blocks: &self.blocks,
            session,
            exact: Some(&view),
            output_tokens: req.meta().expected_output_tokens(),
        };
        let need = Need {
            estimated_tokens: req.prompt_tokens,
            adapter,
            ..Need::default()
        };
        let d = self
            .router
            .route_name_with(self.model, &need, &affinity)
            .expect("every replica is healthy and serves the model");
        (d.backend.index(), d.work)
    }

    /// A request routed at `work` was admitted to `replica`: it counts on its load, one
    /// request and its work.
    pub fn started(&mut self, replica: usize, work: u64) {
        let registry = self.router.registry_mut();
        registry.batch_started(BackendId::from_index(replica));
        registry.work_started(BackendId::from_index(replica), work);
    }

    /// A request started on `replica` at `work` finished or failed.
    pub fn finished(&mut self, replica: usize, work: u64) {
        let registry = self.router.registry_mut();
        registry.batch_finished(BackendId::from_index(replica));
        registry.work_finished(BackendId::from_index(replica), work);
    }
}

/// Load imbalance: the busiest replica's busy time over the mean (1 when perfectly even or
/// when nothing ran).
pub fn imbalance(busy_ns: &[Nanos]) -> f64 {
    let total: u128 = busy_ns.iter().map(|&b| u128::from(b)).sum();
    let max = busy_ns.iter().copied().max().unwrap_or(0);
    if total == 0 || busy_ns.is_empty() {
        1.0
    } else {
        max as f64 * busy_ns.len() as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sweep_values_round_trip() {
        for (i, r) in ClusterRouting::ALL.into_iter().enumerate() {
            assert_eq!(ClusterRouting::from_name(r.as_str()), Some(r));
            assert_eq!(ClusterRouting::of_value(i as f64), Some(r));
            assert_eq!(r.index(), i);
            let (s, warning) = crate::router::Strategy::from_name(r.as_str());
            assert!(warning.is_none());
            assert_eq!(s.as_str(), r.as_str());
        }
        assert_eq!(ClusterRouting::of_value(5.0), None);
        assert_eq!(ClusterRouting::of_value(0.5), None);
    }

    fn request(arena: &mut PrefixArena, t: u64, ids: &[u64]) -> SimRequest {
        SimRequest {
            arrival_ns: t,
            prompt_tokens: 512 * ids.len() as u32,
            output_tokens: 1,
            predicted_output_tokens: 1,
            priority: crate::core::Priority::Normal,
            prefix: arena.push(ids),
        }
    }

    /// `session` keys a request by its first trace block: every turn of a conversation
    /// (same opening block, any continuation) goes to one replica, whatever the load, and
    /// different conversations spread.
    #[test]
    fn session_sends_equal_keys_to_one_replica() {
        use crate::core::continuous::ContinuousConfig;
        let mut arena = PrefixArena::new(512);
        let reqs: Vec<SimRequest> = (0..64u64)
            .map(|i| {
                let conv = i % 16;
                let ids: Vec<u64> = std::iter::once(1000 + conv).chain(0..i / 16).collect();
                request(&mut arena, i, &ids)
            })
            .collect();
        let cfg = ContinuousConfig {
            replicas: 4,
            ..ContinuousConfig::default()
        };
        let sched = Continuous::with_groups(cfg, &[1; 4]);
        let mut c = SimCluster::new(
            ClusterRouting::Session,
            prefix_config(16),
            4,
            &reqs,
            &arena,
            16,
            7,
        )
        .expect("builds");
        let mut home = [usize::MAX; 16];
        let mut used = [false; 4];
        for (i, r) in reqs.iter().enumerate() {
            let (replica, work) = c.route(&sched, r, &arena, crate::core::lora::BASE_MODEL);
            c.started(replica, work); // load grows; the session must not move
            let conv = i % 16;
            if home[conv] == usize::MAX {
                home[conv] = replica;
            }
            assert_eq!(replica, home[conv], "request {i} of conversation {conv}");
            used[replica] = true;
        }
        assert!(used.iter().filter(|&&u| u).count() >= 3, "{home:?}");
    }

    #[test]
    fn imbalance_is_max_over_mean() {
        assert_eq!(imbalance(&[]), 1.0);
        assert_eq!(imbalance(&[0, 0]), 1.0);
        assert_eq!(imbalance(&[5, 5]), 1.0);
        assert!((imbalance(&[3, 1]) - 1.5).abs() < 1e-12);
    }
}
