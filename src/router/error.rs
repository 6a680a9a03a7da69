//! What can go wrong in routing, as values: [`RouterConfigError`] at start-up (a bad
//! `[[backends]]` or `[routing]` table) and [`RouteError`] per request (404 / 400 / 503).
//!
//! Every message names the thing at fault (backend, model, alias, key) and says what to do
//! about it. This is the only file of the router whose values own `String`s and `Vec`s
//! built per request, and they are built only when a request fails: nothing here may be
//! constructed on the success path of a routing decision.

use std::fmt;

/// A problem in the router's configuration, found once at start-up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouterConfigError {
    /// A key of one `[[backends]]` table is wrong.
    #[error("[[backends]] '{backend}': {key}: {why}")]
    Backend {
        /// The backend's name, or `#N` (1-based position) when the name itself is missing.
        backend: String,
        key: &'static str,
        why: String,
    },
    /// A key of one model of one backend is wrong.
    #[error("[[backends]] '{backend}', model '{model}': {key}: {why}")]
    Model {
        backend: String,
        /// The model's name, or `#N` (1-based position) when the name itself is missing.
        model: String,
        key: &'static str,
        why: String,
    },
    /// Aliases that point at each other in a circle, listed in order and closed
    /// (`a -> b -> a`).
    #[error(
        "routing.aliases: circular alias {}: aliases are single level; point each of them \
         at a model a backend serves",
        .cycle.join(" -> ")
    )]
    AliasCycle { cycle: Vec<String> },
    /// An alias whose target is itself an alias (no cycle).
    #[error(
        "routing.aliases: '{alias}' points to '{target}', which is itself an alias (of \
         '{next}'); aliases are single level: write \"{alias}\" = \"{next}\""
    )]
    AliasChain {
        alias: String,
        target: String,
        next: String,
    },
    /// Any other problem with one alias.
    #[error("routing.aliases: '{alias}': {why}")]
    Alias { alias: String, why: String },
    /// A `[routing.prefix]` key out of range.
    #[error("routing.prefix.{key} = {value}: {why}")]
    Prefix {
        key: &'static str,
        value: u64,
        why: &'static str,
    },
    /// A problem with one fallback chain.
    #[error("routing.fallbacks: '{model}': {why}")]
    Fallback { model: String, why: String },
    /// `[routing.weights]` do not sum to 100.
    #[error(
        "routing.weights: priority + load + latency must sum to 100, got {priority} + {load} \
         + {latency} = {sum}"
    )]
    Weights {
        priority: u32,
        load: u32,
        latency: u32,
        sum: u64,
    },
}

/// Why no backend of one model could take a request (the parts of an error message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelOutcome {
    /// No backend serves this model.
    NotServed,
    /// Backends serve it, but none is healthy with a closed circuit.
    NoHealthy(Unavailable),
    /// Healthy backends serve it, but none has every capability the request needs.
    Missing(MissingCapabilities),
}

impl fmt::Display for ModelOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelOutcome::NotServed => f.write_str("not served by any backend"),
            ModelOutcome::NoHealthy(u) => write!(f, "no healthy backend: {u}"),
            ModelOutcome::Missing(m) => write!(f, "missing {m}"),
        }
    }
}

/// How the backends serving a model are unavailable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// Backends that serve the model.
    pub serving: u32,
    /// Of those, failing their health check.
    pub unhealthy: u32,
    /// Of those, healthy but with a circuit that is open or half-open.
    pub circuit_not_closed: u32,
    /// Of those, removed: draining or an empty slot (see `router::slots`).
    pub removed: u32,
    /// Of those, not serving the request's LoRA adapter (a configured adapter its model
    /// does not list).
    pub without_adapter: u32,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.serving == 1 { "" } else { "s" };
        write!(
            f,
            "{} backend{s} serve{} it, {} unhealthy, {} with an open or half-open circuit",
            self.serving,
            if self.serving == 1 { "s" } else { "" },
            self.unhealthy,
            self.circuit_not_closed
        )?;
        if self.removed > 0 {
            write!(f, ", {} removed (draining or empty)", self.removed)?;
        }
        if self.without_adapter > 0 {
            write!(
                f,
                ", {} without the requested LoRA adapter",
                self.without_adapter
            )?;
        }
        Ok(())
    }
}

/// The capabilities no healthy backend of a model offers for a request.
///
/// Invariant: at least one of the four is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingCapabilities {
    pub vision: bool,
    pub tools: bool,
    pub json_mode: bool,
    /// Set when no backend's context is long enough: what the request needs and the
    /// longest context on offer.
    pub context: Option<ContextShortfall>,
    /// Every capability listed exists on some backend, but no backend has all of them.
    pub no_single_backend: bool,
}

/// The request's estimated size against the longest context a healthy backend offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextShortfall {
    pub estimated_tokens: u32,
    pub context_length_max: u32,
}

impl MissingCapabilities {
    /// The missing capabilities by config name (`vision`, `tools`, `json_mode`,
    /// `context_length`), for a JSON error body.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        [
            (self.vision, "vision"),
            (self.tools, "tools"),
            (self.json_mode, "json_mode"),
            (self.context.is_some(), "context_length"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
    }
}

