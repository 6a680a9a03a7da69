//! Layering: the built-in defaults, then a TOML file, then `ABE_*` environment overrides,
//! then command-line flags, each over the one before. Printing the result back as TOML
//! (`abe config show`) lives here too.
//!
//! What must never happen here: judging values (a layer only puts a value of the right
//! type in its place; `settings` checks it), or reading a variable that does not start with
//! `ABE_`.

use super::error::{invalid, ConfigError};
use super::sections::Config;
use crate::core::strategy::UnknownStrategy;
use std::path::Path;

/// Command-line overrides for the common keys.
#[derive(Clone, Debug, Default)]
pub struct FlagOverrides {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub strategy: Option<String>,
    pub workers: Option<usize>,
}

impl Config {
    /// Reads a TOML file over the defaults (not yet validated).
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.display().to_string(),
            message,
        })
    }

    /// Parses TOML text over the defaults (not yet validated). A choice (a strategy, a
    /// latency model, an idle policy...) is typed here: an unknown name is an error naming
    /// the key, the value and the valid names. The per-kind keys the text leaves out take
    /// their backends' kinds' defaults (`kind_defaults`).
    pub fn from_toml(text: &str) -> Result<Config, String> {
        let mut cfg: Config = serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|e| {
                let key = e.path().to_string();
                let why = e.into_inner().to_string();
                if key == "." {
                    why
                } else {
                    format!("{key}: {why}")
                }
            })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        super::kind_defaults::fill(&mut cfg, &table);
        Ok(cfg)
    }

    /// The effective config: defaults, then `file`, then `env` (`ABE_*` pairs), then flags;
    /// not yet checked (`abe serve` checks it once, in [`Config::check`]).
    pub fn layered(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &FlagOverrides,
    ) -> Result<Config, ConfigError> {
        let mut cfg = match file {
            Some(p) => Self::from_file(p)?,
            None => Config::default(),
        };
        cfg.apply_env(env)?;
        cfg.apply_flags(flags)?;
        Ok(cfg)
    }

    /// [`layered`](Self::layered), then validated (`abe config check`, `abe config show`).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &FlagOverrides,
    ) -> Result<Config, ConfigError> {
        let cfg = Self::layered(file, env, flags)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Applies `ABE_<SECTION>_<KEY>=value` overrides (e.g. `ABE_BATCHING_STRATEGY=fixed`,
    /// `ABE_BATCHING_PRIORITY_MAX_WAIT_MS_LOW=80`). Unknown `ABE_` keys are errors, so a typo
    /// is not silently ignored. `RUST_LOG`-style non-`ABE_` variables are not looked at.
    pub fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        // The tree holds only what the environment may set. `[[backends]]`,
        // `[workers.backends.<name>]` and the alias and fallback maps are file-only: they
        // are left out of the tree (an `ABE_BACKENDS_*` variable gets a clear error, and no
        // backend, alias or model name can be mistaken for a key) and carried over
        // untouched. Round-tripping them through the tree would also
        // replace every api_key with its redacted serialised form.
        let mut bare = self.clone();
        bare.backends.clear();
        bare.workers.backends.clear();
        bare.routing.aliases.clear();
        bare.routing.fallbacks.clear();
        let mut tree = toml::Value::try_from(&bare).expect("config serialises to TOML");
        // What each override set, by dotted key, to name the variable's value if the typed
        // config refuses it.
        let mut set: Vec<(String, String)> = Vec::new();
        for (var, value) in env {
            let Some(rest) = var.strip_prefix("ABE_") else {
                continue;
            };
            let path = rest.to_ascii_lowercase();
            if let Some(why) = file_only(&path) {
                return Err(ConfigError::UnsupportedEnv {
                    var,
                    why: why.into(),
                });
            }
            let key_display = path.replace('_', ".");
            let Some(slot) = find_key(&mut tree, &path) else {
                return Err(ConfigError::UnknownEnv {
                    var,
                    key: key_display,
                });
            };
            let (dotted, target) = slot;
            *target = parse_like(target, &value).map_err(|why| invalid(&dotted, &value, why))?;
            set.push((dotted, value));
        }
        if !set.is_empty() {
            let mut updated: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
                let key = e.path().to_string();
                let inner = e.into_inner();
                let why = inner.message();
                let value = set
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == key)
                    .map_or("ABE_*", |(_, v)| v.as_str());
                invalid(&key, value, why.trim_end())
            })?;
            // The tree holds the admin token redacted (it serialises so): keep the real one
            // unless an override set it.
            if !set.iter().any(|(k, _)| k == "server.admin_token") {
                updated.server.admin_token = std::mem::take(&mut self.server.admin_token);
            }
            updated.backends = std::mem::take(&mut self.backends);
            updated.workers.backends = std::mem::take(&mut self.workers.backends);
            updated.routing.aliases = std::mem::take(&mut self.routing.aliases);
            updated.routing.fallbacks = std::mem::take(&mut self.routing.fallbacks);
            *self = updated;
        }
        Ok(())
    }

    /// Applies command-line flags. A `--strategy` that names no strategy is an error.
    pub fn apply_flags(&mut self, f: &FlagOverrides) -> Result<(), ConfigError> {
        if let Some(h) = &f.host {
            self.server.host = h.clone();
        }
        if let Some(p) = f.port {
            self.server.port = p;
        }
        if let Some(s) = &f.strategy {
            self.batching.strategy = s
                .parse()
                .map_err(|e: UnknownStrategy| invalid("batching.strategy", s, e.to_string()))?;
        }
        if let Some(w) = f.workers {
            self.workers.count = w;
        }
        Ok(())
    }

    /// The effective config as TOML (for `abe config show`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serialises to TOML")
    }
}

