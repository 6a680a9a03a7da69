//! Counters the HTTP server keeps: responses by endpoint and status code, connections, bytes.
//!
//! Every counter is a plain atomic the io threads bump with a `Relaxed` `fetch_add`; no
//! lock, no allocation, a fixed set of series (endpoints and status codes are closed enums,
//! anything else lands in `Other` / "other"), so a client can never grow the label space.
//! Nothing here may block or allocate after construction: it runs on the io threads' hot path.
//!
//! Ordering: every counter is independent and publishes no other data, so `Relaxed` is
//! enough; a reader may see one counter a few increments ahead of another, never a torn value.

use std::sync::atomic::{AtomicU64, Ordering};

/// Which part of the API a response belongs to (the `endpoint` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `GET /v1/models`
    Models,
    /// `GET /metrics` (Prometheus text)
    Metrics,
    /// `GET /metrics/json`
    MetricsJson,
    /// `GET /metrics/history`
    MetricsHistory,
    /// `GET /events` (SSE telemetry)
    Events,
    /// `GET /dashboard` and its assets, and `GET /`
    Dashboard,
    /// `POST /tokenize`, `POST /detokenize`
    Tokenize,
    /// `/admin/...`
    Admin,
    /// `GET /health`
    Health,
    /// `GET /ready`
    Ready,
    /// Anything else (404s for unknown paths, requests too broken to route).
    Other,
}

impl Endpoint {
    /// Number of endpoints.
    pub const COUNT: usize = 14;
    /// Every endpoint, in metric order.
    pub const ALL: [Endpoint; Endpoint::COUNT] = [
        Endpoint::Completions,
        Endpoint::ChatCompletions,
        Endpoint::Embeddings,
        Endpoint::Models,
        Endpoint::Metrics,
        Endpoint::MetricsJson,
        Endpoint::MetricsHistory,
        Endpoint::Events,
        Endpoint::Dashboard,
        Endpoint::Tokenize,
        Endpoint::Admin,
        Endpoint::Health,
        Endpoint::Ready,
        Endpoint::Other,
    ];

    /// Metric label and JSON key.
    pub const fn as_str(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Models => "models",
            Endpoint::Metrics => "metrics",
            Endpoint::MetricsJson => "metrics_json",
            Endpoint::MetricsHistory => "metrics_history",
            Endpoint::Events => "events",
            Endpoint::Dashboard => "dashboard",
            Endpoint::Tokenize => "tokenize",
            Endpoint::Admin => "admin",
            Endpoint::Health => "health",
            Endpoint::Ready => "ready",
            Endpoint::Other => "other",
        }
    }

    /// Dense index `0..COUNT`.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The endpoint a request path (query string allowed) is counted under. A convenience for
    /// the router; it decides nothing about routing itself.
    pub fn from_path(path: &str) -> Endpoint {
        let path = match path.bytes().position(|b| b == b'?') {
            Some(q) => &path[..q],
            None => path,
        };
        Endpoint::of_path(path)
    }

    /// As [`from_path`](Self::from_path), for a path already without its query string (a
    /// parsed head's `path`): no scan for the `?`.
    pub fn of_path(path: &str) -> Endpoint {
        match path {
            "/v1/completions" => Endpoint::Completions,
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/v1/models" => Endpoint::Models,
            "/metrics" => Endpoint::Metrics,
            "/metrics/json" => Endpoint::MetricsJson,
            "/metrics/history" => Endpoint::MetricsHistory,
            "/events" => Endpoint::Events,
            "/" | "/dashboard" => Endpoint::Dashboard,
            "/tokenize" | "/detokenize" => Endpoint::Tokenize,
            p if p.starts_with("/dashboard/") => Endpoint::Dashboard,
            "/health" => Endpoint::Health,
            "/ready" => Endpoint::Ready,
            p if p == "/admin" || p.starts_with("/admin/") => Endpoint::Admin,
            p if p.starts_with("/v1/models/") => Endpoint::Models,
            _ => Endpoint::Other,
        }
    }
}

