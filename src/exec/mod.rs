//! Executors: what a worker thread does with a batch.
//!
//! A worker owns one `Executor` and calls it once per batch. This issue has the `sim`
//! executor (latency models and synthetic output); `upstream` (HTTP to a real backend) comes
//! with routing. Executors run on worker threads: they may allocate and block, the engine
//! never waits for them.

pub mod latency;
pub mod sim;
pub mod synth;

use crate::core::continuous::{EntryResult, StepEntry};
use crate::core::{Kind, Ticket};
use std::sync::Arc;

/// What one request asks for, as the worker needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Work {
    pub kind: Kind,
    /// Prompt text (completion) or input text (embedding). Shared, so the engine can hand a
    /// copy to a worker without allocating (continuous batching keeps it for recompute).
    pub prompt: Arc<str>,
    /// Output tokens asked for (completions).
    pub max_tokens: u32,
    /// Embedding dimensions asked for (0: the executor's default).
    pub dimensions: u32,
    /// Sampling seed from the client, if any (changes synthetic output deterministically).
    pub seed: Option<u64>,
    /// Sampling temperature and nucleus mass, if given (change the synthetic choice
    /// deterministically, like the seed).
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Stop sequences: generation ends before the first one (finish_reason "stop").
    pub stop: Option<Arc<[String]>>,
    /// The client streams: token events are wanted.
    pub stream: bool,
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// A stop sequence or end of sequence.
    Stop,
}

impl FinishReason {
    /// OpenAI's wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
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

/// A failed batch, as reported by an executor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("injected fault: {0}")]
    Injected(&'static str),
    #[error("backend error: {0}")]
    Backend(String),
}

/// Runs batches. One instance per worker thread.
pub trait Executor: Send {
    /// Processes every item of a batch, filling `output`; blocks for the service time.
    fn execute(&mut self, items: &mut [BatchItem]) -> Result<(), ExecError>;

    /// Runs one continuous-batching step (one forward pass over the items), filling each
    /// item's `token`, `result` and, for finished requests, `output`.
    fn step(&mut self, _items: &mut [StepItem]) -> Result<(), ExecError> {
        Err(ExecError::Backend(
            "this executor does not run continuous batching".into(),
        ))
    }
}

impl Work {
    /// The key of this request's synthetic output stream: prompt, seed, temperature, top_p.
    pub fn stream_key(&self) -> u64 {
        let mut key = synth::stream_key(&self.prompt, self.seed);
        for (salt, v) in [
            (0x7465_6d70u64, self.temperature),
            (0x746f_705fu64, self.top_p),
        ] {
            if let Some(v) = v {
                key ^= (v.to_bits() ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            }
        }
        key
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
