//! Fuzzing the HTTP front end (see `abe::fuzz`): request heads through the parser, split at
//! every byte, and whole pipelines of mutated requests through a live server, sent whole
//! and split. Short bounded campaigns here; `FUZZ_ITERS` / `FUZZ_SEED` make long
//! runs (RELIABILITY.md). Seeds: `fuzz/corpus/http/`.

use crate::common;

use abe::fuzz::{invariants, seeds_from_dir, signature, Campaign};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

const DICTIONARY: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b"\r",
    b"\r\n\r\n",
    b": ",
    b":",
    b" ",
    b"\t",
    b",",
    b"\0",
    b"\xff",
    b"\xc3\xa9",
    b"Content-Length: ",
    b"Content-Length: 0\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Connection: close\r\n",
    b"Connection: keep-alive\r\n",
    b"Expect: 100-continue\r\n",
    b"Host: x\r\n",
    b"X-Priority: critical\r\n",
    b"GET ",
    b"POST ",
    b"HEAD ",
    b"PUT ",
    b" HTTP/1.1",
    b" HTTP/1.0",
    b" HTTP/2.0",
    b"/v1/completions",
    b"/v1/chat/completions",
    b"/v1/embeddings",
    b"/health",
    b"/metrics",
    b"?q=1",
    b"{\"prompt\":\"x\"}",
    b"\"stream\":true,",
    b"\"max_tokens\":",
    b"\"n\":",
];

const HEADER_MAX: usize = 1024;
const BODY_MAX: usize = 4096;

fn seeds() -> Vec<Vec<u8>> {
    seeds_from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/http"))
}

/// The outcome of one parse, as a signature and for comparing prefixes.
fn outcome(r: &Result<Option<abe::http::parse::Head>, abe::http::parse::HeadError>) -> u64 {
    match r {
        Ok(None) => signature(0u16),
        Ok(Some(h)) => signature((
            200u16,
            h.method as u8,
            h.close,
            h.http10,
            h.expect_continue,
            h.content_length.min(2),
        )),
        // The message up to the first quoted value or number says which rule refused it.
        Err(e) => signature((
            e.status.code(),
            e.message
                .split(|c: char| c == '\'' || c.is_ascii_digit())
                .next(),
        )),
    }
}

#[test]
fn request_heads_parse_the_same_whatever_the_split() {
    let report = Campaign::new("http_head", seeds(), DICTIONARY, 2048, 5_000).run(|input| {
        let whole = invariants::http_head(input, HEADER_MAX, BODY_MAX);
        outcome(&whole)
    });
    eprintln!("{report}");
}