/// Why the server closed a connection the client had not finished with (the `reason` label
/// of `abe_http_connections_evicted_total`). Slow and idle clients must not lock others out:
/// see `server::eviction` for when each applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Eviction {
    /// An idle connection (no request in progress, nothing owed) closed to make room for a
    /// new one at the connection limit.
    IdleAtLimit,
    /// A connection sending its request below `server.min_data_rate_bytes_per_sec`, closed to
    /// make room for a new one at the connection limit (the grace period does not protect it
    /// then).
    SlowAtLimit,
    /// A request head or body arriving below the minimum data rate after
    /// `server.min_data_rate_grace`: answered 408 and closed.
    SlowRequest,
    /// A request not received within `server.read_timeout`: answered 408 and closed.
    ReadTimeout,
    /// An idle keep-alive connection closed after `server.keep_alive_timeout`.
    IdleTimeout,
    /// A response the client did not take within `server.write_timeout`.
    WriteStalled,
}

impl Eviction {
    /// Number of kinds.
    pub const COUNT: usize = 6;
    /// Every kind, in metric order.
    pub const ALL: [Eviction; Eviction::COUNT] = [
        Eviction::IdleAtLimit,
        Eviction::SlowAtLimit,
        Eviction::SlowRequest,
        Eviction::ReadTimeout,
        Eviction::IdleTimeout,
        Eviction::WriteStalled,
    ];

    /// Metric label and JSON key.
    pub const fn as_str(self) -> &'static str {
        match self {
            Eviction::IdleAtLimit => "idle_at_limit",
            Eviction::SlowAtLimit => "slow_at_limit",
            Eviction::SlowRequest => "slow_request",
            Eviction::ReadTimeout => "read_timeout",
            Eviction::IdleTimeout => "idle_timeout",
            Eviction::WriteStalled => "write_stalled",
        }
    }
}

/// Status codes counted individually; every other code is counted as "other".
pub const TRACKED_STATUS_CODES: [u16; 14] = [
    200, 400, 401, 404, 405, 408, 411, 413, 429, 431, 500, 502, 503, 504,
];

/// Number of status slots per endpoint: the tracked codes plus "other".
pub const STATUS_SLOTS: usize = TRACKED_STATUS_CODES.len() + 1;

/// Slot of every status code not in [`TRACKED_STATUS_CODES`].
pub const OTHER_STATUS_SLOT: usize = STATUS_SLOTS - 1;

/// `code` label value of each slot.
pub const STATUS_SLOT_LABELS: [&str; STATUS_SLOTS] = [
    "200", "400", "401", "404", "405", "408", "411", "413", "429", "431", "500", "502", "503",
    "504", "other",
];

/// The slot `status` is counted in (`0..STATUS_SLOTS`).
pub const fn status_slot(status: u16) -> usize {
    match status {
        200 => 0,
        400 => 1,
        401 => 2,
        404 => 3,
        405 => 4,
        408 => 5,
        411 => 6,
        413 => 7,
        429 => 8,
        431 => 9,
        500 => 10,
        502 => 11,
        503 => 12,
        504 => 13,
        _ => OTHER_STATUS_SLOT,
    }
}

// The slot table, the label table and the code list must agree; checked at compile time.
const _: () = {
    let mut i = 0;
    while i < TRACKED_STATUS_CODES.len() {
        assert!(status_slot(TRACKED_STATUS_CODES[i]) == i);
        i += 1;
    }
    assert!(status_slot(0) == OTHER_STATUS_SLOT);
};

/// Lock-free HTTP counters shared by every io thread (put it in an `Arc` or a `static`).
///
/// Invariant: `connections_closed <= connections_accepted` as long as the server calls
/// [`HttpStats::connection_closed`] exactly once per [`HttpStats::connection_opened`].
#[derive(Debug)]
pub struct HttpStats {
    /// Responses written, `[endpoint.index()][status_slot(code)]`.
    responses: [[AtomicU64; STATUS_SLOTS]; Endpoint::COUNT],
    /// Connections accepted (under the connection limit).
    connections_accepted: AtomicU64,
    /// Connections closed, for any reason, after being accepted.
    connections_closed: AtomicU64,
    /// Connections turned away because the connection limit was reached.
    connections_refused: AtomicU64,
    /// Connections the server closed before the client was done, by [`Eviction`] kind.
    evictions: [AtomicU64; Eviction::COUNT],
    /// Bytes read from clients.
    bytes_in: AtomicU64,
    /// Bytes written to clients.
    bytes_out: AtomicU64,
}

