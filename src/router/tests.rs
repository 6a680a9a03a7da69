//! Acceptance scenarios of the intelligent-router specification (F06): user stories US-01
//! to US-06, acceptance criteria AC-01 to AC-16 and the spec's edge cases, each test named
//! after what it proves.

/// Property tests of the router (`tests/properties.rs`).
mod properties;

use super::registry::sim_backend as backend;
use super::*;
use crate::core::circuit::CircuitState;
use std::collections::BTreeMap;

const NONE: Capabilities = Capabilities {
    vision: false,
    tools: false,
    json_mode: false,
};
const VISION: Capabilities = Capabilities {
    vision: true,
    ..NONE
};
const TOOLS: Capabilities = Capabilities {
    tools: true,
    ..NONE
};
const JSON: Capabilities = Capabilities {
    json_mode: true,
    ..NONE
};

fn routing(strategy: &str) -> RoutingConfig {
    RoutingConfig {
        strategy: strategy.into(),
        ..RoutingConfig::default()
    }
}

fn router(backends: &[BackendConfig], cfg: &RoutingConfig) -> Router {
    let (r, warning) = Router::build(backends, cfg, 0x5eed).expect("valid config");
    assert!(warning.is_none(), "{warning:?}");
    r
}

fn id(r: &Router, name: &str) -> BackendId {
    r.registry().backend_id(name).expect("backend exists")
}

fn chosen(r: &mut Router, req: &Requirements<'_>) -> String {
    let d = r.route(req).unwrap_or_else(|e| panic!("routes: {e}"));
    r.registry().backend(d.backend).name().to_string()
}

fn aliases(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|&(a, t)| (a.to_string(), t.to_string()))
        .collect()
}

fn fallbacks(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|&(m, c)| (m.to_string(), c.iter().map(|s| s.to_string()).collect()))
        .collect()
}

// ---- US-01: basic model routing --------------------------------------------------------

