//! The Responses API's response object and its store: the JSON of a response (whole, the
//! stream's `response.created` / `response.completed`, the stored copy) built from what the
//! request asked and what the engine answered, and the bounded store `GET /v1/responses/{id}`
//! reads (`store`, default true; the oldest goes first past [`STORE_MAX`] answers or
//! [`STORE_MAX_BYTES`]). Decoding
//! the request lives in [`super::responses`]; the stream's events in [`super::stream`].
//!
//! What must never happen here: a store that grows past its bound, or an id that answers
//! with another request's response.

use super::wire::{Content, Message};
use crate::exec::{FinishReason, Output};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Responses kept for `GET /v1/responses/{id}`: at most 1,024 answers ...
pub const STORE_MAX: usize = 1024;

/// ... and at most 64 MiB of them, counting the text bytes of each answer's JSON and of its
/// conversation (not the allocations' own overhead, a few dozen bytes a message). A
/// conversation holds every earlier turn of its `previous_response_id` chain, so a long chain
/// stores text that grows with the square of its length: the bytes, not the count, bound it
/// then. The oldest go first; an answer larger than the whole bound is not kept.
pub const STORE_MAX_BYTES: usize = 64 << 20;

/// A kept response: its JSON, its conversation (input and output, without its
/// instructions) for a later request's `previous_response_id`, and the bytes both hold.
type Entry = (Arc<str>, Arc<[Message]>, usize);

/// The kept responses by id, their ids oldest first, and the bytes they hold.
type Kept = (HashMap<Arc<str>, Entry>, VecDeque<Arc<str>>, usize);

/// The text bytes a conversation holds (roles, contents, parts).
fn conversation_bytes(conversation: &[Message]) -> usize {
    conversation
        .iter()
        .map(|m| {
            m.role.len()
                + match &m.content {
                    None => 0,
                    Some(Content::Text(t)) => t.len(),
                    Some(Content::Parts(parts)) => parts
                        .iter()
                        .map(|p| p.kind.len() + p.text.as_ref().map_or(0, String::len))
                        .sum(),
                }
        })
        .sum()
}

/// The stored responses, oldest first out.
#[derive(Debug, Default)]
pub struct ResponseStore {
    inner: Mutex<Kept>,
}

impl ResponseStore {
    /// Keeps `body` (the response's JSON) and its `conversation` under `id`, dropping the
    /// oldest past the bound.
    pub fn insert(&self, id: &str, body: String, conversation: Arc<[Message]>) {
        let bytes = body.len() + conversation_bytes(&conversation);
        if bytes > STORE_MAX_BYTES {
            // Larger than the whole store: not kept, and nothing else is evicted for it.
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order, held) = &mut *g;
        let id: Arc<str> = id.into();
        match map.insert(id.clone(), (body.into(), conversation, bytes)) {
            None => order.push_back(id),
            Some((_, _, was)) => *held -= was,
        }
        *held += bytes;
        while order.len() > STORE_MAX || *held > STORE_MAX_BYTES {
            let Some(old) = order.pop_front() else { break };
            if let Some((_, _, b)) = map.remove(&old) {
                *held -= b;
            }
        }
        // Guarantees: both bounds hold and every kept id is in both.
        debug_assert!(map.len() == order.len() && map.len() <= STORE_MAX);
        debug_assert!(*held <= STORE_MAX_BYTES);
    }

    /// The stored response `id`, if still kept.
    pub fn get(&self, id: &str) -> Option<Arc<str>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(id).map(|(body, _, _)| body.clone())
    }

    /// The conversation of stored response `id` (its input then its output), if still kept.
    pub fn conversation(&self, id: &str) -> Option<Arc<[Message]>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(id).map(|(_, c, _)| c.clone())
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
    /// `text.format` as asked (`{"type": "text"}` by default).
    pub text_format: Value,
    pub previous_response_id: Option<String>,
    /// The input this response ran on (a previous response's conversation first), without
    /// its instructions: stored with the output for a later `previous_response_id`.
    pub conversation: Vec<Message>,
    /// Set (by the endpoint) when `store` is on: the answer goes there when complete.
    pub store: Option<Arc<ResponseStore>>,
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
        "previous_response_id": meta.previous_response_id,
        "store": meta.store.is_some(),
        "temperature": meta.temperature,
        "text": {"format": meta.text_format},
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
        let mut conversation = meta.conversation.clone();
        conversation.push(Message {
            role: "assistant".into(),
            content: Some(Content::Text(text.to_string())),
        });
        store.insert(&meta.id, body.clone(), conversation.into());
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
                "no stored response '{id}': it was not stored ('store': false, or larger \
                 than the whole store), or no longer is (abe keeps the newest {STORE_MAX} \
                 answers and {} MiB of them)",
                STORE_MAX_BYTES >> 20
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
            s.insert(
                &format!("resp_{i}"),
                format!("{{\"n\":{i}}}"),
                Arc::from(Vec::new()),
            );
        }
        assert!(s.get("resp_0").is_none());
        assert!(s.get("resp_9").is_none());
        assert_eq!(s.get("resp_10").as_deref(), Some("{\"n\":10}"));
        assert!(s.get(&format!("resp_{}", STORE_MAX + 9)).is_some());
    }

    /// A `previous_response_id` chain re-stores every earlier turn: the bytes bound the
    /// store long before the count does, the newest stay, and the held bytes never pass it.
    #[test]
    fn a_long_conversation_chain_is_bounded_in_bytes_not_only_in_count() {
        let s = ResponseStore::default();
        let turn = "x".repeat(4 << 20); // 4 MiB a turn
        let mut conversation: Vec<Message> = Vec::new();
        for i in 0..20 {
            conversation.push(Message {
                role: "user".into(),
                content: Some(Content::Text(turn.clone())),
            });
            s.insert(
                &format!("resp_{i}"),
                "{}".into(),
                conversation.clone().into(),
            );
            let held = s.inner.lock().unwrap().2;
            assert!(held <= STORE_MAX_BYTES, "turn {i}: {held} bytes held");
        }
        // 20 turns of a growing chain would hold 840 MiB under the count bound alone.
        // Turn 14 (15 turns, 60 MiB) is the last that fits; it pushed out every
        // older one; the later ones, each over the bound alone, were not kept and evicted
        // nothing.
        let kept: Vec<usize> = (0..20)
            .filter(|i| s.get(&format!("resp_{i}")).is_some())
            .collect();
        assert_eq!(kept, [14]);
        assert!(s.conversation("resp_14").is_some_and(|c| c.len() == 15));
    }
}