impl fmt::Display for MissingCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.names().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        if let Some(c) = self.context {
            write!(
                f,
                " (the request is about {} tokens; the longest context is {})",
                c.estimated_tokens, c.context_length_max
            )?;
        }
        if self.no_single_backend {
            f.write_str(" (each is on some backend, but no backend has all of them)")?;
        }
        Ok(())
    }
}

/// One model tried in a fallback chain, and why it could not serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriedModel {
    pub model: String,
    pub outcome: ModelOutcome,
}

/// Why one request could not be routed. `status()` is the HTTP status to answer with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// 400: the request names no model.
    #[error("model name is empty: set \"model\" to one of the models GET /v1/models lists")]
    EmptyModel,
    /// 404: nothing by that name, or an alias whose target no backend serves.
    #[error("{}", not_found(.model, .alias_target.as_deref()))]
    ModelNotFound {
        model: String,
        /// Set when `model` is an alias: the model it points to.
        alias_target: Option<String>,
    },
    /// 400: healthy backends serve the model, but none has everything the request needs.
    #[error(
        "No backend supports required capabilities for model '{model}'{}: missing {missing}; \
         drop what the request does not need or route it to a model that has it",
        via_alias(.alias.as_deref())
    )]
    CapabilityMismatch {
        model: String,
        /// Set when the request named this model through an alias.
        alias: Option<String>,
        missing: MissingCapabilities,
    },
    /// 503: backends serve the model, but none is healthy with a closed circuit.
    #[error(
        "No healthy backend available for model '{model}'{}: {unavailable}; retry later",
        via_alias(.alias.as_deref())
    )]
    NoHealthyBackend {
        model: String,
        alias: Option<String>,
        unavailable: Unavailable,
    },
    /// 503: the model and every model of its fallback chain failed.
    #[error(
        "All backends in fallback chain unavailable for '{requested}': tried {}; retry later",
        tried_list(.tried)
    )]
    FallbackChainExhausted {
        requested: String,
        /// Every model tried, in order: the requested one (or its alias target), then the
        /// chain.
        tried: Vec<TriedModel>,
    },
}

impl RouteError {
    /// The HTTP status code to answer with.
    pub fn status(&self) -> u16 {
        match self {
            RouteError::EmptyModel | RouteError::CapabilityMismatch { .. } => 400,
            RouteError::ModelNotFound { .. } => 404,
            RouteError::NoHealthyBackend { .. } | RouteError::FallbackChainExhausted { .. } => 503,
        }
    }

    /// A stable machine-readable code for the error body's `code` field.
    pub fn code(&self) -> &'static str {
        match self {
            RouteError::EmptyModel => "model_empty",
            RouteError::ModelNotFound { .. } => "model_not_found",
            RouteError::CapabilityMismatch { .. } => "capability_mismatch",
            RouteError::NoHealthyBackend { .. } => "no_healthy_backend",
            RouteError::FallbackChainExhausted { .. } => "fallback_chain_exhausted",
        }
    }
}

fn not_found(model: &str, alias_target: Option<&str>) -> String {
    match alias_target {
        None => format!(
            "Model '{model}' not found: no backend serves it and it is not an alias (GET \
             /v1/models lists what abe routes)"
        ),
        Some(t) => format!(
            "Model '{model}' not found: alias '{model}' points to '{t}', which no backend \
             serves; point the alias at a served model or add a backend for '{t}'"
        ),
    }
}

fn via_alias(alias: Option<&str>) -> String {
    alias.map_or_else(String::new, |a| format!(" (requested as alias '{a}')"))
}

fn tried_list(tried: &[TriedModel]) -> String {
    let parts: Vec<String> = tried
        .iter()
        .map(|t| format!("'{}' ({})", t.model, t.outcome))
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_codes() {
        let nf = RouteError::ModelNotFound {
            model: "gpt-5".into(),
            alias_target: None,
        };
        assert_eq!(nf.status(), 404);
        assert_eq!(nf.code(), "model_not_found");
        assert!(nf.to_string().starts_with("Model 'gpt-5' not found"));
        assert_eq!(RouteError::EmptyModel.status(), 400);
    }

    #[test]
    fn missing_lists_every_capability() {
        let m = MissingCapabilities {
            vision: true,
            tools: true,
            json_mode: false,
            context: Some(ContextShortfall {
                estimated_tokens: 9000,
                context_length_max: 8192,
            }),
            no_single_backend: false,
        };
        assert_eq!(
            m.names().collect::<Vec<_>>(),
            ["vision", "tools", "context_length"]
        );
        let s = m.to_string();
        assert!(s.starts_with("vision, tools, context_length"), "{s}");
        assert!(s.contains("9000") && s.contains("8192"), "{s}");
    }

    #[test]
    fn unavailable_reads_well() {
        let u = Unavailable {
            serving: 1,
            unhealthy: 1,
            circuit_not_closed: 0,
            removed: 0,
            without_adapter: 0,
        };
        assert_eq!(
            u.to_string(),
            "1 backend serves it, 1 unhealthy, 0 with an open or half-open circuit"
        );
        let u = Unavailable {
            serving: 3,
            unhealthy: 2,
            circuit_not_closed: 1,
            removed: 0,
            without_adapter: 0,
        };
        assert_eq!(
            u.to_string(),
            "3 backends serve it, 2 unhealthy, 1 with an open or half-open circuit"
        );
    }
}
