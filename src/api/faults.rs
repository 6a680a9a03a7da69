//! Failures by kind, the way a real server fails, injected in front of the engine for the
//! gateways and routers being tested against abe: 429 with `Retry-After`, 401, vLLM's
//! context-length 400, 404 (model), 500 and 503, each at its own rate; and, for streams,
//! the stream cut short without `[DONE]`, the connection reset, or a stall, after N chunks.
//! The `[workers] fault_*` keys set them at start-up; `POST /admin/faults` changes them.
//!
//! Lives here: the settings, the shared cell the io threads read once per request, the
//! seeded draw and the per-kind counters (shown by `GET /admin/faults`). Every injected
//! answer carries `x-abe-fault: <kind>` so a test or a soak tells it from a real one; its
//! body is the OpenAI error a client would get anyway. What must never happen here: a
//! fault that reaches the engine (HTTP faults answer before admission, so the engine's
//! counters never see them), a lock on the request path, or an unseeded draw.

use crate::http::response::{Response, Status};
use crate::runtime::seq_cell::SeqCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// An HTTP failure answered in place of a generation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpFault {
    /// 429 with `Retry-After`.
    RateLimited,
    /// 401, a bad API key.
    Unauthorized,
    /// 400 with vLLM's context-length message.
    ContextLength,
    /// 404, the model does not exist.
    ModelNotFound,
    /// 500.
    InternalError,
    /// 503.
    Unavailable,
}

impl HttpFault {
    pub const ALL: [HttpFault; 6] = [
        HttpFault::RateLimited,
        HttpFault::Unauthorized,
        HttpFault::ContextLength,
        HttpFault::ModelNotFound,
        HttpFault::InternalError,
        HttpFault::Unavailable,
    ];

    /// The name in `x-abe-fault`, the admin body (`<name>_rate`) and the counters.
    pub const fn as_str(self) -> &'static str {
        match self {
            HttpFault::RateLimited => "rate_limited",
            HttpFault::Unauthorized => "unauthorized",
            HttpFault::ContextLength => "context_length",
            HttpFault::ModelNotFound => "model_not_found",
            HttpFault::InternalError => "internal_error",
            HttpFault::Unavailable => "unavailable",
        }
    }
}

/// What happens to a stream after `after_chunks` SSE events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFaultKind {
    /// The stream ends (a well-framed last chunk) without the rest, the finish chunk or
    /// `data: [DONE]`.
    Cut,
    /// The connection is reset (TCP RST) once the first chunks are written.
    Reset,
    /// Nothing more is written for this many ms, then the stream goes on as normal (to
    /// within the io thread's 50 ms tick).
    Stall { ms: u32 },
}

/// A stream's fault, drawn when the request arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamFault {
    pub kind: StreamFaultKind,
    /// SSE events written before the fault strikes.
    pub after_chunks: u32,
}

impl StreamFault {
    /// The name in `x-abe-fault`.
    pub const fn as_str(self) -> &'static str {
        match self.kind {
            StreamFaultKind::Cut => "stream_cut",
            StreamFaultKind::Reset => "stream_reset",
            StreamFaultKind::Stall { .. } => "stream_stall",
        }
    }
}

/// Rates (0..=1) and parameters of the front faults. The HTTP rates are exclusive (one draw
/// per request picks at most one), so their sum is at most 1; the stream rates likewise,
/// drawn again for a stream that passed.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FrontFaultSettings {
    pub rate_limited_rate: f64,
    /// `Retry-After` of an injected 429, in seconds.
    pub retry_after_s: u32,
    pub unauthorized_rate: f64,
    pub context_length_rate: f64,
    pub model_not_found_rate: f64,
    pub internal_error_rate: f64,
    pub unavailable_rate: f64,
    pub stream_cut_rate: f64,
    pub stream_reset_rate: f64,
    pub stream_stall_rate: f64,
    /// SSE events a faulty stream writes before its fault.
    pub stream_after_chunks: u32,
    /// How long a stalled stream stalls, in ms.
    pub stream_stall_ms: u32,
}