/// Why an env key path (lowercased, `ABE_` stripped) addresses a file-only part of the
/// config, or `None` when it may be an ordinary key.
fn file_only(path: &str) -> Option<&'static str> {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}_"));
    if under("backends") {
        Some("[[backends]] tables can only be set in the config file (--config FILE)")
    } else if under("workers_backends") {
        Some(
            "[workers.backends.<name>] tables can only be set in the config file \
             (--config FILE)",
        )
    } else if under("routing_aliases") || under("routing_fallbacks") {
        Some(
            "[routing.aliases] and [routing.fallbacks] can only be set in the config file \
             (--config FILE)",
        )
    } else {
        None
    }
}

/// Finds the TOML value addressed by an env key path like `batching_max_batch_size`
/// (underscores are ambiguous, so every split against the actual tree is tried), returning
/// its dotted name and the value.
fn find_key<'a>(tree: &'a mut toml::Value, path: &str) -> Option<(String, &'a mut toml::Value)> {
    let keys = key_path(tree, path)?;
    let mut node = tree;
    for k in &keys {
        node = node.as_table_mut()?.get_mut(k)?;
    }
    Some((keys.join("."), node))
}

/// The table keys leading to the leaf that `path` names, longest key match first.
fn key_path(tree: &toml::Value, path: &str) -> Option<Vec<String>> {
    let table = tree.as_table()?;
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for key in keys {
        let child = &table[key.as_str()];
        if path == key.as_str() && !child.is_table() {
            return Some(vec![key.clone()]);
        }
        if let Some(rest) = path.strip_prefix(&format!("{key}_")) {
            if let Some(mut tail) = key_path(child, rest) {
                tail.insert(0, key.clone());
                return Some(tail);
            }
        }
    }
    None
}

/// Parses `text` as a value of the same TOML type as `like`.
fn parse_like(like: &toml::Value, text: &str) -> Result<toml::Value, String> {
    match like {
        toml::Value::String(_) => Ok(toml::Value::String(text.to_string())),
        toml::Value::Integer(_) => text
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| "expected an integer".to_string()),
        toml::Value::Float(_) => text
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| "expected a number".to_string()),
        toml::Value::Boolean(_) => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err("expected true or false".to_string()),
        },
        _ => Err("this key cannot be set from the environment".to_string()),
    }
}