/// The head scanner (`abe::http::head_scan`) against httparse on mutated heads: whenever it
/// reads a head, httparse reads the same one (method, target, version, every header name and
/// value in order, length), and it never reads one httparse refuses or calls partial. No
/// server: the two parsers side by side.
#[test]
fn the_head_scanner_reads_exactly_what_httparse_reads() {
    const MAX_HEADERS: usize = abe::http::parse::HEADERS_MAX;
    let mut seeds = seeds();
    seeds.push(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 30\r\n\r\n{\"prompt\":\"hi\",\"max_tokens\":1}"
            .to_vec(),
    );
    // Near misses of the scanner's subset, for the mutations to cross its edges both ways.
    for near in [
        &b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"[..],
        b"GET /?a=1 HTTP/1.0\nHost: x\n\n",
        b"GET / HTTP/1.1\r\nX-A: \t a b \t\r\nX-B:\r\nX-C: \xc3\xa9\r\n\r\n",
        b"\r\nDELETE /admin/backends/a HTTP/1.1\r\nHost : x\r\n\r\n",
    ] {
        seeds.push(near.to_vec());
    }
    let report = Campaign::new("head_scan", seeds, DICTIONARY, 2048, 100_000).run(|input| {
        let mut scanned_headers = Vec::new();
        let scanned = abe::http::head_scan::scan(input, MAX_HEADERS, |name, value| {
            scanned_headers.push((name.to_string(), value.to_vec()));
            true
        });
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(input);
        if let Some(line) = scanned {
            let shown = String::from_utf8_lossy(input);
            assert_eq!(
                parsed,
                Ok(httparse::Status::Complete(line.head_len)),
                "scanned, httparse did not read the same length: {shown:?}"
            );
            assert_eq!(req.method, Some(line.method), "{shown:?}");
            assert_eq!(req.path, Some(line.target), "{shown:?}");
            assert_eq!(req.version, Some(u8::from(!line.http10)), "{shown:?}");
            let theirs: Vec<(String, Vec<u8>)> = req
                .headers
                .iter()
                .map(|h| (h.name.to_string(), h.value.to_vec()))
                .collect();
            assert_eq!(scanned_headers, theirs, "{shown:?}");
        }
        let httparse_outcome: u8 = match parsed {
            Ok(httparse::Status::Complete(_)) => 0,
            Ok(httparse::Status::Partial) => 1,
            Err(_) => 2,
        };
        signature((scanned.is_some(), httparse_outcome))
    });
    eprintln!("{report}");
}

/// Statuses of every response in `bytes`: each `HTTP/1.1 NNN` (a body is not followed to
/// its end, HEAD answers have none; a body quoting a status line would count, the same way
/// whole and split).
fn statuses(bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = bytes[i..].windows(9).position(|w| w == b"HTTP/1.1 ") {
        let p = i + at;
        let code = std::str::from_utf8(&bytes[p + 9..(p + 12).min(bytes.len())])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // 100 Continue is interim: whether it is sent depends on the split.
        if code != 100 {
            out.push(code);
        }
        i = p + 9;
    }
    out
}

/// Sends `pieces` on a fresh connection, half-closes, and reads everything until the server
/// closes. Returns the statuses.
fn exchange(addr: SocketAddr, pieces: &[&[u8]]) -> Vec<u16> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for p in pieces {
        if s.write_all(p).is_err() {
            break; // the server may close early (an error response); what it said still counts
        }
    }
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server neither answered nor closed: {e}"),
    }
    statuses(&out)
}

#[test]
fn pipelines_get_the_same_answers_sent_whole_or_split_and_the_server_survives() {
    let mut cfg = common::test_config();
    cfg.server.max_header_bytes = HEADER_MAX;
    cfg.server.max_body_bytes = BODY_MAX;
    cfg.server.admin_token = "t".into();
    let abe = common::start(cfg);
    let addr = abe.local_addr();
    // The harness sees what a client sees: the three pipelined seeds answered in order.
    let pipelined = &seeds()[4];
    assert_eq!(exchange(addr, &[pipelined]), [200, 200, 200]);
    let report = Campaign::new("http_pipeline", seeds(), DICTIONARY, 4096, 1_000).run(|input| {
        let whole = exchange(addr, &[input]);
        // Split points drawn from the input itself, so a replay splits the same way.
        let mut rng = SmallRng::seed_from_u64(signature(input));
        let mut cuts: Vec<usize> = (0..rng.gen_range(1..8))
            .map(|_| rng.gen_range(0..=input.len()))
            .collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for c in cuts {
            pieces.push(&input[from..c]);
            from = c;
        }
        pieces.push(&input[from..]);
        let split = exchange(addr, &pieces);
        // Answers that depend on the server's state (the strategy an admin request switched,
        // 429 under load) are the same here: one connection at a time, a zero-latency worker.
        assert_eq!(whole, split, "sent whole vs split at {:?}", pieces.len());
        assert!(
            !whole.iter().any(|&c| c >= 500 && c != 503),
            "5xx: {whole:?}"
        );
        signature(&whole)
    });
    eprintln!("{report}");
    let mut c = common::Client::connect(addr);
    assert_eq!(c.request("GET", "/health", None).status, 200);
    abe.shutdown();
}
