//! Executors: what a worker thread does with a batch.
//!
//! A worker owns one `Executor` and calls it once per batch: `sim` (latency models and
//! synthetic output), `upstream` (HTTP to an OpenAI-compatible backend) or `embed` (a
//! sentence-transformers model on the CPU, feature `embed`). Executors run on
//! worker threads: they may allocate and block, the engine never waits for them.

pub mod concurrent;
pub mod embed;
pub mod health;
pub mod latency;
pub mod roofline;
pub mod sim;
pub mod synth;
pub mod upstream;
pub mod work;

use crate::core::continuous::{EntryResult, StepEntry};
use crate::core::Ticket;

pub use work::{Sampling, Work};

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// A stop sequence or end of sequence.
    Stop,
    /// The model called tools (an upstream backend's answer; see `Output::Text::tool_calls`).
    ToolCalls,
}

impl FinishReason {
    /// OpenAI's wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// A worker's answer for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Text {
        text: String,
        prompt_tokens: u32,
        completion_tokens: u32,
        finish_reason: FinishReason,
        /// Chat answers from an upstream backend: the message's `tool_calls` array as the
        /// backend sent it (JSON text), relayed to the client as is. `None` otherwise.
        tool_calls: Option<Box<str>>,
        /// Prompt tokens whose KV was found in the prefix cache (OpenAI's
        /// `usage.prompt_tokens_details.cached_tokens`); `None` where no prefix cache
        /// applies (request-level batching, prefix caching off), so the field is left out.
        cached_tokens: Option<u32>,
    },
    Embedding {
        vector: Vec<f32>,
        prompt_tokens: u32,
    },
}

/// One request inside a batch on its way to a worker and back.
#[derive(Debug)]
pub struct BatchItem {
    pub ticket: Ticket,
    pub work: Work,
    /// Filled by the executor.
    pub output: Option<Output>,
    /// Filled by the executor when this request alone failed (the rest of the batch may have
    /// succeeded); takes precedence over `output`.
    pub error: Option<ExecError>,
    /// LoRA adapters loaded for the batch, counted on its first item (the `sim` executor
    /// adds `lora_load_ms` for each).
    pub lora_loads: u32,
    /// Set by the worker when it sent the output straight to the request's submitter
    /// (`runtime::direct_reply`): what the engine's books need of it. `output` is then
    /// `None`.
    pub answered: Option<OutputSummary>,
}

impl BatchItem {
    pub fn new(ticket: Ticket, work: Work) -> BatchItem {
        BatchItem {
            ticket,
            work,
            output: None,
            error: None,
            lora_loads: 0,
            answered: None,
        }
    }
}

/// The counts of an output that the engine records (metrics, `/events`), kept when the
/// output itself went to the client without passing through the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputSummary {
    pub prompt_tokens: u32,
    /// 0 for an embedding.
    pub completion_tokens: u32,
    /// `None` for an embedding.
    pub finish_reason: Option<FinishReason>,
    pub cached_tokens: Option<u32>,
}

impl Output {
    /// What the engine's books need of this output.
    pub fn summary(&self) -> OutputSummary {
        match self {
            Output::Text {
                prompt_tokens,
                completion_tokens,
                finish_reason,
                cached_tokens,
                ..
            } => OutputSummary {
                prompt_tokens: *prompt_tokens,
                completion_tokens: *completion_tokens,
                finish_reason: Some(*finish_reason),
                cached_tokens: *cached_tokens,
            },
            Output::Embedding { prompt_tokens, .. } => OutputSummary {
                prompt_tokens: *prompt_tokens,
                completion_tokens: 0,
                finish_reason: None,
                cached_tokens: None,
            },
        }
    }
}

/// One slot's share of a continuous-batching step, on its way to a worker and back.
#[derive(Debug)]
pub struct StepItem {
    pub entry: StepEntry,
    /// The request, when this step admits it into its slot (`entry.admitted`).
    pub work: Option<Work>,
    /// Filled by the executor for streaming requests: text to stream now (the token sampled
    /// in this step, plus any held back before it), and where it starts in the output.
    pub token: Option<String>,
    pub token_offset: u32,
    /// Filled by the executor: whether the request goes on.
    pub result: EntryResult,
    /// Filled by the executor when the request finished: its whole output.
    pub output: Option<Output>,
}

/// A failed batch or request, as reported by an executor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("injected fault: {0}")]
    Injected(&'static str),
    #[error("backend error: {0}")]
    Backend(String),
    /// The backend could not be reached (connect refused, reset, DNS...).
    #[error("cannot reach backend '{backend}': {message}")]
    Connect { backend: String, message: String },
    /// The backend answered with an HTTP error status.
    #[error("backend '{backend}' answered {status}: {message}")]
    Status {
        backend: String,
        status: u16,
        message: String,
    },
    /// The backend did not answer in time.
    #[error("backend '{backend}' timed out: {message}")]
    Timeout { backend: String, message: String },
    /// The backend answered something that is not the expected OpenAI shape.
    #[error("backend '{backend}' sent an invalid response: {message}")]
    Protocol { backend: String, message: String },
    /// The backend stopped taking requests while this one waited for it (its circuit
    /// opened and no other backend could take the request): 503, retry later.
    #[error("backend '{backend}' is unavailable: {message}")]
    Unavailable { backend: String, message: String },
    /// A local executor cannot take this request as it is (an input too long for the model,
    /// more `dimensions` than it has): the client's to fix, answered 400, never retried.
    #[error("backend '{backend}' cannot take this request: {message}")]
    Invalid { backend: String, message: String },
}

