//! Property tests of the router (the spec's list): the smart score stays in `0..=100`,
//! round-robin is exactly even over any multiple of the candidate count, smart always picks
//! a maximal score (the first on ties), alias resolution always terminates (graphs with
//! cycles are rejected at build), and every decision respects every filter.

use crate::core::circuit::CircuitState;
use crate::router::registry::sim_backend;
use crate::router::strategy::{pick, Strategy as Routing};
use crate::router::{
    score, BackendConfig, BackendId, Candidate, Capabilities, Requirements, Router,
    RouterConfigError, RoutingConfig, Weights,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::BTreeMap;

fn weights() -> impl Strategy<Value = Weights> {
    (0u32..=100)
        .prop_flat_map(|p| (Just(p), 0u32..=100 - p))
        .prop_map(|(priority, load)| Weights {
            priority,
            load,
            latency: 100 - priority - load,
        })
}

fn candidate(i: u32) -> impl Strategy<Value = Candidate> {
    (
        prop_oneof![0u32..=120, any::<u32>()],
        prop_oneof![0u32..=120, any::<u32>()],
        prop_oneof![0u32..=1200, any::<u32>()],
    )
        .prop_map(move |(priority, pending_batches, latency_ms)| Candidate {
            backend: BackendId(i),
            priority,
            pending_batches,
            pending_work: 0,
            latency_ms,
        })
}

fn candidates(max: usize) -> impl Strategy<Value = Vec<Candidate>> {
    (1..=max).prop_flat_map(|n| (0..n as u32).map(candidate).collect::<Vec<_>>())
}

/// One backend's live state and offer, for whole-router properties.
#[derive(Clone, Debug)]
struct Live {
    priority: u32,
    context_length: u32,
    caps: Capabilities,
    healthy: bool,
    circuit: CircuitState,
    pending: u32,
    latency_ms: Option<f64>,
}

fn caps() -> impl Strategy<Value = Capabilities> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(vision, tools, json_mode)| {
        Capabilities {
            vision,
            tools,
            json_mode,
        }
    })
}

fn live() -> impl Strategy<Value = Live> {
    (
        0u32..=120,
        prop_oneof![Just(1024u32), Just(4096), Just(32768)],
        caps(),
        prop::bool::weighted(0.85),
        prop_oneof![
            8 => Just(CircuitState::Closed),
            1 => Just(CircuitState::Open),
            1 => Just(CircuitState::HalfOpen),
        ],
        0u32..=130,
        prop::option::of(0.0f64..3000.0),
    )
        .prop_map(
            |(priority, context_length, caps, healthy, circuit, pending, latency_ms)| Live {
                priority,
                context_length,
                caps,
                healthy,
                circuit,
                pending,
                latency_ms,
            },
        )
}

fn router_of(backends: &[Live], strategy: &str, seed: u64) -> Router {
    let cfgs: Vec<BackendConfig> = backends
        .iter()
        .enumerate()
        .map(|(i, l)| {
            sim_backend(
                &format!("b{i}"),
                l.priority,
                &[("m", l.context_length, l.caps)],
            )
        })
        .collect();
    let cfg = RoutingConfig {
        strategy: strategy.into(),
        ..RoutingConfig::default()
    };
    let (mut r, _) = Router::build(&cfgs, &cfg, seed).expect("valid");
    for (i, l) in backends.iter().enumerate() {
        let id = BackendId(i as u32);
        let reg = r.registry_mut();
        reg.set_healthy(id, l.healthy);
        reg.set_circuit(id, l.circuit);
        for _ in 0..l.pending {
            reg.batch_started(id);
        }
        if let Some(ms) = l.latency_ms {
            reg.record_latency_ms(id, ms);
        }
    }
    r
}

fn eligible(l: &Live, req: &Requirements<'_>) -> bool {
    l.healthy
        && l.circuit == CircuitState::Closed
        && l.context_length >= req.estimated_tokens
        && l.caps.covers(req.needs)
}

fn as_candidate(i: usize, l: &Live) -> Candidate {
    Candidate {
        backend: BackendId(i as u32),
        priority: l.priority,
        pending_batches: l.pending,
        pending_work: 0,
        latency_ms: l.latency_ms.map_or(0, |ms| ms as u32),
    }
}

/// Whether following alias targets from some alias comes back to a name already visited
/// (computed independently of the resolver).
fn has_cycle(aliases: &BTreeMap<String, String>) -> bool {
    aliases.keys().any(|start| {
        let mut at = start.as_str();
        for _ in 0..=aliases.len() {
            match aliases.get(at) {
                Some(next) => at = next,
                None => return false,
            }
        }
        true // still inside the alias set after more steps than there are aliases
    })
}

