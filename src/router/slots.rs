//! Backends that come and go, inside tables sized at start: every backend is a *slot*
//! (`BackendId`) whose state is [`SlotState::Active`], [`SlotState::Draining`] or
//! [`SlotState::Empty`]. Only an active slot is routable; a draining one finishes what it
//! holds and the engine then marks it empty; an empty one can be filled again (the admin
//! API, a reload, DNS discovery) without the engine growing a table.
//!
//! A `[[backends]]` table with `discovery = { dns, port, every, max_addresses }` instead of
//! `base_url` is expanded here, before the registry is built, into `max_addresses` upstream
//! slots named `<name>-0`, `<name>-1`, ... that start empty; the discovery thread fills one
//! per address the name resolves to and drains those whose address disappears.
//!
//! Spare slots (`routing.spare_backend_slots`) are appended after them: empty `upstream`
//! slots serving nothing, which an add or a reload fills with a backend the config did not
//! have at start (a new name, models and address; `router::tables` swaps the engine's
//! tables). When every spare slot is in use, an add is refused with the key to raise.
//!
//! What must never happen here: I/O, clocks, threads. This file is the plain data of the
//! plan; the live side (who resolves, who retargets) is `crate::live`.

use super::discovery::{Discovery, DISCOVERY_MAX_ADDRESSES_MAX};
use super::error::RouterConfigError;
use super::registry::{concurrent_batches_default, BackendConfig, BackendKindName};
#[cfg(doc)]
use super::slot::SlotState;

/// Most spare slots (`routing.spare_backend_slots`): each has its own workers.
pub const SPARE_BACKEND_SLOTS_MAX: u32 = 64;

/// Spare slots when `routing.spare_backend_slots` is unset: 8 when some table is `upstream`
/// or follows a DNS name (abe routes to servers, and servers come and go), else 0 (a
/// stand-in serving `sim` or `embed` backends has nothing to add, and every slot is a lane
/// the engine looks at each turn).
pub fn spare_slots_default(backends: &[BackendConfig]) -> u32 {
    if backends.iter().any(|b| b.kind == BackendKindName::Upstream) {
        8
    } else {
        0
    }
}

/// Where a spare slot's placeholder points until it is filled: a port nothing listens
/// on, refused at once (the health checker probes every upstream slot).
pub const SPARE_PLACEHOLDER_URL: &str = "http://127.0.0.1:0";

/// Appends `n` spare slots of `kind` to `backends` (after every table and discovery
/// slot): empty slots, named `spare-<i>` (a name a table already has is skipped), serving
/// nothing, with the workers of a table of their kind that does not set
/// `max_concurrent_batches` ([`concurrent_batches_default`]), and for `upstream` each
/// completion alone
/// (no prompt arrays: the slot's lane is built before the backend that fills it is known).
/// `POST /admin/backends`
/// or a reload fills one with a backend the config did not have. Returns their indexes.
pub fn add_spares(
    backends: &mut Vec<BackendConfig>,
    n: u32,
    kind: BackendKindName,
) -> Result<Vec<usize>, RouterConfigError> {
    if n > SPARE_BACKEND_SLOTS_MAX {
        return Err(RouterConfigError::Backend {
            backend: "*".into(),
            key: "routing.spare_backend_slots",
            why: format!(
                "{n} is out of range 0..={SPARE_BACKEND_SLOTS_MAX} (one empty slot, with its \
                 own workers, each)"
            ),
        });
    }
    let mut added = Vec::with_capacity(n as usize);
    let mut i = 0usize;
    while added.len() < n as usize {
        let name = format!("spare-{i}");
        i += 1;
        if backends.iter().any(|b| b.name == name) {
            continue;
        }
        added.push(backends.len());
        backends.push(spare_placeholder(name, kind));
    }
    Ok(added)
}

/// An unfilled spare slot's table, of `kind` (`upstream` in request batching, `sim` in
/// continuous batching, which runs only `sim` backends).
pub fn spare_placeholder(name: String, kind: BackendKindName) -> BackendConfig {
    BackendConfig {
        name,
        kind,
        base_url: (kind == BackendKindName::Upstream).then(|| SPARE_PLACEHOLDER_URL.into()),
        api_key: None,
        model_dir: None,
        truncate: None,
        priority: super::registry::PRIORITY_DEFAULT,
        max_concurrent_batches: concurrent_batches_default(kind),
        prompt_array: None,
        models: Vec::new(),
        discovery: None,
        spare: true,
    }
}

