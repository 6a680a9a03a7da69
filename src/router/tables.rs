//! A running router's next tables: the backends (names, kinds, models, offers) and the
//! names requests may use (aliases, fallback chains), rebuilt off the engine thread when
//! a backend fills a spare slot or a reload changes `[routing.aliases]` or
//! `[routing.fallbacks]`, then swapped in whole by the engine between two turns.
//!
//! Ids stay valid across a swap: the next tables keep every `ModelId` and `NameId` the
//! running ones handed out ([`Registry::build_after`], [`Resolver::build_after`]) and only
//! append, so a request resolved by an io thread's older copy, or holding a decision made
//! before the swap, still means the same model and name. A slot's live state (health,
//! circuit, load, active/draining/empty) is not part of the tables and carries on. A slot
//! whose backend changes (another name, other models) must be empty when the engine swaps:
//! otherwise the swap is refused whole ([`TablesRefused`]) and nothing changes.
//!
//! What must never happen here: an allocation in [`Router::swap_tables`] (the engine calls
//! it; everything it needs is built by [`Router::next_tables`] on the caller's thread), an
//! id of the running tables that the next ones do not have, or a half-applied swap.

use super::error::RouterConfigError;
use super::registry::{BackendConfig, BackendId, Registry};
use super::resolve::Resolver;
use super::select::Router;
use super::slot::SlotState;
use std::collections::BTreeMap;

/// Tables built for a running router (see the module doc); the engine swaps them in.
#[derive(Debug)]
pub struct RouteTables {
    registry: Registry,
    resolver: Resolver,
    /// Round-robin positions by `ModelId`, as many as the next registry has models (the
    /// running ones are copied over at the swap).
    cursors: Vec<u64>,
    /// `session`'s rendezvous keys by `BackendId` (hashes of the next names).
    backend_keys: Vec<u64>,
}

/// Why the engine kept its tables: a slot that still holds requests would change backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("backend slot {} is not empty: a slot changes backend only once its drain is over", .0.index())]
pub struct TablesRefused(pub BackendId);

impl RouteTables {
    /// The next registry (backends, models, offers; its live state is not used).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }
}

impl Router {
    /// Tables for `backends` (one table per slot, in slot order; a spare slot not filled is
    /// a `spare` placeholder) with `aliases` and `fallbacks`, checked as at start and
    /// keeping this router's ids. Allocates: call it off the engine thread.
    pub fn next_tables(
        &self,
        backends: &[BackendConfig],
        aliases: &BTreeMap<String, String>,
        fallbacks: &BTreeMap<String, Vec<String>>,
    ) -> Result<RouteTables, RouterConfigError> {
        if backends.len() != self.registry.len() {
            return Err(RouterConfigError::Backend {
                backend: "*".into(),
                key: "backends",
                why: format!(
                    "{} tables for {} slots: the slots are fixed at start",
                    backends.len(),
                    self.registry.len()
                ),
            });
        }
        let registry = Registry::build_after(backends, Some(&self.registry))?;
        let resolver = Resolver::build_after(&registry, aliases, fallbacks, Some(&self.resolver))?;
        debug_assert!(registry.model_count() >= self.registry.model_count());
        debug_assert!(resolver.len() >= self.resolver.len());
        Ok(RouteTables {
            cursors: vec![0; registry.model_count()],
            backend_keys: registry
                .backends()
                .map(|(_, b)| super::affinity::backend_key(b.name()))
                .collect(),
            registry,
            resolver,
        })
    }

    /// Swaps `next` in (on the engine thread: moves and copies only). Afterwards `next`
    /// holds the old tables, for the caller to drop elsewhere. Refused, with nothing
    /// changed, when a slot whose backend changes is not empty.
    pub fn swap_tables(&mut self, next: &mut RouteTables) -> Result<(), TablesRefused> {
        assert_eq!(
            next.registry.len(),
            self.registry.len(),
            "tables for every slot"
        );
        assert!(next.cursors.len() >= self.cursors.len(), "ids only grow");
        assert!(next.resolver.len() >= self.resolver.len(), "ids only grow");
        for (id, now) in self.registry.backends() {
            let then = next.registry.backend(id);
            let changes = now.name() != then.name()
                || now.models() != then.models()
                || std::mem::discriminant(now.kind()) != std::mem::discriminant(then.kind());
            if changes && self.registry.state(id).slot() != SlotState::Empty {
                return Err(TablesRefused(id));
            }
        }
        next.cursors[..self.cursors.len()].copy_from_slice(&self.cursors);
        for b in 0..self.registry.len() {
            let id = BackendId::from_index(b);
            if self.registry.backend(id).name() != next.registry.backend(id).name() {
                // Another backend in this slot: nothing it cached is known.
                self.forget_cached(id);
            }
        }
        self.registry.adopt_tables(&mut next.registry);
        std::mem::swap(&mut self.resolver, &mut next.resolver);
        std::mem::swap(&mut self.cursors, &mut next.cursors);
        std::mem::swap(&mut self.backend_keys, &mut next.backend_keys);
        Ok(())
    }

