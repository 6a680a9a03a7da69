//! The one place a parsed body becomes the payload: the fields a worker needs are checked
//! here and the [`Work`] (with its [`Sampling`]) is built once, then moves inside
//! `runtime::Request` to the worker unchanged.
//!
//! A new OpenAI sampling field: declare it with the shared fields of the text bodies
//! ([`GenerationBody`] in `api/wire.rs`), check and store it in `sampling()` below, add it
//! to [`Sampling`] (`exec/work.rs`), and use it in the executor (`exec/upstream/wire.rs`
//! forwards it; `exec/sim.rs` may key on it). Nothing in the runtime changes.
//!
//! What must never happen here: routing or engine calls (the endpoints in `api/mod.rs` do
//! those), or a second copy of a prompt's text.

use super::stream::StreamOptions;
use super::wire::{self, body_error, BodyError, GenerationBody};
use crate::core::{Kind, Priority};
use crate::exec::{Sampling, Work};

/// A text request (completion or chat), checked: how to schedule and answer it, and the
/// payload of its prompts.
pub(super) struct Text {
    pub priority: Priority,
    /// Choices per prompt (`n`, at least 1).
    pub n: u32,
    /// Answer as a Server-Sent Events stream (`stream: true`).
    pub stream: Option<StreamOptions>,
    /// The payload of each prompt, but for the prompt itself ([`Text::work`] adds it).
    work: Work,
}

/// Most choices per prompt (`n`, `best_of`).
pub const CHOICES_MAX: i64 = 128;

impl Text {
    /// `max_tokens` of every choice.
    pub fn max_tokens(&self) -> u32 {
        self.work.max_tokens
    }

    /// The payloads of a prompt's `n` choices, from the payload of its choice 0: the same
    /// prompt (shared, not copied), each with a seed of its own, so the `n` texts differ and
    /// are each deterministic. Choice 0 is what `n = 1` gets. The last choice takes `work`
    /// itself, so the usual `n = 1` clones nothing.
    pub fn choices(work: Work, n: u32) -> impl Iterator<Item = Work> {
        let mut work = Some(work);
        (0..n).map(move |j| {
            let mut w = if j + 1 == n {
                work.take().expect("the last choice is taken once")
            } else {
                work.clone().expect("taken only by the last choice")
            };
            if j > 0 {
                let base = w.sampling.seed.unwrap_or(0);
                w.sampling.seed = Some(base ^ u64::from(j).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            }
            w
        })
    }

    /// The payload for one prompt (chat: the rendered conversation, and the client's body
    /// when an upstream backend may forward it).
    pub fn work(
        &self,
        prompt: std::sync::Arc<str>,
        chat_body: Option<std::sync::Arc<str>>,
    ) -> Work {
        // Field by field: `..self.work.clone()` would clone the template's prompt and chat
        // body only to drop them.
        let t = &self.work;
        Work {
            kind: t.kind,
            prompt,
            max_tokens: t.max_tokens,
            dimensions: t.dimensions,
            sampling: t.sampling.clone(),
            stream: t.stream,
            predicted_output_tokens: t.predicted_output_tokens,
            model: t.model.clone(),
            chat_body,
            prompt_blocks: t.prompt_blocks.clone(),
        }
    }
}

/// Where a text request comes from, besides its body's shared fields.
pub(super) struct TextSource<'a> {
    /// Name of the max-tokens field the client used (for messages).
    pub max_tokens_field: &'a str,
    /// `priority` from the body, else the `X-Priority` header.
    pub priority: Option<&'a str>,
    pub priority_header: Option<&'a str>,
    /// The request came as HTTP/1.0 (no chunked encoding, so no streaming).
    pub http10: bool,
    /// `server.max_tokens_limit`.
    pub max_tokens_limit: u32,
}

