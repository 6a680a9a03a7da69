//! OpenAI's Responses API as vLLM serves it: `POST /v1/responses` (text `input` or a list
//! of messages, optional `instructions`; whole or streamed with its event types) and
//! `GET /v1/responses/{id}` while the bounded store keeps the answer (`store`, default
//! true; the oldest of [`STORE_MAX`] answers goes first).
//!
//! A response is one engine request, like a chat completion: the prompt is the rendered
//! conversation, `max_output_tokens` its max tokens. Its JSON is built here (whole answer,
//! the stream's `response.created` / `response.completed`, the stored copy); the stream's
//! deltas are written by [`super::stream`]. What must never happen here: a store that grows
//! past its bound, or an id that answers with another request's response.

use super::wire::{self, body_error, parse_body, Content, ContentPart, Message};
use super::{Decoder, Job, JobKind, Routed};
use crate::exec::{FinishReason, Output};
use crate::http::parse::Head;
use crate::runtime::Request;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Responses kept for `GET /v1/responses/{id}`: 1,024 answers of at most
/// `server.max_tokens_limit` tokens each (a few MiB on defaults).
pub const STORE_MAX: usize = 1024;

/// The kept responses by id, and their ids oldest first.
type Kept = (HashMap<Arc<str>, Arc<str>>, VecDeque<Arc<str>>);

/// The stored responses, oldest first out.
#[derive(Debug, Default)]
pub struct ResponseStore {
    inner: Mutex<Kept>,
}

impl ResponseStore {
    /// Keeps `body` (the response's JSON) under `id`, dropping the oldest past the bound.
    pub fn insert(&self, id: &str, body: String) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        let id: Arc<str> = id.into();
        if map.insert(id.clone(), body.into()).is_none() {
            order.push_back(id);
        }
        while order.len() > STORE_MAX {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        // Guarantees: the bound holds and every kept id is in both.
        debug_assert!(map.len() == order.len() && map.len() <= STORE_MAX);
    }

    /// The stored response `id`, if still kept.
    pub fn get(&self, id: &str) -> Option<Arc<str>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(id).cloned()
    }
}

/// What a response's JSON repeats from its request, and where it is stored.
#[derive(Debug)]
pub struct ResponseMeta {
    /// `resp_<hex>`.
    pub id: String,
    /// `msg_<hex>`: the output message's id.
    pub message_id: String,
    pub model: String,
    pub created_at: u64,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: f64,
    pub top_p: f64,
    /// Set (by the endpoint) when `store` is on: the answer goes there when complete.
    pub store: Option<Arc<ResponseStore>>,
}

/// The body of `POST /v1/responses` (fields abe uses; others are ignored).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct ResponsesBody<'a> {
    model: Option<String>,
    input: Option<Input>,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    stream: Option<bool>,
    store: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<i64>,
    previous_response_id: Option<String>,
    #[serde(borrow)]
    priority: Option<wire::PriorityField<'a>>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

#[derive(serde::Deserialize)]
struct InputItem {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<ItemContent>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ItemContent {
    Text(String),
    Parts(Vec<ItemPart>),
}

#[derive(serde::Deserialize)]
struct ItemPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// A fresh id: 16 hex digits from a process-wide counter mixed with the clock, so ids do
/// not repeat within a run nor (likely) across restarts.
fn fresh_hex() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = t ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    format!("{:016x}", z ^ (z >> 29))
}

/// The conversation of `input` (with `instructions` as a system message first), as chat
/// messages.
fn messages(instructions: Option<&str>, input: Input) -> Result<Vec<Message>, wire::BodyError> {
    let mut out = Vec::new();
    if let Some(i) = instructions {
        out.push(Message {
            role: "system".into(),
            content: Some(Content::Text(i.into())),
        });
    }
    match input {
        Input::Text(t) => out.push(Message {
            role: "user".into(),
            content: Some(Content::Text(t)),
        }),
        Input::Items(items) => {
            for (i, item) in items.into_iter().enumerate() {
                let content = match item.content {
                    Some(ItemContent::Text(t)) => Content::Text(t),
                    Some(ItemContent::Parts(parts)) => Content::Parts(
                        parts
                            .into_iter()
                            .map(|p| ContentPart {
                                // input_text / output_text are text to the chat template.
                                kind: match p.kind.as_str() {
                                    "input_text" | "output_text" => "text".into(),
                                    _ => p.kind,
                                },
                                text: p.text,
                            })
                            .collect(),
                    ),
                    None => {
                        return Err(body_error(
                            "missing_field",
                            format!("missing required field 'input[{i}].content'"),
                        ))
                    }
                };
                out.push(Message {
                    role: item.role.unwrap_or_else(|| "user".into()),
                    content: Some(content),
                });
            }
        }
    }
    Ok(out)
}

