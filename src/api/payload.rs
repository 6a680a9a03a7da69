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
    /// Answer as a Server-Sent Events stream (`stream: true`).
    pub stream: Option<StreamOptions>,
    /// The payload of each prompt, but for the prompt itself ([`Text::work`] adds it).
    work: Work,
}

impl Text {
    /// The payload for one prompt (chat: the rendered conversation, and the client's body
    /// when an upstream backend may forward it).
    pub fn work(&self, prompt: String, chat_body: Option<std::sync::Arc<str>>) -> Work {
        Work {
            prompt: prompt.into(),
            chat_body,
            ..self.work.clone()
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
    if let Some(n) = g.n {
        if n != 1 {
            return Err(body_error(
                "invalid_value",
                format!("'n' must be 1 (got {n}): one choice per prompt is supported"),
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
    });
    let priority = wire::priority(src.priority, src.priority_header)?;
    Ok(Text {
        priority,
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
    })
}

/// The payload of one embedding input (`dimensions` 0: the executor's default).
pub(super) fn embedding(input: String, dimensions: u32) -> Work {
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