impl Default for FrontFaultSettings {
    /// The `[workers] fault_*` defaults (all off).
    fn default() -> Self {
        FrontFaultSettings::from_config(&crate::config::WorkersConfig::default())
    }
}

impl FrontFaultSettings {
    /// What the `[workers] fault_*` keys ask for (checked when the config was).
    pub fn from_config(w: &crate::config::WorkersConfig) -> FrontFaultSettings {
        FrontFaultSettings {
            rate_limited_rate: w.fault_rate_limited_rate,
            retry_after_s: w.fault_retry_after_s,
            unauthorized_rate: w.fault_unauthorized_rate,
            context_length_rate: w.fault_context_length_rate,
            model_not_found_rate: w.fault_model_not_found_rate,
            internal_error_rate: w.fault_internal_error_rate,
            unavailable_rate: w.fault_unavailable_rate,
            stream_cut_rate: w.fault_stream_cut_rate,
            stream_reset_rate: w.fault_stream_reset_rate,
            stream_stall_rate: w.fault_stream_stall_rate,
            stream_after_chunks: w.fault_stream_after_chunks,
            stream_stall_ms: w.fault_stream_stall_ms,
        }
    }

    /// The HTTP kinds with their rates, in draw order.
    pub fn http_rates(&self) -> [(HttpFault, f64); 6] {
        [
            (HttpFault::RateLimited, self.rate_limited_rate),
            (HttpFault::Unauthorized, self.unauthorized_rate),
            (HttpFault::ContextLength, self.context_length_rate),
            (HttpFault::ModelNotFound, self.model_not_found_rate),
            (HttpFault::InternalError, self.internal_error_rate),
            (HttpFault::Unavailable, self.unavailable_rate),
        ]
    }

    /// The stream kinds with their rates, in draw order.
    pub fn stream_rates(&self) -> [(StreamFaultKind, f64); 3] {
        [
            (StreamFaultKind::Cut, self.stream_cut_rate),
            (StreamFaultKind::Reset, self.stream_reset_rate),
            (
                StreamFaultKind::Stall {
                    ms: self.stream_stall_ms,
                },
                self.stream_stall_rate,
            ),
        ]
    }

    /// Every rate within 0..=1 and each group's sum at most 1: `Err` names the first that
    /// is not (key as in the admin body; the config prefixes `workers.fault_`).
    pub fn check(&self) -> Result<(), String> {
        for (key, v) in self.named_rates() {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{key} must be 0..=1, got {v}"));
            }
        }
        self.check_sums()
    }

    /// Each rate by its name in the admin body (the config prefixes `workers.fault_`).
    pub fn named_rates(&self) -> [(&'static str, f64); 9] {
        [
            ("rate_limited_rate", self.rate_limited_rate),
            ("unauthorized_rate", self.unauthorized_rate),
            ("context_length_rate", self.context_length_rate),
            ("model_not_found_rate", self.model_not_found_rate),
            ("internal_error_rate", self.internal_error_rate),
            ("unavailable_rate", self.unavailable_rate),
            ("stream_cut_rate", self.stream_cut_rate),
            ("stream_reset_rate", self.stream_reset_rate),
            ("stream_stall_rate", self.stream_stall_rate),
        ]
    }

    /// Each group's sum at most 1 (the single rates checked apart).
    pub fn check_sums(&self) -> Result<(), String> {
        let http: f64 = self.http_rates().iter().map(|(_, r)| r).sum();
        if http > 1.0 + 1e-9 {
            return Err(format!(
                "the HTTP fault rates (rate_limited .. unavailable) sum to {http}; one draw \
                 picks at most one kind, so their sum must be at most 1"
            ));
        }
        let stream: f64 = self.stream_rates().iter().map(|(_, r)| r).sum();
        if stream > 1.0 + 1e-9 {
            return Err(format!(
                "the stream fault rates (stream_cut, stream_reset, stream_stall) sum to \
                 {stream}; their sum must be at most 1"
            ));
        }
        Ok(())
    }

    fn any(&self) -> bool {
        self.http_rates().iter().any(|(_, r)| *r > 0.0)
            || self.stream_rates().iter().any(|(_, r)| *r > 0.0)
    }

    /// As the words of a [`SeqCell`]: the nine rates' bits, then the three counts.
    fn to_words(self) -> [u64; SETTINGS_WORDS] {
        let r = self.named_rates().map(|(_, v)| v.to_bits());
        [
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            u64::from(self.retry_after_s),
            u64::from(self.stream_after_chunks),
            u64::from(self.stream_stall_ms),
        ]
    }

    /// Back from [`Self::to_words`].
    fn from_words(w: [u64; SETTINGS_WORDS]) -> FrontFaultSettings {
        let rate = |i: usize| f64::from_bits(w[i]);
        let count = |i: usize| u32::try_from(w[i]).expect("written from a u32");
        FrontFaultSettings {
            rate_limited_rate: rate(0),
            unauthorized_rate: rate(1),
            context_length_rate: rate(2),
            model_not_found_rate: rate(3),
            internal_error_rate: rate(4),
            unavailable_rate: rate(5),
            stream_cut_rate: rate(6),
            stream_reset_rate: rate(7),
            stream_stall_rate: rate(8),
            retry_after_s: count(9),
            stream_after_chunks: count(10),
            stream_stall_ms: count(11),
        }
    }
}

