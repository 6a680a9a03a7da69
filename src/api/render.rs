//! OpenAI response bodies: completions, embeddings (float or base64 little-endian f32),
//! models. Shapes and `usage` follow OpenAI's API.

use super::json_out;
use super::{Job, JobKind};
use crate::exec::{FinishReason, Output};
use crate::http::response::{self, Response, Status};
use crate::runtime::Outcome;
use base64::Engine as _;
use serde::Serialize;

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens: Option<u64>,
    total_tokens: u64,
}

/// Which text answer a body is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextShape {
    /// `text_completion`: `choices[i].text`.
    Completion,
    /// `chat.completion`: `choices[i].message` from the assistant.
    Chat,
}

/// The 500 for an executor that answered a `what` with the wrong kind of output.
fn wrong_output(what: &str, got: &str) -> Response {
    Response::error(
        Status::InternalError,
        "internal_error",
        format!("the executor answered a {what} with {got}"),
    )
}

/// Writes the JSON body of a completion (one choice per output, in order, usage summed)
/// or chat completion to `out`, with [`json_out`] (no intermediate values: this runs once
/// per request). Field order and bytes are what serde_json wrote for the former structs.
/// An embedding among the outputs is an executor bug: nothing is written and the 500 comes
/// back instead.
pub fn write_text_body<'a, I>(
    out: &mut Vec<u8>,
    shape: TextShape,
    model: &str,
    created: u64,
    id: u64,
    outputs: I,
) -> Result<(), Response>
where
    I: Iterator<Item = &'a Output> + Clone,
{
    write_choices(out, shape, model, created, id, outputs, Choices::default())
}

/// How a text body's choices are laid out: choices per prompt and log-probabilities, and
/// the prompts to echo before their choices' text.
#[derive(Clone, Copy, Debug, Default)]
pub struct Choices<'j> {
    pub options: super::stream::ChoiceOptions,
    pub echo: Option<&'j [std::sync::Arc<str>]>,
    /// The client's `X-Request-Id`: the id after the prefix instead of `id` in hex.
    pub request_id: Option<&'j str>,
}

