//! OpenAI response bodies: completions, embeddings (float or base64 little-endian f32),
//! models. Shapes and `usage` follow OpenAI's API.

use crate::exec::Output;
use crate::http::response::{Response, Status};
use base64::Engine as _;
use serde::Serialize;

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens: Option<u64>,
    total_tokens: u64,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    text: &'a str,
    index: usize,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct CompletionResponse<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<CompletionChoice<'a>>,
    usage: Usage,
}

/// Maps text outputs to choices with `make(index, text, finish_reason)`, summing usage.
/// An embedding among them is an executor bug, answered with a 500.
fn text_choices<'a, T>(
    outputs: &'a [Output],
    what: &str,
    make: impl Fn(usize, &'a str, &'static str) -> T,
) -> Result<(Vec<T>, Usage), Response> {
    let mut prompt = 0u64;
    let mut completion = 0u64;
    let mut choices = Vec::with_capacity(outputs.len());
    for (index, out) in outputs.iter().enumerate() {
        let Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
        } = out
        else {
            return Err(Response::error(
                Status::InternalError,
                "internal_error",
                format!("the executor answered a {what} with an embedding"),
            ));
        };
        prompt += u64::from(*prompt_tokens);
        completion += u64::from(*completion_tokens);
        choices.push(make(index, text, finish_reason.as_str()));
    }
    let usage = Usage {
        prompt_tokens: prompt,
        completion_tokens: Some(completion),
        total_tokens: prompt + completion,
    };
    Ok((choices, usage))
}

/// `POST /v1/completions` answer: one choice per prompt, in order.
pub fn completion(model: &str, created: u64, id: u64, outputs: &[Output]) -> Response {
    let made = text_choices(outputs, "completion", |index, text, finish_reason| {
        CompletionChoice {
            text,
            index,
            logprobs: None,
            finish_reason,
        }
    });
    let (choices, usage) = match made {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body = CompletionResponse {
        id: format!("cmpl-{id:016x}"),
        object: "text_completion",
        created,
        model,
        choices,
        usage,
    };
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: usize,
    message: ChatMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct ChatResponse<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChatChoice<'a>>,
    usage: Usage,
}

/// `POST /v1/chat/completions` answer: one assistant message.
pub fn chat_completion(model: &str, created: u64, id: u64, outputs: &[Output]) -> Response {
    let made = text_choices(
        outputs,
        "chat completion",
        |index, content, finish_reason| ChatChoice {
            index,
            message: ChatMessage {
                role: "assistant",
                content,
            },
            logprobs: None,
            finish_reason,
        },
    );
    let (choices, usage) = match made {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body = ChatResponse {
        id: format!("chatcmpl-{id:016x}"),
        object: "chat.completion",
        created,
        model,
        choices,
        usage,
    };
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

#[derive(Serialize)]
#[serde(untagged)]
enum EmbeddingValue<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct EmbeddingItem<'a> {
    object: &'static str,
    embedding: EmbeddingValue<'a>,
    index: usize,
}

#[derive(Serialize)]
struct EmbeddingResponse<'a> {
    object: &'static str,
    data: Vec<EmbeddingItem<'a>>,
    model: &'a str,
    usage: Usage,
}

/// Little-endian f32 bytes, base64 (what the OpenAI SDK asks for by default).
pub fn embedding_base64(v: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(v.len() * 4);
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `POST /v1/embeddings` answer: one item per input, in order.
pub fn embedding(model: &str, base64: bool, outputs: &[Output]) -> Response {
    let mut prompt = 0u64;
    let mut data = Vec::with_capacity(outputs.len());
    for (index, out) in outputs.iter().enumerate() {
        match out {
            Output::Embedding {
                vector,
                prompt_tokens,
            } => {
                prompt += u64::from(*prompt_tokens);
                let embedding = if base64 {
                    EmbeddingValue::Base64(embedding_base64(vector))
                } else {
                    EmbeddingValue::Float(vector)
                };
                data.push(EmbeddingItem {
                    object: "embedding",
                    embedding,
                    index,
                });
            }
            Output::Text { .. } => {
                return Response::error(
                    Status::InternalError,
                    "internal_error",
                    "the executor answered an embedding with text",
                )
            }
        }
    }
    let body = EmbeddingResponse {
        object: "list",
        data,
        model,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: None,
            total_tokens: prompt,
        },
    };
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

/// `GET /v1/models`.
pub fn models(router: &crate::router::Router) -> Response {
    use crate::router::Routable;
    let data: Vec<serde_json::Value> = router
        .routable()
        .map(|(name, kind)| {
            let mut m = serde_json::json!({
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "abe",
            });
            match kind {
                Routable::Served => {}
                Routable::Alias { target } => m["abe_alias_of"] = target.into(),
                Routable::FallbackOnly => m["abe_fallback_only"] = true.into(),
            }
            m
        })
        .collect();
    let body = serde_json::json!({ "object": "list", "data": data });
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::FinishReason;

    #[test]
    fn completion_has_one_choice_per_output_and_summed_usage() {
        let outs = vec![
            Output::Text {
                text: "a b".into(),
                prompt_tokens: 3,
                completion_tokens: 2,
                finish_reason: FinishReason::Length,
            },
            Output::Text {
                text: "c".into(),
                prompt_tokens: 1,
                completion_tokens: 1,
                finish_reason: FinishReason::Stop,
            },
        ];
        let r = completion("m", 7, 1, &outs);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][1]["index"], 1);
        assert_eq!(v["choices"][1]["finish_reason"], "stop");
        assert_eq!(v["usage"]["total_tokens"], 7);
    }

    #[test]
    fn base64_embeddings_decode_to_the_same_little_endian_floats() {
        let v = [1.0f32, -0.5, 0.25];
        let s = embedding_base64(&v);
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, v);
    }
}
