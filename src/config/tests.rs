//! Tests of the config module: layering, checks and the documented file.

use super::*;
use crate::core::strategy::StrategyKind;
use crate::core::BatchingMode;
use crate::exec::latency::LatencyModel;
use crate::router::{BackendKindName, Strategy};
use std::path::Path;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_are_valid_and_match_the_spec() {
    let r = Config::default().check().unwrap().runtime;
    assert_eq!(r.core.queue_capacity, 10_000);
    assert_eq!(r.core.max_batch_size, 32);
    assert_eq!(r.core.max_batch_tokens, 8192);
    assert_eq!(r.core.strategy, StrategyKind::Auto);
    assert_eq!(r.core.priority_max_wait_ms, [100.0, 50.0, 20.0, 5.0]);
    assert_eq!(r.core.circuit.failure_threshold, 5);
    assert_eq!(r.core.circuit.recovery_ns, 30_000_000_000);
    assert_eq!(r.sim.latency, LatencyModel::LINEAR_DEFAULT);
}

#[test]
fn durations_parse_in_go_style() {
    assert_eq!("30s".parse::<Millis>().unwrap(), Millis(30_000));
    assert_eq!("100ms".parse::<Millis>().unwrap(), Millis(100));
    assert_eq!("1h".parse::<Millis>().unwrap(), Millis(3_600_000));
    assert_eq!("1.5s".parse::<Millis>().unwrap(), Millis(1500));
    assert!("10 parsecs".parse::<Millis>().is_err());
    let c =
        Config::from_toml("[server]\nread_timeout = \"5s\"\n[health]\nrecovery_timeout = 250\n")
            .unwrap();
    assert_eq!(c.server.read_timeout, Millis(5000));
    assert_eq!(c.health.recovery_timeout, Millis(250));
}

#[test]
fn env_overrides_reach_nested_keys_and_typos_are_errors() {
    let mut c = Config::default();
    c.apply_env(env(&[
        ("ABE_BATCHING_STRATEGY", "fixed"),
        ("ABE_BATCHING_MAX_BATCH_SIZE", "8"),
        ("ABE_BATCHING_PRIORITY_MAX_WAIT_MS_LOW", "80"),
        ("ABE_SERVER_READ_TIMEOUT", "2s"),
        ("ABE_ENGINE_PIN", "false"),
        ("PATH", "/usr/bin"),
    ]))
    .unwrap();
    assert_eq!(c.batching.strategy, StrategyKind::Fixed);
    assert_eq!(c.batching.max_batch_size, 8);
    assert_eq!(c.batching.priority_max_wait_ms.low, 80.0);
    assert_eq!(c.server.read_timeout, Millis(2000));
    assert!(!c.engine.pin);
    let err = Config::default()
        .apply_env(env(&[("ABE_BATCHING_STRATEGI", "fixed")]))
        .unwrap_err();
    assert!(err.to_string().contains("ABE_BATCHING_STRATEGI"), "{err}");
    let err = Config::default()
        .apply_env(env(&[("ABE_BATCHING_MAX_BATCH_SIZE", "lots")]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value for batching.max_batch_size = lots: expected an integer"
    );
}

/// A choice is typed when it is read: from the environment, a flag or a file, an unknown
/// name is an error naming the key, the value and the valid names.
#[test]
fn unknown_names_are_refused_where_they_are_read() {
    let e = Config::default()
        .apply_env(env(&[("ABE_BATCHING_STRATEGY", "fastest")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid value for batching.strategy = fastest: unknown strategy 'fastest': valid \
         strategies are auto, fixed, queue_depth, latency_aware, dynamic, multi_bin"
    );
    let flags = FlagOverrides {
        strategy: Some("fastest".into()),
        ..Default::default()
    };
    let e = Config::load(None, env(&[]), &flags)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("invalid value for batching.strategy = fastest: unknown strategy"),
        "{e}"
    );
    for (var, value, key, valid) in [
        (
            "ABE_BATCHING_MODE",
            "batchy",
            "batching.mode",
            "request, continuous",
        ),
        (
            "ABE_WORKERS_LATENCY_MODEL",
            "fast",
            "workers.latency_model",
            "none, linear, calibrated, max_of_batch, affine_step, roofline",
        ),
        (
            "ABE_WORKERS_BALANCER",
            "random",
            "workers.balancer",
            "round_robin, least_loaded, power_of_two",
        ),
        (
            "ABE_ENGINE_IDLE",
            "nap",
            "engine.idle",
            "spin, adaptive, park",
        ),
        (
            "ABE_BATCHING_DYNAMIC_BIN_POLICY",
            "fifo",
            "batching.dynamic.bin_policy",
            "age_aware, response_ratio, round_robin, longest_queue",
        ),
        (
            "ABE_BATCHING_DYNAMIC_PREDICTOR",
            "oracle",
            "batching.dynamic.predictor",
            "max_tokens, ema_by_prompt_bucket",
        ),
    ] {
        let e = Config::default()
            .apply_env(env(&[(var, value)]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("invalid value for {key} = {value}: unknown "))
                && e.contains(&format!("'{value}'"))
                && e.ends_with(valid),
            "{e}"
        );
        let (table, leaf) = key.rsplit_once('.').unwrap();
        let e = Config::from_toml(&format!("[{table}]\n{leaf} = \"{value}\"\n")).unwrap_err();
        assert!(
            e.starts_with(&format!("{key}: "))
                && e.contains(&format!("'{value}'"))
                && e.contains(valid),
            "{e}"
        );
    }
    let shown = Config::default().to_toml();
    assert!(
        shown.contains("strategy = \"auto\"") && shown.contains("idle = \"adaptive\""),
        "choices print as their names: {shown}"
    );
}

#[test]
fn queue_places_beyond_the_engines_32_bit_index_are_refused_with_the_count() {
    let mut c = Config::default();
    c.batching.queue_capacity = 1 << 31;
    c.validate().expect("one backend of 2^31 places fits");
    let toml = "[batching]\nqueue_capacity = 3000000000\n";
    let e = Config::from_toml(toml)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batching.queue_capacity = 3000000000") && e.contains("2^32"),
        "{e}"
    );
    let mut c = Config::default();
    c.batching.queue_capacity = 1 << 31;
    c.routing.spare_backend_slots = Some(1);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("2 backends (spare slots included)"), "{e}");
    // Continuous batching has one lane, its queue and the replicas' slots; it does not
    // use `batching.queue_capacity`.
    let mut c = Config::from_toml("[batching]\nmode = \"continuous\"\n").unwrap();
    c.batching.queue_capacity = 3_000_000_000;
    c.validate()
        .expect("continuous batching does not read batching.queue_capacity");
    c.continuous.max_queue = 1 << 31;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("continuous.max_queue = 2147483648"), "{e}");
}