/// [`write_text_body`] with `n` choices per prompt (a prompt's tokens count once in
/// `usage`), synthetic `logprobs`, and `echo`.
pub fn write_choices<'a, I>(
    out: &mut Vec<u8>,
    shape: TextShape,
    model: &str,
    created: u64,
    id: u64,
    outputs: I,
    choices: Choices<'_>,
) -> Result<(), Response>
where
    I: Iterator<Item = &'a Output> + Clone,
{
    let per_prompt = choices.options.per_prompt();
    // Literal runs are joined per shape so each is one copy.
    let (what, id_open, after_id) = match shape {
        TextShape::Completion => (
            "completion",
            &b"{\"id\":\"cmpl-"[..],
            &b"\",\"object\":\"text_completion\",\"created\":"[..],
        ),
        TextShape::Chat => (
            "chat completion",
            &b"{\"id\":\"chatcmpl-"[..],
            &b"\",\"object\":\"chat.completion\",\"created\":"[..],
        ),
    };
    if outputs
        .clone()
        .any(|o| matches!(o, Output::Embedding { .. }))
    {
        return Err(wrong_output(what, "an embedding"));
    }
    out.extend_from_slice(id_open);
    match choices.request_id {
        Some(rid) => {
            let quoted = serde_json::to_string(rid).unwrap_or_default();
            out.extend_from_slice(&quoted.as_bytes()[1..quoted.len().max(2) - 1]);
        }
        None => json_out::hex16(out, id),
    }
    out.extend_from_slice(after_id);
    json_out::uint(out, created);
    out.extend_from_slice(b",\"model\":");
    json_out::string(out, model);
    out.extend_from_slice(b",\"choices\":[");
    let mut prompt = 0u64;
    let mut completion = 0u64;
    // Summed like prompt tokens (once per prompt); `None` when no output reports it.
    let mut cached: Option<u64> = None;
    for (index, o) in outputs.enumerate() {
        let Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
            tool_calls,
            cached_tokens,
        } = o
        else {
            unreachable!("checked above: every output is text");
        };
        if index % per_prompt == 0 {
            prompt += u64::from(*prompt_tokens);
            if let Some(c) = cached_tokens {
                cached = Some(cached.unwrap_or(0) + u64::from(*c));
            }
        }
        completion += u64::from(*completion_tokens);
        if index > 0 {
            out.push(b',');
        }
        let echoed = choices
            .echo
            .and_then(|e| e.get(index / per_prompt))
            .map_or("", |p| &**p);
        match shape {
            TextShape::Completion => {
                out.extend_from_slice(b"{\"text\":");
                if echoed.is_empty() {
                    json_out::string(out, text);
                } else {
                    json_out::string(out, &format!("{echoed}{text}"));
                }
                out.extend_from_slice(b",\"index\":");
                json_out::uint(out, index as u64);
            }
            TextShape::Chat => {
                out.extend_from_slice(b"{\"index\":");
                json_out::uint(out, index as u64);
                out.extend_from_slice(b",\"message\":{\"role\":\"assistant\",\"content\":");
                match tool_calls {
                    // A tool call with no text: `content` is null, as OpenAI sends it.
                    Some(calls) => {
                        if text.is_empty() {
                            out.extend_from_slice(b"null");
                        } else {
                            json_out::string(out, text);
                        }
                        out.extend_from_slice(b",\"tool_calls\":");
                        out.extend_from_slice(calls.as_bytes());
                    }
                    None => json_out::string(out, text),
                }
                out.push(b'}');
            }
        }
        match choices.options.logprobs {
            None => out.extend_from_slice(b",\"logprobs\":null"),
            Some(top) => {
                out.extend_from_slice(b",\"logprobs\":");
                let pieces = super::logprobs::pieces(text);
                match shape {
                    TextShape::Completion => super::logprobs::write_completion(
                        out,
                        pieces.into_iter(),
                        echoed.len(),
                        top,
                    ),
                    TextShape::Chat => super::logprobs::write_chat(out, pieces.into_iter(), top),
                }
            }
        }
        out.extend_from_slice(match finish_reason {
            FinishReason::Length => b",\"finish_reason\":\"length\"}",
            FinishReason::Stop => b",\"finish_reason\":\"stop\"}",
            FinishReason::ToolCalls => b",\"finish_reason\":\"tool_calls\"}",
        });
    }
    out.extend_from_slice(b"],\"usage\":{\"prompt_tokens\":");
    json_out::uint(out, prompt);
    out.extend_from_slice(b",\"completion_tokens\":");
    json_out::uint(out, completion);
    out.extend_from_slice(b",\"total_tokens\":");
    json_out::uint(out, prompt + completion);
    if let Some(c) = cached {
        json_out::prompt_tokens_details(out, c);
    }
    out.extend_from_slice(b"}}");
    Ok(())
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

