//! The config loader on any input: TOML text, then `ABE_*` overrides after a `---ENV---`
//! line (one `KEY=value` a line, passed to `Config::apply_env` as pairs: no process
//! environment is touched). A config loads or says why; a checked config prints
//! (`abe config show`) as TOML that reads back and checks, without the admin token; its
//! router resolves every name the input mentions to a route or a specific error, along
//! finite, repeat-free fallback chains. Seeds: `fuzz/corpus/config/`, `fuzz/corpus/router/`.
//! The stable campaigns `config` and `router` (`tests/fuzz_config.rs`), coverage-guided.
#![no_main]

use abe::config::Config;
use abe::router::{RequirementsBuilder, Router};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let (toml, pairs) = abe::config::fuzzing::config_input(input);
    let Ok(mut cfg) = Config::from_toml(&toml) else {
        return;
    };
    if cfg.apply_env(pairs).is_err() {
        return;
    }
    let Ok(settings) = cfg.clone().check() else {
        return;
    };
    abe::config::fuzzing::config_show_round_trips(&cfg);

    let (mut router, _) = Router::build(&settings.backends, &cfg.routing, 7)
        .expect("a checked config builds its router");
    let mut names: Vec<&str> = text.split('"').skip(1).step_by(2).take(32).collect();
    names.extend(["", "not-a-model"]);
    for name in names {
        if let Some(id) = router.resolver().lookup(name) {
            let chain = router.resolver().chain_for(id);
            // The chain is the configured list (the alias target's when the alias has
            // none of its own), in order, names no backend serves included. Not bounded
            // by the routable names: cargo fuzz found a longer chain of unserved names
            // (seed router/02b-unserved-fallbacks.toml).
            let configured = |n: &str| cfg.routing.fallbacks.get(n).cloned().unwrap_or_default();
            let mut want = configured(name);
            if want.is_empty() {
                if let Some(target) = cfg.routing.aliases.get(name) {
                    want = configured(target);
                }
            }
            let got: Vec<&str> = chain.iter().map(|n| router.resolver().name(*n)).collect();
            assert_eq!(got, want, "chain of {name:?}");
            let mut seen = std::collections::HashSet::new();
            assert!(
                chain.iter().all(|n| seen.insert(*n)),
                "chain of {name:?} repeats a name"
            );
        }
        let _ = router.route(&RequirementsBuilder::new(name).build());
    }
});
