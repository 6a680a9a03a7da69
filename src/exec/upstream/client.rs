//! The HTTP side of one upstream backend: its target, its keep-alive connection pool (one
//! `ureq::Agent`, shared by all of the backend's worker threads and its health checker), and
//! the mapping of every transport or status failure to an actionable [`ExecError`].
//!
//! What must never happen here: interpreting OpenAI payloads (that is `wire`), reading a
//! response body without a size limit, or turning a failure into a panic.

use super::resolve::KeptResolver;
use crate::exec::ExecError;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use ureq::http::Response;
use ureq::unversioned::transport::DefaultConnector;
use ureq::Body;

/// Largest JSON response body read from a backend (a batch of large embeddings is the
/// biggest expected answer: 64 inputs x 4096 floats x ~20 bytes is ~5 MiB).
pub(super) const RESPONSE_BYTES_MAX: u64 = 64 << 20;
/// Largest error body read to build a `Status` error's message.
const ERROR_BODY_BYTES_MAX: u64 = 64 << 10;
/// Longest snippet of a non-JSON error body quoted in a message.
const ERROR_SNIPPET_CHARS_MAX: usize = 200;
/// Idle keep-alive connections kept per backend: an `upstream` backend's default workers
/// (`router::registry::UPSTREAM_CONCURRENT_BATCHES_DEFAULT`, each one request at a time
/// without prompt arrays); more connections than this are closed after use, not refused.
const IDLE_CONNECTIONS_MAX: usize = 64;

/// Where a backend is and how to talk to it.
#[derive(Clone)]
pub struct UpstreamTarget {
    /// The backend's name in abe's config (appears in every error and log line).
    pub name: String,
    /// `http://host:port`, no trailing slash.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <api_key>` when set.
    pub api_key: Option<String>,
    /// The backend accepts `prompt` as an array on /v1/completions (vLLM, llama.cpp server,
    /// another abe), so a batch of completions can go as one request.
    pub prompt_array: bool,
}

impl fmt::Debug for UpstreamTarget {
    /// The API key is a secret: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTarget")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("prompt_array", &self.prompt_array)
            .finish()
    }
}

/// Time limits of every request to a backend.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamTimeouts {
    /// Establishing a TCP connection.
    pub connect: Duration,
    /// One whole request, from connecting to the last byte of the response (for a stream:
    /// the last event), so it must cover the longest generation a client may ask for.
    pub request: Duration,
}

/// One backend's target and connection pool; cheap to clone (an `Arc`), shared by the
/// backend's workers and its health checker.
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

struct Inner {
    target: UpstreamTarget,
    /// Owns the keep-alive pool. Invariant: built with `http_status_as_error(false)`, so a
    /// 4xx/5xx comes back as a response whose body can be read for its message.
    agent: ureq::Agent,
    /// `Bearer <api_key>`, built once.
    authorization: Option<String>,
    /// As configured, for error messages.
    timeouts: UpstreamTimeouts,
}