/// Writes the JSON body of an embeddings answer (one item per input, in order) to `out`.
/// A text output among them is an executor bug: nothing is written and the 500 comes back.
pub fn write_embedding_body<'a, I>(
    out: &mut Vec<u8>,
    model: &str,
    base64: bool,
    outputs: I,
) -> Result<(), Response>
where
    I: Iterator<Item = &'a Output>,
{
    let mut prompt = 0u64;
    let mut data = Vec::with_capacity(outputs.size_hint().0);
    for (index, out) in outputs.enumerate() {
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
                return Err(Response::error(
                    Status::InternalError,
                    "internal_error",
                    "the executor answered an embedding with text",
                ))
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
    // Writing into a Vec cannot fail, and these types always serialize.
    let _ = serde_json::to_writer(&mut *out, &body);
    Ok(())
}

/// Writes the whole HTTP response for a finished job (head and body) straight into a
/// connection's write buffer `out`, and returns its status code. `outcomes` are the job's
/// parts in request order, all answered; any error answers the whole request with that
/// error (the first one). `close` and `keep_alive_header` add the
/// `Connection` header; `head_only` leaves the body out. `route`, when the engine reported
/// one, is the `x-abe-route` header line ([`RouteHeaderCache::line`]), written also on an
/// error answer.
#[allow(clippy::too_many_arguments)] // the slot's parts, passed without a struct per call
pub fn write_job(
    job: &Job,
    outcomes: &[Option<Outcome>],
    id: u64,
    out: &mut Vec<u8>,
    close: bool,
    keep_alive_header: bool,
    head_only: bool,
    route: Option<&[u8]>,
) -> u16 {
    let route_header = |out: &mut Vec<u8>| {
        if let Some(line) = route {
            out.extend_from_slice(line);
        }
        if let Some(rid) = job.request_id() {
            response::write_request_id(out, rid);
        }
    };
    let failed = outcomes.iter().find_map(|o| match o {
        Some(Err(e)) => Some(e),
        _ => None,
    });
    let fallback = match failed {
        Some(e) => super::error_response(e),
        None => {
            let outputs = outcomes.iter().filter_map(|o| match o {
                Some(Ok(output)) => Some(output),
                _ => None,
            });
            debug_assert_eq!(
                outputs.clone().count(),
                outcomes.len(),
                "all parts answered"
            );
            // Tools and structured output: each part's shape in place of its words.
            let shaped: Option<Vec<Output>> = job.structured().map(|shapes| {
                outputs
                    .clone()
                    .zip(shapes.iter())
                    .map(|(o, shape)| shape.output(o))
                    .collect()
            });
            let written = response::write_json_ok(
                out,
                close,
                keep_alive_header,
                head_only,
                route_header,
                |body| match &shaped {
                    Some(shaped) => job_body(job, id, shaped.iter(), body),
                    None => job_body(job, id, outputs, body),
                },
            );
            match written {
                Ok(()) => return Status::Ok.code(),
                Err(r) => r,
            }
        }
    };
    let mut fallback = fallback;
    if let Some(line) = route {
        let line = line.strip_suffix(b"\r\n").unwrap_or(line);
        fallback
            .headers
            .push(String::from_utf8_lossy(line).into_owned());
    }
    if keep_alive_header {
        fallback.headers.push("Connection: keep-alive".into());
    }
    if let Some(rid) = job.request_id() {
        fallback.echo_request_id(rid);
    }
    fallback.write_to(out, close, head_only);
    fallback.status.code()
}

/// The body of a finished text or embedding job, from its outputs in part order.
fn job_body<'a, I>(job: &Job, id: u64, outputs: I, body: &mut Vec<u8>) -> Result<(), Response>
where
    I: Iterator<Item = &'a Output> + Clone,
{
    match job.kind {
        JobKind::Completion => write_choices(
            body,
            TextShape::Completion,
            &job.model,
            job.created_unix,
            id,
            outputs,
            Choices {
                options: job.choices,
                echo: job.echo(),
                request_id: job.request_id().map(|r| &**r),
            },
        ),
        JobKind::Chat => write_choices(
            body,
            TextShape::Chat,
            &job.model,
            job.created_unix,
            id,
            outputs,
            Choices {
                options: job.choices,
                echo: None,
                request_id: job.request_id().map(|r| &**r),
            },
        ),
        JobKind::Embedding { base64 } => write_embedding_body(body, &job.model, base64, outputs),
        JobKind::Response { .. } => {
            let (Some(meta), Some(output)) = (job.response(), outputs.clone().next()) else {
                return Err(wrong_output("response", "nothing"));
            };
            body.extend_from_slice(super::response_object::finish(meta, output).as_bytes());
            Ok(())
        }
    }
}

/// Appends the `x-abe-route` header line (with its CRLF) saying where the engine routed a
/// request, e.g. `x-abe-route: backend=gpu-a; model=llama3:8b; via=direct`.
pub fn write_route_header(
    out: &mut Vec<u8>,
    router: &crate::router::Router,
    decision: &crate::router::Decision,
) {
    out.extend_from_slice(ROUTE_HEADER.as_bytes());
    out.extend_from_slice(b": ");
    router.describe(decision).write_to(out);
    out.extend_from_slice(b"\r\n");
}

/// The response header naming the backend that served a routed request.
pub const ROUTE_HEADER: &str = "x-abe-route";

/// The `x-abe-route` header line (with its CRLF) of the last routing decision an io thread
/// wrote, rendered once and copied into every response routed the same way (most are: one
/// backend, one model). Rendering it walked the router's name tables for every response,
/// ~200 instructions a request (BENCHMARKS.md, "The hot path again"). The io thread clears
/// it when it takes a new router copy, whose ids may name other backends.
#[derive(Debug, Default)]
pub struct RouteHeaderCache {
    key: Option<(
        crate::router::BackendId,
        crate::router::ModelId,
        crate::router::Via,
    )>,
    line: Vec<u8>,
}

impl RouteHeaderCache {
    /// Forgets the line: the router it was rendered from is no longer the io thread's.
    pub fn clear(&mut self) {
        self.key = None;
    }

    /// The header line for decision `d` of `router`, rendered when the decision differs
    /// from the last one's backend, model or route (its `work` does not show).
    pub fn line(&mut self, router: &crate::router::Router, d: &crate::router::Decision) -> &[u8] {
        let key = (d.backend, d.model, d.via);
        if self.key != Some(key) {
            self.line.clear();
            write_route_header(&mut self.line, router, d);
            self.key = Some(key);
        }
        &self.line
    }
}

/// `GET /v1/models`.
/// `adapters`: the LoRA adapters' cards (`api::lora::model_cards`), listed after the models.
pub fn models(router: &crate::router::Router, adapters: Vec<serde_json::Value>) -> Response {
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
                Routable::Served => {
                    // vLLM's base model card: its own root, no parent.
                    m["root"] = name.into();
                    m["parent"] = serde_json::Value::Null;
                }
                Routable::Alias { target } => m["abe_alias_of"] = target.into(),
                Routable::FallbackOnly => m["abe_fallback_only"] = true.into(),
            }
            m
        })
        .chain(adapters)
        .collect();
    let body = serde_json::json!({ "object": "list", "data": data });
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Whole responses for one body, as the tests read them (the server writes bodies
    // straight into a connection's buffer with `write_job`).
    fn text_response(
        shape: TextShape,
        model: &str,
        created: u64,
        id: u64,
        outputs: &[Output],
    ) -> Response {
        let mut body = Vec::with_capacity(256);
        match write_text_body(&mut body, shape, model, created, id, outputs.iter()) {
            Ok(()) => Response::json(Status::Ok, body),
            Err(r) => r,
        }
    }

    /// `POST /v1/completions` answer: one choice per prompt, in order.
    fn completion(model: &str, created: u64, id: u64, outputs: &[Output]) -> Response {
        text_response(TextShape::Completion, model, created, id, outputs)
    }

    /// `POST /v1/chat/completions` answer: one assistant message.
    fn chat_completion(model: &str, created: u64, id: u64, outputs: &[Output]) -> Response {
        text_response(TextShape::Chat, model, created, id, outputs)
    }

    /// `POST /v1/embeddings` answer: one item per input, in order.
    fn embedding(model: &str, base64: bool, outputs: &[Output]) -> Response {
        let mut body = Vec::new();
        match write_embedding_body(&mut body, model, base64, outputs.iter()) {
            Ok(()) => Response::json(Status::Ok, body),
            Err(r) => r,
        }
    }

    #[test]
    fn completion_has_one_choice_per_output_and_summed_usage() {
        let outs = vec![
            Output::Text {
                text: "a b".into(),
                prompt_tokens: 3,
                completion_tokens: 2,
                finish_reason: FinishReason::Length,
                tool_calls: None,
                cached_tokens: None,
            },
            Output::Text {
                text: "c".into(),
                prompt_tokens: 1,
                completion_tokens: 1,
                finish_reason: FinishReason::Stop,
                tool_calls: None,
                cached_tokens: None,
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
    fn text_bodies_have_the_openai_fields_and_escape_tricky_text() {
        let tricky = "quote \" backslash \\ nl \n nul \u{0} é 日本 🙂 \u{2028}";
        let outs = vec![Output::Text {
            text: tricky.into(),
            prompt_tokens: 4,
            completion_tokens: 9,
            finish_reason: FinishReason::Stop,
            tool_calls: None,
            cached_tokens: None,
        }];
        let r = completion("m\"x", 1_700_000_000, 0xab, &outs);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "id": "cmpl-00000000000000ab",
                "object": "text_completion",
                "created": 1_700_000_000u64,
                "model": "m\"x",
                "choices": [{"text": tricky, "index": 0, "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
            })
        );
        let r = chat_completion("m", 5, 1, &outs);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "id": "chatcmpl-0000000000000001",
                "object": "chat.completion",
                "created": 5,
                "model": "m",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": tricky},
                    "logprobs": null,
                    "finish_reason": "stop",
                }],
                "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
            })
        );
        // Field order as serde_json wrote it for the former structs.
        let plain = vec![Output::Text {
            text: "hi".into(),
            prompt_tokens: 1,
            completion_tokens: 1,
            finish_reason: FinishReason::Length,
            tool_calls: None,
            cached_tokens: None,
        }];
        let r = completion("abe-sim", 7, 1, &plain);
        assert_eq!(
            std::str::from_utf8(&r.body).unwrap(),
            r#"{"id":"cmpl-0000000000000001","object":"text_completion","created":7,"model":"abe-sim","choices":[{"text":"hi","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#
        );
        let vector = vec![Output::Embedding {
            vector: vec![1.0],
            prompt_tokens: 1,
        }];
        assert_eq!(completion("m", 0, 0, &vector).status, Status::InternalError);
        assert_eq!(embedding("m", false, &plain).status, Status::InternalError);
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
