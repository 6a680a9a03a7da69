//! Model-name resolution: `[routing.aliases]` (one name standing for another model) and
//! `[routing.fallbacks]` (a model -> the models to try, in order, when it cannot serve).
//!
//! Both are single level: an alias's target is never looked up as an alias again, and a
//! fallback model's own aliases and fallbacks are never followed. Everything is checked
//! once at build: circular aliases are an error naming the cycle, an alias pointing at
//! another alias is an error saying what to write instead, and so is a fallback that is
//! only an alias. After build every name a request may use sits in one table, so resolving
//! is one hash lookup (no allocation) and always terminates. Nothing here may look at
//! backend health or load: that is `select`'s job.
//!
//! A LoRA adapter's request names its base model and takes neither an alias nor a
//! fallback ([`Resolver::alias_for`], [`Resolver::chain_for_adapter`]): the adapter's
//! weights belong to that model, so another model's backend cannot serve it.

use super::error::RouterConfigError;
use super::registry::{ModelId, Registry};
use crate::core::lora::{AdapterId, BASE_MODEL};
use std::collections::{BTreeMap, HashMap};

/// Dense index of a name the router knows: a served model, an alias, an alias target or a
/// model of a fallback chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(u32);

impl NameId {
    /// The first name (a placeholder value for tables filled later).
    pub const FIRST: NameId = NameId(0);

    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug)]
struct NameEntry {
    name: Box<str>,
    /// Some backend serves a model by this name.
    served: Option<ModelId>,
    /// This name is an alias of that name (whose entry has no alias itself).
    alias: Option<NameId>,
    /// `Resolver::chains[start..end]`: this name's own fallback chain.
    chain_start: u32,
    chain_end: u32,
}

/// What a routable name is, for `GET /v1/models`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routable<'a> {
    /// A model some backend serves.
    Served,
    /// An alias of a served model.
    Alias { target: &'a str },
    /// Not served itself, but some model of its fallback chain is.
    FallbackOnly,
}