#[test]
fn us01_ac01_routes_to_the_backend_with_the_exact_model() {
    let mut r = router(
        &[
            backend("A", 0, &[("llama3:8b", 8192, NONE)]),
            backend("B", 0, &[("mistral:7b", 8192, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let d = r.route(&Requirements::text("llama3:8b", 10)).unwrap();
    assert_eq!(d.backend, id(&r, "A"));
    assert_eq!(r.registry().model_name(d.model), "llama3:8b");
    assert_eq!(d.via, Via::Direct);
    assert_eq!(chosen(&mut r, &Requirements::text("mistral:7b", 10)), "B");
}

#[test]
fn us01_unknown_model_is_404_model_not_found() {
    let mut r = router(
        &[
            backend("A", 0, &[("llama3:8b", 8192, NONE)]),
            backend("B", 0, &[("mistral:7b", 8192, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let e = r.route(&Requirements::text("gpt-5", 10)).unwrap_err();
    assert_eq!(e.status(), 404);
    assert!(e.to_string().starts_with("Model 'gpt-5' not found"), "{e}");
    assert_eq!(
        e,
        RouteError::ModelNotFound {
            model: "gpt-5".into(),
            alias_target: None
        }
    );
}

// ---- US-02: capability-based routing ---------------------------------------------------

#[test]
fn us02_ac03_vision_request_goes_to_the_vision_backend() {
    // The spec's "A has llama3 (no vision), B has llava (vision)": both offer the model the
    // request names, only B with vision. Listed first and preferred, A must still lose.
    let mut r = router(
        &[
            backend("A", 0, &[("llama3:8b", 8192, NONE)]),
            backend(
                "B",
                9,
                &[("llama3:8b", 8192, VISION), ("llava", 4096, VISION)],
            ),
        ],
        &RoutingConfig::default(),
    );
    let mut b = RequirementsBuilder::new("llama3:8b");
    b.text("what is this?").content_part("image_url");
    assert_eq!(chosen(&mut r, &b.build()), "B");
    assert_eq!(
        chosen(&mut r, &Requirements::new("llava", 10, true, false, false)),
        "B"
    );
    assert_eq!(chosen(&mut r, &Requirements::text("llama3:8b", 10)), "A");
}

#[test]
fn us02_ac04_tools_request_goes_to_the_tools_backend() {
    let mut r = router(
        &[
            backend("A", 0, &[("llama3", 8192, NONE)]),
            backend("B", 9, &[("llama3", 8192, TOOLS)]),
        ],
        &RoutingConfig::default(),
    );
    let mut b = RequirementsBuilder::new("llama3");
    b.text("call a function").tools(1);
    assert_eq!(chosen(&mut r, &b.build()), "B");
}

#[test]
fn json_mode_request_goes_to_the_json_backend() {
    let mut r = router(
        &[
            backend("A", 0, &[("llama3", 8192, TOOLS)]),
            backend("B", 9, &[("llama3", 8192, JSON)]),
        ],
        &RoutingConfig::default(),
    );
    let mut b = RequirementsBuilder::new("llama3");
    b.response_format(Some("json_object"));
    assert_eq!(chosen(&mut r, &b.build()), "B");
}

#[test]
fn us02_no_vision_backend_is_400_capability_mismatch() {
    let mut r = router(
        &[backend("A", 0, &[("llama3:8b", 8192, TOOLS)])],
        &RoutingConfig::default(),
    );
    let e = r
        .route(&Requirements::new("llama3:8b", 10, true, false, false))
        .unwrap_err();
    assert_eq!(e.status(), 400);
    assert_eq!(e.code(), "capability_mismatch");
    let msg = e.to_string();
    assert!(
        msg.contains("'llama3:8b'") && msg.contains("missing vision"),
        "{msg}"
    );
}

#[test]
fn ac10_capability_mismatch_lists_every_missing_capability() {
    let mut r = router(
        &[
            backend("A", 0, &[("m", 1000, NONE)]),
            backend("B", 0, &[("m", 2000, TOOLS)]),
        ],
        &RoutingConfig::default(),
    );
    let e = r
        .route(&Requirements::new("m", 5000, true, true, true))
        .unwrap_err();
    let RouteError::CapabilityMismatch { missing, .. } = &e else {
        panic!("{e:?}")
    };
    // tools exists (on B), so it is not listed; the rest is.
    assert_eq!(
        missing.names().collect::<Vec<_>>(),
        ["vision", "json_mode", "context_length"]
    );
    assert_eq!(
        missing.context,
        Some(ContextShortfall {
            estimated_tokens: 5000,
            context_length_max: 2000
        })
    );
    let msg = e.to_string();
    assert!(
        msg.contains("missing vision, json_mode, context_length") && msg.contains("2000"),
        "{msg}"
    );
}

#[test]
fn capabilities_spread_over_backends_are_a_mismatch_naming_them() {
    let mut r = router(
        &[
            backend("A", 0, &[("m", 1000, VISION)]),
            backend("B", 0, &[("m", 1000, TOOLS)]),
        ],
        &RoutingConfig::default(),
    );
    let e = r
        .route(&Requirements::new("m", 10, true, true, false))
        .unwrap_err();
    let RouteError::CapabilityMismatch { missing, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(missing.no_single_backend);
    assert_eq!(missing.names().collect::<Vec<_>>(), ["vision", "tools"]);
    assert!(e.to_string().contains("no backend has all of them"), "{e}");
}

// ---- AC-05: context length -------------------------------------------------------------

#[test]
fn ac05_filters_by_context_length() {
    let mut r = router(
        &[
            backend("short", 0, &[("m", 4096, NONE)]),
            backend("long", 50, &[("m", 32768, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    assert_eq!(
        chosen(&mut r, &Requirements::text("m", 4096)),
        "short",
        "<= fits"
    );
    assert_eq!(chosen(&mut r, &Requirements::text("m", 4097)), "long");
    let mut b = RequirementsBuilder::new("m");
    b.text(&"x".repeat(40_000)); // 10,000 tokens
    assert_eq!(chosen(&mut r, &b.build()), "long");
    let e = r.route(&Requirements::text("m", 40_000)).unwrap_err();
    assert_eq!(e.status(), 400);
    assert!(e.to_string().contains("context_length"), "{e}");
}

/// An embed backend serving all-MiniLM-L6-v2 at its true 256-token limit, truncating
/// (`None`: the default) or not. Building it needs the `embed` feature.
#[cfg(feature = "embed")]
fn minilm(truncate: Option<bool>) -> BackendConfig {
    BackendConfig {
        kind: BackendKindName::Embed,
        model_dir: Some("/models/minilm".into()),
        truncate,
        ..backend("minilm", 0, &[("all-MiniLM-L6-v2", 256, NONE)])
    }
}

#[cfg(feature = "embed")]
#[test]
fn an_embed_backend_takes_an_input_longer_than_its_context_to_its_executor() {
    // The issue's request: one input of about 809 estimated tokens against a 256 limit.
    let long = Requirements::text("all-MiniLM-L6-v2", 809);
    let mut r = router(&[minilm(None)], &RoutingConfig::default());
    assert!(
        r.precheck(&long).is_ok(),
        "cut by the executor, not refused"
    );
    assert_eq!(chosen(&mut r, &long), "minilm");
    // What it cannot do is still refused: no tools on an embedding model.
    let tools = Requirements::new("all-MiniLM-L6-v2", 1, false, true, false);
    assert_eq!(r.precheck(&tools).unwrap_err().status(), 400);

    // truncate = false: the executor refuses that one input with its exact token count
    // (tests/embed_model.rs); the router's estimate does not pre-empt it.
    let r = router(&[minilm(Some(false))], &RoutingConfig::default());
    assert!(r.precheck(&long).is_ok());
    // A sim backend of the same context still refuses by the estimate.
    let r = router(
        &[backend("s", 0, &[("all-MiniLM-L6-v2", 256, NONE)])],
        &RoutingConfig::default(),
    );
    let e = r.precheck(&long).unwrap_err();
    assert_eq!(e.status(), 400);
    assert!(
        e.to_string().contains("context") && e.to_string().contains("256"),
        "{e}"
    );
}

#[test]
fn a_model_table_without_context_length_is_refused_naming_the_key() {
    let mut b = backend("s", 0, &[("m", 1, NONE)]);
    b.models[0].context_length = None;
    let Err(e) = Router::build(&[b], &RoutingConfig::default(), 1) else {
        panic!("a model without context_length was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("'s'") && e.contains("context_length") && e.contains("missing"),
        "{e}"
    );
}

// ---- AC-02: health and circuit ---------------------------------------------------------

#[test]
fn ac02_only_healthy_backends_with_a_closed_circuit_are_candidates() {
    let mut r = router(
        &[
            backend("A", 0, &[("m", 100, NONE)]),
            backend("B", 1, &[("m", 100, NONE)]),
            backend("C", 2, &[("m", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let (a, b) = (id(&r, "A"), id(&r, "B"));
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "A");
    r.registry_mut().set_healthy(a, false);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "B");
    r.registry_mut().set_circuit(b, CircuitState::Open);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "C");
    r.registry_mut().set_circuit(b, CircuitState::HalfOpen);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "C");
    // Back in the set once healthy again.
    r.registry_mut().set_healthy(a, true);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "A");
}

#[test]
fn ac02_all_unhealthy_is_503_no_healthy_backend() {
    let mut r = router(
        &[
            backend("A", 0, &[("m", 100, NONE)]),
            backend("B", 0, &[("m", 100, NONE)]),
            backend("C", 0, &[("m", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let (a, b, c) = (id(&r, "A"), id(&r, "B"), id(&r, "C"));
    r.registry_mut().set_healthy(a, false);
    r.registry_mut().set_healthy(b, false);
    r.registry_mut().set_circuit(c, CircuitState::Open);
    let e = r.route(&Requirements::text("m", 1)).unwrap_err();
    assert_eq!(e.status(), 503);
    assert_eq!(
        e,
        RouteError::NoHealthyBackend {
            model: "m".into(),
            alias: None,
            unavailable: Unavailable {
                serving: 3,
                unhealthy: 2,
                circuit_not_closed: 1,
                removed: 0,
                without_adapter: 0,
            }
        }
    );
    assert!(e
        .to_string()
        .contains("No healthy backend available for model 'm'"));
}

#[test]
fn capable_but_down_is_503_and_never_capable_is_400() {
    // The only vision backend is down: the request is fine, retry later (503). A request
    // no backend could ever serve is the client's to change (400), up or down.
    let mut r = router(
        &[
            backend("A", 0, &[("m", 100, NONE)]),
            backend("B", 0, &[("m", 100, VISION)]),
        ],
        &RoutingConfig::default(),
    );
    let b = id(&r, "B");
    r.registry_mut().set_healthy(b, false);
    let e = r
        .route(&Requirements::new("m", 1, true, false, false))
        .unwrap_err();
    assert_eq!(e.status(), 503, "{e}");
    let RouteError::NoHealthyBackend { unavailable, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (unavailable.serving, unavailable.unhealthy),
        (1, 1),
        "capable ones only"
    );
    let e = r
        .route(&Requirements::new("m", 1, false, true, false))
        .unwrap_err();
    assert_eq!(e.status(), 400, "{e}");
    let a = id(&r, "A");
    r.registry_mut().set_healthy(a, false);
    let e = r
        .route(&Requirements::new("m", 1, false, true, false))
        .unwrap_err();
    assert_eq!(e.status(), 400, "{e}");
}

// ---- US-03 / AC-06 / AC-11: load- and latency-aware smart scoring ------------------------

#[test]
fn us03_fewer_pending_batches_wins() {
    let mut r = router(
        &[
            backend("A", 10, &[("llama3:8b", 100, NONE)]),
            backend("B", 10, &[("llama3:8b", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let (a, b) = (id(&r, "A"), id(&r, "B"));
    for _ in 0..10 {
        r.registry_mut().batch_started(a);
    }
    for _ in 0..2 {
        r.registry_mut().batch_started(b);
    }
    for s in [Strategy::Smart, Strategy::LeastLoaded, Strategy::PowerOfTwo] {
        r.set_strategy(s);
        for _ in 0..20 {
            assert_eq!(
                chosen(&mut r, &Requirements::text("llama3:8b", 1)),
                "B",
                "{s}"
            );
        }
    }
}

#[test]
fn us03_ac06_lower_latency_scores_higher() {
    let mut r = router(
        &[
            backend("A", 10, &[("m", 100, NONE)]),
            backend("B", 10, &[("m", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let (a, b) = (id(&r, "A"), id(&r, "B"));
    r.registry_mut().record_latency_ms(a, 50.0);
    r.registry_mut().record_latency_ms(b, 200.0);
    let w = Weights::default();
    let ca = Candidate {
        backend: a,
        priority: 10,
        pending_batches: 0,
        pending_work: 0,
        latency_ms: 50,
    };
    let cb = Candidate {
        backend: b,
        latency_ms: 200,
        ..ca
    };
    assert!(score(&ca, &w) > score(&cb, &w));
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "A");
}

#[test]
fn ac06_ac11_smart_picks_the_highest_score_over_all_three_parts() {
    let mut r = router(
        &[
            backend("preferred-but-busy", 0, &[("m", 100, NONE)]),
            backend("balanced", 20, &[("m", 100, NONE)]),
            backend("slow", 0, &[("m", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let (p, b, s) = (
        id(&r, "preferred-but-busy"),
        id(&r, "balanced"),
        id(&r, "slow"),
    );
    for _ in 0..100 {
        r.registry_mut().batch_started(p); // 50 + 0 + 20 = 70
    }
    r.registry_mut().record_latency_ms(b, 100.0); // 40 + 30 + 18 = 88
    r.registry_mut().record_latency_ms(s, 5000.0); // 50 + 30 + 0 = 80
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "balanced");
}

#[test]
fn equal_scores_go_to_the_first_candidate_and_no_latency_counts_as_zero() {
    let mut r = router(
        &[
            backend("A", 5, &[("m", 100, NONE)]),
            backend("B", 5, &[("m", 100, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    for _ in 0..5 {
        assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "A");
    }
    // B measured at 0 ms: the same score as unmeasured A; A stays first.
    let b = id(&r, "B");
    r.registry_mut().record_latency_ms(b, 0.0);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "A");
    // A measured at 60 ms: latency part 94 instead of 100, score 96 against B's 97.
    let a = id(&r, "A");
    r.registry_mut().record_latency_ms(a, 60.0);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "B");
}

// ---- US-04 / AC-07: aliases ------------------------------------------------------------

#[test]
fn us04_ac07_alias_routes_to_the_target_model() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("gpt-4", "llama3:70b")]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("small", 0, &[("llama3:8b", 8192, NONE)]),
            backend("big", 5, &[("llama3:70b", 8192, NONE)]),
        ],
        &cfg,
    );
    let d = r.route(&Requirements::text("gpt-4", 10)).unwrap();
    assert_eq!(d.backend, id(&r, "big"));
    assert_eq!(r.registry().model_name(d.model), "llama3:70b");
    assert!(matches!(d.via, Via::Alias { .. }));
    assert_eq!(
        r.describe(&d).to_string(),
        "backend=big; model=llama3:70b; via=alias; requested=gpt-4"
    );
}

#[test]
fn us04_alias_to_unserved_model_is_404_naming_both() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("gpt-4", "llama3:70b")]),
        ..RoutingConfig::default()
    };
    let mut r = router(&[backend("small", 0, &[("llama3:8b", 8192, NONE)])], &cfg);
    let e = r.route(&Requirements::text("gpt-4", 10)).unwrap_err();
    assert_eq!(e.status(), 404);
    let msg = e.to_string();
    assert!(
        msg.starts_with("Model 'gpt-4' not found") && msg.contains("'llama3:70b'"),
        "{msg}"
    );
}

#[test]
fn alias_is_used_only_when_the_name_itself_cannot_serve() {
    // "gpt-4" is both served directly and an alias; the alias is the second choice.
    let cfg = RoutingConfig {
        aliases: aliases(&[("gpt-4", "llama3:70b")]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("real", 0, &[("gpt-4", 8192, NONE)]),
            backend("local", 0, &[("llama3:70b", 8192, NONE)]),
        ],
        &cfg,
    );
    let d = r.route(&Requirements::text("gpt-4", 1)).unwrap();
    assert_eq!((d.backend, d.via), (id(&r, "real"), Via::Direct));
    let real = id(&r, "real");
    r.registry_mut().set_healthy(real, false);
    let d = r.route(&Requirements::text("gpt-4", 1)).unwrap();
    assert_eq!(d.backend, id(&r, "local"));
    assert!(matches!(d.via, Via::Alias { .. }));
}

#[test]
fn ac09_circular_aliases_are_rejected_at_build_naming_the_cycle() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("a", "b"), ("b", "c"), ("c", "a")]),
        ..RoutingConfig::default()
    };
    let e = Router::build(&[backend("x", 0, &[("m", 1, NONE)])], &cfg, 1).unwrap_err();
    assert_eq!(
        e,
        RouterConfigError::AliasCycle {
            cycle: ["a", "b", "c", "a"].map(String::from).to_vec()
        }
    );
    assert!(e.to_string().contains("a -> b -> c -> a"), "{e}");
}

// ---- US-05 / AC-08: fallback chains ----------------------------------------------------

#[test]
fn us05_ac08_fallback_chain_is_walked_in_order() {
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("claude-3-opus", &["llama3:70b", "mistral:7b"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("A", 0, &[("llama3:8b", 8192, NONE)]),
            backend("B", 0, &[("mistral:7b", 8192, NONE)]),
        ],
        &cfg,
    );
    let d = r.route(&Requirements::text("claude-3-opus", 10)).unwrap();
    assert_eq!(d.backend, id(&r, "B"));
    assert_eq!(r.registry().model_name(d.model), "mistral:7b");
    assert_eq!(
        r.describe(&d).to_string(),
        "backend=B; model=mistral:7b; via=fallback; requested=claude-3-opus"
    );
}

#[test]
fn fallback_applies_when_the_primary_is_unhealthy_or_incapable() {
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("llama3:70b", &["llama3:8b", "mistral:7b"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("big", 0, &[("llama3:70b", 8192, NONE)]),
            backend("small", 0, &[("llama3:8b", 8192, NONE)]),
            backend("vis", 0, &[("mistral:7b", 8192, VISION)]),
        ],
        &cfg,
    );
    assert_eq!(chosen(&mut r, &Requirements::text("llama3:70b", 1)), "big");
    let big = id(&r, "big");
    r.registry_mut().set_circuit(big, CircuitState::Open);
    assert_eq!(
        chosen(&mut r, &Requirements::text("llama3:70b", 1)),
        "small"
    );
    r.registry_mut().set_circuit(big, CircuitState::Closed);
    // Vision: only the last model of the chain has it; the same filters apply to each.
    assert_eq!(
        chosen(
            &mut r,
            &Requirements::new("llama3:70b", 1, true, false, false)
        ),
        "vis"
    );
}

#[test]
fn us05_exhausted_chain_is_503_listing_every_model_tried() {
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("claude-3-opus", &["llama3:70b", "mistral:7b"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("A", 0, &[("llama3:70b", 8192, TOOLS)]),
            backend("B", 0, &[("mistral:7b", 8192, NONE)]),
        ],
        &cfg,
    );
    let a = id(&r, "A");
    r.registry_mut().set_healthy(a, false);
    let e = r
        .route(&Requirements::new("claude-3-opus", 10, false, true, false))
        .unwrap_err();
    assert_eq!(e.status(), 503);
    assert_eq!(e.code(), "fallback_chain_exhausted");
    let RouteError::FallbackChainExhausted { requested, tried } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(requested, "claude-3-opus");
    let names: Vec<&str> = tried.iter().map(|t| t.model.as_str()).collect();
    assert_eq!(names, ["claude-3-opus", "llama3:70b", "mistral:7b"]);
    assert_eq!(tried[0].outcome, ModelOutcome::NotServed);
    assert!(matches!(tried[1].outcome, ModelOutcome::NoHealthy(_)));
    assert!(matches!(tried[2].outcome, ModelOutcome::Missing(m) if m.tools));
    let msg = e.to_string();
    for m in [
        "'claude-3-opus'",
        "'llama3:70b'",
        "'mistral:7b'",
        "missing tools",
    ] {
        assert!(msg.contains(m), "{m} in {msg}");
    }
}

#[test]
fn alias_to_unavailable_model_tries_the_targets_fallback_chain() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("gpt-4", "llama3:70b")]),
        fallbacks: fallbacks(&[("llama3:70b", &["llama3:8b"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("big", 0, &[("llama3:70b", 8192, NONE)]),
            backend("small", 0, &[("llama3:8b", 8192, NONE)]),
        ],
        &cfg,
    );
    let big = id(&r, "big");
    r.registry_mut().set_healthy(big, false);
    let d = r.route(&Requirements::text("gpt-4", 1)).unwrap();
    assert_eq!(d.backend, id(&r, "small"));
    assert_eq!(
        r.describe(&d).to_string(),
        "backend=small; model=llama3:8b; via=fallback; requested=gpt-4"
    );
    let small = id(&r, "small");
    r.registry_mut().set_healthy(small, false);
    let e = r.route(&Requirements::text("gpt-4", 1)).unwrap_err();
    let RouteError::FallbackChainExhausted { tried, .. } = &e else {
        panic!("{e:?}")
    };
    let names: Vec<&str> = tried.iter().map(|t| t.model.as_str()).collect();
    assert_eq!(
        names,
        ["llama3:70b", "llama3:8b"],
        "the alias target, then its chain"
    );
}

#[test]
fn fallbacks_are_single_level() {
    // a -> [b], b -> [c]: a request for "a" never reaches "c".
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("a", &["b"]), ("b", &["c"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("A", 0, &[("a", 100, NONE)]),
            backend("B", 0, &[("b", 100, NONE)]),
            backend("C", 0, &[("c", 100, NONE)]),
        ],
        &cfg,
    );
    let (a, b) = (id(&r, "A"), id(&r, "B"));
    r.registry_mut().set_healthy(a, false);
    r.registry_mut().set_healthy(b, false);
    let e = r.route(&Requirements::text("a", 1)).unwrap_err();
    assert_eq!(e.code(), "fallback_chain_exhausted");
    assert!(!e.to_string().contains("'c'"), "{e}");
    assert_eq!(chosen(&mut r, &Requirements::text("b", 1)), "C");
}

#[test]
fn empty_fallback_chain_means_no_fallback() {
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("m", &[])]),
        ..RoutingConfig::default()
    };
    let mut r = router(&[backend("A", 0, &[("m", 100, NONE)])], &cfg);
    let a = id(&r, "A");
    r.registry_mut().set_healthy(a, false);
    let e = r.route(&Requirements::text("m", 1)).unwrap_err();
    assert_eq!(e.code(), "no_healthy_backend");
}

// ---- US-06 / AC-12..AC-14: strategies --------------------------------------------------

fn three(strategy: &str) -> Router {
    router(
        &[
            backend("A", 2, &[("m", 100, NONE)]),
            backend("B", 1, &[("m", 100, NONE)]),
            backend("C", 3, &[("m", 100, NONE)]),
        ],
        &routing(strategy),
    )
}

#[test]
fn us06_ac12_round_robin_gives_each_of_3_backends_2_of_6_requests() {
    let mut r = three("round_robin");
    let mut counts = BTreeMap::new();
    for _ in 0..6 {
        *counts
            .entry(chosen(&mut r, &Requirements::text("m", 1)))
            .or_insert(0) += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("A".into(), 2), ("B".into(), 2), ("C".into(), 2)])
    );
}

#[test]
fn round_robin_cursor_is_per_model() {
    // Alternating two models must not pin each model to one backend.
    let mut r = router(
        &[
            backend("A", 0, &[("x", 100, NONE), ("y", 100, NONE)]),
            backend("B", 0, &[("x", 100, NONE), ("y", 100, NONE)]),
        ],
        &routing("round_robin"),
    );
    let mut xs = Vec::new();
    for _ in 0..4 {
        xs.push(chosen(&mut r, &Requirements::text("x", 1)));
        chosen(&mut r, &Requirements::text("y", 1));
    }
    assert_eq!(xs, ["A", "B", "A", "B"]);
}

#[test]
fn us06_ac13_priority_only_always_picks_the_lowest_priority_number() {
    let mut r = router(
        &[
            backend("two", 2, &[("m", 100, NONE)]),
            backend("one", 1, &[("m", 100, NONE)]),
        ],
        &routing("priority_only"),
    );
    let two = id(&r, "two");
    let one = id(&r, "one");
    for _ in 0..50 {
        r.registry_mut().batch_started(one); // load does not matter
    }
    r.registry_mut().record_latency_ms(one, 9000.0);
    r.registry_mut().record_latency_ms(two, 1.0);
    for _ in 0..20 {
        assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "one");
    }
}

#[test]
fn us06_ac14_random_spreads_100_requests_over_3_backends_25_to_45_each() {
    let mut r = three("random");
    let mut counts = BTreeMap::<String, u32>::new();
    for _ in 0..100 {
        *counts
            .entry(chosen(&mut r, &Requirements::text("m", 1)))
            .or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(
        counts.values().all(|&c| (25..=45).contains(&c)),
        "{counts:?}"
    );
    // And over many requests, within 2% of a third each.
    let mut counts = [0u32; 3];
    for _ in 0..30_000 {
        let d = r.route(&Requirements::text("m", 1)).unwrap();
        counts[d.backend.index()] += 1;
    }
    assert!(
        counts.iter().all(|&c| (9_800..=10_200).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn random_is_reproducible_from_the_seed() {
    let run = |seed| {
        let (mut r, _) = Router::build(&three_backends(), &routing("random"), seed).expect("valid");
        (0..50)
            .map(|_| r.route(&Requirements::text("m", 1)).unwrap().backend)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9), run(10));
}

fn three_backends() -> Vec<BackendConfig> {
    ["A", "B", "C"]
        .iter()
        .map(|n| backend(n, 0, &[("m", 100, NONE)]))
        .collect()
}

#[test]
fn unknown_strategy_is_smart_with_a_warning() {
    let (r, warning) = Router::build(&three_backends(), &routing("fastest"), 1).unwrap();
    assert_eq!(r.strategy(), Strategy::Smart);
    assert!(warning.unwrap().to_string().contains("\"fastest\""));
}

#[test]
fn weights_not_summing_to_100_are_a_config_error() {
    let cfg = RoutingConfig {
        weights: Weights {
            priority: 60,
            load: 30,
            latency: 20,
        },
        ..RoutingConfig::default()
    };
    let e = Router::build(&three_backends(), &cfg, 1).unwrap_err();
    assert!(
        matches!(e, RouterConfigError::Weights { sum: 110, .. }),
        "{e}"
    );
}

#[test]
fn custom_weights_change_the_choice() {
    let cfg = RoutingConfig {
        weights: Weights {
            priority: 0,
            load: 100,
            latency: 0,
        },
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("preferred", 0, &[("m", 100, NONE)]),
            backend("idle", 100, &[("m", 100, NONE)]),
        ],
        &cfg,
    );
    let p = id(&r, "preferred");
    r.registry_mut().batch_started(p);
    assert_eq!(chosen(&mut r, &Requirements::text("m", 1)), "idle");
}

// ---- AC-10: descriptive errors; edge cases ---------------------------------------------

#[test]
fn ac10_empty_model_name_is_400() {
    let mut r = router(&three_backends(), &RoutingConfig::default());
    for m in ["", "  "] {
        let e = r.route(&Requirements::text(m, 1)).unwrap_err();
        assert_eq!(e, RouteError::EmptyModel);
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("\"model\""), "{e}");
    }
}

#[test]
fn no_backends_registered_is_model_not_found() {
    let mut r = router(&[], &RoutingConfig::default());
    let e = r.route(&Requirements::text("llama3", 1)).unwrap_err();
    assert_eq!(e.status(), 404);
}

#[test]
fn name_known_only_as_a_fallback_target_is_not_found() {
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("m", &["ghost"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(&[backend("A", 0, &[("m", 100, NONE)])], &cfg);
    let e = r.route(&Requirements::text("ghost", 1)).unwrap_err();
    assert_eq!(e.status(), 404);
}

#[test]
fn every_failure_has_its_status() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("alias", "gone")]),
        fallbacks: fallbacks(&[("chain", &["down"])]),
        ..RoutingConfig::default()
    };
    let mut r = router(
        &[
            backend("A", 0, &[("plain", 100, NONE)]),
            backend("B", 0, &[("down", 100, NONE)]),
        ],
        &cfg,
    );
    let b = id(&r, "B");
    r.registry_mut().set_healthy(b, false);
    let cases: [(&str, bool, u16, &str); 6] = [
        ("", false, 400, "model_empty"),
        ("nope", false, 404, "model_not_found"),
        ("alias", false, 404, "model_not_found"),
        ("plain", true, 400, "capability_mismatch"),
        ("down", false, 503, "no_healthy_backend"),
        ("chain", false, 503, "fallback_chain_exhausted"),
    ];
    for (model, vision, status, code) in cases {
        let e = r
            .route(&Requirements::new(model, 1, vision, false, false))
            .unwrap_err();
        assert_eq!((e.status(), e.code()), (status, code), "{model}: {e}");
        assert!(
            e.to_string().len() > 20,
            "a message a person can act on: {e}"
        );
    }
}

// ---- retries and dispatch-time picks ---------------------------------------------------

#[test]
fn pick_excluding_skips_backends_that_failed_this_request() {
    let mut r = three("priority_only");
    let d = r.route(&Requirements::text("m", 1)).unwrap();
    assert_eq!(d.backend, id(&r, "B"), "priority 1");
    let req = Requirements::text("m", 1);
    let next = r.pick_excluding(d.model, &req, &[d.backend]).unwrap();
    assert_eq!(next, id(&r, "A"), "priority 2");
    let all = [id(&r, "A"), id(&r, "B"), id(&r, "C")];
    assert_eq!(r.pick_excluding(d.model, &req, &all), None);
    assert_eq!(r.pick(d.model, &req), Some(id(&r, "B")));
}

// ---- AC-15 / AC-16: speed, no allocation, one owner ------------------------------------

/// 100 backends, 1000 models, every backend serving model "m0000".
fn wide_router() -> Router {
    let backends: Vec<BackendConfig> = (0..100u32)
        .map(|b| {
            let mut models = vec![(
                "m0000".to_string(),
                4096 << (b % 4),
                Capabilities {
                    vision: b % 3 == 0,
                    tools: b % 2 == 0,
                    json_mode: b % 5 != 0,
                },
            )];
            models.extend((0..10).map(|k| (format!("m{:04}", 1 + (b * 10 + k) % 999), 8192, NONE)));
            BackendConfig {
                models: models
                    .into_iter()
                    .map(|(name, context_length, capabilities)| ModelConfig {
                        name,
                        context_length: Some(context_length),
                        capabilities,
                        adapters: Vec::new(),
                    })
                    .collect(),
                ..backend(&format!("b{b:03}"), b % 7, &[])
            }
        })
        .collect();
    let r = router(&backends, &RoutingConfig::default());
    assert_eq!(r.registry().model_count(), 1000);
    r
}

#[test]
fn ac15_decisions_take_well_under_a_millisecond() {
    let mut r = wide_router();
    for b in 0..100u32 {
        let id = BackendId(b);
        for _ in 0..(b * 37 % 120) {
            r.registry_mut().batch_started(id);
        }
        r.registry_mut()
            .record_latency_ms(id, f64::from(b * 13 % 1500));
    }
    let req = Requirements::new("m0000", 5000, false, true, false);
    let n = 2000u32;
    let start = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(r.route(std::hint::black_box(&req)).unwrap());
    }
    let per = start.elapsed() / n;
    // The spec's budget is 1 ms; the bench holds release builds to 1 us.
    assert!(
        per < std::time::Duration::from_millis(1),
        "{per:?} per decision"
    );
}

#[test]
fn route_takes_mut_self_and_reuses_its_scratch_buffer() {
    // The signature is the contract: exclusive access, so no lock is needed, and the
    // router's own scratch, so no per-decision buffer is needed.
    let _: fn(&mut Router, &Requirements<'_>) -> Result<Decision, RouteError> = Router::route;
    let mut r = wide_router();
    let before = r.scratch_identity();
    assert_eq!(before.1, r.registry().offers_per_model_max());
    assert_eq!(before.1, 100);
    for s in Strategy::ALL {
        r.set_strategy(s);
        for i in 0..500u32 {
            let model = format!("m{:04}", i % 1000);
            let needs_tools = i % 3 == 0;
            let _ = r.route(&Requirements::new(&model, i * 7, false, needs_tools, false));
        }
    }
    assert_eq!(r.scratch_identity(), before, "scratch never reallocated");
}

#[test]
fn ac16_the_router_has_one_owner_and_moves_to_the_engine_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Router>();
    let mut r = three("round_robin");
    let handle = std::thread::spawn(move || {
        let picks: Vec<BackendId> = (0..3)
            .map(|_| r.route(&Requirements::text("m", 1)).unwrap().backend)
            .collect();
        (r, picks)
    });
    let (mut r, picks) = handle.join().unwrap();
    assert_eq!(picks, [BackendId(0), BackendId(1), BackendId(2)]);
    // State carried across the move.
    assert_eq!(
        r.route(&Requirements::text("m", 1)).unwrap().backend,
        BackendId(0)
    );
}

// ---- configuration from TOML -----------------------------------------------------------

#[test]
fn builds_from_backends_and_routing_tables() {
    #[derive(serde::Deserialize)]
    struct File {
        backends: Vec<BackendConfig>,
        routing: RoutingConfig,
    }
    let f: File = toml::from_str(
        r#"
        [routing]
        strategy = "least_loaded"
        max_retries = 3
        [routing.weights]
        priority = 60
        load = 20
        latency = 20
        [routing.aliases]
        "gpt-4" = "llama3:70b"
        [routing.fallbacks]
        "llama3:70b" = ["llama3:8b"]

        [[backends]]
        name = "big"
        kind = "upstream"
        base_url = "http://127.0.0.1:9001"
        [[backends.models]]
        name = "llama3:70b"
        context_length = 8192
        capabilities = { tools = true }

        [[backends]]
        name = "small"
        kind = "sim"
        [[backends.models]]
        name = "llama3:8b"
        context_length = 8192
        "#,
    )
    .expect("valid toml");
    let (mut r, warning) = Router::build(&f.backends, &f.routing, 1).unwrap();
    assert!(warning.is_none());
    assert_eq!(r.strategy(), Strategy::LeastLoaded);
    assert_eq!(r.max_retries(), 3);
    assert_eq!(r.weights().priority, 60);
    assert_eq!(chosen(&mut r, &Requirements::text("gpt-4", 1)), "big");
    let routable: Vec<&str> = r.routable().map(|(n, _)| n).collect();
    assert!(routable.contains(&"gpt-4") && routable.contains(&"llama3:8b"));
}

#[test]
fn routing_table_defaults() {
    let r: RoutingConfig = toml::from_str("").unwrap();
    assert_eq!(r, RoutingConfig::default());
    assert_eq!(r.strategy, "smart");
    assert_eq!(r.weights, Weights::default());
    assert_eq!(r.max_retries, 2);
    assert!(toml::from_str::<RoutingConfig>("strategyy = 'smart'").is_err());
}

#[test]
fn precheck_judges_static_errors_whatever_the_live_state() {
    let cfg = RoutingConfig {
        aliases: aliases(&[("v", "llava")]),
        ..Default::default()
    };
    let mut r = router(
        &[
            backend("A", 0, &[("m", 100, NONE)]),
            backend("B", 0, &[("llava", 100, VISION)]),
        ],
        &cfg,
    );
    // Unknown and empty names, capability mismatch: same answers as route().
    assert_eq!(
        r.precheck(&Requirements::text("gpt-5", 1))
            .unwrap_err()
            .status(),
        404
    );
    assert_eq!(
        r.precheck(&Requirements::text(" ", 1))
            .unwrap_err()
            .status(),
        400
    );
    let vision_on_m = Requirements::new("m", 1, true, false, false);
    assert_eq!(
        r.precheck(&vision_on_m).unwrap_err(),
        r.route(&vision_on_m).unwrap_err()
    );
    assert_eq!(
        r.precheck(&Requirements::text("m", 101))
            .unwrap_err()
            .status(),
        400,
        "longer than every backend's context"
    );
    // A down backend is not a static error: precheck passes, route_name says 503.
    let a = id(&r, "A");
    r.registry_mut().set_healthy(a, false);
    let (name, need) = r.precheck(&Requirements::text("m", 1)).expect("static ok");
    assert_eq!(r.route_name(name, &need).unwrap_err().status(), 503);
    // An alias resolves to the same decision through either path.
    let (name, need) = r
        .precheck(&Requirements::new("v", 1, true, false, false))
        .unwrap();
    assert_eq!(
        r.route_name(name, &need).unwrap(),
        r.route(&Requirements::new("v", 1, true, false, false))
            .unwrap()
    );
}

// ---- issue 24: prefix_aware and session --------------------------------------------------

/// The chained names of a prompt whose blocks hold `contents`.
fn names(contents: impl IntoIterator<Item = u64>) -> Vec<crate::core::prefix::BlockHash> {
    let mut parent = crate::core::prefix::ROOT;
    contents
        .into_iter()
        .map(|c| {
            parent = crate::core::prefix::chain(parent, c);
            parent
        })
        .collect()
}

fn routed_with(r: &mut Router, affinity: &Affinity<'_>) -> String {
    let d = r
        .route_with(&Requirements::text("m", 1), affinity)
        .unwrap_or_else(|e| panic!("routes: {e}"));
    r.registry().backend(d.backend).name().to_string()
}

#[test]
fn prefix_aware_follows_the_prompt_it_sent_and_spreads_new_ones_by_load() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    assert_eq!(r.strategy(), Strategy::PrefixAware);
    let (a, b, c) = (id(&r, "A"), id(&r, "B"), id(&r, "C"));
    // A conversation's first turn: nothing matches, least loaded (A, the first on a tie).
    let turn1 = names(0..40);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&turn1)), "A");
    r.registry_mut().batch_started(a);
    // Another conversation: nothing matches, least loaded is now B.
    let other = names(1000..1040);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&other)), "B");
    r.registry_mut().batch_started(b);
    // Turn 2 extends turn 1: back to A though A and B are busier than C.
    let turn2 = names(0..64);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&turn2)), "A");
    assert_eq!(
        r.prefix_index(a).unwrap().cached_prefix_blocks(&turn2),
        64,
        "recorded after the decision"
    );
    assert_eq!(r.prefix_index(c).unwrap().len(), 0);
    // A is overloaded against C (> 64 in flight and > 150 %): least loaded instead.
    for _ in 0..70 {
        r.registry_mut().batch_started(a);
    }
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&turn2)), "C");
    // No names: least loaded, and nothing is recorded.
    let before: u32 = [a, b, c]
        .iter()
        .map(|&x| r.prefix_index(x).unwrap().len())
        .sum();
    assert_eq!(routed_with(&mut r, &Affinity::NONE), "C");
    let after: u32 = [a, b, c]
        .iter()
        .map(|&x| r.prefix_index(x).unwrap().len())
        .sum();
    assert_eq!(before, after);
}

#[test]
fn prefix_aware_asks_the_exact_view_first_and_records_only_what_it_guessed() {
    /// Says backend B holds 50 blocks of anything, knows nothing of the others.
    struct OnlyB(BackendId);
    impl CacheView for OnlyB {
        fn cached_prefix_blocks(
            &self,
            backend: BackendId,
            blocks: &[crate::core::prefix::BlockHash],
        ) -> Option<u32> {
            (backend == self.0).then_some(50.min(blocks.len() as u32))
        }
    }
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let b = id(&r, "B");
    let view = OnlyB(b);
    let p = names(0..64);
    let aff = Affinity {
        blocks: &p,
        session: None,
        exact: Some(&view),
        output_tokens: 0,
    };
    assert_eq!(routed_with(&mut r, &aff), "B");
    assert_eq!(
        r.prefix_index(b).unwrap().len(),
        0,
        "exact: nothing guessed"
    );
    // Without the view B's index knows nothing: least loaded (A), recorded there.
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&p)), "A");
    let a = id(&r, "A");
    assert_eq!(r.prefix_index(a).unwrap().cached_prefix_blocks(&p), 64);
    // The index is forgotten on a restart.
    r.forget_cached(a);
    assert!(r.prefix_index(a).unwrap().is_empty());
}

