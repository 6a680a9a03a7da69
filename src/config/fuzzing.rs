//! The config's fuzzing properties, shared by the stable campaign (`tests/fuzz_config.rs`)
//! and the coverage-guided target (`fuzz/fuzz_targets/config_toml.rs`): how an input splits
//! into TOML and `ABE_*` overrides, and what `abe config show` must print of a checked config.
//!
//! Only fuzzers call this (it is built with the `testing` feature only); what must never
//! happen here: anything the server reads at run time.

use super::Config;

/// A config input's TOML text and its `ABE_*` overrides: the lines after a `---ENV---` line,
/// one `KEY=value` each (passed as pairs; no process environment is touched).
pub fn config_input(input: &[u8]) -> (String, Vec<(String, String)>) {
    let text = String::from_utf8_lossy(input);
    let (toml, env) = text.split_once("---ENV---").unwrap_or((&text, ""));
    let pairs = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect();
    (toml.to_string(), pairs)
}

/// What `abe config show` prints of a checked config: TOML that reads back and checks again,
/// without the admin token.
pub fn config_show_round_trips(cfg: &Config) {
    let shown = cfg.to_toml();
    let token = cfg.server.admin_token.expose();
    // A token that is also a word of the TOML (a key, "true") cannot be told apart.
    if token.len() >= 8 {
        assert!(
            !shown.contains(token),
            "config show printed the admin token"
        );
    }
    let back = Config::from_toml(&shown)
        .unwrap_or_else(|e| panic!("config show is not TOML that reads back: {e}\n{shown}"));
    back.validate()
        .unwrap_or_else(|e| panic!("config show does not check again: {e}\n{shown}"));
}
