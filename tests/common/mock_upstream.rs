//! A mock OpenAI-compatible backend for tests: a std-only HTTP/1.1 keep-alive server on a
//! loopback port (a thread per connection) that answers /v1/models, /health,
//! /v1/completions (string or array prompt), /v1/chat/completions and /v1/embeddings, with
//! SSE streaming (chunked) for the first two. Its output is deterministic ([`mock_text`],
//! [`mock_embedding`]), so tests can check where each answer landed.
//!
//! Faults are switched at run time with [`MockUpstream::set_mode`]; counters and the last
//! request seen per path let tests check what was sent. Dropping it stops every thread
//! (bounded: threads look at a stop flag at least every 20 ms).
//!
//! What must never happen here: a thread left running after drop, or a test hanging on the
//! mock because a client misbehaved (every read and write has a timeout).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The model the mock lists (it answers for any model name it is asked).
pub const MOCK_MODEL: &str = "mock-model";
/// Words generated when a request gives no max_tokens.
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Embedding size when a request gives no dimensions.
pub const DEFAULT_DIMENSIONS: usize = 8;

/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);
const HEAD_BYTES_MAX: usize = 64 << 10;
const BODY_BYTES_MAX: usize = 16 << 20;

/// How the mock answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Normal answers.
    Ok,
    /// Every request (probes included) gets this status with an OpenAI-shaped error body.
    Status(u16),
    /// Requests are read and never answered (until the mock is dropped).
    Hang,
    /// The connection is closed as soon as a request has been read, without an answer.
    Close,
    /// Normal answers, each connection closed after its first one without saying so (as a
    /// backend's keep-alive timeout closes an idle connection).
    OneThenClose,
}

/// The deterministic completion for `prompt`: "echo:" + the prompt, cut to `max_tokens`
/// whitespace-separated words (joined by single spaces).
pub fn mock_text(prompt: &str, max_tokens: u32) -> String {
    mock_words(prompt, max_tokens).0.join(" ")
}

/// The words of [`mock_text`] and whether they were cut short (finish_reason "length").
fn mock_words(prompt: &str, max_tokens: u32) -> (Vec<String>, bool) {
    let full = format!("echo:{prompt}");
    let words: Vec<String> = full.split_whitespace().map(str::to_string).collect();
    let cut = words.len() > max_tokens as usize;
    (words.into_iter().take(max_tokens as usize).collect(), cut)
}

/// The pieces a stream of [`mock_text`] is sent in: one word each, the space before it
/// included, so the pieces concatenate to the text.
pub fn mock_pieces(prompt: &str, max_tokens: u32) -> Vec<String> {
    let (words, _) = mock_words(prompt, max_tokens);
    words
        .into_iter()
        .enumerate()
        .map(|(k, w)| if k == 0 { w } else { format!(" {w}") })
        .collect()
}

/// The deterministic embedding of `input`: multiples of 1/1024 in [-0.5, 0.5), exact in
/// both f32 and JSON.
pub fn mock_embedding(input: &str, dimensions: usize) -> Vec<f32> {
    // FNV-1a, then splitmix64 per component.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in input.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..dimensions as u64)
        .map(|j| {
            let mut z = h.wrapping_add(j.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 54) as f32 / 1024.0 - 0.5
        })
        .collect()
}

/// Tokens as the mock counts them: whitespace-separated words, at least 1.
pub fn mock_tokens(text: &str) -> u64 {
    text.split_whitespace().count().max(1) as u64
}

#[derive(Default)]
struct Seen {
    requests: HashMap<String, u64>,
    /// Requests whose answer was written in full, by path.
    answered: HashMap<String, u64>,
    last_body: HashMap<String, String>,
    last_headers: HashMap<String, Vec<(String, String)>>,
}

