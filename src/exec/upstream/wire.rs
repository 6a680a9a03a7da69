//! OpenAI wire format as the upstream executor speaks it: request bodies built from
//! [`Work`](crate::exec::Work) and the response shapes parsed back (completions, chat,
//! embeddings, stream chunks), plus splitting a batch's usage between its requests.
//!
//! What must never happen here: I/O of any kind, or a panic on a backend's bytes (every
//! unexpected shape is an `Err(String)` naming the offending field).

use crate::exec::{FinishReason, Work};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use smallvec::SmallVec;
use std::borrow::Cow;

/// The /v1/completions body for `works` (one or more requests sharing model and sampling
/// parameters; the first one's are used). One request sends `prompt` as a string, which
/// every backend accepts; several send an array.
pub(super) fn completions_body(model: &str, works: &[&Work], stream: bool) -> String {
    debug_assert!(!works.is_empty());
    let sampling = &works[0].sampling;
    let body = CompletionsBody {
        model,
        prompt: match works {
            [one] => Prompt::One(&one.prompt),
            _ => Prompt::Many(works),
        },
        max_tokens: works[0].max_tokens,
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        seed: sampling.seed,
        stop: sampling.stop.as_deref().filter(|s| !s.is_empty()),
        stream,
    };
    // Serializing plain fields and strings to a String cannot fail.
    serde_json::to_string(&body).unwrap_or_default()
}

/// The /v1/completions body, written straight from the requests (no JSON tree built).
#[derive(Serialize)]
struct CompletionsBody<'a> {
    model: &'a str,
    prompt: Prompt<'a>,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [String]>,
    stream: bool,
}

/// One prompt as a string, several as an array.
enum Prompt<'a> {
    One(&'a str),
    Many(&'a [&'a Work]),
}

impl Serialize for Prompt<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Prompt::One(p) => s.serialize_str(p),
            Prompt::Many(works) => s.collect_seq(works.iter().map(|w| &*w.prompt)),
        }
    }
}

/// The /v1/embeddings body for `inputs`; `dimensions` is sent only when non-zero.
pub(super) fn embeddings_body(model: &str, inputs: &[&str], dimensions: u32) -> String {
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("input".into(), json!(inputs));
    body.insert("encoding_format".into(), "float".into());
    if dimensions != 0 {
        body.insert("dimensions".into(), dimensions.into());
    }
    Value::Object(body).to_string()
}

/// The client's chat body with `model` replaced, `stream` forced, and `stream_options`
/// dropped (abe does not ask the backend for a usage chunk; several backends reject
/// `stream_options` without `stream`), and whether the backend is asked to stream: not when
/// the request offers tools (a streamed answer's tool calls come in fragments abe does not
/// reassemble; the whole answer is relayed to a streaming client at the end instead).
pub(super) fn chat_body(
    original: &str,
    model: &str,
    stream: bool,
) -> Result<(String, bool), String> {
    let mut v: Value = serde_json::from_str(original)
        .map_err(|e| format!("the client's chat body is not JSON: {e}"))?;
    let body = v
        .as_object_mut()
        .ok_or("the client's chat body is not a JSON object")?;
    let has_tools = body
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let stream = stream && !has_tools;
    body.insert("model".into(), model.into());
    body.insert("stream".into(), stream.into());
    body.remove("stream_options");
    Ok((v.to_string(), stream))
}

/// Token counts a backend reports.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub(super) struct BackendUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: Option<u32>,
}

/// One generated text.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Choice {
    /// Which prompt of the request it answers.
    pub index: usize,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Chat: the message's non-empty `tool_calls` array, as JSON text.
    pub tool_calls: Option<Box<str>>,
}

/// A parsed /v1/completions or /v1/chat/completions answer.
#[derive(Debug)]
pub(super) struct TextResponse {
    pub choices: Vec<Choice>,
    pub usage: Option<BackendUsage>,
}

/// A parsed /v1/embeddings answer.
#[derive(Debug)]
pub(super) struct EmbeddingsResponse {
    /// (input index, vector).
    pub data: Vec<(usize, Vec<f32>)>,
    pub usage: Option<BackendUsage>,
}

