//! Slow and idle clients cannot lock others out: with every connection slot held by idle
//! connections or by requests dribbling in, a normal client is still served, and each
//! eviction is counted in /metrics. Real server on a loopback port; connection counts stay
//! far below the file-descriptor limit `tools/test.sh` sets (client and server ends both
//! live in this process).

use crate::common;

use abe::config::Millis;
use common::{start, test_config, Client};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Slots held by misbehaving clients in each test.
const HELD: usize = 200;

/// `/metrics/json` over `c`.
fn metrics(c: &mut Client) -> serde_json::Value {
    let r = c.request("GET", "/metrics/json", None);
    assert_eq!(r.status, 200);
    r.json()
}

/// Waits (bounded) until the server counts `open` connections, asking over `probe`.
fn wait_open(probe: &mut Client, open: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v = metrics(probe);
        if v["http"]["connections_open"] == open {
            return;
        }
        assert!(Instant::now() < until, "never saw {open} open: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A request head announcing a 100-byte body, and the first byte of that body.
const SLOW_START: &[u8] =
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{";

/// Holds a slot the slow way: a complete request, then `SLOW_START` in the same write. Once
/// the first is answered the server has read the second, so the connection is known to be
/// receiving a request (not idle) when this returns.
fn dribble(c: &mut Client) {
    let mut bytes = common::request_bytes("GET", "/health", None, &[]);
    bytes.extend_from_slice(SLOW_START);
    c.send_raw(&bytes);
    assert_eq!(c.read_response().expect("health").status, 200);
}

/// Fills all `HELD` slots with connections made by `hold`; the last one is the probe that
/// saw them all accepted, then made to hold its slot the same way.
fn fill(addr: SocketAddr, hold: impl Fn(&mut Client)) -> Vec<Client> {
    fill_n(addr, HELD, hold)
}

fn fill_n(addr: SocketAddr, n: usize, hold: impl Fn(&mut Client)) -> Vec<Client> {
    let mut held: Vec<Client> = (0..n - 1)
        .map(|_| {
            let mut c = Client::connect(addr);
            hold(&mut c);
            c
        })
        .collect();
    let mut probe = Client::connect(addr);
    wait_open(&mut probe, n as u64);
    hold(&mut probe);
    held.push(probe);
    held
}

fn evicted(v: &serde_json::Value, why: &str) -> u64 {
    v["http"]["connections_evicted"][why]
        .as_u64()
        .unwrap_or_else(|| panic!("no eviction count {why}: {v}"))
}

#[test]
fn idle_connections_give_way_to_new_clients_at_the_limit() {
    let mut cfg = test_config();
    cfg.server.max_connections = HELD;
    let abe = start(cfg);
    let addr = abe.local_addr();
    let _held = fill(addr, |_| {}); // connect, send nothing
                                    // Each served client stays connected, so each newcomer needs a slot given up.
    let mut served = Vec::new();
    for round in 0..20 {
        let mut c = Client::connect(addr);
        let r = common::post_completion(&mut c, "abe-sim", &format!("round {round}"));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        served.push(c);
    }
    let mut c = Client::connect(addr);
    let v = metrics(&mut c);
    assert!(evicted(&v, "idle_at_limit") >= 20, "{v}");
    assert_eq!(v["http"]["connections_refused"], 0, "{v}");
    abe.shutdown();
}

#[test]
fn requests_below_the_minimum_rate_give_way_at_the_limit_and_are_told_why() {
    let mut cfg = test_config();
    cfg.server.max_connections = HELD;
    // Every dribbling request is below this rate a few milliseconds after its first byte;
    // a grace far longer than the test shows the limit does not wait for it.
    cfg.server.min_data_rate_bytes_per_sec = 1_000_000;
    cfg.server.min_data_rate_grace = Millis(600_000);
    let abe = start(cfg);
    let addr = abe.local_addr();
    let mut held = fill(addr, dribble);
    for round in 0..20 {
        let mut c = Client::connect(addr);
        let r = common::post_completion(&mut c, "abe-sim", &format!("round {round}"));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
    }
    let mut c = Client::connect(addr);
    let v = metrics(&mut c);
    // A client served and gone frees its slot; one still connected is idle and goes before
    // a slow one: at least the first newcomer took a slow request's slot.
    assert!(evicted(&v, "slow_at_limit") >= 1, "{v}");
    assert_eq!(v["http"]["connections_refused"], 0, "{v}");
    // The slowest (the first, the longest at a byte) went first, told why.
    let r = held[0].read_response().expect("a 408 before the close");
    assert_eq!(r.status, 408);
    assert!(
        r.error_message()
            .contains("server.min_data_rate_bytes_per_sec"),
        "{}",
        r.text()
    );
    assert!(held[0].is_closed());
    abe.shutdown();
}

#[test]
fn a_request_below_the_minimum_rate_after_its_grace_gets_408() {
    let mut cfg = test_config();
    cfg.server.min_data_rate_grace = Millis(100);
    let abe = start(cfg);
    let mut slow = Client::connect(abe.local_addr());
    slow.send_raw(SLOW_START);
    let r = slow
        .read_response()
        .expect("a 408, long before the read timeout");
    assert_eq!(r.status, 408);
    assert!(r.error_message().contains("server.min_data_rate_grace"));
    assert!(slow.is_closed());
    let mut c = Client::connect(abe.local_addr());
    let v = metrics(&mut c);
    assert_eq!(evicted(&v, "slow_request"), 1, "{v}");
    let prom = c.request("GET", "/metrics", None).text();
    assert!(
        prom.contains("abe_http_connections_evicted_total{reason=\"slow_request\"} 1"),
        "{prom}"
    );
    abe.shutdown();
}

#[test]
fn with_every_slot_busy_or_fast_a_newcomer_is_still_refused_politely() {
    let mut cfg = test_config();
    cfg.server.max_connections = 3;
    cfg.server.min_data_rate_bytes_per_sec = 0; // nobody is too slow
    let abe = start(cfg);
    let addr = abe.local_addr();
    let _held = fill_n(addr, 3, dribble);
    let mut extra = Client::connect(addr);
    let r = extra.read_response().expect("a refusal, not a hang");
    assert_eq!(r.status, 503);
    assert!(r.error_message().contains("connection limit (3)"));
    abe.shutdown();
}