struct Shared {
    mode: Mutex<Mode>,
    delay: Mutex<Duration>,
    piece_delay: Mutex<Duration>,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    stop: AtomicBool,
    connections: AtomicU64,
    seen: Mutex<Seen>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not hide the mock's state from the others.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps `d` in slices; false if stopped meanwhile.
    fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while !self.stopped() {
            let now = Instant::now();
            if now >= end {
                return true;
            }
            std::thread::sleep((end - now).min(POLL));
        }
        false
    }
}

/// A running mock backend. Stops on drop.
pub struct MockUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl MockUpstream {
    /// Starts a mock on 127.0.0.1 on a free port, in `Mode::Ok`.
    pub fn start() -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("mock upstream binds");
        let addr = listener.local_addr().expect("mock upstream address");
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Ok),
            delay: Mutex::new(Duration::ZERO),
            piece_delay: Mutex::new(Duration::ZERO),
            in_flight: AtomicU64::new(0),
            in_flight_max: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            seen: Mutex::new(Seen::default()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("mock-upstream".into())
                .spawn(move || accept_loop(listener, shared))
                .expect("mock upstream thread starts")
        };
        MockUpstream {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
    }

    pub fn mode(&self) -> Mode {
        *lock(&self.shared.mode)
    }

    /// Wait this long before each answer in `Mode::Ok` (a slow backend).
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.shared.delay) = delay;
    }

    /// Wait this long between the events of a stream (a slowly generating backend).
    pub fn set_piece_delay(&self, delay: Duration) {
        *lock(&self.shared.piece_delay) = delay;
    }

    /// The most requests the mock has held at once (read, not yet answered).
    /// Requests being answered now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    pub fn in_flight_max(&self) -> u64 {
        self.shared.in_flight_max.load(Ordering::Acquire)
    }

    /// Requests received for `path` (any method, query string ignored), whatever the mode.
    pub fn requests(&self, path: &str) -> u64 {
        lock(&self.shared.seen)
            .requests
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Requests to `path` answered in full (in whatever mode was set when each was read).
    pub fn answered(&self, path: &str) -> u64 {
        lock(&self.shared.seen)
            .answered
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Requests received on every path.
    pub fn total_requests(&self) -> u64 {
        lock(&self.shared.seen).requests.values().sum()
    }

    /// TCP connections accepted (keep-alive reuse keeps this low).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// The body of the last request to `path`.
    pub fn last_body(&self, path: &str) -> Option<String> {
        lock(&self.shared.seen).last_body.get(path).cloned()
    }

    /// The body of the last request to `path`, parsed (panics if it is not JSON).
    pub fn last_json(&self, path: &str) -> Option<Value> {
        self.last_body(path)
            .map(|b| serde_json::from_str(&b).expect("last request body is JSON"))
    }

    /// A header (case-insensitive name) of the last request to `path`.
    pub fn last_header(&self, path: &str, name: &str) -> Option<String> {
        lock(&self.shared.seen)
            .last_headers
            .get(path)?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the blocking accept; it sees the flag and returns.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopped() {
            return;
        }
        let Ok(stream) = stream else { continue };
        shared.connections.fetch_add(1, Ordering::AcqRel);
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("mock-upstream-conn".into())
            .spawn(move || {
                let _ = serve(stream, &conn_shared);
            });
        let mut threads = lock(&shared.threads);
        threads.retain(|t| !t.is_finished());
        if let Ok(t) = spawned {
            threads.push(t);
        }
    }
}

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Serves one connection until the client closes it, asks to, or the mock stops.
fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(POLL))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let req = match read_request(&mut stream, &mut buf, shared)? {
            Some(Ok(req)) => req,
            Some(Err(status)) => {
                let body = error_body(status, "mock upstream: bad request framing");
                return write_json(&mut stream, status, &body, true);
            }
            None => return Ok(()),
        };
        {
            let mut seen = lock(&shared.seen);
            *seen.requests.entry(req.path.clone()).or_default() += 1;
            seen.last_body.insert(
                req.path.clone(),
                String::from_utf8_lossy(&req.body).into_owned(),
            );
            seen.last_headers
                .insert(req.path.clone(), req.headers.clone());
        }
        let mode = *lock(&shared.mode);
        let _in_flight = InFlight::enter(shared);
        match mode {
            Mode::Hang => {
                while !shared.stopped() {
                    std::thread::sleep(POLL);
                }
                return Ok(());
            }
            Mode::Close => {
                let _ = stream.shutdown(Shutdown::Both);
                return Ok(());
            }
            Mode::Status(status) => {
                let body = error_body(status, &format!("mock upstream answers {status}"));
                write_json(&mut stream, status, &body, req.close)?;
            }
            Mode::Ok | Mode::OneThenClose => {
                let delay = *lock(&shared.delay);
                if !delay.is_zero() && !shared.sleep(delay) {
                    return Ok(());
                }
                answer(&mut stream, &req, shared)?;
            }
        }
        if mode == Mode::OneThenClose {
            *lock(&shared.seen)
                .answered
                .entry(req.path.clone())
                .or_default() += 1;
            let _ = stream.shutdown(Shutdown::Both);
            return Ok(());
        }
        *lock(&shared.seen)
            .answered
            .entry(req.path.clone())
            .or_default() += 1;
        if req.close {
            return Ok(());
        }
    }
}