    /// This router's lookup copy (see [`Router::lookup_copy`]) with `tables` in place of
    /// its own: the io threads' copy once the engine swapped the same tables in.
    pub fn lookup_copy_with(&self, tables: RouteTables) -> Router {
        let mut copy = self.lookup_copy();
        let mut tables = tables;
        // A lookup copy's slots hold no requests: take the tables whatever changes.
        for b in 0..copy.registry.len() {
            copy.registry
                .set_slot(BackendId::from_index(b), SlotState::Empty);
        }
        copy.swap_tables(&mut tables)
            .expect("every slot of the copy is empty");
        for b in 0..copy.registry.len() {
            let id = BackendId::from_index(b);
            copy.registry.set_slot(id, self.registry.state(id).slot());
        }
        copy
    }
}

impl Clone for RouteTables {
    fn clone(&self) -> Self {
        RouteTables {
            registry: self.registry.clone(),
            resolver: self.resolver.clone(),
            cursors: self.cursors.clone(),
            backend_keys: self.backend_keys.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::slots::spare_placeholder;
    use crate::router::{BackendKindName, ModelConfig, Requirements, RoutingConfig};

    fn upstream(name: &str, model: &str) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            base_url: Some(format!("http://{name}:8000")),
            models: vec![ModelConfig {
                name: model.into(),
                context_length: Some(1000),
                capabilities: Default::default(),
                adapters: Vec::new(),
            }],
            spare: false,
            ..spare_placeholder(String::new(), BackendKindName::Upstream)
        }
    }

    /// `a` serving `m1`, and one spare slot (empty, as `serve` starts it).
    fn with_a_spare() -> (Router, Vec<BackendConfig>) {
        let slots = vec![
            upstream("a", "m1"),
            spare_placeholder("spare-0".into(), BackendKindName::Upstream),
        ];
        let (mut r, _) = Router::build(&slots, &RoutingConfig::default(), 1).unwrap();
        r.registry_mut()
            .set_slot(BackendId::from_index(1), SlotState::Empty);
        (r, slots)
    }

