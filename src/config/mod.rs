//! Configuration: embedded defaults, then a TOML file, then `ABE_*` environment overrides,
//! then command-line flags; checked once into typed settings with errors that name the key,
//! the value and why.
//!
//! Keys follow the Go spec's config (server, batching, workers, health, metrics) plus abe's
//! own (`engine`, `continuous`) and routing across backends (`[[backends]]`, `[routing]`,
//! `[upstream]`, whose types live in [`crate::router`]). `config.toml` at the repository
//! root documents every key; a test keeps it in sync with [`Config::default`].
//!
//! - `sections`: one serde struct per table, with its defaults (read from the parts' own
//!   defaults where a part has one). A choice (`batching.mode`, `batching.strategy`,
//!   `workers.latency_model`, `workers.balancer`, `engine.idle`, ...) is the part's enum
//!   from the moment the text is read.
//! - `layering`: file, environment and flags over the defaults (and back to TOML), giving
//!   a [`Config`].
//! - `settings`: [`Config::check`], the one check, into [`Settings`]: the runtime's
//!   settings (core, sim executors, continuous batching, threads), the backends and the
//!   router. `abe serve` calls it once.
//! - `embed_context`: an `embed` model's omitted `context_length`, from its model_dir.
//! - `kind_defaults`: the keys whose default depends on the backends' executor kinds
//!   (`embed`: one batch at a time, batches of 64, unpinned), filled in where the file
//!   leaves them out.
//! - `millis`, `error`: durations and errors shared by the three.
//!
//! Nothing here runs after start-up, and nothing below `config` (core, runtime, exec, sim,
//! router) imports it: settings flow down as the parts' own types. A new key goes in
//! `sections` (with its default and a line in config.toml) and, if it needs judging, in
//! `settings`.

mod embed_context;
mod error;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod kind_defaults;
mod layering;
mod millis;
mod secret;
mod sections;
mod settings;
mod sim_backends;
#[cfg(test)]
mod tests;

pub use error::ConfigError;
pub use kind_defaults::KindDefaults;
pub use layering::FlagOverrides;
pub use millis::Millis;
pub use secret::Secret;
pub use sections::*;
pub use settings::Settings;
pub use sim_backends::SimBackendLatency;