/// Counts a request from the time it is read to the time it is answered (or dropped).
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.in_flight_max.fetch_max(now, Ordering::AcqRel);
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads the next request: `None` when the connection ends (or the mock stops) first,
/// `Some(Err(status))` for a request the mock cannot frame.
fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    shared: &Shared,
) -> io::Result<Option<Result<Request, u16>>> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let method = parsed.method.unwrap_or("").to_string();
                let target = parsed.path.unwrap_or("/");
                let path = target.split('?').next().unwrap_or("/").to_string();
                let version = parsed.version.unwrap_or(1);
                let headers: Vec<(String, String)> = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let mut req = Request {
                    method,
                    path,
                    headers,
                    body: Vec::new(),
                    close: false,
                };
                let connection = req.header("connection").map(str::to_ascii_lowercase);
                req.close = match version {
                    0 => connection.as_deref() != Some("keep-alive"),
                    _ => connection.as_deref() == Some("close"),
                };
                buf.drain(..head_len);
                let chunked = req
                    .header("transfer-encoding")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
                if chunked {
                    match read_chunked(stream, buf, shared)? {
                        Some(Ok(body)) => req.body = body,
                        Some(Err(status)) => return Ok(Some(Err(status))),
                        None => return Ok(None),
                    }
                } else {
                    let len = match req.header("content-length").map(|v| v.trim().parse()) {
                        None => 0,
                        Some(Ok(n)) if n <= BODY_BYTES_MAX => n,
                        Some(Ok(_)) => return Ok(Some(Err(413))),
                        Some(Err(_)) => return Ok(Some(Err(400))),
                    };
                    if !fill(stream, buf, len, shared)? {
                        return Ok(None);
                    }
                    req.body = buf.drain(..len).collect();
                }
                return Ok(Some(Ok(req)));
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_BYTES_MAX => {
                if !read_more(stream, buf, shared)? {
                    return Ok(None);
                }
            }
            Ok(httparse::Status::Partial) => return Ok(Some(Err(431))),
            Err(_) => return Ok(Some(Err(400))),
        }
    }
}