/// Words of [`FrontFaultSettings`] in its [`SeqCell`].
const SETTINGS_WORDS: usize = 12;

/// The injected faults of one server, shared by its io threads.
#[derive(Debug)]
pub struct FrontFaults {
    /// Fast path: false while every rate is 0, so a server without faults reads one flag.
    /// Relaxed: a setting is advisory; a request racing a change may see either.
    armed: AtomicBool,
    /// Written only by `POST /admin/faults` (rare); read only when `armed`, without a lock
    /// (a sequence lock: a read sees one whole setting, the old or the new).
    settings: SeqCell<SETTINGS_WORDS>,
    seed: u64,
    /// Draws so far: draw `i` is a hash of (seed, i), so a run's sequence of draws is
    /// fixed by the seed (which request gets which depends on arrival order).
    draws: AtomicU64,
    /// Injected so far, by kind: the six HTTP kinds, then cut, reset, stall.
    injected: [AtomicU64; 9],
}

impl FrontFaults {
    /// Faults with `settings`, draws seeded by `seed` (`[workers] seed`).
    pub fn new(settings: FrontFaultSettings, seed: u64) -> FrontFaults {
        FrontFaults {
            armed: AtomicBool::new(settings.any()),
            settings: SeqCell::new(settings.to_words()),
            seed,
            draws: AtomicU64::new(0),
            injected: Default::default(),
        }
    }

    /// The current settings (no lock: see `settings`).
    pub fn get(&self) -> FrontFaultSettings {
        FrontFaultSettings::from_words(self.settings.read())
    }

    /// Replaces the settings (checked by the caller with [`FrontFaultSettings::check`]).
    pub fn set(&self, s: FrontFaultSettings) {
        debug_assert!(s.check().is_ok());
        self.settings.write(s.to_words());
        self.armed.store(s.any(), Ordering::Relaxed);
    }

    /// Faults injected so far, by kind name.
    pub fn injected(&self) -> serde_json::Value {
        let names = HttpFault::ALL.map(HttpFault::as_str).into_iter().chain([
            "stream_cut",
            "stream_reset",
            "stream_stall",
        ]);
        let mut m = serde_json::Map::new();
        for (name, n) in names.zip(&self.injected) {
            m.insert(name.into(), n.load(Ordering::Relaxed).into());
        }
        serde_json::Value::Object(m)
    }