#[test]
fn prefix_aware_skips_an_unhealthy_backend_holding_the_prefix() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let p = names(0..64);
    let first = routed_with(&mut r, &Affinity::prefix(&p));
    let held = id(&r, &first);
    r.registry_mut().set_healthy(held, false);
    let second = routed_with(&mut r, &Affinity::prefix(&p));
    assert_ne!(second, first);
    r.registry_mut().set_healthy(held, true);
    // Both now hold it; the first listed of equal matches and loads.
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&p)), "A");
}

#[test]
fn prefix_indexes_are_allocated_with_the_strategy_and_their_size_is_stated() {
    let mut r = three("least_loaded");
    assert!(r.prefix_index(BackendId::FIRST).is_none());
    assert_eq!(r.prefix_index_bytes(), 0);
    r.set_strategy(Strategy::PrefixAware);
    assert_eq!(
        r.prefix_index_bytes(),
        3 * 32_768 * 40,
        "three backends at the default bound"
    );
}

#[test]
fn session_keeps_a_session_on_one_backend_and_moves_only_a_leaving_backends() {
    let mut r = router(&three_backends(), &routing("session"));
    let mut homes = Vec::new();
    for key in 0..300u64 {
        let k = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        homes.push(routed_with(&mut r, &Affinity::session(k)));
        // Load does not move a session.
        let home = id(&r, homes.last().unwrap());
        r.registry_mut().batch_started(home);
        assert_eq!(
            &routed_with(&mut r, &Affinity::session(k)),
            homes.last().unwrap()
        );
    }
    for n in ["A", "B", "C"] {
        let count = homes.iter().filter(|h| *h == n).count();
        assert!((60..140).contains(&count), "{n}: {count} of 300");
    }
    let b = id(&r, "B");
    r.registry_mut().set_healthy(b, false);
    for (key, home) in homes.iter().enumerate() {
        let k = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let now = routed_with(&mut r, &Affinity::session(k));
        if home == "B" {
            assert_ne!(now, "B");
        } else {
            assert_eq!(&now, home, "only B's sessions move");
        }
    }
    r.registry_mut().set_healthy(b, true);
    for (key, home) in homes.iter().enumerate() {
        let k = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        assert_eq!(
            &routed_with(&mut r, &Affinity::session(k)),
            home,
            "they come back"
        );
    }
    // No key: least loaded.
    let least = ["A", "B", "C"]
        .into_iter()
        .min_by_key(|n| r.registry().state(id(&r, n)).pending_batches())
        .unwrap();
    assert_eq!(routed_with(&mut r, &Affinity::NONE), least);
}