/// Reads a chunked body (RFC 9112 7.1; extensions and trailers skipped).
fn read_chunked(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    shared: &Shared,
) -> io::Result<Option<Result<Vec<u8>, u16>>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                break p;
            }
            if buf.len() > HEAD_BYTES_MAX {
                return Ok(Some(Err(400)));
            }
            if !read_more(stream, buf, shared)? {
                return Ok(None);
            }
        };
        let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        buf.drain(..line_end + 2);
        let size_text = line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return Ok(Some(Err(400)));
        };
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let end = loop {
                    if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                        break p;
                    }
                    if !read_more(stream, buf, shared)? {
                        return Ok(None);
                    }
                };
                buf.drain(..end + 2);
                if end == 0 {
                    return Ok(Some(Ok(body)));
                }
            }
        }
        if body.len() + size > BODY_BYTES_MAX {
            return Ok(Some(Err(413)));
        }
        if !fill(stream, buf, size + 2, shared)? {
            return Ok(None);
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

/// Reads until `buf` holds `len` bytes; false if the connection ended or the mock stopped.
fn fill(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    len: usize,
    shared: &Shared,
) -> io::Result<bool> {
    while buf.len() < len {
        if !read_more(stream, buf, shared)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One read; false on end of stream or stop. Timeouts only make it look at the flag.
fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, shared: &Shared) -> io::Result<bool> {
    let mut chunk = [0u8; 16 << 10];
    loop {
        if shared.stopped() {
            return Ok(false);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(true);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn error_body(status: u16, message: &str) -> Value {
    let kind = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": status.to_string()}})
}

fn write_json(stream: &mut TcpStream, status: u16, body: &Value, close: bool) -> io::Result<()> {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n",
        reason(status),
        body.len(),
        if close { "connection: close\r\n" } else { "" },
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    stream.write_all(&out)?;
    stream.flush()
}

/// Writes an SSE response: each event in its own chunk (flushed, so a client sees pieces
/// one by one), then `data: [DONE]` and the last chunk.
fn write_sse(stream: &mut TcpStream, events: &[Value], shared: &Shared) -> io::Result<()> {
    let piece_delay = *lock(&shared.piece_delay);
    stream.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    let mut send = |data: &str| -> io::Result<()> {
        let event = format!("data: {data}\n\n");
        stream.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())?;
        stream.flush()
    };
    for (k, e) in events.iter().enumerate() {
        if k > 0 && !piece_delay.is_zero() && !shared.sleep(piece_delay) {
            return Ok(());
        }
        send(&e.to_string())?;
    }
    send("[DONE]")?;
    stream.write_all(b"0\r\n\r\n")?;
    stream.flush()
}

fn models() -> Value {
    json!({"object": "list", "data": [
        {"id": MOCK_MODEL, "object": "model", "created": 0, "owned_by": "mock"}
    ]})
}

/// Answers a request in `Mode::Ok`.
fn answer(stream: &mut TcpStream, req: &Request, shared: &Shared) -> io::Result<()> {
    let close = req.close;
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/models" | "/health") => write_json(stream, 200, &models(), close),
        ("POST", path @ ("/v1/completions" | "/v1/chat/completions" | "/v1/embeddings")) => {
            let body: Value = match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(e) => {
                    let err = error_body(400, &format!("mock upstream: body is not JSON: {e}"));
                    return write_json(stream, 400, &err, close);
                }
            };
            let answered = match path {
                "/v1/completions" => completions(stream, &body, close, shared),
                "/v1/chat/completions" => chat(stream, &body, close, shared),
                _ => embeddings(stream, &body, close),
            };
            match answered {
                Ok(r) => r,
                Err(message) => write_json(stream, 400, &error_body(400, &message), close),
            }
        }
        _ => {
            let err = error_body(
                404,
                &format!("mock upstream: no route {} {}", req.method, req.path),
            );
            write_json(stream, 404, &err, close)
        }
    }
}

fn max_tokens(body: &Value, fields: &[&str]) -> u32 {
    fields
        .iter()
        .find_map(|f| body.get(*f).and_then(Value::as_u64))
        .map_or(DEFAULT_MAX_TOKENS, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn model_of(body: &Value) -> Value {
    body.get("model")
        .cloned()
        .unwrap_or_else(|| MOCK_MODEL.into())
}

/// `Err(message)` is a 400 for the client.
type Answer = Result<io::Result<()>, String>;

/// `body[field]` as a list: a string, or an array of strings; `Err` is the 400 message.
fn strings(body: &Value, field: &str) -> Result<Vec<String>, String> {
    match body.get(field) {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| p.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("mock upstream: {field} arrays must hold strings")),
        _ => Err(format!(
            "mock upstream: {field} must be a string or an array of strings"
        )),
    }
}

fn completions(stream: &mut TcpStream, body: &Value, close: bool, shared: &Shared) -> Answer {
    let prompts = strings(body, "prompt")?;
    let max = max_tokens(body, &["max_tokens"]);
    let model = model_of(body);
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let mut events = Vec::new();
        for (k, p) in prompts.iter().enumerate() {
            for piece in mock_pieces(p, max) {
                events.push(
                    json!({"id": "cmpl-mock", "object": "text_completion", "model": model,
                    "choices": [{"index": k, "text": piece, "finish_reason": null}]}),
                );
            }
            let (_, cut) = mock_words(p, max);
            events.push(
                json!({"id": "cmpl-mock", "object": "text_completion", "model": model,
                "choices": [{"index": k, "text": "", "finish_reason": finish(cut)}]}),
            );
        }
        return Ok(write_sse(stream, &events, shared));
    }
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (k, p) in prompts.iter().enumerate() {
        let (words, cut) = mock_words(p, max);
        let text = words.join(" ");
        prompt_tokens += mock_tokens(p);
        completion_tokens += words.len() as u64;
        choices.push(
            json!({"index": k, "text": text, "logprobs": null, "finish_reason": finish(cut)}),
        );
    }
    let answer = json!({"id": "cmpl-mock", "object": "text_completion", "created": 0,
        "model": model, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}});
    Ok(write_json(stream, 200, &answer, close))
}

fn finish(cut: bool) -> &'static str {
    if cut {
        "length"
    } else {
        "stop"
    }
}

