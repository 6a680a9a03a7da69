//! The payload: what one request asks of an executor, in the one shape it has from the API
//! to the worker.
//!
//! The API builds a [`Work`] once from a parsed body (`crate::api::payload`); it travels
//! inside `runtime::Request`, the engine's `Submission` and pending slot, and a
//! [`BatchItem`](super::BatchItem) / [`StepItem`](super::StepItem) to the worker, moved and
//! never repacked or copied (the prompt is shared, so handing it on does not allocate). The
//! only field set on the way is `model`, when the engine routes the request.
//!
//! Adding an OpenAI sampling field (say `frequency_penalty`) touches four places, and
//! nothing in the runtime:
//! 1. the wire bodies: one line with the fields both text endpoints share
//!    (`GenerationBody` in `api/wire.rs`);
//! 2. the one place that builds the payload, `api/payload.rs` (check it, store it);
//! 3. [`Sampling`] here: its `PartialEq` decides which requests may share an upstream array
//!    request, and [`Work::stream_key`] which synthetic output a request gets;
//! 4. the executor that uses it (`exec/upstream/wire.rs` forwards it; `exec/sim.rs` may key
//!    on it).
//!
//! What must never happen here: anything that allocates or copies the prompt after the API
//! built it.

use crate::core::Kind;
use std::sync::Arc;

/// What one request asks for, as the worker needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Work {
    pub kind: Kind,
    /// Prompt text (completion) or input text (embedding). Shared, so the engine can hand a
    /// copy to a worker without allocating (continuous batching keeps it for recompute).
    pub prompt: Arc<str>,
    /// Output tokens asked for (completions; 0 for embeddings).
    pub max_tokens: u32,
    /// Embedding dimensions asked for (0: the executor's default).
    pub dimensions: u32,
    /// How the next token is chosen.
    pub sampling: Sampling,
    /// The client streams: token events are wanted.
    pub stream: bool,
    /// abe extension: the client's predicted output length (0: unknown), a hint for
    /// length-aware strategies (copied into the scheduler's `RequestMeta` at submission).
    pub predicted_output_tokens: u32,
    /// The model the backend is asked for (set by the engine when it routes the request;
    /// `None` before). A LoRA adapter's request carries the adapter's name from the io
    /// thread, and the engine keeps it: an upstream vLLM serves the adapter under its own
    /// name. Shared, so setting it does not allocate.
    pub model: Option<Arc<str>>,
    /// Chat completions only: the client's JSON request body, for an `upstream` backend to
    /// forward (messages, tools, response_format...) with `model` and `stream` replaced.
    /// `prompt` holds the same conversation rendered for the `sim` executor.
    pub chat_body: Option<Arc<str>>,
    /// Continuous batching with prefix caching: the names of the prompt's full KV blocks
    /// (`core::prefix::text_block_hashes`, computed on the io thread), which the scheduler
    /// looks up and caches. `None` otherwise.
    pub prompt_blocks: Option<Arc<[crate::core::prefix::BlockHash]>>,
}

/// A request's sampling settings, as the client gave them (validated by the API).
///
/// Two requests with equal `Sampling` (and model and `max_tokens`) can ride in one upstream
/// array request. Floats compare by bits, so equality is an equivalence (and `-0.0` is not
/// `0.0`: a backend may tell them apart).
#[derive(Clone, Debug, Default)]
pub struct Sampling {
    /// Sampling seed, if any (changes synthetic output deterministically).
    pub seed: Option<u64>,
    /// Temperature and nucleus mass, if given (change the synthetic choice
    /// deterministically, like the seed).
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Stop sequences: generation ends before the first one (finish_reason "stop").
    pub stop: Option<Arc<[String]>>,
    /// vLLM's `ignore_eos`: no natural end of sequence, generate `max_tokens`.
    pub ignore_eos: bool,
    /// vLLM's `min_tokens`: no natural end of sequence before this many tokens.
    pub min_tokens: u32,
}

impl PartialEq for Sampling {
    fn eq(&self, other: &Sampling) -> bool {
        let bits = |v: Option<f64>| v.map(f64::to_bits);
        self.seed == other.seed
            && bits(self.temperature) == bits(other.temperature)
            && bits(self.top_p) == bits(other.top_p)
            && self.stop == other.stop
            && self.ignore_eos == other.ignore_eos
            && self.min_tokens == other.min_tokens
    }
}

impl Eq for Sampling {}

impl Work {
    /// The key of this request's synthetic output stream: prompt, seed, temperature, top_p.
    pub fn stream_key(&self) -> u64 {
        let s = &self.sampling;
        let mut key = super::synth::stream_key(&self.prompt, s.seed);
        for (salt, v) in [(0x7465_6d70u64, s.temperature), (0x746f_705fu64, s.top_p)] {
            if let Some(v) = v {
                key ^= (v.to_bits() ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            }
        }
        key
    }

    /// Stop sequences, if any.
    pub fn stop(&self) -> Option<&[String]> {
        self.sampling.stop.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_compares_floats_by_bits() {
        let a = Sampling {
            temperature: Some(0.0),
            ..Sampling::default()
        };
        let nan = Sampling {
            top_p: Some(f64::NAN),
            ..Sampling::default()
        };
        assert_eq!(a, a.clone());
        assert_eq!(nan, nan.clone());
        assert_ne!(
            a,
            Sampling {
                temperature: Some(-0.0),
                ..Sampling::default()
            }
        );
        assert_ne!(a, Sampling::default());
    }
}