impl fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl UpstreamClient {
    /// A client with its own connection pool for `target`.
    pub fn new(mut target: UpstreamTarget, timeouts: UpstreamTimeouts) -> UpstreamClient {
        // Paths are appended to the base; a trailing slash would make them `//v1/...`.
        while target.base_url.ends_with('/') {
            target.base_url.pop();
        }
        let config = ureq::Agent::config_builder()
            // Error statuses are answers with a body worth reading, not transport errors.
            .http_status_as_error(false)
            // Backends are addressed directly; ureq would otherwise pick up HTTP_PROXY from
            // the environment and send loopback traffic through it.
            .proxy(None)
            .max_redirects(0)
            .timeout_connect(Some(timeouts.connect.min(timeouts.request)))
            .timeout_global(Some(timeouts.request))
            .max_idle_connections(IDLE_CONNECTIONS_MAX)
            .max_idle_connections_per_host(IDLE_CONNECTIONS_MAX)
            .user_agent(concat!("abe/", env!("CARGO_PKG_VERSION")))
            .build();
        let authorization = target.api_key.as_ref().map(|k| format!("Bearer {k}"));
        UpstreamClient {
            inner: Arc::new(Inner {
                target,
                // Not `new_with_config`: its resolver starts a thread per request (see
                // `resolve`).
                agent: ureq::Agent::with_parts(
                    config,
                    DefaultConnector::default(),
                    KeptResolver::default(),
                ),
                authorization,
                timeouts,
            }),
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.inner.target.name
    }

    /// The backend's base URL (`http://host:port`).
    pub fn base_url(&self) -> &str {
        &self.inner.target.base_url
    }

    /// A client of the same backend (name, prompt arrays, time limits) at another address,
    /// with a connection pool of its own (a backend slot filled again, see `slot`).
    pub fn retargeted(&self, base_url: &str, api_key: Option<String>) -> UpstreamClient {
        let target = UpstreamTarget {
            name: self.inner.target.name.clone(),
            base_url: base_url.to_string(),
            api_key,
            prompt_array: self.inner.target.prompt_array,
        };
        UpstreamClient::new(target, self.inner.timeouts)
    }

    /// A client of another backend (a spare slot filled: its name, address, key and prompt
    /// arrays), with this one's time limits and a connection pool of its own.
    pub fn for_target(&self, target: UpstreamTarget) -> UpstreamClient {
        UpstreamClient::new(target, self.inner.timeouts)
    }

    /// `Bearer <api_key>`, when a key is set.
    pub(super) fn authorization(&self) -> Option<&str> {
        self.inner.authorization.as_deref()
    }

    /// The time limits of every request.
    pub(super) fn timeouts(&self) -> UpstreamTimeouts {
        self.inner.timeouts
    }

    /// Whether /v1/completions takes an array of prompts.
    pub fn prompt_array(&self) -> bool {
        self.inner.target.prompt_array
    }

    /// GET {base}{path} (e.g. "/v1/models"), Ok on 2xx within `timeout`.
    pub fn probe(&self, path: &str, timeout: Duration) -> Result<(), ExecError> {
        let mut call = Call::new(self, "GET", path);
        call.timeout = timeout;
        let mut request = self.inner.agent.get(call.url());
        if let Some(auth) = &self.inner.authorization {
            request = request.header("Authorization", auth);
        }
        let response = request
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .map_err(|e| call.transport_error(e))?;
        let mut response = call.check_status(response)?;
        // Read the (small) body so the connection goes back to the pool.
        let _ = response
            .body_mut()
            .with_config()
            .limit(ERROR_BODY_BYTES_MAX)
            .read_to_vec();
        Ok(())
    }
}

/// One request to a backend, named for error messages (`POST /v1/completions`).
pub(super) struct Call<'a> {
    client: &'a UpstreamClient,
    method: &'static str,
    path: &'a str,
    /// The whole call's time budget (for messages).
    timeout: Duration,
}

impl<'a> Call<'a> {
    pub(super) fn new(client: &'a UpstreamClient, method: &'static str, path: &'a str) -> Self {
        Call {
            client,
            method,
            path,
            timeout: client.inner.timeouts.request,
        }
    }

    fn url(&self) -> String {
        format!("{}{}", self.client.base_url(), self.path)
    }

    fn backend(&self) -> String {
        self.client.name().to_string()
    }

    /// "POST http://host:port/v1/completions: {detail}": the backend's name is in the
    /// error's variant, the address tells the operator which config entry to look at.
    fn message(&self, detail: impl fmt::Display) -> String {
        format!(
            "{} {}{}: {detail}",
            self.method,
            self.client.base_url(),
            self.path
        )
    }

    /// "POST /v1/completions: {detail}", for a backend's own error message, which goes back
    /// to the client as is (a 4xx): it must not carry abe's internal addresses.
    fn status_message(&self, detail: impl fmt::Display) -> String {
        format!("{} {}: {detail}", self.method, self.path)
    }

    /// The backend sent something that is not the expected OpenAI shape.
    pub(super) fn protocol(&self, detail: impl fmt::Display) -> ExecError {
        ExecError::Protocol {
            backend: self.backend(),
            message: self.message(detail),
        }
    }

    /// A failure of sending the request or reading the response.
    pub(super) fn transport_error(&self, e: ureq::Error) -> ExecError {
        let backend = self.backend();
        match e {
            ureq::Error::Timeout(ureq::Timeout::Connect) => self.connect_timeout(),
            ureq::Error::Timeout(_) => self.request_timeout(),
            ureq::Error::Io(io) => self.io_error(io),
            ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => ExecError::Connect {
                backend,
                message: self.message(e),
            },
            ureq::Error::StatusCode(status) => ExecError::Status {
                backend,
                status,
                message: self.status_message("error status"),
            },
            other => ExecError::Protocol {
                backend,
                message: self.message(other),
            },
        }
    }

