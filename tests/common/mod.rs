//! Shared helpers for integration tests: start a real abe on a loopback port, and a small
//! raw HTTP/1.1 client (raw so tests can pipeline, stall, and send malformed requests).
#![allow(dead_code)]

use abe::config::Config;
use abe::serve::Running;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub mod mock_upstream;

/// A config for tests: loopback, any free port, zero latency, unpinned.
pub fn test_config() -> Config {
    let mut c = Config::default();
    c.server.port = 0;
    c.workers.count = 2;
    c.workers.latency_model = abe::exec::latency::LatencyKind::None;
    c.engine.pin = false;
    c
}

/// Starts abe in process.
pub fn start(config: Config) -> Running {
    Running::start(config).expect("abe starts")
}

/// Both batching modes, for tests that check a behaviour in each.
pub const MODES: [abe::core::BatchingMode; 2] = [
    abe::core::BatchingMode::Request,
    abe::core::BatchingMode::Continuous,
];

/// Starts abe on [`test_config`] in batching mode `mode`.
pub fn start_in(mode: abe::core::BatchingMode) -> Running {
    let mut cfg = test_config();
    cfg.batching.mode = mode;
    start(cfg)
}

/// POSTs a `/v1/completions` request for `model` (at most 4 tokens) and reads the answer.
pub fn post_completion(c: &mut Client, model: &str, prompt: &str) -> Resp {
    let body = serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 4});
    c.request("POST", "/v1/completions", Some(&body.to_string()))
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The OpenAI error message, asserting the error shape.
    pub fn error_message(&self) -> String {
        let v = self.json();
        assert!(v["error"]["type"].is_string(), "no error.type in {v}");
        assert!(v["error"]["code"].is_string(), "no error.code in {v}");
        v["error"]["message"]
            .as_str()
            .expect("error.message")
            .to_string()
    }
}

/// A keep-alive connection.
pub struct Client {
    pub reader: BufReader<TcpStream>,
}

impl Client {
    /// A longer bound on each read, for servers whose answers take long on a loaded machine
    /// (a real model's forward passes in a debug build): a bound against hanging, not a
    /// timing check.
    #[allow(dead_code)]
    pub fn with_read_timeout(self, d: Duration) -> Client {
        self.reader.get_ref().set_read_timeout(Some(d)).unwrap();
        self
    }

    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            reader: BufReader::new(s),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).expect("write");
    }

    /// Sends one request and reads its response.
    pub fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Resp {
        self.send_raw(&request_bytes(method, path, body, &[]));
        self.read_response().expect("a response")
    }

    pub fn request_with(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Resp {
        self.send_raw(&request_bytes(method, path, body, headers));
        self.read_response().expect("a response")
    }

    /// Reads one response; `None` on a clean EOF before any byte.
    pub fn read_response(&mut self) -> Option<Resp> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let mut parts = line.split_whitespace();
        let _version = parts.next()?;
        let status: u16 = parts.next()?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.reader.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':')?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        if status == 100 {
            return self.read_response();
        }
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        if chunked {
            let mut body = Vec::new();
            loop {
                let mut size_line = String::new();
                self.reader.read_line(&mut size_line).ok()?;
                let size = usize::from_str_radix(size_line.trim(), 16).ok()?;
                let mut chunk = vec![0; size + 2]; // data + CRLF
                self.reader.read_exact(&mut chunk).ok()?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
            return Some(Resp {
                status,
                headers,
                body,
            });
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).ok()?;
        Some(Resp {
            status,
            headers,
            body,
        })
    }

    /// True when the server closed the connection within the read timeout: EOF, or a reset
    /// (the kernel resets instead of a FIN when the server closes with unread bytes, e.g.
    /// requests sent after a `Connection: close` one).
    pub fn is_closed(&mut self) -> bool {
        let mut buf = [0u8; 1];
        match self.reader.read(&mut buf) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }
}

/// Bytes of one request.
pub fn request_bytes(
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        out.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    out.push_str("\r\n");
    if let Some(b) = body {
        out.push_str(b);
    }
    out.into_bytes()
}