#[test]
fn an_affinity_does_not_change_the_other_strategies() {
    let p = names(0..64);
    let with = Affinity {
        blocks: &p,
        session: Some(7),
        exact: None,
        output_tokens: 0,
    };
    for s in Strategy::ALL {
        if matches!(s, Strategy::PrefixAware | Strategy::Session) {
            continue;
        }
        let (mut plain, mut aff) = (three(s.as_str()), three(s.as_str()));
        for i in 0..50 {
            let x = chosen(&mut plain, &Requirements::text("m", 1));
            assert_eq!(routed_with(&mut aff, &with), x, "{s} at {i}");
            let b = id(&plain, &x);
            plain.registry_mut().batch_started(b);
            aff.registry_mut().batch_started(b);
        }
    }
}

#[test]
fn a_bad_prefix_table_is_a_config_error() {
    let cfg = RoutingConfig {
        prefix: PrefixConfig {
            balance_rel_threshold_pct: 50,
            ..PrefixConfig::default()
        },
        ..routing("prefix_aware")
    };
    let e = Router::build(&three_backends(), &cfg, 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("routing.prefix.balance_rel_threshold_pct = 50"),
        "{e}"
    );
}

#[test]
fn a_backend_back_from_unhealthy_is_forgotten_and_a_healthy_verdict_alone_is_not() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let p = names(0..64);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&p)), "A");
    let a = id(&r, "A");
    r.set_healthy(a, true); // already healthy: nothing changes
    assert_eq!(r.prefix_index(a).unwrap().cached_prefix_blocks(&p), 64);
    r.set_healthy(a, false);
    assert!(!r.registry().state(a).healthy());
    assert_eq!(
        r.prefix_index(a).unwrap().cached_prefix_blocks(&p),
        64,
        "kept while away"
    );
    r.set_healthy(a, true);
    assert!(
        r.prefix_index(a).unwrap().is_empty(),
        "it may have restarted"
    );
}

