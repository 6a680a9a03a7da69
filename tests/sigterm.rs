//! `abe serve` as a process: starts on embedded defaults, has every metric on its first
//! scrape, and on SIGTERM with a few hundred requests in flight answers every one of them
//! and exits 0.

use crate::common;

use common::{request_bytes, Client};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn spawn_abe(extra_env: &[(&str, &str)]) -> (std::process::Child, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_abe"));
    cmd.args(["serve", "--port", "0"])
        .env("RUST_LOG", "warn")
        .env("ABE_ENGINE_PIN", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("abe starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("abe listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn sigterm_with_hundreds_of_requests_in_flight_answers_them_all_and_exits_zero() {
    // 300 ms per batch, 4 workers, batches of up to 32: 300 requests take about 1 s.
    let (mut child, addr) = spawn_abe(&[
        ("ABE_WORKERS_BASE_LATENCY_MS", "300"),
        ("ABE_WORKERS_PER_TOKEN_LATENCY_MS", "0"),
    ]);
    let mut clients: Vec<Client> = (0..20).map(|_| Client::connect(addr)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let mut bytes = Vec::new();
        for j in 0..15 {
            bytes.extend(request_bytes(
                "POST",
                "/v1/completions",
                Some(&format!(r#"{{"prompt":"c{i} r{j}","max_tokens":3}}"#)),
                &[],
            ));
        }
        c.send_raw(&bytes);
    }
    // Let the server read everything, then ask it to stop while work is in flight.
    std::thread::sleep(Duration::from_millis(200));
    sigterm(&child);
    let mut ok = 0;
    for c in clients.iter_mut() {
        for _ in 0..15 {
            let r = c
                .read_response()
                .expect("every admitted request is answered");
            assert_eq!(r.status, 200, "{}", r.text());
            ok += 1;
        }
    }
    assert_eq!(ok, 300);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < until, "abe did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_binary_runs_on_embedded_defaults_and_refuses_a_bad_config_with_the_key() {
    let (mut child, addr) = spawn_abe(&[]);
    let mut c = Client::connect(addr);
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"hi","max_tokens":2}"#),
    );
    assert_eq!(r.status, 200);
    sigterm(&child);
    assert!(child.wait().unwrap().success());

    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args(["serve", "--port", "0"])
        .env("ABE_BATCHING_MAX_BATCH_SIZE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("batching.max_batch_size = 0: must be at least 1"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args(["config", "check", "config.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args(["config", "show", "--strategy", "fixed"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("strategy = \"fixed\""));
    let out = Command::new(env!("CARGO_BIN_EXE_abe"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("abe 0.1.0 (git "), "{v}");
}

/// The first scrape, sent the moment the address is printed, already has the engine's
/// series: tools size things from them (`tools/cluster.sh` sizes a front's prefix index from
/// `abe_continuous_kv_capacity_tokens`), and before the engine published at start they were
/// absent for the first few ms (every first scrape in 8 tries missed them).
#[test]
fn the_first_scrape_has_the_engines_metrics() {
    let (mut child, addr) = spawn_abe(&[
        ("ABE_BATCHING_MODE", "continuous"),
        ("ABE_WORKERS_COUNT", "1"),
    ]);
    let mut c = Client::connect(addr);
    c.send_raw(&request_bytes("GET", "/metrics", None, &[]));
    let r = c.read_response();
    // The server stops before any assertion, so a failing one does not leave it running.
    sigterm(&child);
    let status = child.wait().unwrap();
    let r = r.expect("the scrape is answered");
    assert_eq!(r.status, 200);
    let body = r.text();
    let capacity = body
        .lines()
        .find_map(|l| l.strip_prefix("abe_continuous_kv_capacity_tokens "))
        .unwrap_or_else(|| panic!("no KV capacity on the first scrape:\n{body}"));
    assert!(capacity.trim().parse::<u64>().unwrap() > 0, "{capacity}");
    assert!(status.success(), "exit status {status}");
}