/// Decodes `POST /v1/responses` into a job of one engine request.
pub(super) fn decode(ctx: &Decoder<'_>, head: &Head, body: &[u8]) -> Result<Routed, Routed> {
    let b: ResponsesBody<'_> = parse_body(body).map_err(super::bad)?;
    if b.previous_response_id.is_some() {
        return Err(super::bad(body_error(
            "unsupported_value",
            "'previous_response_id' is not supported by abe; send the conversation as 'input'",
        )));
    }
    let input = b.input.ok_or_else(|| {
        super::bad(body_error(
            "missing_field",
            "missing required field 'input'",
        ))
    })?;
    let msgs = messages(b.instructions.as_deref(), input).map_err(super::bad)?;
    let generation = wire::GenerationBody {
        max_tokens: b.max_output_tokens,
        stream: b.stream,
        temperature: b.temperature,
        top_p: b.top_p,
        seed: b.seed,
        ..Default::default()
    };
    let source = super::text_source(ctx, head, "max_output_tokens", b.priority.as_deref());
    let text = super::payload::text(source, generation).map_err(super::bad)?;
    let model = super::model_of(ctx, b.model.as_deref()).to_string();
    let route = super::check_model(ctx, &model, |r| {
        for m in &msgs {
            if let Some(Content::Text(t)) = &m.content {
                r.text(t);
            }
        }
    })?;
    let prompt = super::chat::render_prompt(Some(msgs)).map_err(super::bad)?;
    super::check_model_len(ctx, &prompt, &text)?;
    let mut work = text.work(prompt, None);
    super::name_prompt_blocks(ctx, &mut work);
    let meta = ResponseMeta {
        id: format!("resp_{}", fresh_hex()),
        message_id: format!("msg_{}", fresh_hex()),
        model: model.clone(),
        created_at: super::unix_now(),
        instructions: b.instructions,
        max_output_tokens: b.max_output_tokens.map(|n| n as u32),
        temperature: b.temperature.unwrap_or(1.0),
        top_p: b.top_p.unwrap_or(1.0),
        // Attached by `attach_store` when `store` is not false.
        store: None,
    };
    let store = b.store != Some(false);
    Ok(Routed::Submit(Box::new(Job {
        kind: JobKind::Response { store },
        model,
        requests: vec![Request {
            priority: text.priority,
            route: Some(route),
            work,
        }],
        created_unix: meta.created_at,
        stream: text.stream,
        choices: Default::default(),
        echo: None,
        request_id: head.request_id.as_deref().map(Arc::from),
        structured: None,
        response: Some(Arc::new(meta)),
    })))
}

/// Gives a response job that asked for `store` the server's store.
pub fn attach_store(store: &Arc<ResponseStore>, mut routed: Routed) -> Routed {
    if let Routed::Submit(job) = &mut routed {
        if let (JobKind::Response { store: true }, Some(meta)) = (&job.kind, job.response.as_mut())
        {
            if let Some(m) = Arc::get_mut(meta) {
                m.store = Some(store.clone());
            }
        }
    }
    routed
}

/// The response object: `status` `in_progress` with no output (a stream's start), or
/// complete with `text` and usage (`incomplete` when `max_output_tokens` cut it).
pub fn response_json(meta: &ResponseMeta, done: Option<(&str, u64, u64, bool)>) -> Value {
    let (status, output, usage, incomplete) = match done {
        None => ("in_progress", json!([]), Value::Null, Value::Null),
        Some((text, input, output, cut)) => (
            if cut { "incomplete" } else { "completed" },
            json!([message_json(meta, text, "completed")]),
            json!({
                "input_tokens": input,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input + output,
            }),
            if cut {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
        ),
    };
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": meta.instructions,
        "max_output_tokens": meta.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "store": meta.store.is_some(),
        "temperature": meta.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": meta.top_p,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    })
}

/// The output message item.
pub fn message_json(meta: &ResponseMeta, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": meta.message_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// The finished response of `output`, stored when asked: (its JSON text).
pub fn finish(meta: &ResponseMeta, output: &Output) -> String {
    let (text, input, out, cut) = match output {
        Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
            ..
        } => (
            text.as_str(),
            u64::from(*prompt_tokens),
            u64::from(*completion_tokens),
            *finish_reason == FinishReason::Length && meta.max_output_tokens.is_some(),
        ),
        Output::Embedding { .. } => ("", 0, 0, false),
    };
    let body = response_json(meta, Some((text, input, out, cut))).to_string();
    if let Some(store) = &meta.store {
        store.insert(&meta.id, body.clone());
    }
    body
}

/// `GET /v1/responses/{id}`.
pub fn get(store: &ResponseStore, id: &str) -> crate::http::response::Response {
    use crate::http::response::{Response, Status};
    match store.get(id) {
        Some(body) => Response::json(Status::Ok, body.as_bytes().to_vec()),
        None => Response::error(
            Status::NotFound,
            "not_found",
            format!(
                "no stored response '{id}': it was not stored ('store': false), or is older \
                 than the newest {STORE_MAX}"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_newest_up_to_its_bound() {
        let s = ResponseStore::default();
        for i in 0..STORE_MAX + 10 {
            s.insert(&format!("resp_{i}"), format!("{{\"n\":{i}}}"));
        }
        assert!(s.get("resp_0").is_none());
        assert!(s.get("resp_9").is_none());
        assert_eq!(s.get("resp_10").as_deref(), Some("{\"n\":10}"));
        assert!(s.get(&format!("resp_{}", STORE_MAX + 9)).is_some());
    }
}
