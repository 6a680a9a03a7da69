//! Replaying the public trace formats: `abe simulate --trace` on slices of the Azure LLM
//! 2023 and Mooncake FAST'25 traces (tests/fixtures, attribution in its README), in both
//! batching modes; `rate_scale` and `--requests` on a trace; the scenario route; the ideal
//! prefix reuse of the Mooncake slice against an independent count.

use abe::sim::arrivals::Arrivals;
use abe::sim::reuse::ideal_prefix_reuse;
use abe::sim::scenario::Scenario;
use abe::sim::workload::Digest;
use abe::sim::{simulate, simulate_scenario, SimulateOptions};
use std::path::{Path, PathBuf};

const AZURE: &str = "tests/fixtures/azure_llm_2023_conv_200.csv";
const MOONCAKE: &str = "tests/fixtures/mooncake_fast25_synthetic_200.jsonl";

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("abe-trace-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn simulate_trace_runs_both_public_formats_in_both_modes() {
    let exe = env!("CARGO_BIN_EXE_abe");
    let dir = scratch_dir("cli");
    for (name, rel) in [("azure", AZURE), ("mooncake", MOONCAKE)] {
        for mode in ["request", "continuous"] {
            let json = dir.join(format!("{name}-{mode}.json"));
            let out = std::process::Command::new(exe)
                .args(["simulate", "--trace"])
                .arg(fixture(rel))
                .args(["--mode", mode, "--strategies", "fixed", "--requests", "120"])
                .args(["--rate-scale", "4", "--json"])
                .arg(&json)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} {mode}: {stderr}");
            let stdout = String::from_utf8(out.stdout).unwrap();
            let run = if mode == "request" {
                "fixed"
            } else {
                "continuous"
            };
            assert!(stdout.contains(run), "{name} {mode}: {stdout}");
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            assert_eq!(v["scenario"], "trace");
            assert_eq!(v["requests"], 120, "--requests takes the first 120 rows");
            let runs = v["runs"].as_array().unwrap();
            assert_eq!(runs.len(), 1);
            assert_eq!(runs[0]["strategy"], run, "{name} {mode}");
            assert_eq!(runs[0]["request_digest"], v["request_digest"]);
        }
    }
    // A bad trace is an error naming the file and line, not a panic.
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n\
         {\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": \"x\"}\n",
    )
    .unwrap();
    let out = std::process::Command::new(exe)
        .args(["simulate", "--trace"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.jsonl:2: 'hash_ids' must be a list of integers"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rate_scale_divides_a_traces_timestamps_and_requests_takes_its_first_rows() {
    let path = fixture(MOONCAKE);
    let s = Scenario::replay(&path);
    let full = s.workload.generate_with_prefix(1_000, 1).unwrap();
    assert_eq!(full.requests.len(), 200, "the slice has 200 rows");
    let last = full.requests.last().unwrap();
    assert_eq!(
        last.arrival_ns, 58_501_000_000,
        "Mooncake timestamps are ms"
    );
    let fast = s.workload.arrivals.scaled(4.0).unwrap();
    let w = abe::sim::workload::Workload {
        arrivals: fast,
        ..s.workload.clone()
    };
    let quick = w.generate_with_prefix(50, 1).unwrap();
    assert_eq!(quick.requests.len(), 50);
    for (a, b) in full.requests.iter().zip(&quick.requests) {
        assert_eq!(a.arrival_ns / 4, b.arrival_ns);
        assert_eq!(
            (a.prompt_tokens, a.output_tokens),
            (b.prompt_tokens, b.output_tokens)
        );
        assert_eq!(a.prefix, b.prefix);
    }
    assert!(full.requests.iter().all(|r| r.prefix.len > 0));
    assert_eq!(
        full.arena.chains.len(),
        full.trace_ids.len(),
        "ids and names are parallel"
    );

    // The digest folds prefixes in only when there are some.
    let bare: Vec<_> = full
        .requests
        .iter()
        .map(|r| abe::sim::workload::SimRequest {
            prefix: Default::default(),
            ..*r
        })
        .collect();
    assert_ne!(Digest::of(&full.requests), Digest::of(&bare));
    let az = Scenario::replay(&fixture(AZURE))
        .workload
        .generate_with_prefix(1_000, 1)
        .unwrap();
    assert_eq!(az.requests.len(), 200);
    assert!(az.trace_ids.is_empty() && az.arena.chains.is_empty());
    assert!(az.requests.iter().all(|r| r.prefix.len == 0));
    // Azure: arrival = wall-clock minus the first row's (18:15:46.6805900 to 18:16:47.9441270).
    assert_eq!(az.requests[0].arrival_ns, 0);
    assert_eq!(az.requests[199].arrival_ns, 61_263_537_000);
}

#[test]
fn the_scenario_route_replays_any_format_with_its_rate_scale() {
    let dir = scratch_dir("scenario");
    for rel in [AZURE, MOONCAKE] {
        let file = dir.join("s.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"replay_test\"\nrequests = 80\n[workload.arrivals]\nprocess = \"replay\"\n\
                 path = \"{}\"\nrate_scale = 2.0\n[engine]\nworkers = 1\n",
                fixture(rel).display()
            ),
        )
        .unwrap();
        let s = Scenario::load(&file).unwrap();
        assert!(matches!(
            s.workload.arrivals,
            Arrivals::Replay { rate_scale, .. } if rate_scale == 2.0
        ));
        let report = simulate_scenario(
            &s,
            &SimulateOptions {
                strategies: vec!["fixed".into()],
                sweep: vec!["rate_scale=1,2".into()],
                ..SimulateOptions::default()
            },
        )
        .unwrap();
        assert_eq!(report.requests, 80);
        assert_eq!(report.runs.len(), 2, "one run per rate_scale point");
    }
    // --trace with --scenario keeps the scenario's settings.
    let report = simulate(&SimulateOptions {
        scenario: "steady_state".into(),
        trace: Some(fixture(AZURE)),
        strategies: vec!["fixed".into()],
        requests: Some(30),
        ..SimulateOptions::default()
    })
    .unwrap();
    assert_eq!(report.scenario, "steady_state");
    assert_eq!(report.requests, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ideal reuse of the Mooncake slice, against a count made outside abe (Python over the
/// raw hash_ids: a 512-token block hits when the same id prefix was seen before, at most
/// `(input_length - 1) / 512` blocks, full blocks only): 164,352 of 2,663,480 prompt tokens.
#[test]
fn ideal_reuse_of_the_mooncake_slice_matches_an_independent_count() {
    let g = Scenario::replay(&fixture(MOONCAKE))
        .workload
        .generate_with_prefix(1_000, 1)
        .unwrap();
    let s = ideal_prefix_reuse(&g.requests, &g.arena, 512);
    assert_eq!((s.query_tokens, s.hit_tokens), (2_663_480, 164_352));
    let fine = ideal_prefix_reuse(&g.requests, &g.arena, 16);
    assert_eq!(fine.query_tokens, s.query_tokens);
    assert!(
        fine.hit_tokens >= s.hit_tokens,
        "16-token blocks hit at least what 512-token blocks do"
    );
}

/// The simulator's prefix cache against the ideal: one replica whose KV cache holds the
/// whole slice (nothing is ever evicted) and arrivals slowed 1,000x (each request has
/// finished prefilling before the next arrives, as the ideal assumes). The hit rate the run
/// reports must be the ideal one exactly; with caching off nothing hits and nothing else of
/// the run changes shape.
#[test]
fn the_simulated_prefix_cache_hits_what_an_unbounded_cache_would() {
    let mut s = Scenario::replay(&fixture(MOONCAKE));
    s.engine.mode = Some(abe::core::BatchingMode::Continuous);
    s.engine.workers = Some(1);
    s.engine.kv_capacity_tokens = Some(4_000_000); // the slice has 2.66 M prompt tokens
    let g = s.workload.generate_with_prefix(1_000, 1).unwrap();
    let ideal = ideal_prefix_reuse(&g.requests, &g.arena, 16);
    assert!(ideal.hit_tokens > 0);
    let opts = SimulateOptions {
        sweep: vec!["rate_scale=0.001".into()],
        ..SimulateOptions::default()
    };
    let report = simulate_scenario(&s, &opts).unwrap();
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let p = &json["runs"][0]["continuous"]["prefix_cache"];
    assert_eq!(p["query_tokens"], ideal.query_tokens, "{p}");
    assert_eq!(p["hit_tokens"], ideal.hit_tokens, "{p}");
    assert_eq!(p["evicted_blocks"], 0);

    s.engine.prefix_caching = Some(false);
    let off = simulate_scenario(&s, &opts).unwrap();
    let json: serde_json::Value = serde_json::from_str(&off.to_json()).unwrap();
    assert!(json["runs"][0]["continuous"].get("prefix_cache").is_none());
    let on_prefill = report.runs[0].continuous.as_ref().unwrap().prefill_tokens;
    let off_prefill = off.runs[0].continuous.as_ref().unwrap().prefill_tokens;
    assert_eq!(
        off_prefill - on_prefill,
        ideal.hit_tokens,
        "a hit is prefill skipped, token for token"
    );
}

/// The Mooncake slice through 4 replicas with each routing strategy ([`abe::sim::cluster`]).
fn routed_slice(sweep: &str) -> (abe::sim::report::SimReport, serde_json::Value) {
    let mut s = Scenario::replay(&fixture(MOONCAKE));
    s.engine.mode = Some(abe::core::BatchingMode::Continuous);
    s.engine.workers = Some(4);
    let opts = SimulateOptions {
        sweep: vec![sweep.into()],
        ..SimulateOptions::default()
    };
    let report = simulate_scenario(&s, &opts).unwrap();
    let json = serde_json::from_str(&report.to_json()).unwrap();
    (report, json)
}

/// Without a routing strategy the run is today's (one central queue of 4 replicas): the
/// numbers main printed for it before routing existed, and no cluster section.
#[test]
fn without_routing_the_run_is_the_central_queue_it_was() {
    let mut s = Scenario::replay(&fixture(MOONCAKE));
    s.engine.mode = Some(abe::core::BatchingMode::Continuous);
    s.engine.workers = Some(4);
    let report = simulate_scenario(&s, &SimulateOptions::default()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert!(json["runs"][0].get("cluster").is_none());
    assert!(json["engine"].get("routing").is_none());
    let run = &report.runs[0];
    let c = run.continuous.as_ref().unwrap();
    assert_eq!(report.request_digest, "5495d70cc9df6131");
    assert_eq!((run.completed, c.steps), (200, 19_380));
    assert_eq!(c.ttft_ms.mean, 594.6332844249999);
    let p = c.prefix_cache.unwrap();
    assert_eq!((p.query_tokens, p.hit_tokens), (2_663_480, 5_296));
    assert_eq!(p.evicted_blocks, 59_559);
}

#[test]
fn prefix_aware_hits_at_least_round_robin_and_the_reference_bounds_every_strategy() {
    let (report, json) =
        routed_slice("routing=round_robin,least_loaded,power_of_two,prefix_aware,session");
    let table = report.table();
    assert!(
        table.contains("ref hit %") && table.contains("imbalance"),
        "{table}"
    );
    let csv = abe::sim::output::cluster_csv(&report);
    assert_eq!(
        csv.lines().count(),
        1 + 5 * 4,
        "a header, then a row per run and replica"
    );
    assert!(csv
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("0,continuous routing=round_robin,round_robin,0,50,"));
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5);
    let hit = |i: usize| runs[i]["cluster"]["hit_rate"].as_f64().unwrap();
    let reference = runs[0]["cluster"]["reference_hit_rate"].as_f64().unwrap();
    assert!(reference > 0.0);
    for (i, (run, name)) in runs
        .iter()
        .zip([
            "round_robin",
            "least_loaded",
            "power_of_two",
            "prefix_aware",
            "session",
        ])
        .enumerate()
    {
        let c = &run["cluster"];
        assert_eq!(c["routing"], name);
        assert_eq!(run["label"], format!("continuous routing={name}"));
        assert_eq!(
            run["request_digest"], json["request_digest"],
            "same requests"
        );
        assert_eq!(c["reference_hit_rate"].as_f64().unwrap(), reference);
        assert!(
            hit(i) <= reference,
            "{name}: {} > reference {reference}",
            hit(i)
        );
        assert!(
            hit(i) <= c["unbounded_hit_rate"].as_f64().unwrap(),
            "{name}"
        );
        let replicas = c["replicas"].as_array().unwrap();
        assert_eq!(replicas.len(), 4);
        let routed: u64 = replicas
            .iter()
            .map(|r| r["requests"].as_u64().unwrap())
            .sum();
        assert_eq!(routed, run["admitted"].as_u64().unwrap());
        assert!(c["imbalance"].as_f64().unwrap() >= 1.0);
        let query: u64 = run["continuous"]["prefix_cache"]["hit_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            (hit(i) - query as f64 / 2_663_480.0).abs() < 1e-9,
            "cluster = sum of replicas"
        );
    }
    assert!(
        hit(3) >= hit(0),
        "prefix_aware {} < round_robin {}",
        hit(3),
        hit(0)
    );
    let rr = runs[0]["cluster"]["replicas"].as_array().unwrap();
    assert!(
        rr.iter().all(|r| r["requests"] == 50),
        "round robin deals evenly"
    );
}

#[test]
fn routing_needs_continuous_mode_and_a_known_name() {
    let s = Scenario::replay(&fixture(MOONCAKE));
    let opts = SimulateOptions {
        sweep: vec!["routing=prefix_aware".into()],
        requests: Some(10),
        ..SimulateOptions::default()
    };
    let e = simulate_scenario(&s, &opts).unwrap_err().to_string();
    assert!(e.contains("--mode continuous"), "{e}");
    let opts = SimulateOptions {
        sweep: vec!["routing=smart".into()],
        ..opts
    };
    let e = simulate_scenario(&s, &opts).unwrap_err().to_string();
    assert!(e.contains("prefix_aware"), "{e}");
}