/// The text of a chat message's content: a string, or the text parts of an array.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

fn chat(stream: &mut TcpStream, body: &Value, close: bool, shared: &Shared) -> Answer {
    let last = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .ok_or("mock upstream: messages must be a non-empty array")?;
    let prompt = last
        .get("content")
        .and_then(content_text)
        .ok_or("mock upstream: the last message has no text content")?;
    let max = max_tokens(body, &["max_completion_tokens", "max_tokens"]);
    let model = model_of(body);
    let (words, cut) = mock_words(&prompt, max);
    // A request offering tools is answered with a call of the first one (not streamed).
    let first_tool = body
        .get("tools")
        .and_then(Value::as_array)
        .and_then(|t| t.first())
        .and_then(|t| t["function"]["name"].as_str());
    if let Some(name) = first_tool {
        let answer = json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_mock", "type": "function",
                    "function": {"name": name, "arguments": format!("{{\"q\":{:?}}}", prompt)}}]},
                "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        return Ok(write_json(stream, 200, &answer, close));
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let chunk = |delta: Value, finish_reason: Value| {
            json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
        };
        let mut events = vec![chunk(json!({"role": "assistant"}), Value::Null)];
        for piece in mock_pieces(&prompt, max) {
            events.push(chunk(json!({"content": piece}), Value::Null));
        }
        events.push(chunk(json!({}), finish(cut).into()));
        return Ok(write_sse(stream, &events, shared));
    }
    let prompt_tokens = mock_tokens(&prompt);
    let completion_tokens = words.len() as u64;
    let answer = json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words.join(" ")},
                     "finish_reason": finish(cut)}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}});
    Ok(write_json(stream, 200, &answer, close))
}

fn embeddings(stream: &mut TcpStream, body: &Value, close: bool) -> Answer {
    let inputs = strings(body, "input")?;
    let dims = body
        .get("dimensions")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_DIMENSIONS, |d| d as usize);
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(k, input)| {
            json!({"object": "embedding", "index": k, "embedding": mock_embedding(input, dims)})
        })
        .collect();
    let prompt_tokens: u64 = inputs.iter().map(|i| mock_tokens(i)).sum();
    let answer = json!({"object": "list", "model": model_of(body), "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}});
    Ok(write_json(stream, 200, &answer, close))
}