    /// A uniform draw in [0, 1) (splitmix64 of the seed and the draw's number).
    fn draw(&self) -> f64 {
        let i = self.draws.fetch_add(1, Ordering::Relaxed);
        let mut z = self
            .seed
            .wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the kind whose slice of [0, 1) holds one draw, if any.
    fn pick<K: Copy>(&self, rates: &[(K, f64)]) -> Option<(usize, K)> {
        let u = self.draw();
        let mut edge = 0.0;
        for (i, (k, r)) in rates.iter().enumerate() {
            edge += r;
            if u < edge {
                return Some((i, *k));
            }
        }
        None
    }

    /// The HTTP fault this request gets, if any (counted).
    pub fn draw_http(&self) -> Option<HttpFault> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        let s = self.get();
        let (i, kind) = self.pick(&s.http_rates())?;
        self.injected[i].fetch_add(1, Ordering::Relaxed);
        Some(kind)
    }

    /// The stream fault this streaming request gets, if any (counted).
    pub fn draw_stream(&self) -> Option<StreamFault> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        let s = self.get();
        let (i, kind) = self.pick(&s.stream_rates())?;
        self.injected[6 + i].fetch_add(1, Ordering::Relaxed);
        Some(StreamFault {
            kind,
            after_chunks: s.stream_after_chunks,
        })
    }

    /// Retry-After of an injected 429, in seconds.
    pub fn retry_after_s(&self) -> u32 {
        self.get().retry_after_s
    }
}

/// Injects this server's faults into a decoded request: a valid job may be answered by an
/// HTTP fault instead (never submitted, so the engine never counts it), or, streamed, get
/// a stream fault. Anything else is left as it is. In place: the job is not moved through
/// (a few hundred bytes a request, for a server that injects nothing).
pub fn inject(faults: &FrontFaults, routed: &mut super::Routed) {
    let super::Routed::Submit(job) = routed else {
        return;
    };
    if let Some(kind) = faults.draw_http() {
        let (prompt_tokens, max_tokens) = job
            .requests
            .first()
            .map(|r| {
                (
                    crate::exec::prompt_tokens(&r.work.prompt),
                    r.work.max_tokens,
                )
            })
            .unwrap_or((0, 0));
        let response = http_response(
            kind,
            &job.model,
            prompt_tokens,
            max_tokens,
            faults.retry_after_s(),
        );
        *routed = super::Routed::Now(response);
        return;
    }
    if let Some(s) = job.stream_mut() {
        s.fault = faults.draw_stream();
    }
}

