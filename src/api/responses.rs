//! OpenAI's Responses API as vLLM serves it, the request side: `POST /v1/responses` (text
//! `input` or a list of messages, optional `instructions`) decoded into one engine request,
//! like a chat completion: the prompt is the rendered conversation, `max_output_tokens` its
//! max tokens; `text.format` (`json_object`, `json_schema`) makes the output schema-valid
//! JSON, through [`super::structured`] as chat's `response_format` does;
//! `previous_response_id` puts a stored response's input and output before the new input.
//! The response object and its store are in [`super::response_object`]; the
//! stream's events in [`super::stream`].
//!
//! What must never happen here: a stored answer for a request that asked `store: false`.

use super::response_object::{ResponseMeta, ResponseStore};
use super::wire::{self, body_error, parse_body, Content, ContentPart, Message};
use super::{Decoder, Job, JobKind, Routed};
use crate::http::parse::Head;
use crate::runtime::Request;
use std::sync::Arc;

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
    /// `text.format`: `text`, `json_object`, or `json_schema` (`name`, `schema`, `strict`).
    text: Option<TextParam>,
    /// Refused when not empty: abe does not answer tools here yet.
    tools: Option<Vec<serde_json::Value>>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct TextParam {
    format: Option<serde_json::Value>,
}

/// What `text.format` asks of the output: a plan for [`super::structured`] (`None`: plain
/// text) and the format as the response object repeats it.
fn text_format(
    text: Option<TextParam>,
) -> Result<(Option<super::structured::Plan>, serde_json::Value), wire::BodyError> {
    let Some(format) = text.and_then(|t| t.format) else {
        return Ok((None, serde_json::json!({"type": "text"})));
    };
    let invalid = |m: &str| body_error("invalid_value", m.to_string());
    let rf = match format.get("type").and_then(serde_json::Value::as_str) {
        Some("text") => return Ok((None, format)),
        Some("json_object") => wire::ResponseFormat {
            kind: Some("json_object".into()),
            json_schema: None,
        },
        Some("json_schema") => {
            let schema = format
                .get("schema")
                .ok_or_else(|| invalid("'text.format.schema' is required with type json_schema"))?;
            // Chat's shape: {"json_schema": {"schema": ...}}.
            wire::ResponseFormat {
                kind: Some("json_schema".into()),
                json_schema: Some(serde_json::json!({ "schema": schema })),
            }
        }
        _ => {
            return Err(invalid(
                "'text.format.type' must be 'text', 'json_object' or 'json_schema'",
            ))
        }
    };
    let plan = super::structured::plan(&super::structured::Asks {
        response_format: Some(&rf),
        ..Default::default()
    })?;
    Ok((plan, format))
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
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(super::bad(body_error(
            "unsupported_value",
            "'tools' in /v1/responses is not supported by abe yet; send tools to \
             /v1/chat/completions",
        )));
    }
    let input = b.input.ok_or_else(|| {
        super::bad(body_error(
            "missing_field",
            "missing required field 'input'",
        ))
    })?;
    // A previous response's input and output come first (its instructions do not carry
    // over, as OpenAI's); an id not kept is a 404, as OpenAI answers.
    let mut conversation: Vec<Message> = match &b.previous_response_id {
        None => Vec::new(),
        Some(id) => match ctx.responses.and_then(|s| s.conversation(id)) {
            Some(c) => c.to_vec(),
            None => {
                return Err(Routed::Now(crate::http::response::Response::error(
                    crate::http::response::Status::NotFound,
                    "previous_response_not_found",
                    format!(
                        "Previous response with id '{id}' not found (not stored, or no \
                         longer: abe keeps the newest {} answers and {} MiB of them)",
                        super::response_object::STORE_MAX,
                        super::response_object::STORE_MAX_BYTES >> 20
                    ),
                )))
            }
        },
    };
    conversation.extend(messages(None, input).map_err(super::bad)?);
    let mut msgs = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &b.instructions {
        msgs.push(Message {
            role: "system".into(),
            content: Some(Content::Text(i.clone())),
        });
    }
    msgs.extend(conversation.iter().cloned());
    let (plan, format) = text_format(b.text).map_err(super::bad)?;
    let explicit_max = b.max_output_tokens.is_some();
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
    let model = super::job_model(ctx, super::model_of(ctx, b.model.as_deref()));
    let route = super::check_model(ctx, &model, |r| {
        for m in &msgs {
            if let Some(Content::Text(t)) = &m.content {
                r.text(t);
            }
        }
    })?;
    let prompt = super::chat::render_prompt(Some(msgs)).map_err(super::bad)?;
    super::check_model_len(ctx, &prompt, &text)?;
    let mut work = text.work(prompt.into(), None);
    super::name_prompt_blocks(ctx, &mut work, route.need.adapter);
    let meta = ResponseMeta {
        id: format!("resp_{}", fresh_hex()),
        message_id: format!("msg_{}", fresh_hex()),
        model: model.to_string(),
        created_at: super::unix_now(),
        instructions: b.instructions,
        max_output_tokens: b.max_output_tokens.map(|n| n as u32),
        temperature: b.temperature.unwrap_or(1.0),
        top_p: b.top_p.unwrap_or(1.0),
        text_format: format,
        previous_response_id: b.previous_response_id,
        // Kept only for the store.
        conversation: if b.store != Some(false) {
            conversation
        } else {
            Vec::new()
        },
        // Attached by `attach_store` when `store` is not false.
        store: None,
    };
    let store = b.store != Some(false);
    let created_at = meta.created_at;
    let mut requests = vec![Request {
        priority: text.priority,
        route: Some(route),
        work,
    }];
    let structured = super::shape_parts(ctx, plan.as_ref(), &mut requests, explicit_max)?;
    let mut job = Job::new(JobKind::Response { store }, model, requests)
        .with_stream(text.stream)
        .with_request_id(head.request_id.as_deref())
        .with_structured(structured);
    job.created_unix = created_at;
    job.extras_mut().response = Some(Arc::new(meta));
    Ok(Routed::Submit(job))
}

/// Gives a response job that asked for `store` the server's store.
pub fn attach_store(store: &Arc<ResponseStore>, routed: &mut Routed) {
    if let Routed::Submit(job) = routed {
        let stored = matches!(job.kind, JobKind::Response { store: true });
        let meta = job.extras.as_mut().and_then(|x| x.response.as_mut());
        if let (true, Some(meta)) = (stored, meta) {
            if let Some(m) = Arc::get_mut(meta) {
                m.store = Some(store.clone());
            }
        }
    }
}
