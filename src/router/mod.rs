//! Model routing across backends (the intelligent-router specification, F06), sans-IO.
//!
//! Many backends each serve some models with some capabilities; a request names a model
//! (maybe an alias) and needs some capabilities; the router resolves the name, filters the
//! backends that can serve it now, and picks one by strategy.
//!
//! - [`capabilities`]: vision, tools, JSON mode: what a model offers and a request needs.
//! - [`registry`]: backends, their models and capabilities, live state per backend.
//! - [`resolve`]: aliases and fallback chains (single level, checked at build).
//! - [`requirements`]: what a request needs (model, estimated tokens, vision, tools, JSON).
//! - [`strategy`]: the smart score and the strategies.
//! - [`affinity`]: what a request would rather have (prompt block names, a session key):
//!   `prefix_aware`'s balance rule and thresholds, `session`'s rendezvous hashing, the
//!   [`CacheView`] an exact cache answers through.
//! - [`prefix_index`]: the approximate, bounded, LRU prefix index kept per backend.
//! - [`select`]: the decision flow ([`Router::route`]).
//! - [`slot`]: a backend slot's state (active, draining, empty); [`discovery`]: the
//!   `discovery` key (a DNS name instead of a `base_url`); [`slots`]: backends that come
//!   and go within the slots abe starts with, `discovery` tables expanded into slots, spare
//!   slots reserved; [`tables`]: a running router's next tables (spare slots filled,
//!   aliases and fallbacks changed), built off the engine and swapped in whole.
//! - [`error`]: config errors and per-request errors with their HTTP status.
//!
//! ```
//! use abe::router::{BackendConfig, Requirements, Router, RoutingConfig};
//! let backends = [BackendConfig::default_sim("abe-sim", 8192)];
//! let (mut router, warning) = Router::build(&backends, &RoutingConfig::default(), 42).unwrap();
//! assert!(warning.is_none());
//! let d = router.route(&Requirements::text("abe-sim", 100)).unwrap();
//! assert_eq!(router.describe(&d).to_string(), "backend=sim; model=abe-sim; via=direct");
//! assert_eq!(router.route(&Requirements::text("gpt-5", 1)).unwrap_err().status(), 404);
//! ```
//!
//! What never happens in this module: I/O, clock reads, locks, threads, or allocation on
//! the success path of a decision. Health probes, circuit breaking, executing on the chosen
//! backend and the response header are the caller's; they feed state in through
//! [`Registry`]'s methods and read decisions out.

pub mod affinity;
pub mod capabilities;
pub mod discovery;
pub mod error;
pub mod lora;
pub mod prefix_index;
pub mod registry;
pub mod requirements;
pub mod resolve;
pub mod select;
pub mod slot;
pub mod slots;
pub mod strategy;
pub mod tables;

#[cfg(test)]
mod tests;

pub use affinity::{Affinity, CacheView, PrefixConfig};
pub use capabilities::Capabilities;
pub use discovery::Discovery;
pub use error::{
    ContextShortfall, MissingCapabilities, ModelOutcome, RouteError, RouterConfigError, TriedModel,
    Unavailable,
};
pub use prefix_index::PrefixIndex;
pub use registry::{
    ApiKey, Backend, BackendConfig, BackendId, BackendKind, BackendKindName, BackendState,
    ModelConfig, ModelId, Offer, Registry,
};
pub use requirements::{estimate_tokens, Requirements, RequirementsBuilder};
pub use resolve::{NameId, Resolver, Routable};
pub use select::{Decision, DecisionText, LiveRouting, Need, Router, RoutingConfig, Via};
pub use slot::SlotState;
pub use slots::DiscoveryPlan;
pub use strategy::{score, Candidate, Strategy, UnknownStrategy, Weights};
pub use tables::{RouteTables, TablesRefused};
