//! Configuration errors. Every message names the key, the value and why, so a user can fix
//! the file, variable or flag at fault. Nothing here prints or exits: `main` does that.

use crate::core::strategy::research::keys::InvalidSetting;
use crate::router::RouterConfigError;
use std::fmt;

/// A configuration problem, naming the key, the value and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML for abe: {message}")]
    Parse { path: String, message: String },
    #[error("invalid value for {key} = {value}: {why}")]
    Invalid {
        key: String,
        value: String,
        why: String,
    },
    #[error("unknown environment override {var}: no config key {key} (keys look like ABE_BATCHING_STRATEGY)")]
    UnknownEnv { var: String, key: String },
    /// An `ABE_*` variable addressing a part of the config that only a file can set.
    #[error("environment override {var} is not supported: {why}")]
    UnsupportedEnv { var: String, why: String },
    /// `[[backends]]` or `[routing]` does not build a router; the message names the backend,
    /// model, alias or key at fault.
    #[error(transparent)]
    Routing(#[from] RouterConfigError),
}

impl From<InvalidSetting> for ConfigError {
    fn from(e: InvalidSetting) -> Self {
        ConfigError::Invalid {
            key: e.key,
            value: e.value,
            why: e.why,
        }
    }
}

/// A [`ConfigError::Invalid`]: `key` = `value` is wrong because `why`.
pub(crate) fn invalid(key: &str, value: impl fmt::Display, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        why: why.into(),
    }
}