/// The answer of an injected HTTP fault: the OpenAI error body a real server sends for it
/// (the context-length one in vLLM's words, for `model` with `prompt_tokens` asked for
/// `max_tokens` more), with `x-abe-fault: <kind>`.
pub fn http_response(
    kind: HttpFault,
    model: &str,
    prompt_tokens: u32,
    max_tokens: u32,
    retry_after_s: u32,
) -> Response {
    let r = match kind {
        HttpFault::RateLimited => {
            let mut r = Response::error(
                Status::TooManyRequests,
                "rate_limit_exceeded",
                format!("Rate limit reached for {model}; retry after {retry_after_s} s"),
            );
            r.headers.retain(|h| !h.starts_with("Retry-After"));
            r.with_header(format!("Retry-After: {retry_after_s}"))
        }
        HttpFault::Unauthorized => Response::error(
            Status::Unauthorized,
            "invalid_api_key",
            "Incorrect API key provided",
        ),
        HttpFault::ContextLength => {
            let total = u64::from(prompt_tokens) + u64::from(max_tokens);
            // A limit the request exceeds, as a server with a shorter context would have.
            let limit = total.saturating_sub(1).max(1);
            Response::error(
                Status::BadRequest,
                "context_length_exceeded",
                format!(
                    "This model's maximum context length is {limit} tokens. However, you \
                     requested {total} tokens ({prompt_tokens} in the messages, {max_tokens} \
                     in the completion). Please reduce the length of the messages or \
                     completion."
                ),
            )
        }
        HttpFault::ModelNotFound => Response::error(
            Status::NotFound,
            "model_not_found",
            format!("The model `{model}` does not exist."),
        ),
        HttpFault::InternalError => Response::error(
            Status::InternalError,
            "internal_server_error",
            "The server had an error while processing your request",
        ),
        HttpFault::Unavailable => Response::error(
            Status::ServiceUnavailable,
            "service_unavailable",
            "The server is overloaded or not ready yet",
        ),
    };
    r.with_header(format!("x-abe-fault: {}", kind.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_http(rate: f64) -> FrontFaultSettings {
        FrontFaultSettings {
            rate_limited_rate: rate,
            unauthorized_rate: rate,
            context_length_rate: rate,
            model_not_found_rate: rate,
            internal_error_rate: rate,
            unavailable_rate: rate,
            ..Default::default()
        }
    }

    #[test]
    fn settings_read_back_whole_from_the_lock_free_cell() {
        let s = FrontFaultSettings {
            rate_limited_rate: 0.1,
            retry_after_s: 7,
            unauthorized_rate: 0.05,
            context_length_rate: 0.02,
            model_not_found_rate: 0.01,
            internal_error_rate: 0.3,
            unavailable_rate: 0.125,
            stream_cut_rate: 0.2,
            stream_reset_rate: 0.25,
            stream_stall_rate: 0.5,
            stream_after_chunks: 3,
            stream_stall_ms: u32::MAX,
        };
        let f = FrontFaults::new(FrontFaultSettings::default(), 7);
        assert_eq!(f.get(), FrontFaultSettings::default());
        f.set(s);
        assert_eq!(f.get(), s, "every field, in its place");
        assert_eq!(f.retry_after_s(), 7);
        f.set(FrontFaultSettings::default());
        assert_eq!(f.get(), FrontFaultSettings::default());
        assert!(f.draw_http().is_none(), "disarmed again");
    }

    #[test]
    fn nothing_is_drawn_while_every_rate_is_zero() {
        let f = FrontFaults::new(FrontFaultSettings::default(), 7);
        assert!((0..1000).all(|_| f.draw_http().is_none() && f.draw_stream().is_none()));
        assert_eq!(
            f.draws.load(Ordering::Relaxed),
            0,
            "the fast path draws nothing"
        );
    }

    #[test]
    fn each_kind_is_drawn_near_its_rate_and_counted() {
        let f = FrontFaults::new(all_http(0.1), 7);
        let mut seen = [0u32; 6];
        for _ in 0..60_000 {
            if let Some(k) = f.draw_http() {
                seen[HttpFault::ALL.iter().position(|&x| x == k).unwrap()] += 1;
            }
        }
        for (k, n) in HttpFault::ALL.iter().zip(seen) {
            assert!((5_000..7_000).contains(&n), "{k:?}: {n} of 60000 at 10%");
            assert_eq!(f.injected()[k.as_str()], u64::from(n));
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_sequence() {
        let s = FrontFaultSettings {
            stream_cut_rate: 0.3,
            stream_stall_rate: 0.3,
            ..all_http(0.05)
        };
        let run = |seed| {
            let f = FrontFaults::new(s, seed);
            (0..200)
                .map(|_| (f.draw_http(), f.draw_stream()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn rates_out_of_range_or_summing_past_one_are_refused_by_name() {
        let mut s = FrontFaultSettings {
            unauthorized_rate: 1.5,
            ..Default::default()
        };
        assert!(s.check().unwrap_err().contains("unauthorized_rate"));
        s.unauthorized_rate = 0.5;
        s.unavailable_rate = 0.6;
        assert!(s.check().unwrap_err().contains("sum to"));
        s.unavailable_rate = 0.5;
        assert!(s.check().is_ok());
    }

    #[test]
    fn the_429_carries_the_configured_retry_after_once() {
        let r = http_response(HttpFault::RateLimited, "m", 3, 4, 7);
        let retry: Vec<_> = r
            .headers
            .iter()
            .filter(|h| h.starts_with("Retry-After"))
            .collect();
        assert_eq!(retry, ["Retry-After: 7"]);
        assert_eq!(r.status, Status::TooManyRequests);
    }
}