/// One `discovery` table, expanded: the name to follow and the slots its addresses fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryPlan {
    /// The `[[backends]]` table's name (its slots are `<name>-<i>`).
    pub name: String,
    pub discovery: Discovery,
    /// Indexes into the expanded backend list (its `BackendId`s), in slot order.
    pub slots: Vec<usize>,
}

/// The name of slot `i` of discovery table `name`.
pub fn slot_name(name: &str, i: usize) -> String {
    format!("{name}-{i}")
}

/// Expands every `discovery` table into its empty upstream slots (each a copy of the table
/// with a placeholder `base_url` of the name itself, until an address fills it). Tables
/// without `discovery` pass through unchanged, in order. Errors name the table and key.
pub fn expand_discovery(
    configs: Vec<BackendConfig>,
) -> Result<(Vec<BackendConfig>, Vec<DiscoveryPlan>), RouterConfigError> {
    let mut out = Vec::with_capacity(configs.len());
    let mut plans = Vec::new();
    for cfg in configs {
        let Some(d) = cfg.discovery.clone() else {
            out.push(cfg);
            continue;
        };
        let err = |key: &'static str, why: String| RouterConfigError::Backend {
            backend: cfg.name.clone(),
            key,
            why,
        };
        if cfg.kind != BackendKindName::Upstream {
            return Err(err(
                "discovery",
                "is for kind = \"upstream\" only (each address becomes a remote backend)".into(),
            ));
        }
        if cfg.base_url.is_some() {
            return Err(err(
                "discovery",
                "takes the place of base_url; set one of them, not both".into(),
            ));
        }
        let host_ok = !d.dns.trim().is_empty()
            && d.dns
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
        if !host_ok {
            return Err(err(
                "discovery.dns",
                format!(
                    "\"{}\" is not a DNS name, e.g. \"vllm.serving.svc.cluster.local\"",
                    d.dns
                ),
            ));
        }
        if d.port == 0 {
            return Err(err("discovery.port", "must be a port, 1..=65535".into()));
        }
        if d.every < 100 {
            return Err(err(
                "discovery.every",
                format!("{}ms is too often; resolve at most every 100ms", d.every),
            ));
        }
        if !(1..=DISCOVERY_MAX_ADDRESSES_MAX).contains(&d.max_addresses) {
            return Err(err(
                "discovery.max_addresses",
                format!(
                    "{} is out of range 1..={DISCOVERY_MAX_ADDRESSES_MAX} (one slot, with \
                     its own workers, per address)",
                    d.max_addresses
                ),
            ));
        }
        let mut slots = Vec::with_capacity(d.max_addresses as usize);
        for i in 0..d.max_addresses as usize {
            slots.push(out.len());
            out.push(BackendConfig {
                name: slot_name(&cfg.name, i),
                base_url: Some(format!("http://{}:{}", d.dns, d.port)),
                discovery: None,
                ..cfg.clone()
            });
        }
        plans.push(DiscoveryPlan {
            name: cfg.name,
            discovery: d,
            slots,
        });
    }
    Ok((out, plans))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::SlotState;

    fn parse(toml_text: &str) -> Vec<BackendConfig> {
        #[derive(serde::Deserialize)]
        struct F {
            backends: Vec<BackendConfig>,
        }
        toml::from_str::<F>(toml_text).unwrap().backends
    }

    #[test]
    fn discovery_expands_into_empty_slots_named_after_the_table() {
        let b = parse(
            r#"
            [[backends]]
            name = "fixed"
            kind = "sim"
            models = [{ name = "m", context_length = 100 }]
            [[backends]]
            name = "vllm"
            kind = "upstream"
            discovery = { dns = "vllm.serving.svc", port = 8000, every = "5s", max_addresses = 3 }
            models = [{ name = "m", context_length = 100 }]
            "#,
        );
        assert_eq!(b[1].discovery.as_ref().unwrap().every, 5000);
        let (out, plans) = expand_discovery(b).unwrap();
        let names: Vec<_> = out.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["fixed", "vllm-0", "vllm-1", "vllm-2"]);
        assert_eq!(
            out[2].base_url.as_deref(),
            Some("http://vllm.serving.svc:8000")
        );
        assert!(out.iter().all(|b| b.discovery.is_none()));
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].slots, [1, 2, 3]);
        assert_eq!(plans[0].name, "vllm");
    }

    #[test]
    fn only_an_active_slot_is_routed_to() {
        use crate::router::{BackendId, Requirements, Router, RoutingConfig};
        let mut a = BackendConfig::default_sim("m", 1000);
        a.name = "a".into();
        let mut b = a.clone();
        b.name = "b".into();
        let routing = RoutingConfig {
            strategy: "round_robin".into(),
            ..RoutingConfig::default()
        };
        let (mut router, _) = Router::build(&[a, b], &routing, 1).unwrap();
        let req = Requirements::text("m", 10);
        let picks = |r: &mut Router| -> Vec<usize> {
            (0..4)
                .map(|_| r.route(&req).unwrap().backend.index())
                .collect()
        };
        assert_eq!(picks(&mut router), [0, 1, 0, 1]);
        router
            .registry_mut()
            .set_slot(BackendId::from_index(0), SlotState::Draining);
        assert_eq!(picks(&mut router), [1, 1, 1, 1]);
        router
            .registry_mut()
            .set_slot(BackendId::from_index(1), SlotState::Empty);
        let e = router.route(&req).unwrap_err();
        assert_eq!(e.status(), 503);
        assert!(
            e.to_string().contains("2 removed (draining or empty)"),
            "{e}"
        );
        router
            .registry_mut()
            .set_slot(BackendId::from_index(0), SlotState::Active);
        assert_eq!(picks(&mut router), [0, 0, 0, 0]);
    }

    #[test]
    fn a_reload_changes_the_strategy_and_keeps_the_index_size() {
        use crate::router::{BackendId, Requirements, Router, RoutingConfig, Strategy};
        let mut a = BackendConfig::default_sim("m", 1000);
        a.name = "a".into();
        let mut b = a.clone();
        b.name = "b".into();
        b.priority = 10;
        let routing = RoutingConfig {
            strategy: "round_robin".into(),
            ..RoutingConfig::default()
        };
        let (mut router, _) = Router::build(&[a, b], &routing, 1).unwrap();
        let req = Requirements::text("m", 10);
        let picks = |r: &mut Router| -> Vec<BackendId> {
            (0..4).map(|_| r.route(&req).unwrap().backend).collect()
        };
        assert_eq!(
            picks(&mut router).iter().filter(|b| b.index() == 1).count(),
            2
        );
        let mut live = router.live_routing();
        live.strategy = Strategy::PriorityOnly;
        live.max_retries = 5;
        live.prefix.max_tracked_blocks = 7;
        router.set_live_routing(live);
        // a has priority 0 (default_sim), b 10: priority_only always picks a.
        assert!(picks(&mut router).iter().all(|b| b.index() == 0));
        assert_eq!(router.max_retries(), 5);
        assert_ne!(
            router.prefix_config().max_tracked_blocks,
            7,
            "fixed at build"
        );
    }

    #[test]
    fn discovery_mistakes_name_the_key() {
        let bad = |extra: &str, kind: &str| {
            let b = parse(&format!(
                "[[backends]]\nname = \"v\"\nkind = \"{kind}\"\n{extra}\n\
                 models = [{{ name = \"m\", context_length = 100 }}]\n"
            ));
            expand_discovery(b).unwrap_err().to_string()
        };
        let e = bad("discovery = { dns = \"x\", port = 1 }", "sim");
        assert!(e.contains("discovery") && e.contains("upstream"), "{e}");
        let e = bad(
            "base_url = \"http://a:1\"\ndiscovery = { dns = \"x\", port = 1 }",
            "upstream",
        );
        assert!(e.contains("not both"), "{e}");
        let e = bad("discovery = { dns = \"a b\", port = 1 }", "upstream");
        assert!(e.contains("discovery.dns"), "{e}");
        let e = bad(
            "discovery = { dns = \"x\", port = 1, every = \"10ms\" }",
            "upstream",
        );
        assert!(e.contains("discovery.every"), "{e}");
        let e = bad(
            "discovery = { dns = \"x\", port = 1, max_addresses = 0 }",
            "upstream",
        );
        assert!(e.contains("max_addresses"), "{e}");
    }
}