#[test]
fn exact_backends_and_the_lookup_copy_hold_no_approximate_index() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let b = id(&r, "B");
    r.set_cache_exact(b);
    assert!(r.prefix_index(b).is_none());
    assert_eq!(r.prefix_index_bytes(), 2 * 32_768 * 40);
    // Nothing answers for B: it counts unmatched, and nothing is recorded for it.
    let (a, c) = (id(&r, "A"), id(&r, "C"));
    r.registry_mut().batch_started(a);
    r.registry_mut().batch_started(c);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&names(0..8))), "B");
    assert!(r.prefix_index(b).is_none());
    let copy = r.lookup_copy();
    assert_eq!(copy.prefix_index_bytes(), 0);
    assert_eq!(copy.strategy(), Strategy::PrefixAware);
    assert_eq!(r.clone().prefix_index_bytes(), r.prefix_index_bytes());
}

#[test]
fn a_decision_costs_the_prompt_not_cached_on_the_chosen_backend() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let p = names(0..64); // 64 blocks; the estimate (within the backends' context of 100)
    let req = Requirements::text("m", 64);
    let with_output = Affinity {
        output_tokens: 100,
        ..Affinity::prefix(&p)
    };
    let first = r.route_with(&req, &with_output).unwrap();
    assert_eq!(first.work, 64, "nothing cached; decode_token_work is 0");
    let again = r.route_with(&req, &with_output).unwrap();
    assert_eq!(again.backend, first.backend);
    assert_eq!(again.work, 0, "all of it cached there");
    // Half the prompt cached: half of it to compute.
    let half: Vec<_> = p[..32].iter().copied().chain(names(1000..1032)).collect();
    assert_eq!(
        r.route_with(&req, &Affinity::prefix(&half)).unwrap().work,
        32
    );
    // Weighted output tokens count when configured.
    let mut cfg = routing("prefix_aware");
    cfg.prefix.decode_token_work = 3;
    let mut r = router(&three_backends(), &cfg);
    assert_eq!(r.route_with(&req, &with_output).unwrap().work, 64 + 300);
}

