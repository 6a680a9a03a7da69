//! Criterion benches of the live runtime with the `none` latency model (pure overhead).
//!
//! - `runtime/round_trip`: one request submitted through `Handle::submit` and waited for,
//!   one at a time: the latency of an idle engine (wake-ups included).
//! - `runtime/pipelined_256`: requests through a tagged submitter with 256 in flight; one
//!   iteration = one request, so the figure is engine + worker cost per request under load.
//! - `http_head/{small_post,openai_sdk,browser_get}/{scan,httparse,parse_head}`: reading a
//!   request head on the io thread, `head_scan::scan` (abe's one-pass scanner for the
//!   common head) against `httparse::Request::parse` (what reads every other head) on the
//!   same bytes, and `parse::parse_head` (the scanner, the header fields and the framing
//!   checks). Heads: `small_post`, the completion POST of `tools/bench/keepalive_posts.py`
//!   (the instruction budget's request, 3 headers, 97 bytes); `openai_sdk`, the head the
//!   OpenAI Python SDK 1.x sends for a chat completion (12 headers, 520 bytes);
//!   `browser_get`, a dashboard GET with a browser's headers (9 headers, 480 bytes).
//!   Instructions a call (steadier than the clock on a shared machine):
//!   `tools/bench/http_head_instructions.sh`. In this binary rather than its own: each
//!   bench binary links the whole crate, which a fresh machine's suite pays for.

use abe::core::{Kind, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::Work;
use abe::http::{head_scan, parse};
use abe::runtime::{self, Request, RuntimeConfig};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Instant;

fn config() -> RuntimeConfig {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = 1;
    cfg.sim.latency = LatencyModel::None;
    cfg
}

fn request() -> Request {
    Request {
        priority: Priority::Normal,
        route: None,
        work: Work {
            kind: Kind::Completion,
            prompt: "a short prompt for the overhead bench".into(),
            max_tokens: 1,
            ..Default::default()
        },
    }
}

fn round_trip(c: &mut Criterion) {
    let handle = runtime::start(config()).expect("runtime starts");
    let mut group = c.benchmark_group("runtime");
    group.bench_function("round_trip", |b| {
        b.iter(|| handle.submit(request()).wait().expect("served"))
    });
    let mut sub = handle.submitter(None).expect("submitter");
    group.bench_function("pipelined_256", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let (mut sent, mut done) = (0u64, 0u64);
            while done < iters {
                while sent < iters && sub.in_flight() < 256 {
                    if sub.submit(request(), sent).is_err() {
                        break;
                    }
                    sent += 1;
                }
                let n = sub.drain_completions(|c| {
                    assert!(c.outcome().is_some_and(|o| o.is_ok()));
                });
                done += n as u64;
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            start.elapsed()
        })
    });
    group.finish();
    handle.shutdown(std::time::Duration::from_secs(5));
}

const SMALL_POST: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 30\r\n\r\n";

const OPENAI_SDK: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\n\
Host: 127.0.0.1:8080\r\n\
Accept-Encoding: gzip, deflate\r\n\
Connection: keep-alive\r\n\
Accept: application/json\r\n\
Content-Type: application/json\r\n\
User-Agent: OpenAI/Python 1.54.4\r\n\
X-Stainless-Lang: python\r\n\
X-Stainless-Package-Version: 1.54.4\r\n\
X-Stainless-OS: Linux\r\n\
X-Stainless-Arch: x64\r\n\
Authorization: Bearer sk-abe-0123456789abcdef0123456789abcdef01234567\r\n\
Content-Length: 96\r\n\r\n";

const BROWSER_GET: &[u8] = b"GET /dashboard/dashboard.js HTTP/1.1\r\n\
Host: localhost:8080\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: */*\r\n\
Accept-Language: en-US,en;q=0.5\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Connection: keep-alive\r\n\
Referer: http://localhost:8080/dashboard/\r\n\
Sec-Fetch-Dest: script\r\n\
Sec-Fetch-Mode: no-cors\r\n\r\n";

/// The scanner on `head`, its headers' value bytes summed (so nothing is optimised away).
/// Out of line, so that `valgrind --tool=callgrind` counts each reader's instructions a call.
#[inline(never)]
fn head_scan_once(head: &[u8]) -> (Option<head_scan::RequestLine<'_>>, usize) {
    let mut n = 0usize;
    let line = head_scan::scan(head, parse::HEADERS_MAX, |_, v| {
        n += v.len();
        true
    });
    (line, n)
}

/// httparse on `head`, the same sum.
#[inline(never)]
fn httparse_once(head: &[u8]) -> (bool, usize) {
    let mut headers = [std::mem::MaybeUninit::uninit(); parse::HEADERS_MAX];
    let mut req = httparse::Request::new(&mut []);
    let r = req.parse_with_uninit_headers(head, &mut headers);
    let n: usize = req.headers.iter().map(|h| h.value.len()).sum();
    (r.is_ok() && req.method.is_some() && req.path.is_some(), n)
}

fn http_head(c: &mut Criterion) {
    for (name, head) in [
        ("small_post", SMALL_POST),
        ("openai_sdk", OPENAI_SDK),
        ("browser_get", BROWSER_GET),
    ] {
        assert!(
            head_scan_once(head).0.is_some(),
            "{name} is of the scanner's shape"
        );
        assert_eq!(
            head_scan_once(head).1,
            httparse_once(head).1,
            "{name}: the same values"
        );
        c.bench_function(&format!("http_head/{name}/scan"), |b| {
            b.iter(|| black_box(head_scan_once(black_box(head))))
        });
        c.bench_function(&format!("http_head/{name}/httparse"), |b| {
            b.iter(|| black_box(httparse_once(black_box(head))))
        });
        c.bench_function(&format!("http_head/{name}/parse_head"), |b| {
            b.iter(|| black_box(parse::parse_head(black_box(head), 16 * 1024, 1 << 20)))
        });
    }
}

criterion_group!(benches, round_trip, http_head);
criterion_main!(benches);