    /// No connection within the connect timeout.
    pub(super) fn connect_timeout(&self) -> ExecError {
        ExecError::Timeout {
            backend: self.backend(),
            message: self.message(format_args!(
                "no connection within the connect timeout ({:?})",
                self.client.inner.timeouts.connect.min(self.timeout)
            )),
        }
    }

    /// No whole answer within the request timeout.
    pub(super) fn request_timeout(&self) -> ExecError {
        ExecError::Timeout {
            backend: self.backend(),
            message: self.message(format_args!(
                "no complete answer within the request timeout ({:?})",
                self.timeout
            )),
        }
    }

    /// A non-2xx answer: a `Status` error carrying the backend's own message from `body`.
    pub(super) fn status_error(&self, status: u16, body: &str) -> ExecError {
        ExecError::Status {
            backend: self.backend(),
            status,
            message: self.status_message(error_detail(body)),
        }
    }

    /// The connection broke or the answer was not HTTP (`detail` says how).
    pub(super) fn connection_lost(&self, detail: impl fmt::Display) -> ExecError {
        ExecError::Connect {
            backend: self.backend(),
            message: self.message(format_args!("connection lost: {detail}")),
        }
    }

    /// A socket error, while connecting or in the middle of a response.
    pub(super) fn io_error(&self, e: io::Error) -> ExecError {
        use io::ErrorKind as K;
        // ureq wraps its own errors (a timeout while reading the body) in io::Error.
        if e.get_ref().is_some_and(|inner| inner.is::<ureq::Error>()) {
            return self.transport_error(ureq::Error::from(e));
        }
        let backend = self.backend();
        match e.kind() {
            K::TimedOut | K::WouldBlock => ExecError::Timeout {
                backend,
                message: self.message(e),
            },
            K::ConnectionRefused => ExecError::Connect {
                backend,
                message: self.message(format_args!("{e} (is the backend running?)")),
            },
            K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::AddrNotAvailable
            | K::HostUnreachable
            | K::NetworkUnreachable => ExecError::Connect {
                backend,
                message: self.message(format_args!("connection lost: {e}")),
            },
            _ => ExecError::Protocol {
                backend,
                message: self.message(e),
            },
        }
    }

    /// Passes a 2xx response through; turns anything else into a `Status` error carrying the
    /// backend's own message.
    fn check_status(&self, mut response: Response<Body>) -> Result<Response<Body>, ExecError> {
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(ERROR_BODY_BYTES_MAX)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        Err(self.status_error(status, &body))
    }
}

/// The human part of an error body: OpenAI's `error.message`, the `error` string or
/// `detail` other servers (TGI, FastAPI) send, else a short snippet of the raw body.
pub(super) fn error_detail(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("message"))
            .and_then(|m| m.as_str());
        if let Some(m) = found {
            return m.to_string();
        }
    }
    let body = body.trim();
    if body.is_empty() {
        return "(empty body)".to_string();
    }
    match body.char_indices().nth(ERROR_SNIPPET_CHARS_MAX) {
        Some((cut, _)) => format!("{}...", &body[..cut]),
        None => body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_detail_prefers_openai_message() {
        let body = r#"{"error":{"message":"model 'x' not found","type":"invalid_request_error"}}"#;
        assert_eq!(error_detail(body), "model 'x' not found");
        assert_eq!(error_detail(r#"{"error":"overloaded"}"#), "overloaded");
        assert_eq!(error_detail(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_detail("  "), "(empty body)");
        assert_eq!(
            error_detail("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        let long = "x".repeat(1000);
        assert_eq!(error_detail(&long).len(), ERROR_SNIPPET_CHARS_MAX + 3);
    }

    #[test]
    fn trailing_slashes_are_dropped_and_key_is_redacted() {
        let target = UpstreamTarget {
            name: "b".into(),
            base_url: "http://127.0.0.1:1//".into(),
            api_key: Some("sk-secret".into()),
            prompt_array: true,
        };
        let timeouts = UpstreamTimeouts {
            connect: Duration::from_millis(100),
            request: Duration::from_secs(1),
        };
        let client = UpstreamClient::new(target, timeouts);
        assert_eq!(client.base_url(), "http://127.0.0.1:1");
        assert!(!format!("{client:?}").contains("sk-secret"));
    }
}