#[test]
fn work_fed_by_the_caller_moves_a_request_off_a_backend_busy_with_long_prompts() {
    let mut r = router(&three_backends(), &routing("prefix_aware"));
    let (a, b) = (id(&r, "A"), id(&r, "B"));
    let p = names(0..64);
    let req = Requirements::text("m", 64);
    assert_eq!(routed_with(&mut r, &Affinity::prefix(&p)), "A");
    // Every backend holds one request; A's are long uncached prompts, B's and C's short.
    for (backend, work) in [(a, 40_000), (b, 100), (id(&r, "C"), 200)] {
        r.registry_mut().batch_started(backend);
        r.registry_mut().work_started(backend, work);
    }
    // 40,000 against B's 100 + 64: more than 32,768 above and 150 %: B.
    assert_eq!(
        r.route_with(&req, &Affinity::prefix(&p)).unwrap().backend,
        b
    );
    // A's work drops below the slack: the cache wins again.
    r.registry_mut().work_finished(a, 20_000);
    assert_eq!(
        r.route_with(&req, &Affinity::prefix(&p)).unwrap().backend,
        a
    );
    // Nothing matched: the least work, not the first of equal request counts.
    assert_eq!(
        routed_with(&mut r, &Affinity::prefix(&names(500..520))),
        "B"
    );
}

