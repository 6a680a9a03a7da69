//! Configuration: embedded defaults, then a TOML file, then `ABE_*` environment overrides,
//! then command-line flags; checked once into typed settings with errors that name the key,
//! the value and why.
//!
//! Keys follow the Go spec's config (server, batching, workers, health, metrics) plus abe's
//! own (`engine`, `continuous`) and routing across backends (`[[backends]]`, `[routing]`,
//! `[upstream]`, whose types live in [`crate::router`]). `config.toml` at the repository
//! root documents every key; a test keeps it in sync with [`Config::default`].
//!
//! - `sections`: one serde struct per table, with its defaults.
//! - `layering`: file, environment and flags over the defaults (and back to TOML).
//! - `settings`: the one check, into the typed settings each part runs on.
//! - `millis`, `error`: durations and errors shared by the three.
//!
//! Nothing here runs after start-up, and nothing below `config` (core, runtime, exec, sim,
//! router) imports it: settings flow down as the parts' own types.

mod error;
mod layering;
mod millis;
mod sections;
mod settings;
#[cfg(test)]
mod tests;

pub use error::ConfigError;
pub use layering::FlagOverrides;
pub use millis::Millis;
pub use sections::*;
pub use settings::Settings;