/// OpenAI's name to abe's: "length" is the only way to run out, "tool_calls" is relayed;
/// "stop", "eos", "content_filter" or none all mean the output ended by itself.
pub(super) fn finish_reason(name: Option<&str>) -> FinishReason {
    match name {
        Some("length") => FinishReason::Length,
        Some("tool_calls") => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

/// `body` as a `T`, or where it is not one. Parsed plainly first (the usual case); only a
/// body that fails is parsed again to name the offending field.
fn parse<'de, T: Deserialize<'de>>(body: &'de str) -> Result<T, String> {
    if let Ok(parsed) = serde_json::from_str(body) {
        return Ok(parsed);
    }
    let mut de = serde_json::Deserializer::from_str(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        format!("unexpected JSON at `{path}`: {}", e.inner())
    })
}

#[derive(Deserialize)]
struct RawCompletions<'a> {
    /// One choice, the usual answer to a request forwarded alone, stays inline.
    #[serde(borrow)]
    choices: SmallVec<[RawCompletionChoice<'a>; 1]>,
    #[serde(default)]
    usage: Option<BackendUsage>,
}

#[derive(Deserialize)]
struct RawCompletionChoice<'a> {
    #[serde(default)]
    index: Option<usize>,
    text: String,
    /// Borrowed from the body unless it has escapes (then copied).
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

/// A /v1/completions answer; a choice without `index` answers the prompt at its position.
pub(super) fn parse_completions(body: &str) -> Result<TextResponse, String> {
    let raw: RawCompletions = parse(body)?;
    let choices = raw
        .choices
        .into_iter()
        .enumerate()
        .map(|(k, c)| Choice {
            index: c.index.unwrap_or(k),
            text: c.text,
            finish_reason: finish_reason(c.finish_reason.as_deref()),
            tool_calls: None,
        })
        .collect();
    Ok(TextResponse {
        choices,
        usage: raw.usage,
    })
}

#[derive(Deserialize)]
struct RawChat {
    choices: Vec<RawChatChoice>,
    #[serde(default)]
    usage: Option<BackendUsage>,
}

#[derive(Deserialize)]
struct RawChatChoice {
    message: RawMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Value>,
}

/// A /v1/chat/completions answer: the first choice's message content.
pub(super) fn parse_chat(body: &str) -> Result<TextResponse, String> {
    let raw: RawChat = parse(body)?;
    let first = raw
        .choices
        .into_iter()
        .next()
        .ok_or("the answer has no choices")?;
    let tool_calls = first
        .message
        .tool_calls
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .map(|t| t.to_string().into_boxed_str());
    let mut finish = finish_reason(first.finish_reason.as_deref());
    if tool_calls.is_some() && finish == FinishReason::Stop {
        // Some servers say "stop" with tool calls; OpenAI says "tool_calls".
        finish = FinishReason::ToolCalls;
    }
    Ok(TextResponse {
        choices: vec![Choice {
            index: 0,
            text: first.message.content.unwrap_or_default(),
            finish_reason: finish,
            tool_calls,
        }],
        usage: raw.usage,
    })
}

#[derive(Deserialize)]
struct RawEmbeddings {
    data: Vec<RawEmbedding>,
    #[serde(default)]
    usage: Option<BackendUsage>,
}

#[derive(Deserialize)]
struct RawEmbedding {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

/// A /v1/embeddings answer (float encoding); an entry without `index` answers the input at
/// its position.
pub(super) fn parse_embeddings(body: &str) -> Result<EmbeddingsResponse, String> {
    let raw: RawEmbeddings = parse(body)?;
    let data = raw
        .data
        .into_iter()
        .enumerate()
        .map(|(k, d)| (d.index.unwrap_or(k), d.embedding))
        .collect();
    Ok(EmbeddingsResponse {
        data,
        usage: raw.usage,
    })
}

/// One `data:` event of a stream.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Chunk {
    /// The next piece of text (empty pieces, such as chat's first `{"role":"assistant"}`
    /// delta, are `None`).
    pub text: Option<String>,
    pub finish_reason: Option<FinishReason>,
    pub usage: Option<BackendUsage>,
}

#[derive(Deserialize)]
struct RawChunk {
    #[serde(default)]
    choices: Vec<RawChunkChoice>,
    #[serde(default)]
    usage: Option<BackendUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct RawChunkChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<RawDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawDelta {
    #[serde(default)]
    content: Option<String>,
}

/// What went wrong with a stream chunk.
#[derive(Debug, PartialEq)]
pub(super) enum ChunkError {
    /// The backend reported an error inside the stream (its message).
    Upstream(String),
    /// The chunk is not the expected shape.
    Invalid(String),
}

/// One stream event's JSON: `choices[0].text` (completions) or `choices[0].delta.content`
/// (chat), the finish reason once it is set, and usage if the backend sends it.
pub(super) fn parse_chunk(data: &str, chat: bool) -> Result<Chunk, ChunkError> {
    let raw: RawChunk = parse(data).map_err(ChunkError::Invalid)?;
    if let Some(error) = raw.error {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .map_or_else(|| error.to_string(), str::to_string);
        return Err(ChunkError::Upstream(message));
    }
    let mut chunk = Chunk {
        usage: raw.usage,
        ..Chunk::default()
    };
    if let Some(choice) = raw.choices.into_iter().next() {
        let text = if chat {
            choice.delta.and_then(|d| d.content)
        } else {
            choice.text
        };
        chunk.text = text.filter(|t| !t.is_empty());
        chunk.finish_reason = choice
            .finish_reason
            .as_deref()
            .map(|f| finish_reason(Some(f)));
    }
    Ok(chunk)
}

/// Splits `total` between requests in proportion to `weights` (each at least 1), so the
/// shares add up to `total` exactly: floors first, the remainder to the largest remainders.
pub(super) fn split_proportional(total: u32, weights: &[u32]) -> Vec<u32> {
    if weights.is_empty() {
        return Vec::new();
    }
    let weights: Vec<u64> = weights.iter().map(|&w| u64::from(w.max(1))).collect();
    let sum: u64 = weights.iter().sum();
    let total = u64::from(total);
    let mut shares: Vec<u64> = weights.iter().map(|w| total * w / sum).collect();
    let mut left = total - shares.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    // Largest remainder first; ties to the earlier request, so the split is deterministic.
    order.sort_by_key(|&k| std::cmp::Reverse(total * weights[k] % sum));
    for &k in order.iter().cycle() {
        if left == 0 {
            break;
        }
        shares[k] += 1;
        left -= 1;
    }
    debug_assert_eq!(shares.iter().sum::<u64>(), total);
    // Each share is at most `total`, which came from a u32.
    shares.into_iter().map(|s| s as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn work(prompt: &str) -> Work {
        Work {
            prompt: prompt.into(),
            max_tokens: 5,
            ..Work::default()
        }
    }

    #[test]
    fn completions_body_uses_a_string_for_one_prompt_and_an_array_for_several() {
        let mut a = work("a");
        a.sampling.temperature = Some(0.5);
        a.sampling.seed = Some(7);
        a.sampling.stop = Some(Arc::from(vec!["\n".to_string()]));
        let b = work("b");
        let one: Value = serde_json::from_str(&completions_body("m", &[&a], false)).unwrap();
        assert_eq!(one["prompt"], "a");
        assert_eq!(one["model"], "m");
        assert_eq!(one["temperature"], 0.5);
        assert_eq!(one["seed"], 7);
        assert_eq!(one["stop"], json!(["\n"]));
        assert_eq!(one["stream"], false);
        assert!(one.get("top_p").is_none());
        let two: Value = serde_json::from_str(&completions_body("m", &[&a, &b], true)).unwrap();
        assert_eq!(two["prompt"], json!(["a", "b"]));
        assert_eq!(two["stream"], true);
    }

    #[test]
    fn embeddings_body_sends_dimensions_only_when_asked() {
        let v: Value = serde_json::from_str(&embeddings_body("e", &["x", "y"], 0)).unwrap();
        assert_eq!(v["input"], json!(["x", "y"]));
        assert_eq!(v["encoding_format"], "float");
        assert!(v.get("dimensions").is_none());
        let v: Value = serde_json::from_str(&embeddings_body("e", &["x"], 16)).unwrap();
        assert_eq!(v["dimensions"], 16);
    }

    #[test]
    fn chat_body_replaces_model_and_stream() {
        let original = r#"{"model":"alias","messages":[{"role":"user","content":"hi"}],
            "stream":true,"stream_options":{"include_usage":true},"tools":[]}"#;
        let (body, stream) = chat_body(original, "real", false).unwrap();
        assert!(!stream);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["model"], "real");
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["tools"], json!([]));
        // Empty tools: streams as asked; tools offered: asked whole.
        assert!(chat_body(original, "real", true).unwrap().1);
        let tools = r#"{"messages":[],"tools":[{"type":"function"}],"stream":true}"#;
        let (body, stream) = chat_body(tools, "real", true).unwrap();
        assert!(!stream);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["stream"],
            false
        );
        assert!(chat_body("[1]", "m", false).is_err());
        assert!(chat_body("{", "m", false).is_err());
    }

    #[test]
    fn completions_map_choices_by_index() {
        let body = r#"{"choices":[{"index":1,"text":"B","finish_reason":"length"},
            {"index":0,"text":"A","finish_reason":"stop"}],
            "usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}"#;
        let r = parse_completions(body).unwrap();
        assert_eq!(r.choices[0].index, 1);
        assert_eq!(r.choices[0].finish_reason, FinishReason::Length);
        assert_eq!(r.choices[1].text, "A");
        assert_eq!(r.usage.unwrap().completion_tokens, Some(6));
        let err = parse_completions(r#"{"choices":[{"text":null}]}"#).unwrap_err();
        assert!(err.contains("choices[0].text"), "{err}");
    }

    #[test]
    fn chat_takes_the_first_message_and_keeps_tool_calls() {
        let r = parse_chat(r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}"#)
            .unwrap();
        assert_eq!(r.choices[0].text, "hi");
        assert_eq!(r.choices[0].tool_calls, None);
        assert!(parse_chat(r#"{"choices":[]}"#).is_err());
        let tool = r#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}]}"#;
        let r = parse_chat(tool).unwrap();
        assert_eq!(r.choices[0].text, "");
        assert_eq!(r.choices[0].finish_reason, FinishReason::ToolCalls);
        let calls: Value =
            serde_json::from_str(r.choices[0].tool_calls.as_deref().unwrap()).unwrap();
        assert_eq!(calls[0]["function"]["name"], "f");
    }

    #[test]
    fn stream_chunks() {
        let c = parse_chunk(
            r#"{"choices":[{"index":0,"text":"ab","finish_reason":null}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(c.text.as_deref(), Some("ab"));
        assert_eq!(c.finish_reason, None);
        let c = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, true).unwrap();
        assert_eq!(c.text, None);
        let c = parse_chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"length"}],"usage":null}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.finish_reason, Some(FinishReason::Length));
        let e = parse_chunk(r#"{"error":{"message":"overloaded"}}"#, true).unwrap_err();
        assert_eq!(e, ChunkError::Upstream("overloaded".into()));
        assert!(matches!(
            parse_chunk("nope", true),
            Err(ChunkError::Invalid(_))
        ));
    }

    #[test]
    fn split_adds_up() {
        assert_eq!(split_proportional(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split_proportional(10, &[1, 3]), vec![3, 7]);
        assert_eq!(split_proportional(1, &[1, 1, 1]), vec![1, 0, 0]);
        assert_eq!(split_proportional(0, &[0, 5]), vec![0, 0]);
        assert_eq!(split_proportional(7, &[]), Vec::<u32>::new());
        let s = split_proportional(u32::MAX, &[u32::MAX, 1, 2]);
        assert_eq!(
            s.iter().map(|&x| u64::from(x)).sum::<u64>(),
            u64::from(u32::MAX)
        );
    }
}