/// LoRA: a configured adapter is served only by the backends whose model lists it; one
/// loaded at run time (an id the config does not name) by every backend of its model; and a
/// backend holding the adapter resident is preferred when a view says so.
#[test]
fn lora_adapters_route_to_the_backends_that_list_them_and_prefer_residency() {
    let mut a = backend("a", 0, &[("m", 8192, NONE)]);
    a.models[0].adapters = vec![lora::AdapterConfig::Name("sql".into())];
    let b = backend("b", 0, &[("m", 8192, NONE)]);
    let mut r = router(&[a, b], &routing("round_robin"));
    let sql = Requirements {
        adapter: 1,
        ..Requirements::text("m", 10)
    };
    let (name, need) = r.precheck(&sql).unwrap();
    assert_eq!(need.adapter, 1);
    for _ in 0..4 {
        let d = r.route_name(name, &need).unwrap();
        assert_eq!(
            r.registry().backend(d.backend).name(),
            "a",
            "only a lists sql"
        );
    }
    let loaded = Need { adapter: 2, ..need };
    let seen: std::collections::BTreeSet<_> = (0..4)
        .map(|_| r.route_name(name, &loaded).unwrap().backend)
        .collect();
    assert_eq!(
        seen.len(),
        2,
        "a run-time adapter runs on every backend of its model"
    );

    let affinity = Affinity {
        exact: Some(&AdapterTwoOnB),
        ..Affinity::NONE
    };
    for _ in 0..4 {
        let d = r.route_name_with(name, &loaded, &affinity).unwrap();
        assert_eq!(
            r.registry().backend(d.backend).name(),
            "b",
            "b holds it resident"
        );
    }
}