/// Checks the shared fields of a text body (in the order a client sees errors: stop,
/// max_tokens, n, stream, priority) and builds its payload.
pub(super) fn text(src: TextSource<'_>, mut g: GenerationBody) -> Result<Text, BodyError> {
    let sampling = sampling(&mut g)?;
    let (field, limit) = (src.max_tokens_field, src.max_tokens_limit);
    let max_tokens = match g.max_tokens {
        None => 16,
        Some(n) if n < 1 || n > i64::from(limit) => {
            return Err(body_error(
                "invalid_value",
                format!("'{field}' must be between 1 and {limit}, got {n}"),
            ))
        }
        Some(n) => n as u32,
    };
    let n = match g.n {
        None => 1,
        Some(n) if !(1..=CHOICES_MAX).contains(&n) => {
            return Err(body_error(
                "invalid_value",
                format!("'n' must be between 1 and {CHOICES_MAX}, got {n}"),
            ))
        }
        Some(n) => n as u32,
    };
    if let Some(best_of) = g.best_of {
        if best_of < i64::from(n) || best_of > CHOICES_MAX {
            return Err(body_error(
                "invalid_value",
                format!("'best_of' must be between n ({n}) and {CHOICES_MAX}, got {best_of}"),
            ));
        }
        if best_of > i64::from(n) && g.stream == Some(true) {
            return Err(body_error(
                "invalid_value",
                "'best_of' greater than 'n' cannot be streamed",
            ));
        }
    }
    if let Some(m) = g.min_tokens {
        if m < 0 || m > i64::from(max_tokens) {
            return Err(body_error(
                "invalid_value",
                format!("'min_tokens' must be between 0 and max_tokens ({max_tokens}), got {m}"),
            ));
        }
    }
    if g.stream == Some(true) && src.http10 {
        return Err(body_error(
            "unsupported_value",
            "'stream': true needs HTTP/1.1 (Server-Sent Events are sent with chunked encoding)",
        ));
    }
    let stream = (g.stream == Some(true)).then(|| StreamOptions {
        include_usage: g
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        choices: Default::default(),
        fault: None,
        // Filled with the prompt tokens by the endpoint, which knows the prompts.
        continuous_usage: g
            .stream_options
            .and_then(|o| o.continuous_usage_stats)
            .filter(|&on| on)
            .map(|_| 0),
    });
    let priority = wire::priority(src.priority, src.priority_header)?;
    let mut sampling = sampling;
    sampling.ignore_eos = g.ignore_eos.unwrap_or(false);
    sampling.min_tokens = g.min_tokens.unwrap_or(0) as u32;
    Ok(Text {
        priority,
        n,
        stream,
        work: Work {
            kind: Kind::Completion,
            max_tokens,
            sampling,
            stream: stream.is_some(),
            predicted_output_tokens: g.predicted_output_tokens.unwrap_or(0),
            ..Work::default()
        },
    })
}

/// The sampling settings of a text body, checked (moved out of `g`).
fn sampling(g: &mut GenerationBody) -> Result<Sampling, BodyError> {
    Ok(Sampling {
        stop: wire::stop_sequences(g.stop.take())?,
        seed: g.seed.map(|s| s as u64),
        temperature: g.temperature,
        top_p: g.top_p,
        ..Sampling::default()
    })
}

/// The payload of one embedding input (`dimensions` 0: the executor's default).
pub(super) fn embedding(input: &str, dimensions: u32) -> Work {
    Work {
        kind: Kind::Embedding,
        prompt: input.into(),
        dimensions,
        ..Work::default()
    }
}

/// `dimensions` of an embeddings body, checked (0: not given).
pub(super) fn dimensions(value: Option<i64>) -> Result<u32, BodyError> {
    match value {
        None => Ok(0),
        Some(d) if !(1..=65_536).contains(&d) => Err(body_error(
            "invalid_value",
            format!("'dimensions' must be between 1 and 65536, got {d}"),
        )),
        Some(d) => Ok(d as u32),
    }
}