impl ExecError {
    /// Worth trying on another backend (and counted against this backend's circuit):
    /// unreachable, timed out, a 5xx, or a fault of the executor itself. A 4xx is the
    /// request's own problem and goes back to the client as is.
    pub fn is_backend_fault(&self) -> bool {
        match self {
            ExecError::Status { status, .. } => *status >= 500,
            ExecError::Invalid { .. } => false,
            ExecError::Protocol { .. } | ExecError::Unavailable { .. } => true,
            ExecError::Injected(_)
            | ExecError::Backend(_)
            | ExecError::Connect { .. }
            | ExecError::Timeout { .. } => true,
        }
    }

    /// The HTTP status the client gets when this is the final failure: 504 for a timeout,
    /// 503 for a backend that became unavailable, the backend's own 4xx, 502 for anything else a backend did wrong, 500 for a fault
    /// inside abe's own executors.
    pub fn http_status(&self) -> u16 {
        match self {
            ExecError::Timeout { .. } => 504,
            ExecError::Unavailable { .. } => 503,
            ExecError::Invalid { .. } => 400,
            ExecError::Status { status, .. } if (400..500).contains(status) => *status,
            ExecError::Status { .. } | ExecError::Connect { .. } | ExecError::Protocol { .. } => {
                502
            }
            ExecError::Injected(_) | ExecError::Backend(_) => 500,
        }
    }
}

/// Where an executor sends the text of streaming requests as it arrives (request-level
/// batching with an `upstream` backend relays chunks this way). Best effort: a sink may drop
/// pieces when its consumer is behind; the final output must carry the whole text.
pub trait TokenSink {
    /// `text` is the next piece of `items[item]`'s output, starting at byte `offset`.
    fn token(&mut self, item: usize, offset: u32, text: String);
}

/// A sink that drops everything (tests, callers without streaming).
pub struct NoTokens;

impl TokenSink for NoTokens {
    fn token(&mut self, _item: usize, _offset: u32, _text: String) {}
}

/// Runs batches. One instance per worker thread.
pub trait Executor: Send {
    /// Processes every item of a batch, filling `output` (or `error` for an item that failed
    /// on its own); blocks for the service time. `Err` fails the whole batch. Streaming items
    /// may send their text to `tokens` as it arrives.
    fn execute(
        &mut self,
        items: &mut [BatchItem],
        tokens: &mut dyn TokenSink,
    ) -> Result<(), ExecError>;

    /// The event loop this executor's worker runs on, if it runs on one
    /// (`exec::concurrent`): workers whose executors return the same share run as seats of
    /// one thread in request-level batching. `None`: a thread of its own.
    fn event_loop(&self) -> Option<&std::sync::Arc<concurrent::LoopShare>> {
        None
    }

    /// Runs one continuous-batching step (one forward pass over the items), filling each
    /// item's `token`, `result` and, for finished requests, `output`. `dispatched` is the
    /// clock reading of the engine turn that formed the step (at or before the send): an
    /// executor that emulates a step's duration ends it at `dispatched` plus that duration,
    /// so the turn's own work and the hand-off to its thread are not added on top.
    fn step(
        &mut self,
        _items: &mut [StepItem],
        _dispatched: std::time::Instant,
    ) -> Result<(), ExecError> {
        Err(ExecError::Backend(
            "this executor does not run continuous batching".into(),
        ))
    }
}

/// Where `text` must be cut for the first of `stops` it contains (the stop sequence is not
/// part of the output, as in OpenAI's API).
pub fn stop_at(text: &str, stops: Option<&[String]>) -> Option<usize> {
    stops?
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// As [`stop_at`], for `text` grown from its first `old_len` bytes, which held no stop
/// sequence (they were checked when they were generated). A new match must end past
/// `old_len`, so it starts at most `longest stop - 1` bytes before it: only from there is
/// searched, and checking after every token costs the new piece, not the whole text.
pub fn stop_at_since(text: &str, old_len: usize, stops: Option<&[String]>) -> Option<usize> {
    let stops = stops?;
    debug_assert!(stop_at(&text[..old_len], Some(stops)).is_none());
    let longest = stops.iter().map(String::len).max()?;
    let mut from = old_len.saturating_sub(longest.saturating_sub(1));
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    stop_at(&text[from..], Some(stops)).map(|cut| from + cut)
}

/// Does `text` end with a proper prefix of one of `stops` (so the next tokens may complete
/// it, and what is generated so far must not be streamed yet)?
pub fn may_continue_into_stop(text: &str, stops: Option<&[String]>) -> bool {
    stops.is_some_and(|stops| {
        stops.iter().any(|s| {
            (1..s.len())
                .filter(|&k| s.is_char_boundary(k))
                .any(|k| text.ends_with(&s[..k]))
        })
    })
}

/// Prompt tokens as abe estimates them: bytes / 4, rounded up.
pub fn prompt_tokens(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_at_since_finds_what_stop_at_finds_in_grown_text() {
        let stops: Vec<String> = ["river stone", "é!", "x"].map(String::from).into();
        let words = ["the", "river", "stone", "é!", "café", "x"];
        let mut text = String::new();
        for &w in words.iter().cycle().take(40) {
            let old_len = text.len();
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(w);
            let full = stop_at(&text, Some(&stops));
            assert_eq!(
                stop_at_since(&text, old_len, Some(&stops)),
                full,
                "{text:?}"
            );
            if let Some(cut) = full {
                text.truncate(cut);
            }
        }
        assert_eq!(stop_at_since("abc", 0, None), None);
        assert_eq!(stop_at_since("abc", 0, Some(&[])), None);
    }
}