/// LoRA: the only backend listing a configured adapter is down while another backend of
/// the model is up: the request gets a 503 that says the up one lacks the adapter (the
/// explanation once tripped a debug assertion on the engine thread).
#[test]
fn an_adapter_whose_backends_are_all_down_is_a_503_naming_the_backends_without_it() {
    let mut a = backend("a", 0, &[("m", 8192, NONE)]);
    a.models[0].adapters = vec![lora::AdapterConfig::Name("sql".into())];
    let b = backend("b", 0, &[("m", 8192, NONE)]);
    let mut r = router(&[a, b], &routing("round_robin"));
    let sql = Requirements {
        adapter: 1,
        ..Requirements::text("m", 10)
    };
    let (name, need) = r.precheck(&sql).unwrap();
    let a_id = r.registry().backend_id("a").unwrap();
    r.registry_mut().set_healthy(a_id, false);
    let e = r.route_name(name, &need).unwrap_err();
    assert_eq!(e.status(), 503);
    let RouteError::NoHealthyBackend { unavailable, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!((unavailable.serving, unavailable.unhealthy), (2, 1));
    assert_eq!(unavailable.without_adapter, 1);
    assert!(
        e.to_string()
            .contains("1 without the requested LoRA adapter"),
        "{e}"
    );
}

/// LoRA: an adapter is served only by a backend that has it, never through its base
/// model's fallback or alias: another model's backend (or the same backend, as another
/// model) would answer with the wrong weights. With the base model down, a run-time
/// adapter's request is a 503 for its base model; a base request still falls back.
#[test]
fn an_adapter_is_never_served_through_a_fallback_or_alias_by_another_model() {
    let mut a = backend("a", 0, &[("m", 8192, NONE), ("other", 8192, NONE)]);
    a.models[0].adapters = vec![lora::AdapterConfig::Name("sql".into())];
    let b = backend("b", 0, &[("other", 8192, NONE)]);
    let cfg = RoutingConfig {
        fallbacks: fallbacks(&[("m", &["other"])]),
        aliases: aliases(&[("m", "other")]),
        ..routing("round_robin")
    };
    let mut r = router(&[a, b], &cfg);
    // "m" is served by a only; make its one offer unavailable.
    let a_id = r.registry().backend_id("a").unwrap();
    for adapter in [1, 2] {
        // 1: configured on a's "m"; 2: loaded at run time on "m".
        let req = Requirements {
            adapter,
            ..Requirements::text("m", 10)
        };
        let (name, need) = r.precheck(&req).unwrap();
        let d = r.route_name(name, &need).unwrap();
        assert_eq!((d.backend, r.registry().model_name(d.model)), (a_id, "m"));
        r.registry_mut().set_healthy(a_id, false);
        let e = r.route_name(name, &need).unwrap_err();
        assert_eq!(e.status(), 503, "adapter {adapter}: {e}");
        assert!(
            matches!(&e, RouteError::NoHealthyBackend { model, .. } if model == "m"),
            "adapter {adapter}: not served as 'other': {e:?}"
        );
        let base = r.route(&Requirements::text("m", 10)).unwrap();
        assert_eq!(
            r.registry().model_name(base.model),
            "other",
            "the base model still falls back"
        );
        r.registry_mut().set_healthy(a_id, true);
    }
}

/// LoRA affinity gives way to load: a backend holding the adapter resident stops being the
/// only choice once it has more than one batch in flight beyond the least busy candidate.
#[test]
fn lora_affinity_gives_way_when_the_resident_backend_is_busier() {
    let a = backend("a", 0, &[("m", 8192, NONE)]);
    let b = backend("b", 0, &[("m", 8192, NONE)]);
    let mut r = router(&[a, b], &routing("least_loaded"));
    let loaded = Requirements {
        adapter: 2,
        ..Requirements::text("m", 10)
    };
    let (name, need) = r.precheck(&loaded).unwrap();
    let affinity = Affinity {
        exact: Some(&AdapterTwoOnB),
        ..Affinity::NONE
    };
    let b_id = r.registry().backend_id("b").unwrap();
    let pick = |r: &mut Router| {
        let d = r.route_name_with(name, &need, &affinity).unwrap();
        r.registry().backend(d.backend).name().to_string()
    };
    r.registry_mut().batch_started(b_id);
    assert_eq!(pick(&mut r), "b", "one batch more: still worth it");
    r.registry_mut().batch_started(b_id);
    assert_eq!(pick(&mut r), "a", "two more: a loads it");
}

/// An exact view for the LoRA tests: backend 1 (`b`) holds adapter 2 resident, nothing else
/// is resident and no prefix is cached.
struct AdapterTwoOnB;

impl CacheView for AdapterTwoOnB {
    fn cached_prefix_blocks(
        &self,
        _: BackendId,
        _: &[crate::core::prefix::BlockHash],
    ) -> Option<u32> {
        None
    }
    fn adapter_resident(&self, backend: BackendId, adapter: u16) -> Option<bool> {
        Some(backend.index() == 1 && adapter == 2)
    }
}

/// An `upstream` backend sends alone what its executor sends as a request of its own and
/// answers with the batch: every completion without prompt arrays, chats and streams with
/// them; the other kinds run a batch as one.
#[test]
fn an_upstream_backend_sends_alone_what_goes_as_a_request_of_its_own() {
    let upstream = |name: &str, prompt_array: Option<bool>| BackendConfig {
        kind: BackendKindName::Upstream,
        base_url: Some("http://127.0.0.1:9".into()),
        prompt_array,
        ..backend(name, 0, &[("m", 4096, NONE)])
    };
    let r = router(
        &[
            upstream("plain", None),
            upstream("no-arrays", Some(false)),
            upstream("arrays", Some(true)),
            backend("sim", 0, &[("m", 4096, NONE)]),
        ],
        &RoutingConfig::default(),
    );
    let alone = |name: &str| r.registry().backend(id(&r, name)).alone();
    use crate::core::Alone;
    assert_eq!(alone("plain"), Alone::Completions);
    assert_eq!(alone("no-arrays"), Alone::Completions);
    assert_eq!(alone("arrays"), Alone::OwnRequests);
    assert_eq!(alone("sim"), Alone::Never);
}