#[test]
fn bad_values_name_the_key_the_value_and_why() {
    let mut c = Config::default();
    c.batching.min_wait_ms = 200.0;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("batching.min_wait_ms = 200") && e.contains("max_wait_ms"),
        "{e}"
    );
    let mut c = Config::default();
    c.workers.fault_error_rate = 1.5;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("probability"));
    assert!(Config::from_toml("[batching]\nmax_batch_sise = 3\n")
        .unwrap_err()
        .contains("max_batch_sise"));
}

#[test]
fn admin_without_token_on_a_public_address_is_refused() {
    let mut c = Config::default();
    c.server.host = "0.0.0.0".into();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("server.admin_token"), "{e}");
    c.server.admin_token = "secret".into();
    c.validate().unwrap();
    c.server.admin_token = Default::default();
    c.server.admin_enabled = false;
    c.validate().unwrap();
}

#[test]
fn flags_override_env_and_file() {
    let dir = std::env::temp_dir().join(format!("abe-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(&path, "[server]\nport = 9000\n[workers]\ncount = 2\n").unwrap();
    let c = Config::load(
        Some(&path),
        env(&[("ABE_SERVER_PORT", "9100")]),
        &FlagOverrides {
            workers: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.server.port, 9100);
    assert_eq!(c.workers.count, 3);
    std::fs::remove_dir_all(&dir).ok();
}

/// Two backends (one sim, one upstream with a key), an alias and a fallback.
const TWO_BACKENDS: &str = r#"
    [[backends]]
    name = "local"
    kind = "sim"
    priority = 10
    max_concurrent_batches = 2
    [[backends.models]]
    name = "llama3:8b"
    context_length = 8192
    capabilities = { tools = true, json_mode = true }

    [[backends]]
    name = "gpu-a"
    kind = "upstream"
    base_url = "http://10.0.0.5:8000"
    api_key = "sk-live-0123456789"
    priority = 0
    max_concurrent_batches = 8
    [[backends.models]]
    name = "llama3:70b"
    context_length = 32768
    [[backends.models]]
    name = "llama3:8b"
    context_length = 8192

    [routing]
    strategy = "least_loaded"
    max_retries = 3
    [routing.weights]
    priority = 40
    load = 40
    latency = 20
    [routing.aliases]
    "gpt-4o" = "llama3:70b"
    [routing.fallbacks]
    "llama3:70b" = ["llama3:8b"]

    [upstream]
    request_timeout = "90s"
"#;

fn two_backends() -> Config {
    Config::from_toml(TWO_BACKENDS).expect("parses")
}

fn validate_err(c: &Config) -> String {
    c.validate().unwrap_err().to_string()
}

#[test]
fn backends_routing_and_upstream_parse_and_validate() {
    let c = two_backends();
    let s = c.clone().check().unwrap();
    assert!(s.routing_warning.is_none());
    assert_eq!(
        s.backends[..2],
        c.backends[..],
        "configured backends win, then the spare slots"
    );
    // An upstream table: abe routes to servers, so 8 spare slots by default.
    assert_eq!(s.spare, (2..10).collect::<Vec<_>>());
    assert!(s.backends[2..]
        .iter()
        .all(|b| b.spare && b.kind == BackendKindName::Upstream && b.models.is_empty()));
    let mut none = c.clone();
    none.routing.spare_backend_slots = Some(0);
    assert_eq!(none.check().unwrap().backends, c.backends);
    assert_eq!(c.backends.len(), 2);
    assert_eq!(c.backends[1].kind, BackendKindName::Upstream);
    assert_eq!(
        c.backends[1].api_key.as_ref().unwrap().expose(),
        "sk-live-0123456789"
    );
    assert_eq!(c.routing.max_retries, 3);
    assert_eq!(c.routing.aliases["gpt-4o"], "llama3:70b");
    assert_eq!(c.routing.fallbacks["llama3:70b"], ["llama3:8b"]);
    assert_eq!(c.upstream.request_timeout, Millis(90_000));
    assert_eq!(c.upstream.connect_timeout, Millis(2_000));
    let mut router = s.router;
    let d = router
        .route(&crate::router::Requirements::text("gpt-4o", 100))
        .unwrap();
    assert_eq!(
        router.describe(&d).to_string(),
        "backend=gpu-a; model=llama3:70b; via=alias; requested=gpt-4o"
    );
}

#[test]
fn effective_backends_default_to_one_sim_backend_from_server_and_workers() {
    let mut c = Config::default();
    c.server.model_name = "tiny".into();
    c.workers.count = 3;
    let b = c.effective_backends();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].kind, BackendKindName::Sim);
    assert_eq!(b[0].max_concurrent_batches, 3);
    assert_eq!(b[0].models.len(), 1);
    assert_eq!(b[0].models[0].name, "tiny");
    assert_eq!(
        b[0].models[0].context_length,
        Some(DEFAULT_SIM_CONTEXT_LENGTH)
    );
    let mut router = c.check().unwrap().router;
    let d = router
        .route(&crate::router::Requirements::text("tiny", 1))
        .unwrap();
    assert_eq!(
        router.describe(&d).to_string(),
        "backend=sim; model=tiny; via=direct"
    );
}

#[test]
fn router_config_errors_keep_their_message() {
    let mut c = two_backends();
    c.routing.aliases.insert("a".into(), "b".into());
    c.routing.aliases.insert("b".into(), "a".into());
    let e = validate_err(&c);
    assert!(
        e.contains("routing.aliases") && e.contains("a -> b -> a"),
        "{e}"
    );

    let mut c = two_backends();
    c.routing.weights.latency = 30;
    let e = validate_err(&c);
    assert!(
        e.contains("routing.weights") && e.contains("must sum to 100") && e.contains("110"),
        "{e}"
    );

    let mut c = two_backends();
    c.backends[1].name = "local".into();
    let e = validate_err(&c);
    assert!(e.contains("'local'") && e.contains("unique"), "{e}");

    let mut c = two_backends();
    c.backends[0].base_url = Some("http://h:1".into());
    let e = validate_err(&c);
    assert!(e.contains("'local'") && e.contains("upstream"), "{e}");
    let mut c = two_backends();
    c.backends[0].api_key = Some(crate::router::ApiKey::new("k"));
    let e = validate_err(&c);
    assert!(e.contains("'local'") && e.contains("api_key"), "{e}");
}

#[test]
fn upstream_base_url_must_be_plain_http() {
    let mut c = two_backends();
    c.backends[1].base_url = None;
    let e = validate_err(&c);
    assert!(
        e.contains("'gpu-a'") && e.contains("base_url") && e.contains("http://"),
        "{e}"
    );
    c.backends[1].base_url = Some("https://gpu-a.example:443".into());
    let e = validate_err(&c);
    assert!(
        e.starts_with(
            "invalid value for backends['gpu-a'].base_url = https://gpu-a.example:443: \
             https is not supported"
        ) && e.contains("TLS-terminating proxy"),
        "{e}"
    );
    c.backends[1].base_url = Some("HTTPS://gpu-a.example".into());
    assert!(validate_err(&c).contains("https is not supported"));
}

#[test]
fn continuous_mode_refuses_upstream_backends_and_takes_several_sim_ones() {
    let mut c = two_backends();
    c.batching.mode = BatchingMode::Continuous;
    let e = validate_err(&c);
    assert!(
        e.starts_with("invalid value for batching.mode = continuous")
            && e.contains(&format!("upstream backend \"{}\"", c.backends[1].name))
            && e.contains("runs its own continuous batching")
            && e.contains("batching.mode = \"request\""),
        "{e}"
    );
    // Two sim backends: routed across in continuous mode.
    c.backends[1].kind = BackendKindName::Sim;
    c.backends[1].base_url = None;
    c.backends[1].api_key = None;
    c.validate().unwrap();
    c.backends.remove(1);
    c.routing.aliases.clear();
    c.routing.fallbacks.clear();
    c.validate().unwrap();
    let mut c = Config::default();
    c.batching.mode = BatchingMode::Continuous;
    c.validate().unwrap();
}

#[test]
fn max_retries_is_at_most_8() {
    let mut c = Config::default();
    c.routing.max_retries = 8;
    c.validate().unwrap();
    c.routing.max_retries = 9;
    let e = validate_err(&c);
    assert!(
        e.starts_with("invalid value for routing.max_retries = 9: must be at most 8"),
        "{e}"
    );
}

#[test]
fn upstream_keys_are_checked() {
    let mut c = Config::default();
    c.upstream.request_timeout = Millis(0);
    assert!(validate_err(&c).contains("upstream.request_timeout"));
    let mut c = Config::default();
    c.upstream.health_path = "health".into();
    assert!(validate_err(&c).contains("upstream.health_path"));
}

#[test]
fn env_overrides_reach_routing_and_upstream() {
    let mut c = two_backends();
    c.apply_env(env(&[
        ("ABE_ROUTING_STRATEGY", "round_robin"),
        ("ABE_ROUTING_MAX_RETRIES", "5"),
        ("ABE_ROUTING_WEIGHTS_PRIORITY", "30"),
        ("ABE_ROUTING_WEIGHTS_LOAD", "50"),
        ("ABE_UPSTREAM_REQUEST_TIMEOUT", "2m"),
        ("ABE_UPSTREAM_HEALTH_PATH", "/health"),
    ]))
    .unwrap();
    assert_eq!(c.routing.strategy, "round_robin");
    assert_eq!(c.routing.max_retries, 5);
    assert_eq!(c.routing.weights.priority, 30);
    assert_eq!(c.routing.weights.load, 50);
    assert_eq!(c.upstream.request_timeout, Millis(120_000));
    assert_eq!(c.upstream.health_path, "/health");
    c.validate().unwrap();
    let untouched = two_backends();
    assert_eq!(
        c.backends, untouched.backends,
        "backends survive, key and all"
    );
    assert_eq!(c.routing.aliases, untouched.routing.aliases);
    assert_eq!(c.routing.fallbacks, untouched.routing.fallbacks);

    for var in [
        "ABE_BACKENDS",
        "ABE_BACKENDS_0_NAME",
        "ABE_ROUTING_ALIASES_GPT-4O",
        "ABE_ROUTING_FALLBACKS",
    ] {
        let before = two_backends();
        let mut c = before.clone();
        let e = c.apply_env(env(&[(var, "x")])).unwrap_err().to_string();
        assert!(
            e.contains(var) && e.contains("only be set in the config file"),
            "{e}"
        );
        assert_eq!(c, before, "a failed override changes nothing");
    }
    let e = Config::default()
        .apply_env(env(&[("ABE_ROUTING_MAX_RETRIES", "many")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid value for routing.max_retries = many: expected an integer"
    );
}

#[test]
fn an_unknown_routing_strategy_is_a_warning_not_an_error() {
    let mut c = Config::default();
    c.routing.strategy = "fastest".into();
    let s = c.check().unwrap();
    let w = s.routing_warning.expect("a warning").to_string();
    assert!(
        w.contains("routing.strategy = \"fastest\"") && w.contains("smart"),
        "{w}"
    );
    assert_eq!(s.router.strategy(), Strategy::Smart);
}

#[test]
fn config_show_prints_backends_and_routing_without_api_keys() {
    let c = two_backends();
    let shown = c.to_toml();
    assert!(!shown.contains("sk-live"), "{shown}");
    assert!(shown.contains("api_key = \"<redacted>\""), "{shown}");
    assert!(shown.contains("[[backends]]") && shown.contains("[[backends.models]]"));
    assert!(shown.contains("[routing.aliases]") && shown.contains("[upstream]"));
    let back = Config::from_toml(&shown).expect("show output parses");
    assert_eq!(back.routing, c.routing);
    assert_eq!(back.upstream, c.upstream);
    assert_eq!(back.backends.len(), 2);
    assert_eq!(
        back.backends[0], c.backends[0],
        "no key: round-trips exactly"
    );
    assert_eq!(
        back.backends[1].api_key.as_ref().unwrap().expose(),
        crate::router::ApiKey::REDACTED
    );
    assert!(
        !format!("{c:?}").contains("sk-live"),
        "Debug is redacted too"
    );
    let default_shown = Config::default().to_toml();
    assert_eq!(
        Config::from_toml(&default_shown).unwrap(),
        Config::default()
    );
}

#[test]
fn config_check_validates_backends_in_a_file() {
    let dir = std::env::temp_dir().join(format!("abe-config-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(&path, TWO_BACKENDS).unwrap();
    let c = Config::load(Some(&path), env(&[]), &FlagOverrides::default()).unwrap();
    assert_eq!(c.backends.len(), 2);
    std::fs::write(
        &path,
        TWO_BACKENDS.replace("\"llama3:8b\"]", "\"llama3:8b\", \"llama3:70b\"]"),
    )
    .unwrap();
    let e = Config::load(Some(&path), env(&[]), &FlagOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("routing.fallbacks: 'llama3:70b'") && e.contains("itself"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_documented_config_file_is_the_default_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let documented = Config::from_file(&path).expect("config.toml parses");
    assert_eq!(
        documented,
        Config::default(),
        "config.toml drifted from the defaults"
    );
}

#[test]
fn every_latency_model_is_selectable_live_with_its_documented_defaults() {
    use crate::exec::latency::LatencyKind;
    for kind in LatencyKind::ALL {
        let mut c = Config::default();
        c.workers.latency_model = kind;
        let r = c.clone().check().unwrap().runtime;
        assert_eq!(r.sim.latency, kind.default_model(), "{kind}");
    }
    let c = Config::from_toml(
        "[workers]\nlatency_model = \"affine_step\"\naffine_step_a_ms = 1.5\nprefill_ms_per_token = 0.1\n",
    )
    .unwrap();
    assert_eq!(
        c.clone().check().unwrap().runtime.sim.latency,
        LatencyModel::AffineStep {
            prefill_ms_per_token: 0.1,
            a_ms: 1.5,
            c_ms: 5.5
        }
    );
    let c = Config::from_toml("[batching]\nmode = \"continuous\"\n").unwrap();
    assert_eq!(
        c.check().unwrap().runtime.sim.latency,
        LatencyModel::Roofline(crate::exec::roofline::Roofline::DEFAULT),
        "auto is roofline in continuous mode"
    );
    let mut c = Config::default();
    c.workers.max_of_batch_decode_ms_per_token = -1.0;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("workers.max_of_batch_decode_ms_per_token"),
        "{e}"
    );
}

#[test]
fn the_admin_token_is_never_shown_and_survives_env_overrides() {
    let mut c = Config::from_toml("[server]\nadmin_token = \"tok-file\"\n").unwrap();
    // Any override round-trips the config through its (redacted) TOML tree.
    c.apply_env(env(&[("ABE_BATCHING_MAX_BATCH_SIZE", "16")]))
        .unwrap();
    assert_eq!(c.server.admin_token.expose(), "tok-file");
    c.apply_env(env(&[("ABE_SERVER_ADMIN_TOKEN", "tok-env")]))
        .unwrap();
    assert_eq!(c.server.admin_token.expose(), "tok-env");
    let shown = c.to_toml();
    assert!(!shown.contains("tok-"), "{shown}");
    assert!(shown.contains("admin_token = \"<redacted>\""), "{shown}");
    assert!(!format!("{c:?}").contains("tok-"), "Debug is redacted too");
}

#[test]
fn roofline_live_takes_its_presets_and_sizes_the_kv_cache_in_continuous_mode() {
    use crate::exec::roofline::Roofline;
    let c = Config::from_toml(
        "[batching]\nmode = \"continuous\"\n[workers]\nlatency_model = \"roofline\"\n\
         llm = \"qwen2.5-7b\"\ngpu = \"l40s\"\n",
    )
    .unwrap();
    let r = c.check().unwrap().runtime;
    let LatencyModel::Roofline(m) = r.sim.latency else {
        panic!("{:?}", r.sim.latency)
    };
    assert_eq!(
        (m.llm.as_str(), m.gpu.as_str(), m.tp),
        ("qwen2.5-7b", "l40s", 1)
    );
    assert_eq!(
        r.continuous.unwrap().kv_capacity_tokens,
        m.kv_capacity_tokens()
    );
    let e = Config::from_toml("[workers]\nlatency_model = \"roofline\"\nllm = \"llama-3.1-70b\"\n")
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("workers.latency_model") && e.contains("raise tp"),
        "{e}"
    );
    let e = Config::from_toml("[workers]\ngpu = \"b200\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("h100-sxm"), "{e}");
    assert_eq!(Roofline::DEFAULT.tp, Config::default().workers.tp);
}

#[test]
fn max_model_len_defaults_to_the_roofline_presets_context_length() {
    let len = |toml: &str| {
        Config::from_toml(toml)
            .unwrap()
            .check()
            .unwrap()
            .config
            .server
            .max_model_len
    };
    // Request-level defaults run the linear model: no limit.
    assert_eq!(len(""), 0);
    // Continuous mode on defaults: Llama-3.1-8B's 131,072 tokens.
    assert_eq!(len("[batching]\nmode = \"continuous\"\n"), 131_072);
    assert_eq!(
        len("[workers]\nlatency_model = \"roofline\"\nllm = \"qwen3-30b-a3b\"\n"),
        40_960
    );
    // A set value wins.
    assert_eq!(
        len("[server]\nmax_model_len = 4096\n[batching]\nmode = \"continuous\"\n"),
        4096
    );
    // A sim backend's own roofline counts too: the shortest context of the models served.
    let with_table = |workers: &str, table: &str| {
        len(&format!(
            "[workers]\n{workers}\n[workers.backends.sim]\n{table}\n"
        ))
    };
    assert_eq!(
        with_table("", "latency_model = \"roofline\"\nllm = \"mistral-7b\""),
        32_768
    );
    assert_eq!(
        with_table(
            "latency_model = \"roofline\"\nllm = \"mistral-7b\"",
            "llm = \"llama-3.1-8b\""
        ),
        32_768
    );
    assert_eq!(
        with_table(
            "latency_model = \"roofline\"\nllm = \"llama-3.1-8b\"",
            "llm = \"mistral-7b\""
        ),
        32_768
    );
}

const SLOW_AND_FAST: &str = r#"
[workers]
base_latency_ms = 5.0
per_token_latency_ms = 0.1
[workers.backends.slow]
base_latency_ms = 40.0
latency_variance = 0.0

[[backends]]
name = "fast"
kind = "sim"
[[backends.models]]
name = "m"
context_length = 4096

[[backends]]
name = "slow"
kind = "sim"
[[backends.models]]
name = "m"
context_length = 4096
"#;

#[test]
fn a_sim_backend_takes_its_own_latency_keys_over_workers() {
    let s = Config::from_toml(SLOW_AND_FAST).unwrap().check().unwrap();
    let names: Vec<&str> = s.backends.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["fast", "slow"]);
    let fast = LatencyModel::Linear {
        base_ms: 5.0,
        per_token_ms: 0.1,
        variance: 0.1,
    };
    assert_eq!(s.runtime.sim.latency, fast);
    // fast has no table: [workers]' model. slow: its keys over [workers]'.
    assert_eq!(
        s.sim_latency,
        [
            fast,
            LatencyModel::Linear {
                base_ms: 40.0,
                per_token_ms: 0.1,
                variance: 0.0,
            }
        ]
    );
    // Another model for one backend only.
    let c = Config::from_toml(&format!(
        "{}\n[workers.backends.fast]\nlatency_model = \"calibrated\"\ndecode_beta_ms = 2.0\n",
        SLOW_AND_FAST
    ))
    .unwrap();
    let s = c.check().unwrap();
    let LatencyModel::Calibrated { beta_ms, .. } = s.sim_latency[0] else {
        panic!("{:?}", s.sim_latency[0])
    };
    assert_eq!(beta_ms, 2.0);
    assert!(matches!(s.sim_latency[1], LatencyModel::Linear { .. }));
}

#[test]
fn a_backend_latency_table_must_name_a_sim_backend_and_hold_sane_values() {
    let with = |extra: &str| Config::from_toml(&format!("{SLOW_AND_FAST}\n{extra}"));
    let e = validate_err(&with("[workers.backends.slwo]\nbase_latency_ms = 1.0\n").unwrap());
    assert!(
        e.contains("workers.backends.slwo") && e.contains("the sim backends are: fast, slow"),
        "{e}"
    );
    // With no [[backends]], the one sim backend is named "sim", and the error says so.
    let e = validate_err(
        &Config::from_toml("[workers.backends.local]\nbase_latency_ms = 1.0\n").unwrap(),
    );
    assert!(
        e.contains("the sim backends are: sim") && e.contains("named \"sim\""),
        "{e}"
    );
    Config::from_toml("[workers.backends.sim]\nbase_latency_ms = 1.0\n")
        .unwrap()
        .validate()
        .unwrap();
    let e = validate_err(&with("[workers.backends.fast]\nbase_latency_ms = -1.0\n").unwrap());
    assert!(
        e.contains("workers.backends.fast.base_latency_ms") && e.contains(">= 0"),
        "{e}"
    );
    // A key [workers] does not have is a parse error naming it.
    let e = with("[workers.backends.fast]\nbase_latency = 1.0\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("workers.backends.fast") && e.contains("base_latency"),
        "{e}"
    );
    // Only sim backends simulate latency.
    let mut c = two_backends();
    c.workers.backends.insert(
        c.backends[1].name.clone(),
        SimBackendLatency {
            base_latency_ms: Some(1.0),
            ..SimBackendLatency::default()
        },
    );
    let e = validate_err(&c);
    assert!(
        e.contains(&format!("workers.backends.{}", c.backends[1].name))
            && e.contains("kind = \"upstream\"")
            && e.contains("only sim backends"),
        "{e}"
    );
    // A roofline that does not fit is refused under the backend's key.
    let e = validate_err(
        &with(
            "[workers.backends.fast]\nlatency_model = \"roofline\"\nllm = \"llama-3.1-70b\"\n\
             gpu = \"l4\"\n",
        )
        .unwrap(),
    );
    assert!(e.contains("workers.backends.fast.latency_model"), "{e}");
}

#[test]
fn continuous_mode_keeps_one_kv_capacity_for_every_replica() {
    let base = format!("{SLOW_AND_FAST}\n[batching]\nmode = \"continuous\"\n");
    // Speeds may differ per backend in continuous mode...
    let c = Config::from_toml(&format!(
        "{base}[workers.backends.fast]\nflops_efficiency = 0.3\n"
    ))
    .unwrap();
    let s = c.check().unwrap();
    let (LatencyModel::Roofline(fast), LatencyModel::Roofline(slow)) =
        (s.sim_latency[0], s.sim_latency[1])
    else {
        panic!("{:?}", s.sim_latency)
    };
    assert_eq!(fast.flops_efficiency, 0.3);
    assert_ne!(slow.flops_efficiency, 0.3);
    // ...and repeating [workers]' own GPU changes nothing...
    let gpu = Config::default().workers.gpu.as_str();
    Config::from_toml(&format!("{base}[workers.backends.fast]\ngpu = \"{gpu}\"\n"))
        .unwrap()
        .check()
        .unwrap();
    // ...but another GPU would hold another KV cache: refused, saying both sizes.
    let e = validate_err(
        &Config::from_toml(&format!("{base}[workers.backends.fast]\ngpu = \"l40s\"\n")).unwrap(),
    );
    assert!(
        e.contains("workers.backends.fast.latency_model")
            && e.contains("on l40s")
            && e.contains("one capacity")
            && e.contains("[workers]' roofline"),
        "{e}"
    );
    // With [workers] on another model, the capacity is [batching.dynamic]'s: a backend's own
    // roofline cannot match it.
    let e = validate_err(
        &Config::from_toml(&format!(
            "{SLOW_AND_FAST}\n[batching]\nmode = \"continuous\"\n"
        ))
        .map(|mut c| {
            c.workers.latency_model = crate::exec::latency::LatencyKind::Linear;
            c.workers.backends.insert(
                "fast".into(),
                SimBackendLatency {
                    latency_model: Some(crate::exec::latency::LatencyKind::Roofline),
                    ..SimBackendLatency::default()
                },
            );
            c
        })
        .unwrap(),
    );
    assert!(
        e.contains("workers.backends.fast.latency_model") && e.contains("[batching.dynamic]"),
        "{e}"
    );
}

#[test]
fn backend_latency_tables_are_file_only_and_shown() {
    let mut c = Config::from_toml(SLOW_AND_FAST).unwrap();
    let e = c
        .apply_env(env(&[("ABE_WORKERS_BACKENDS_SLOW_BASE_LATENCY_MS", "1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("config file"), "{e}");
    // Other [workers] overrides keep the tables.
    c.apply_env(env(&[("ABE_WORKERS_PER_TOKEN_LATENCY_MS", "0.2")]))
        .unwrap();
    assert_eq!(c.workers.per_token_latency_ms, 0.2);
    assert_eq!(c.workers.backends["slow"].base_latency_ms, Some(40.0));
    let shown = c.to_toml();
    assert!(
        shown.contains("[workers.backends.slow]") && shown.contains("base_latency_ms = 40.0"),
        "{shown}"
    );
    // Printed back, it reads the same.
    assert_eq!(Config::from_toml(&shown).unwrap(), c);
}

/// An `embed` backend table with only what it must say.
const EMBED_TABLE: &str = "[[backends]]\nname = \"minilm\"\nkind = \"embed\"\n\
    model_dir = \"/models/minilm\"\n[[backends.models]]\nname = \"m\"\ncontext_length = 512\n";

#[test]
fn an_embed_backend_gets_its_kinds_defaults_unless_the_user_set_them() {
    // Nothing tuned: one batch at a time, batches of 64, unpinned; what `config show` prints.
    let c = Config::from_toml(EMBED_TABLE).unwrap();
    assert_eq!(c.backends[0].max_concurrent_batches, 1);
    assert_eq!(c.batching.max_batch_size, 64);
    assert!(!c.engine.pin);
    let shown = c.to_toml();
    assert!(
        shown.contains("max_batch_size = 64")
            && shown.contains("pin = false")
            && shown.contains("max_concurrent_batches = 1"),
        "{shown}"
    );
    assert_eq!(Config::from_toml(&shown).unwrap(), c, "shown reads back");
    // What the file sets wins, key by key.
    let text = format!(
        "[batching]\nmax_batch_size = 16\n[engine]\npin = true\n{}max_concurrent_batches = 3\n",
        EMBED_TABLE.replace("[[backends.models]]", "")
    )
    .replace("context_length = 512\n", "")
    .replace("name = \"m\"\n", "");
    let text = format!("{text}[[backends.models]]\nname = \"m\"\ncontext_length = 512\n");
    let c = Config::from_toml(&text).unwrap();
    assert_eq!(
        (
            c.backends[0].max_concurrent_batches,
            c.batching.max_batch_size,
            c.engine.pin
        ),
        (3, 16, true),
        "{text}"
    );
    // So does an ABE_* variable, applied after the file.
    let mut c = Config::from_toml(EMBED_TABLE).unwrap();
    c.apply_env(env(&[("ABE_ENGINE_PIN", "true")])).unwrap();
    assert!(c.engine.pin);
    assert_eq!(c.batching.max_batch_size, 64);
}

#[test]
fn mixed_kinds_take_each_backends_own_concurrency_and_the_smallest_batch() {
    let sim = "[[backends]]\nname = \"s\"\nkind = \"sim\"\n[[backends.models]]\nname = \"x\"\n\
        context_length = 2048\n";
    let c = Config::from_toml(&format!("{EMBED_TABLE}{sim}")).unwrap();
    assert_eq!(c.backends[0].max_concurrent_batches, 1, "embed");
    assert_eq!(c.backends[1].max_concurrent_batches, 4, "sim");
    assert_eq!(
        c.batching.max_batch_size, 32,
        "the sim backend's batch bounds both"
    );
    assert!(!c.engine.pin, "the embed executor needs the cores");
    // Without an embed backend nothing moves from the built-in defaults.
    let c = Config::from_toml(sim).unwrap();
    let d = Config::default();
    assert_eq!(
        (
            c.backends[0].max_concurrent_batches,
            c.batching.max_batch_size,
            c.engine.pin
        ),
        (4, d.batching.max_batch_size, d.engine.pin)
    );
}

#[test]
fn an_upstream_backend_runs_many_requests_at_once_unless_the_user_set_it() {
    let upstream = "[[backends]]\nname = \"u\"\nkind = \"upstream\"\n\
        base_url = \"http://127.0.0.1:8000\"\n[[backends.models]]\nname = \"x\"\n\
        context_length = 2048\n";
    let c = Config::from_toml(upstream).unwrap();
    assert_eq!(c.backends[0].max_concurrent_batches, 64);
    assert!(c.to_toml().contains("max_concurrent_batches = 64"));
    let d = Config::default();
    assert_eq!(
        (c.batching.max_batch_size, c.engine.pin),
        (d.batching.max_batch_size, d.engine.pin),
        "the rest as built in"
    );
    let set = upstream.replace(
        "kind = \"upstream\"\n",
        "kind = \"upstream\"\nmax_concurrent_batches = 2\n",
    );
    assert_eq!(
        Config::from_toml(&set).unwrap().backends[0].max_concurrent_batches,
        2
    );
}

#[test]
fn upstream_only_fronts_park_idle_threads_unless_the_user_set_it() {
    use crate::runtime::idle::IdlePolicy;
    let upstream = "[[backends]]\nname = \"u\"\nkind = \"upstream\"\n\
        base_url = \"http://127.0.0.1:8000\"\n[[backends.models]]\nname = \"x\"\n\
        context_length = 2048\n";
    assert_eq!(
        Config::from_toml(upstream).unwrap().engine.idle,
        IdlePolicy::Park
    );
    let set = format!("[engine]\nidle = \"adaptive\"\n{upstream}");
    assert_eq!(
        Config::from_toml(&set).unwrap().engine.idle,
        IdlePolicy::Adaptive
    );
    // A sim backend beside it answers in microseconds: the built-in policy stays.
    let sim = "[[backends]]\nname = \"s\"\nkind = \"sim\"\n[[backends.models]]\nname = \"y\"\n\
        context_length = 2048\n";
    let mixed = Config::from_toml(&format!("{upstream}{sim}")).unwrap();
    assert_eq!(mixed.engine.idle, Config::default().engine.idle);
    assert_eq!(Config::default().engine.idle, IdlePolicy::Adaptive);
}

/// `max_lora_adapters` counts distinct adapters: replicas of one model that each list the
/// same adapters (the usual vLLM deployment) use one id per adapter, not one per listing.
#[test]
fn adapters_listed_by_every_replica_count_once_against_max_lora_adapters() {
    let replicas = |adapters: usize| {
        let names: Vec<String> = (0..adapters).map(|i| format!("\"a{i}\"")).collect();
        let mut toml = String::new();
        for r in 0..4 {
            toml.push_str(&format!(
                "[[backends]]\nname = \"r{r}\"\nkind = \"sim\"\n\
                 [[backends.models]]\nname = \"m\"\ncontext_length = 8192\nadapters = [{}]\n",
                names.join(", ")
            ));
        }
        toml
    };
    // 4 replicas x 8 adapters: 8 ids, within the default 16.
    Config::from_toml(&replicas(8)).unwrap().validate().unwrap();
    let e = Config::from_toml(&replicas(17))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lora.max_lora_adapters") && e.contains("17"),
        "{e}"
    );
}

/// `[lora] adapters` lists the server's own model's adapters; with `[[backends]]` that
/// model is not served, so the key is refused, naming where adapters go, not ignored.
#[test]
fn lora_adapters_beside_backends_are_refused_naming_where_adapters_go() {
    let toml = "[lora]\nadapters = [\"sql-lora\"]\n\
                [[backends]]\nname = \"b\"\nkind = \"sim\"\n\
                [[backends.models]]\nname = \"m\"\ncontext_length = 8192\n";
    let e = Config::from_toml(toml)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lora.adapters")
            && e.contains("sql-lora")
            && e.contains("[[backends.models]] adapters"),
        "{e}"
    );
    // Listed on the model, the same adapter is fine; without [[backends]], so is the key.
    let on_model = toml
        .replace("[lora]\nadapters = [\"sql-lora\"]\n", "")
        .replace(
            "context_length = 8192\n",
            "context_length = 8192\nadapters = [\"sql-lora\"]\n",
        );
    Config::from_toml(&on_model).unwrap().validate().unwrap();
    Config::from_toml("[lora]\nadapters = [\"sql-lora\"]\n")
        .unwrap()
        .validate()
        .unwrap();
}