impl Default for HttpStats {
    fn default() -> Self {
        HttpStats::new()
    }
}

impl HttpStats {
    /// All counters at zero. `const`, so it can live in a `static`.
    pub const fn new() -> Self {
        HttpStats {
            responses: [const { [const { AtomicU64::new(0) }; STATUS_SLOTS] }; Endpoint::COUNT],
            connections_accepted: AtomicU64::new(0),
            connections_closed: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            evictions: [const { AtomicU64::new(0) }; Eviction::COUNT],
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    /// Counts one response with `status` for `endpoint`.
    #[inline]
    pub fn record_response(&self, endpoint: Endpoint, status: u16) {
        self.responses[endpoint.index()][status_slot(status)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an accepted connection; pair with exactly one [`HttpStats::connection_closed`].
    #[inline]
    pub fn connection_opened(&self) {
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the close of a connection counted by [`HttpStats::connection_opened`].
    #[inline]
    pub fn connection_closed(&self) {
        self.connections_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection refused at the connection limit (never counted as opened).
    #[inline]
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one connection evicted for `why` (it is also counted closed when it closes).
    #[inline]
    pub fn connection_evicted(&self, why: Eviction) {
        self.evictions[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections evicted for `why` since start.
    pub fn evictions(&self, why: Eviction) -> u64 {
        self.evictions[why as usize].load(Ordering::Relaxed)
    }

    /// Counts `bytes` read from a client.
    #[inline]
    pub fn add_bytes_in(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` written to a client.
    #[inline]
    pub fn add_bytes_out(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Responses for `endpoint` in status slot `slot` (`0..STATUS_SLOTS`).
    pub fn responses_in_slot(&self, endpoint: Endpoint, slot: usize) -> u64 {
        self.responses[endpoint.index()][slot].load(Ordering::Relaxed)
    }

    /// Responses for `endpoint` with `status` (for an untracked code: all "other" responses).
    pub fn responses(&self, endpoint: Endpoint, status: u16) -> u64 {
        self.responses_in_slot(endpoint, status_slot(status))
    }

    /// Responses for `endpoint`, any status.
    pub fn responses_for(&self, endpoint: Endpoint) -> u64 {
        (0..STATUS_SLOTS)
            .map(|s| self.responses_in_slot(endpoint, s))
            .sum()
    }

    /// Connections accepted since start.
    pub fn connections_accepted(&self) -> u64 {
        self.connections_accepted.load(Ordering::Relaxed)
    }

    /// Connections closed since start.
    pub fn connections_closed(&self) -> u64 {
        self.connections_closed.load(Ordering::Relaxed)
    }

    /// Connections refused at the connection limit since start.
    pub fn connections_refused(&self) -> u64 {
        self.connections_refused.load(Ordering::Relaxed)
    }

    /// Connections open now: accepted minus closed. The two loads are not one atomic
    /// snapshot, so a racing close may be seen before its open; saturate instead of wrapping.
    pub fn connections_open(&self) -> u64 {
        let closed = self.connections_closed();
        self.connections_accepted().saturating_sub(closed)
    }

    /// Bytes read from clients since start.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Bytes written to clients since start.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn endpoints_are_dense_and_named_in_snake_case() {
        for (i, e) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(e.index(), i);
            assert!(e
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }

    #[test]
    fn status_labels_name_their_codes() {
        for (slot, code) in TRACKED_STATUS_CODES.into_iter().enumerate() {
            assert_eq!(STATUS_SLOT_LABELS[slot], code.to_string());
            assert_eq!(status_slot(code), slot);
        }
        assert_eq!(STATUS_SLOT_LABELS[OTHER_STATUS_SLOT], "other");
        for code in [201, 204, 301, 418, 499, 501, 599, 0, u16::MAX] {
            assert_eq!(status_slot(code), OTHER_STATUS_SLOT, "{code}");
        }
    }

    #[test]
    fn responses_are_counted_per_endpoint_and_code() {
        let s = HttpStats::new();
        s.record_response(Endpoint::Completions, 200);
        s.record_response(Endpoint::Completions, 200);
        s.record_response(Endpoint::Completions, 429);
        s.record_response(Endpoint::Completions, 418);
        s.record_response(Endpoint::Completions, 201);
        s.record_response(Endpoint::Models, 200);
        assert_eq!(s.responses(Endpoint::Completions, 200), 2);
        assert_eq!(s.responses(Endpoint::Completions, 429), 1);
        assert_eq!(
            s.responses_in_slot(Endpoint::Completions, OTHER_STATUS_SLOT),
            2
        );
        assert_eq!(
            s.responses(Endpoint::Completions, 418),
            2,
            "untracked codes share a slot"
        );
        assert_eq!(s.responses_for(Endpoint::Completions), 5);
        assert_eq!(s.responses(Endpoint::Models, 200), 1);
        assert_eq!(s.responses_for(Endpoint::Embeddings), 0);
    }

    #[test]
    fn connections_and_bytes() {
        let s = HttpStats::default();
        s.connection_opened();
        s.connection_opened();
        s.connection_refused();
        s.connection_closed();
        s.connection_evicted(Eviction::SlowRequest);
        s.add_bytes_in(100);
        s.add_bytes_out(250);
        s.add_bytes_out(5);
        assert_eq!(s.connections_accepted(), 2);
        assert_eq!(s.connections_closed(), 1);
        assert_eq!(s.connections_refused(), 1);
        assert_eq!(s.connections_open(), 1);
        assert_eq!(s.evictions(Eviction::SlowRequest), 1);
        assert_eq!(s.evictions(Eviction::IdleAtLimit), 0);
        for (i, e) in Eviction::ALL.into_iter().enumerate() {
            assert_eq!(e as usize, i);
        }
        assert_eq!((s.bytes_in(), s.bytes_out()), (100, 255));
    }

    #[test]
    fn paths_map_to_endpoints() {
        let cases = [
            ("/v1/completions", Endpoint::Completions),
            ("/v1/chat/completions?x=1", Endpoint::ChatCompletions),
            ("/v1/embeddings", Endpoint::Embeddings),
            ("/v1/models", Endpoint::Models),
            ("/v1/models/gpt-4", Endpoint::Models),
            ("/metrics", Endpoint::Metrics),
            ("/metrics/json", Endpoint::MetricsJson),
            ("/admin/strategy/fixed", Endpoint::Admin),
            ("/health", Endpoint::Health),
            ("/ready", Endpoint::Ready),
            ("/metrics/history?seconds=5", Endpoint::MetricsHistory),
            ("/events", Endpoint::Events),
            ("/dashboard", Endpoint::Dashboard),
            ("/dashboard/dashboard.js", Endpoint::Dashboard),
            ("/", Endpoint::Dashboard),
            ("/dashboards", Endpoint::Other),
            ("/administrator", Endpoint::Other),
            ("", Endpoint::Other),
        ];
        for (path, want) in cases {
            assert_eq!(Endpoint::from_path(path), want, "{path}");
        }
    }

    #[test]
    fn a_static_counts_from_many_threads_without_losing_increments() {
        static STATS: HttpStats = HttpStats::new();
        let shared = Arc::new(HttpStats::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        shared.record_response(Endpoint::Health, 200);
                        shared.add_bytes_out(2);
                        STATS.connection_opened();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(shared.responses(Endpoint::Health, 200), 4000);
        assert_eq!(shared.bytes_out(), 8000);
        assert_eq!(STATS.connections_accepted(), 4000);
    }
}