proptest! {
    #[test]
    fn score_is_always_between_0_and_100(c in candidate(0), w in weights()) {
        let s = score(&c, &w);
        prop_assert!(s <= 100, "{s}");
    }

    #[test]
    fn perfect_and_worst_scores_are_the_bounds(w in weights()) {
        let best = Candidate { backend: BackendId(0), priority: 0, pending_batches: 0, pending_work: 0, latency_ms: 0 };
        let worst = Candidate { priority: 100, pending_batches: 100, latency_ms: 1000, ..best };
        prop_assert_eq!(score(&best, &w), 100);
        prop_assert_eq!(score(&worst, &w), 0);
    }

    #[test]
    fn smart_picks_the_first_maximal_score(cs in candidates(40), w in weights(), seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut cursor = 0;
        let i = pick(Routing::Smart, &cs, &w, &mut cursor, &mut rng);
        let best = cs.iter().map(|c| score(c, &w)).max().unwrap();
        prop_assert_eq!(score(&cs[i], &w), best);
        prop_assert!(cs[..i].iter().all(|c| score(c, &w) < best), "first on ties");
    }

    #[test]
    fn round_robin_is_exactly_even_over_multiples(
        cs in candidates(16), rounds in 1usize..20, start: u64, seed: u64,
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut cursor = start;
        let mut counts = vec![0usize; cs.len()];
        for _ in 0..rounds * cs.len() {
            counts[pick(Routing::RoundRobin, &cs, &Weights::default(), &mut cursor, &mut rng)] += 1;
        }
        prop_assert!(counts.iter().all(|&c| c == rounds), "{:?}", counts);
    }

    #[test]
    fn router_round_robin_is_exactly_even(n in 1usize..12, rounds in 1usize..10) {
        let all_up = Live {
            priority: 0, context_length: 100, caps: Capabilities::default(), healthy: true,
            circuit: CircuitState::Closed, pending: 0, latency_ms: None,
        };
        let mut r = router_of(&vec![all_up; n], "round_robin", 1);
        let mut counts = vec![0usize; n];
        for _ in 0..n * rounds {
            counts[r.route(&Requirements::text("m", 1)).unwrap().backend.index()] += 1;
        }
        prop_assert!(counts.iter().all(|&c| c == rounds), "{:?}", counts);
    }

    #[test]
    fn router_smart_picks_the_first_maximal_eligible_backend(
        backends in prop::collection::vec(live(), 1..30),
        tokens in 0u32..40_000,
        needs in caps(),
    ) {
        let mut r = router_of(&backends, "smart", 1);
        let req = Requirements { model: "m", estimated_tokens: tokens, needs, adapter: 0 };
        let w = Weights::default();
        let best = backends
            .iter()
            .enumerate()
            .filter(|(_, l)| eligible(l, &req))
            .map(|(i, l)| score(&as_candidate(i, l), &w))
            .max();
        match (r.route(&req), best) {
            (Ok(d), Some(best)) => {
                let i = d.backend.index();
                prop_assert!(eligible(&backends[i], &req));
                prop_assert_eq!(score(&as_candidate(i, &backends[i]), &w), best);
                prop_assert!(backends[..i]
                    .iter()
                    .enumerate()
                    .all(|(j, l)| !eligible(l, &req) || score(&as_candidate(j, l), &w) < best));
            }
            (Err(e), None) => {
                prop_assert!(e.status() == 400 || e.status() == 503, "{e}");
                // 400 only when no backend, up or down, could ever take the request.
                let could = backends.iter().any(|l| {
                    l.context_length >= tokens && l.caps.covers(needs)
                });
                prop_assert_eq!(e.status() == 503, could, "{}", e);
            }
            (got, best) => prop_assert!(false, "{:?} vs best {:?}", got, best),
        }
    }

    #[test]
    fn every_strategy_respects_every_filter(
        backends in prop::collection::vec(live(), 1..20),
        tokens in 0u32..40_000,
        needs in caps(),
        seed: u64,
    ) {
        for s in Routing::ALL {
            let mut r = router_of(&backends, s.as_str(), seed);
            let req = Requirements { model: "m", estimated_tokens: tokens, needs, adapter: 0 };
            let any = backends.iter().any(|l| eligible(l, &req));
            match r.route(&req) {
                Ok(d) => prop_assert!(eligible(&backends[d.backend.index()], &req), "{s}"),
                Err(e) => prop_assert!(!any, "{s}: {e}"),
            }
        }
    }

    #[test]
    fn alias_resolution_terminates_and_cycles_are_rejected(
        edges in prop::collection::btree_map(0u8..8, 0u8..10, 0..8),
    ) {
        // Names n0..n9; n0..n3 are served; aliases between arbitrary names.
        let aliases: BTreeMap<String, String> = edges
            .iter()
            .map(|(a, t)| (format!("n{a}"), format!("n{t}")))
            .collect();
        let names: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
        let models: Vec<_> = names
            .iter()
            .map(|n| (n.as_str(), 100, Capabilities::default()))
            .collect();
        let backends = [sim_backend("b", 0, &models)];
        let cfg = RoutingConfig { aliases: aliases.clone(), ..RoutingConfig::default() };
        match Router::build(&backends, &cfg, 1) {
            Err(RouterConfigError::AliasCycle { cycle }) => {
                prop_assert!(has_cycle(&aliases));
                prop_assert!(cycle.len() >= 2 && cycle.first() == cycle.last(), "{:?}", cycle);
                for w in cycle.windows(2) {
                    prop_assert_eq!(aliases.get(&w[0]), Some(&w[1]), "{:?}", cycle);
                }
            }
            Err(RouterConfigError::AliasChain { alias, target, next }) => {
                prop_assert!(!has_cycle(&aliases));
                prop_assert_eq!(aliases.get(&alias), Some(&target));
                prop_assert_eq!(aliases.get(&target), Some(&next));
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
            Ok((mut r, _)) => {
                prop_assert!(!has_cycle(&aliases));
                for name in (0..10).map(|i| format!("n{i}")) {
                    if let Some(id) = r.resolver().lookup(&name) {
                        if let Some(t) = r.resolver().alias_of(id) {
                            prop_assert_eq!(r.resolver().alias_of(t), None, "one step");
                        }
                    }
                    // Terminates, with an answer either way.
                    let _ = r.route(&Requirements::text(&name, 1));
                }
            }
        }
    }
}

// ---- prefix_aware's index and rule, session's hashing -------------------------------------

use crate::core::prefix::{chain, BlockHash, ROOT};
use crate::router::affinity::{
    backend_key, pick_prefix, pick_session, BalanceLoad, PrefixConfig, RequestWork,
};
use crate::router::prefix_index::PrefixIndex;
use std::collections::VecDeque;

/// A prompt from a small tree of shared prefixes: `family` picks the first blocks' content,
/// `branch` where it diverges, `len` its length in blocks.
fn family_prompt(family: u64, branch: usize, len: usize) -> Vec<BlockHash> {
    let mut parent = ROOT;
    (0..len)
        .map(|i| {
            let content = if i < branch {
                family
            } else {
                family * 1000 + i as u64
            };
            parent = chain(parent, content * 64 + i as u64);
            parent
        })
        .collect()
}

/// The reference: an LRU list of names, most recent first, touched as the index touches.
fn reference_insert(lru: &mut VecDeque<BlockHash>, capacity: usize, blocks: &[BlockHash]) {
    for &h in blocks[..blocks.len().min(capacity)].iter().rev() {
        if let Some(at) = lru.iter().position(|&x| x == h) {
            lru.remove(at);
        }
        lru.push_front(h);
        lru.truncate(capacity);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The index tracks exactly the reference LRU's names at every step, stays within its
    /// bound, and its binary-searched match equals the linear walk over the reference.
    #[test]
    fn prefix_index_is_an_lru_set_and_its_match_is_the_longest_prefix(
        capacity in 1u32..100,
        ops in prop::collection::vec((0u64..4, 0usize..40, 0usize..80), 1..40),
    ) {
        let mut ix = PrefixIndex::new(capacity);
        let mut lru = VecDeque::new();
        for &(family, branch, len) in &ops {
            let p = family_prompt(family, branch, len);
            ix.insert_prompt(&p);
            reference_insert(&mut lru, capacity as usize, &p);
            ix.check();
            prop_assert_eq!(ix.len() as usize, lru.len());
            prop_assert!(ix.len() <= capacity);
            for &h in &lru {
                prop_assert!(ix.contains(h));
            }
            for &(f, b, l) in &ops {
                let q = family_prompt(f, b, l);
                let walk = q.iter().take_while(|&&h| lru.contains(&h)).count() as u32;
                prop_assert_eq!(ix.cached_prefix_blocks(&q), walk);
                // Prefix-closed: nothing tracked after the first untracked block.
                prop_assert!(q[walk as usize..].iter().all(|h| !lru.contains(h)));
            }
        }
    }

    /// `prefix_aware` picks either the least loaded candidate or a longest match whose
    /// backend passes the balance rule, and the longest match whenever it covers enough and
    /// passes.
    #[test]
    fn prefix_rule_is_longest_match_within_the_balance_bounds(
        loads in prop::collection::vec(0u32..300, 1..16),
        matched_seed in prop::collection::vec(0u32..=128, 16),
        prompt in 1u32..=128,
        threshold in 0u32..=100,
        abs in 0u32..100,
        rel in 100u32..300,
    ) {
        let cfg = PrefixConfig {
            cache_threshold_pct: threshold,
            balance_abs_threshold: abs,
            balance_rel_threshold_pct: rel,
            ..PrefixConfig::default()
        };
        let c: Vec<Candidate> = loads.iter().enumerate().map(|(i, &l)| Candidate {
            backend: BackendId(i as u32), priority: 0, pending_batches: l, pending_work: 0, latency_ms: 0,
        }).collect();
        let m: Vec<u32> = matched_seed[..c.len()].iter().map(|&x| x.min(prompt)).collect();
        let i = pick_prefix(&c, &m, prompt, &RequestWork::default(), &cfg);
        // The rule written declaratively: the first least loaded candidate; the first of
        // the least loaded among the longest matches; the latter when its match is enough
        // and it is not overloaded against the former.
        let load = |j: usize| BalanceLoad { requests: c[j].pending_batches, work: 0 };
        let least = (0..c.len()).min_by_key(|&j| (c[j].pending_batches, j)).unwrap();
        let longest = *m.iter().max().unwrap();
        let best = (0..c.len()).filter(|&j| m[j] == longest)
            .min_by_key(|&j| (c[j].pending_batches, j)).unwrap();
        let expected = if cfg.enough(longest, prompt) && !cfg.overloaded(load(best), load(least)) {
            best
        } else {
            least
        };
        prop_assert_eq!(i, expected);
        // Never a candidate overloaded against the least loaded one.
        prop_assert!(i == least || !cfg.overloaded(load(i), load(least)));
    }

    /// With work in flight fed: the pick is the fallback (least work, ties to fewer
    /// requests, then the first) or a longest match that covers enough and is not
    /// overloaded against it, work counted with the request's own on each.
    #[test]
    fn prefix_rule_with_work_is_longest_match_or_least_work(
        loads in prop::collection::vec((0u32..8, 0u64..200_000), 1..16),
        matched_seed in prop::collection::vec(0u32..=128, 16),
        prompt in 1u32..=128,
        prompt_tokens in 0u32..40_000,
        output_tokens in 0u32..1_000,
        decode_token_work in 0u32..300,
        abs_work in 0u32..100_000,
        rel in 100u32..300,
    ) {
        let cfg = PrefixConfig {
            balance_abs_work_tokens: abs_work,
            balance_rel_threshold_pct: rel,
            decode_token_work,
            ..PrefixConfig::default()
        };
        let c: Vec<Candidate> = loads.iter().enumerate().map(|(i, &(n, w))| Candidate {
            backend: BackendId(i as u32), priority: 0, pending_batches: n, pending_work: w,
            latency_ms: 0,
        }).collect();
        let m: Vec<u32> = matched_seed[..c.len()].iter().map(|&x| x.min(prompt)).collect();
        let work = RequestWork { prompt_tokens, output_tokens };
        let i = pick_prefix(&c, &m, prompt, &work, &cfg);
        let fallback = (0..c.len())
            .min_by_key(|&j| (c[j].pending_work, c[j].pending_batches, j)).unwrap();
        let at = |j: usize| BalanceLoad {
            requests: c[j].pending_batches,
            work: c[j].pending_work + work.on(m[j], prompt, &cfg),
        };
        let longest = *m.iter().max().unwrap();
        if i != fallback {
            prop_assert_eq!(m[i], longest);
            prop_assert!(cfg.enough(longest, prompt));
            prop_assert!(!cfg.overloaded(at(i), at(fallback)));
        }
        // A cached share never costs more than the whole prompt.
        prop_assert!(work.on(m[i], prompt, &cfg) <= work.on(0, prompt, &cfg));
    }

    /// Rendezvous hashing: removing any set of backends moves only the keys that were on
    /// them, and adding them back restores every key.
    #[test]
    fn session_moves_only_the_keys_of_removed_backends(
        n in 2usize..12,
        removed_mask in any::<u16>(),
        keys in prop::collection::vec(any::<u64>(), 1..64),
    ) {
        let backend_keys: Vec<u64> = (0..n).map(|i| backend_key(&format!("gpu-{i}"))).collect();
        let all: Vec<Candidate> = (0..n as u32).map(|i| Candidate {
            backend: BackendId(i), priority: 0, pending_batches: i, pending_work: 0, latency_ms: 0,
        }).collect();
        let kept: Vec<Candidate> = all.iter().copied()
            .filter(|c| removed_mask & (1 << c.backend.0) == 0).collect();
        prop_assume!(!kept.is_empty());
        for &k in &keys {
            let home = all[pick_session(&all, Some(k), &backend_keys)].backend;
            let now = kept[pick_session(&kept, Some(k), &backend_keys)].backend;
            if removed_mask & (1 << home.0) == 0 {
                prop_assert_eq!(now, home);
            } else {
                prop_assert_ne!(now, home);
            }
        }
    }
}