    fn names(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn a_spare_slot_takes_a_new_backend_and_ids_handed_out_before_stay_valid() {
        let (mut r, mut slots) = with_a_spare();
        let m1 = r.lookup("m1").unwrap();
        let m1_model = r.registry().model_id("m1").unwrap();
        assert_eq!(
            r.route(&Requirements::text("m2", 1)).unwrap_err().status(),
            404
        );

        slots[1] = upstream("c", "m2");
        let fallbacks = [("m1".to_string(), vec!["m2".to_string()])].into();
        let mut next = r
            .next_tables(&slots, &names(&[("x", "m2")]), &fallbacks)
            .unwrap();
        // Built, not swapped: the running router is as it was.
        assert!(r.lookup("x").is_err());
        r.swap_tables(&mut next).unwrap();
        assert_eq!(
            next.registry().backend(BackendId::from_index(1)).name(),
            "spare-0"
        );
        assert_eq!(r.lookup("m1").unwrap(), m1, "name ids carry over");
        assert_eq!(r.registry().model_id("m1"), Some(m1_model), "model ids too");
        assert_eq!(r.registry().backend(BackendId::from_index(1)).name(), "c");

        // Empty until asked to be active: then the new name and the alias route there.
        assert_eq!(
            r.route(&Requirements::text("x", 1)).unwrap_err().status(),
            503
        );
        r.registry_mut()
            .set_slot(BackendId::from_index(1), SlotState::Active);
        let d = r.route(&Requirements::text("x", 1)).unwrap();
        assert_eq!(
            r.describe(&d).to_string(),
            "backend=c; model=m2; via=alias; requested=x"
        );
        // The fallback: a down, so m1 falls back to m2 on c.
        r.registry_mut()
            .set_slot(BackendId::from_index(0), SlotState::Draining);
        let d = r.route(&Requirements::text("m1", 1)).unwrap();
        assert_eq!(
            r.describe(&d).to_string(),
            "backend=c; model=m2; via=fallback; requested=m1"
        );
    }

    #[test]
    fn a_slot_that_holds_requests_keeps_its_backend_and_the_swap_changes_nothing() {
        let (mut r, mut slots) = with_a_spare();
        r.registry_mut()
            .set_slot(BackendId::from_index(1), SlotState::Draining);
        slots[1] = upstream("c", "m2");
        let mut next = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap();
        assert_eq!(
            r.swap_tables(&mut next),
            Err(TablesRefused(BackendId::from_index(1)))
        );
        assert_eq!(
            r.registry().backend(BackendId::from_index(1)).name(),
            "spare-0"
        );
        assert!(r.lookup("m2").is_err(), "nothing changed");
        // Aliases alone change whatever the slots hold.
        slots[1] = spare_placeholder("spare-0".into(), BackendKindName::Upstream);
        let mut next = r
            .next_tables(&slots, &names(&[("y", "m1")]), &BTreeMap::new())
            .unwrap();
        r.swap_tables(&mut next).unwrap();
        let d = r.route(&Requirements::text("y", 1)).unwrap();
        assert_eq!(
            r.describe(&d).to_string(),
            "backend=a; model=m1; via=alias; requested=y"
        );
    }

    #[test]
    fn a_model_no_backend_serves_any_more_keeps_its_id_and_resolves_to_nothing() {
        let (mut r, mut slots) = with_a_spare();
        slots[1] = upstream("c", "m2");
        let mut next = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap();
        r.swap_tables(&mut next).unwrap();
        let m2 = r.registry().model_id("m2").unwrap();
        // c removed and drained; its slot back to a placeholder.
        slots[1] = spare_placeholder("spare-0".into(), BackendKindName::Upstream);
        let mut next = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap();
        r.swap_tables(&mut next).unwrap();
        assert_eq!(r.registry().model_id("m2"), Some(m2));
        assert!(r.registry().offers(m2).is_empty());
        assert!(r.routable().all(|(name, _)| name != "m2"), "not listed");
        let e = r.route(&Requirements::text("m2", 1)).unwrap_err();
        assert!(matches!(e.status(), 404 | 503), "{e}");
        // A copy a swap behind still describes a decision of the newer tables.
        let old_copy = with_a_spare().0;
        let d = crate::router::Decision {
            backend: BackendId::from_index(1),
            model: m2,
            via: crate::router::Via::Direct,
            work: 0,
        };
        assert_eq!(
            old_copy.describe(&d).to_string(),
            "backend=spare-0; model=?; via=direct"
        );
    }

    #[test]
    fn the_slot_count_is_fixed() {
        let (r, slots) = with_a_spare();
        let e = r
            .next_tables(&slots[..1], &BTreeMap::new(), &BTreeMap::new())
            .unwrap_err();
        assert!(e.to_string().contains("fixed at start"), "{e}");
    }

    /// LoRA: a backend added live that lists a configured adapter serves it (the same id),
    /// one that lists a new adapter or moves one to another base model is refused by name.
    #[test]
    fn a_live_backend_serves_the_configured_adapters_it_lists_and_new_ones_are_refused() {
        use crate::router::lora::AdapterConfig;
        let with = |mut b: BackendConfig, adapter: &str| {
            b.models[0].adapters = vec![AdapterConfig::Name(adapter.into())];
            b
        };
        let mut slots = vec![
            with(upstream("a", "m1"), "sql"),
            spare_placeholder("spare-0".into(), BackendKindName::Upstream),
        ];
        let (mut r, _) = Router::build(&slots, &RoutingConfig::default(), 1).unwrap();
        let c = BackendId::from_index(1);
        r.registry_mut().set_slot(c, SlotState::Empty);
        slots[1] = with(upstream("c", "m1"), "sql");
        let mut next = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap();
        r.swap_tables(&mut next).unwrap();
        assert!(
            r.registry().lora_eligible(c, 1),
            "c lists sql: id 1 as at start"
        );
        assert!(r.registry().lora_eligible(BackendId::from_index(0), 1));

        slots[1] = with(upstream("c", "m1"), "chat");
        let e = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'chat' is new") && e.contains("load_lora_adapter"),
            "{e}"
        );
        slots[0] = upstream("a", "m1");
        slots[1] = with(upstream("c", "m2"), "sql");
        let e = r
            .next_tables(&slots, &BTreeMap::new(), &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot move"), "{e}");
    }
}
