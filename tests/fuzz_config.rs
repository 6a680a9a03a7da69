//! Fuzzing the config (TOML file plus `ABE_*` overrides) and the router's alias and
//! fallback resolution built from it (see `abe::fuzz`). An input is TOML, optionally
//! followed by a `---ENV---` line and `KEY=VALUE` lines. Seeds: `fuzz/corpus/config/`,
//! `fuzz/corpus/router/`.
//!
//! Invariants: nothing panics; a config that checks prints (`abe config show`) as TOML that
//! parses and checks again; the admin token never appears in what is shown; every name the
//! input mentions routes to an answer or a specific error, and an alias or fallback chain is
//! finite and never names itself twice.

use abe::config::Config;
use abe::fuzz::{seeds_from_dir, signature, Campaign};
use abe::router::{RequirementsBuilder, Router};
use std::path::Path;

const DICTIONARY: &[&[u8]] = &[
    b"\n",
    b" = ",
    b"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b".",
    b"[server]\n",
    b"[batching]\n",
    b"[workers]\n",
    b"[engine]\n",
    b"[continuous]\n",
    b"[routing]\n",
    b"[routing.aliases]\n",
    b"[routing.fallbacks]\n",
    b"[[backends]]\n",
    b"[[backends.models]]\n",
    b"[workers.backends.b1]\n",
    b"base_latency_ms = ",
    b"gpu = \"l4\"\n",
    b"name = \"m1\"\n",
    b"kind = \"sim\"\n",
    b"kind = \"upstream\"\n",
    b"context_length = ",
    b"\"m1\"",
    b"\"m2\"",
    b"\"x\" = \"y\"\n",
    b"\"y\" = \"x\"\n",
    b"[\"m1\", \"m2\"]",
    b"true",
    b"false",
    b"\"5s\"",
    b"\"1m\"",
    b"\"250ms\"",
    b"---ENV---\n",
    b"ABE_",
    b"ABE_SERVER_PORT=",
    b"ABE_BATCHING_STRATEGY=",
    b"ABE_SERVER_ADMIN_TOKEN=",
    b"ABE_ROUTING_ALIASES_X=",
    b"=",
    b"_",
];

/// Which stage an input reached and what stopped it there.
fn stage(stage: u8, why: &str) -> (u64, String) {
    // The message up to its first quoted value or number says which rule refused it.
    let rule = why
        .split(|c: char| c == '\'' || c == '"' || c.is_ascii_digit())
        .next();
    (signature((stage, rule)), why.to_string())
}

/// Loads and checks a config, checking what `abe config show` prints of it.
fn load(input: &[u8]) -> Result<(Config, abe::config::Settings), (u64, String)> {
    let (toml, env) = abe::config::fuzzing::config_input(input);
    let mut cfg = Config::from_toml(&toml).map_err(|e| stage(1, &e))?;
    cfg.apply_env(env).map_err(|e| stage(2, &e.to_string()))?;
    let settings = cfg.clone().check().map_err(|e| stage(3, &e.to_string()))?;
    abe::config::fuzzing::config_show_round_trips(&cfg);
    Ok((cfg, settings))
}

#[test]
fn configs_and_overrides_load_or_say_why() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/config");
    // The good seeds load (the harness reaches the deep stages), the bad one (last,
    // 99-bad.toml) does not.
    let seeds = seeds_from_dir(&dir);
    for (i, s) in seeds.iter().enumerate() {
        let good = i + 1 < seeds.len();
        assert_eq!(load(s).is_ok(), good, "seed {i}: {:?}", load(s).err());
    }
    let report =
        Campaign::new("config", seeds_from_dir(&dir), DICTIONARY, 4096, 3_000).run(|input| {
            match load(input) {
                Ok(_) => signature(4u8),
                Err((s, _)) => s,
            }
        });
    eprintln!("{report}");
}

/// Quoted strings of the input: the model names, aliases and fallbacks it mentions.
fn names(input: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(input);
    let mut out: Vec<String> = text
        .split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    out.truncate(32);
    out.push(String::new());
    out.push("not-a-model".into());
    out
}

#[test]
fn aliases_and_fallbacks_resolve_to_an_answer_or_a_specific_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/router");
    // The good seeds load; the last is refused (self-reference, alias of an alias).
    let seeds = seeds_from_dir(&dir);
    assert!(load(seeds.last().unwrap()).is_err());
    for s in &seeds[..seeds.len() - 1] {
        if let Err((_, why)) = load(s) {
            panic!("{why}\n{}", String::from_utf8_lossy(s));
        }
    }
    let report =
        Campaign::new("router", seeds_from_dir(&dir), DICTIONARY, 4096, 3_000).run(|input| {
            let (cfg, settings) = match load(input) {
                Ok(loaded) => loaded,
                Err((s, _)) => return s,
            };
            // The router as abe serve builds it, then every name the input mentions.
            let (mut router, _) = Router::build(&settings.backends, &cfg.routing, 7)
                .expect("a checked config builds its router");
            let mut outcomes = Vec::new();
            for name in names(input) {
                if let Some(id) = router.resolver().lookup(&name) {
                    let chain = router.resolver().chain_for(id);
                    // The chain is the configured list (the alias target's when the alias has
                    // none of its own), in order, names no backend serves included. Not bounded
                    // by the routable names: cargo fuzz found a longer chain of unserved names
                    // (seed router/02b-unserved-fallbacks.toml).
                    let configured =
                        |n: &str| cfg.routing.fallbacks.get(n).cloned().unwrap_or_default();
                    let mut want = configured(&name);
                    if want.is_empty() {
                        if let Some(target) = cfg.routing.aliases.get(&name) {
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
                let req = RequirementsBuilder::new(&name).build();
                let outcome = match router.route(&req) {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("{e:?}")
                        .split([' ', '{', '('])
                        .next()
                        .unwrap()
                        .into(),
                };
                outcomes.push(outcome);
            }
            outcomes.sort();
            outcomes.dedup();
            signature((5u8, outcomes))
        });
    eprintln!("{report}");
}