/// FNV-1a over a name's bytes: the hash of the resolver's table, which every request looks
/// up on the io thread. SipHash (std's default) cost ~200 instructions a lookup here
/// (callgrind, BENCHMARKS "The hot path"); its keying guards a table against keys an
/// attacker chooses, and this table's keys come from the config only (a request's name
/// is looked up, never inserted).
#[derive(Clone, Copy, Debug)]
pub struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> NameHasher {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Every name requests may use, resolved to ids. See the module doc.
#[derive(Clone, Debug)]
pub struct Resolver {
    ids: HashMap<Box<str>, NameId, std::hash::BuildHasherDefault<NameHasher>>,
    /// By `NameId`.
    names: Vec<NameEntry>,
    /// Fallback chains, concatenated.
    chains: Vec<NameId>,
}

impl Resolver {
    /// Checks aliases and fallbacks against each other and the registry's models.
    ///
    /// Targets no backend serves are allowed: a request for them is then a 404 or a 503
    /// naming the target, which is more useful than refusing to start.
    pub fn build(
        registry: &Registry,
        aliases: &BTreeMap<String, String>,
        fallbacks: &BTreeMap<String, Vec<String>>,
    ) -> Result<Resolver, RouterConfigError> {
        Resolver::build_after(registry, aliases, fallbacks, None)
    }

    /// As [`build`](Self::build), keeping `prior`'s name ids: its names come first, in its
    /// order (a name nothing uses any more keeps its id and resolves to nothing), so a
    /// `NameId` handed out by `prior` names the same text in the result. A running router's
    /// next tables are built so (`router::tables`): ids in flight stay valid.
    pub fn build_after(
        registry: &Registry,
        aliases: &BTreeMap<String, String>,
        fallbacks: &BTreeMap<String, Vec<String>>,
        prior: Option<&Resolver>,
    ) -> Result<Resolver, RouterConfigError> {
        check_aliases(aliases)?;
        check_fallbacks(registry, aliases, fallbacks)?;

        let mut r = Resolver {
            ids: HashMap::default(),
            names: Vec::new(),
            chains: Vec::new(),
        };
        for e in prior.map_or(&[][..], |p| &p.names[..]) {
            r.intern(&e.name);
        }
        for m in 0..registry.model_count() {
            let id = ModelId(m as u32);
            let n = r.intern(registry.model_name(id));
            // A model a prior registry had and no backend serves now keeps its id only.
            if !registry.offers(id).is_empty() {
                r.names[n.index()].served = Some(id);
            }
        }
        for (alias, target) in aliases {
            let a = r.intern(alias);
            let t = r.intern(target);
            r.names[a.index()].alias = Some(t);
        }
        for (model, chain) in fallbacks {
            let m = r.intern(model);
            let start = r.chains.len() as u32;
            for f in chain {
                let f = r.intern(f);
                r.chains.push(f);
            }
            let e = &mut r.names[m.index()];
            e.chain_start = start;
            e.chain_end = r.chains.len() as u32;
        }
        Ok(r)
    }

    fn intern(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = NameId(u32::try_from(self.names.len()).expect("fewer than 2^32 names"));
        self.ids.insert(name.into(), id);
        self.names.push(NameEntry {
            name: name.into(),
            served: None,
            alias: None,
            chain_start: 0,
            chain_end: 0,
        });
        id
    }

    /// The id of a name requests may use; `None` means nothing by that name exists.
    #[inline]
    pub fn lookup(&self, name: &str) -> Option<NameId> {
        self.ids.get(name).copied()
    }

    /// The first name's id when `name` is it: one comparison, where [`lookup`](Self::lookup)'s
    /// hash and probe cost ~150 instructions (callgrind, a request's model on the io thread;
    /// `Router::lookup` asks this first). The first name is the first backend's first model
    /// at start (a live change keeps earlier names' ids, so it stays first): the one a server
    /// with one model, the usual case, is asked for.
    #[inline]
    pub fn lookup_first(&self, name: &str) -> Option<NameId> {
        let first = self.names.first()?;
        (*first.name == *name).then_some(NameId::FIRST)
    }

    pub fn name(&self, id: NameId) -> &str {
        &self.names[id.index()].name
    }

    /// The name's text, `None` for an id this resolver does not have (one handed out by
    /// newer tables than a lookup copy holds).
    pub fn try_name(&self, id: NameId) -> Option<&str> {
        self.names.get(id.index()).map(|e| &*e.name)
    }

    /// Number of names (ids are `0..len`).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The served model of this exact name.
    #[inline]
    pub fn served(&self, id: NameId) -> Option<ModelId> {
        self.names[id.index()].served
    }

    /// The name this one is an alias of. Its own `alias_of` is always `None`.
    #[inline]
    pub fn alias_of(&self, id: NameId) -> Option<NameId> {
        self.names[id.index()].alias
    }

    /// This name's own fallback chain (empty when none is configured).
    #[inline]
    pub fn fallbacks_of(&self, id: NameId) -> &[NameId] {
        let e = &self.names[id.index()];
        &self.chains[e.chain_start as usize..e.chain_end as usize]
    }

    /// The chain to try for a request naming `id`: its own, or else its alias target's
    /// (the spec: an alias pointing at an unavailable model tries the target's chain).
    #[inline]
    pub fn chain_for(&self, id: NameId) -> &[NameId] {
        let own = self.fallbacks_of(id);
        match self.alias_of(id) {
            Some(t) if own.is_empty() => self.fallbacks_of(t),
            _ => own,
        }
    }

    /// The alias target a request of LoRA adapter `adapter` may go to for `id`: none for an
    /// adapter (see the module doc), else [`Resolver::alias_of`].
    #[inline]
    pub fn alias_for(&self, id: NameId, adapter: AdapterId) -> Option<NameId> {
        self.alias_of(id).filter(|_| adapter == BASE_MODEL)
    }

    /// The fallback chain a request of LoRA adapter `adapter` may take for `id`: none for
    /// an adapter (see the module doc), else [`Resolver::chain_for`].
    #[inline]
    pub fn chain_for_adapter(&self, id: NameId, adapter: AdapterId) -> &[NameId] {
        if adapter == BASE_MODEL {
            self.chain_for(id)
        } else {
            &[]
        }
    }

    /// Every served model a request for `id` (LoRA adapter `adapter`) may be routed to, in
    /// the order routing tries them: the name itself, its alias's target, its fallback
    /// chain.
    pub fn candidates(&self, id: NameId, adapter: AdapterId) -> impl Iterator<Item = ModelId> + '_ {
        self.served(id)
            .into_iter()
            .chain(self.alias_for(id, adapter).and_then(|t| self.served(t)))
            .chain(
                self.chain_for_adapter(id, adapter)
                    .iter()
                    .filter_map(|&f| self.served(f)),
            )
    }

    /// Every name a request can use and what it is, for `GET /v1/models`. Aliases of
    /// unserved models and chains with no served model are left out.
    pub fn routable(&self) -> impl Iterator<Item = (&str, Routable<'_>)> + '_ {
        self.names.iter().enumerate().filter_map(move |(i, e)| {
            let id = NameId(i as u32);
            if e.served.is_some() {
                Some((&*e.name, Routable::Served))
            } else if let Some(t) = e.alias.filter(|&t| self.served(t).is_some()) {
                Some((
                    &*e.name,
                    Routable::Alias {
                        target: self.name(t),
                    },
                ))
            } else if self.chain_for(id).iter().any(|&f| self.served(f).is_some()) {
                Some((&*e.name, Routable::FallbackOnly))
            } else {
                None
            }
        })
    }
}

/// Empty names, cycles (first), then chains.
fn check_aliases(aliases: &BTreeMap<String, String>) -> Result<(), RouterConfigError> {
    for (alias, target) in aliases {
        if alias.trim().is_empty() {
            return Err(RouterConfigError::Alias {
                alias: alias.clone(),
                why: "an alias name must not be empty".into(),
            });
        }
        if target.trim().is_empty() {
            return Err(RouterConfigError::Alias {
                alias: alias.clone(),
                why: "points to an empty name; write the model it stands for".into(),
            });
        }
    }
    // Each alias has one target, so following targets from any alias either leaves the
    // alias set or comes back to a name already on the path: that repeat closes a cycle.
    for start in aliases.keys() {
        let mut path: Vec<&str> = vec![start];
        let mut at = aliases[start].as_str();
        while let Some(next) = aliases.get(at) {
            if let Some(pos) = path.iter().position(|&p| p == at) {
                let mut cycle: Vec<String> = path[pos..].iter().map(|s| s.to_string()).collect();
                cycle.push(at.to_string());
                return Err(RouterConfigError::AliasCycle { cycle });
            }
            path.push(at);
            at = next;
        }
    }
    for (alias, target) in aliases {
        if let Some(next) = aliases.get(target) {
            return Err(RouterConfigError::AliasChain {
                alias: alias.clone(),
                target: target.clone(),
                next: next.clone(),
            });
        }
    }
    Ok(())
}

fn check_fallbacks(
    registry: &Registry,
    aliases: &BTreeMap<String, String>,
    fallbacks: &BTreeMap<String, Vec<String>>,
) -> Result<(), RouterConfigError> {
    for (model, chain) in fallbacks {
        let err = |why: String| RouterConfigError::Fallback {
            model: model.clone(),
            why,
        };
        if model.trim().is_empty() {
            return Err(err("a model name must not be empty".into()));
        }
        for (i, f) in chain.iter().enumerate() {
            if f.trim().is_empty() {
                return Err(err(format!("entry {} is empty", i + 1)));
            }
            if f == model {
                return Err(err(format!(
                    "lists itself ('{f}') as a fallback; remove it"
                )));
            }
            if chain[..i].contains(f) {
                return Err(err(format!("lists '{f}' twice; keep the first")));
            }
            if let Some(target) = aliases.get(f) {
                if registry.model_id(f).is_none() {
                    return Err(err(format!(
                        "fallback '{f}' is an alias and fallbacks are single level; list \
                         the model it points to ('{target}') instead"
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::capabilities::Capabilities;
    use crate::router::registry::sim_backend;

    fn registry(models: &[&str]) -> Registry {
        let models: Vec<_> = models
            .iter()
            .map(|&m| (m, 100, Capabilities::default()))
            .collect();
        Registry::build(&[sim_backend("b", 0, &models)]).unwrap()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|&(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn chains(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|&(a, b)| (a.to_string(), b.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn circular_aliases_are_an_error_naming_the_cycle() {
        let r = registry(&["m"]);
        let e = Resolver::build(&r, &map(&[("a", "b"), ("b", "a")]), &BTreeMap::new()).unwrap_err();
        assert_eq!(
            e,
            RouterConfigError::AliasCycle {
                cycle: vec!["a".into(), "b".into(), "a".into()]
            }
        );
        assert!(e.to_string().contains("a -> b -> a"), "{e}");

        let e = Resolver::build(&r, &map(&[("x", "x")]), &BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains("x -> x"), "{e}");

        // A tail leading into a cycle reports just the cycle.
        let e = Resolver::build(
            &r,
            &map(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")]),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("b -> c -> d -> b"), "{e}");
    }

    #[test]
    fn alias_to_alias_is_an_error_saying_what_to_write() {
        let r = registry(&["m"]);
        let e = Resolver::build(&r, &map(&[("a", "b"), ("b", "m")]), &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("write \"a\" = \"m\""), "{e}");
    }

    #[test]
    fn empty_names_are_errors() {
        let r = registry(&["m"]);
        assert!(Resolver::build(&r, &map(&[("", "m")]), &BTreeMap::new()).is_err());
        assert!(Resolver::build(&r, &map(&[("a", " ")]), &BTreeMap::new()).is_err());
        assert!(Resolver::build(&r, &BTreeMap::new(), &chains(&[("", &["m"])])).is_err());
        assert!(Resolver::build(&r, &BTreeMap::new(), &chains(&[("x", &[""])])).is_err());
    }

    #[test]
    fn fallback_validation() {
        let r = registry(&["m", "n"]);
        let e = Resolver::build(&r, &BTreeMap::new(), &chains(&[("m", &["n", "m"])]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("routing.fallbacks") && e.contains("itself"),
            "{e}"
        );
        let e = Resolver::build(&r, &BTreeMap::new(), &chains(&[("m", &["n", "n"])]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = Resolver::build(&r, &map(&[("g", "n")]), &chains(&[("m", &["g"])]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alias") && e.contains("('n')"), "{e}");
        // An empty chain is allowed and means "no fallback".
        let ok = Resolver::build(&r, &BTreeMap::new(), &chains(&[("m", &[])])).unwrap();
        assert!(ok.fallbacks_of(ok.lookup("m").unwrap()).is_empty());
    }

    #[test]
    fn lookups() {
        let r = registry(&["llama3:70b", "mistral:7b"]);
        let res = Resolver::build(
            &r,
            &map(&[("gpt-4", "llama3:70b"), ("gpt-5", "nowhere")]),
            &chains(&[
                ("llama3:70b", &["mistral:7b"]),
                ("claude-3-opus", &["llama3:70b", "mistral:7b"]),
            ]),
        )
        .unwrap();
        let gpt4 = res.lookup("gpt-4").unwrap();
        let llama = res.lookup("llama3:70b").unwrap();
        assert_eq!(res.alias_of(gpt4), Some(llama));
        assert_eq!(res.alias_of(llama), None);
        assert_eq!(res.served(gpt4), None);
        assert_eq!(res.served(llama), r.model_id("llama3:70b"));
        assert!(res.fallbacks_of(gpt4).is_empty());
        assert_eq!(
            res.chain_for(gpt4),
            res.fallbacks_of(llama),
            "alias uses target's chain"
        );
        let claude = res.lookup("claude-3-opus").unwrap();
        assert_eq!(res.chain_for(claude).len(), 2);
        assert!(res.lookup("nope").is_none());
        assert!(res.lookup("nowhere").is_some(), "targets are known names");

        let routable: Vec<_> = res.routable().collect();
        assert!(routable.contains(&("llama3:70b", Routable::Served)));
        assert!(routable.contains(&(
            "gpt-4",
            Routable::Alias {
                target: "llama3:70b"
            }
        )));
        assert!(routable.contains(&("claude-3-opus", Routable::FallbackOnly)));
        assert!(!routable
            .iter()
            .any(|(n, _)| *n == "gpt-5" || *n == "nowhere"));
    }
}
