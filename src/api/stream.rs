//! Server-Sent Events for `stream: true` on completions and chat completions: OpenAI's
//! chunk shapes (`text_completion` chunks, `chat.completion.chunk` with `delta`), an optional
//! usage chunk (`stream_options.include_usage`), then `data: [DONE]`.
//!
//! In request-level batching a request's tokens all arrive when its batch completes, so the
//! whole stream is rendered at once; each event is one chunk of the chunked response. The
//! event shapes do not depend on that: an iteration-level engine can emit them token by
//! token. Runs on io threads only.

use crate::exec::Output;
use serde_json::json;

/// Streaming options from the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`) before `[DONE]`.
    pub include_usage: bool,
}

/// Which chunk shape to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Completion,
    Chat,
}

/// Splits generated text into the pieces streamed as tokens: each word with the space
/// before it (the synthetic model emits one word per token), so the pieces concatenate back
/// to the text exactly.
pub fn token_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let start = usize::from(rest.starts_with(' '));
        let end = rest[start..]
            .find(' ')
            .map(|i| i + start)
            .unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

fn event(out: &mut Vec<Vec<u8>>, value: &serde_json::Value) {
    let mut e = b"data: ".to_vec();
    e.extend_from_slice(value.to_string().as_bytes());
    e.extend_from_slice(b"\n\n");
    out.push(e);
}

/// Every SSE event of a finished stream, in order, one `Vec` per event.
pub fn events(
    kind: StreamKind,
    model: &str,
    created: u64,
    id: u64,
    outputs: &[Output],
    opts: StreamOptions,
) -> Vec<Vec<u8>> {
    let (id, object) = match kind {
        StreamKind::Completion => (format!("cmpl-{id:016x}"), "text_completion"),
        StreamKind::Chat => (format!("chatcmpl-{id:016x}"), "chat.completion.chunk"),
    };
    let chunk = |choices: serde_json::Value| json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
    let mut out = Vec::new();
    let mut prompt_tokens = 0u64;
    let mut completion_tokens = 0u64;
    for (index, o) in outputs.iter().enumerate() {
        let Output::Text {
            text,
            prompt_tokens: p,
            completion_tokens: c,
            finish_reason,
        } = o
        else {
            continue;
        };
        prompt_tokens += u64::from(*p);
        completion_tokens += u64::from(*c);
        match kind {
            StreamKind::Completion => {
                for piece in token_pieces(text) {
                    event(
                        &mut out,
                        &chunk(
                            json!([{"text": piece, "index": index, "logprobs": null, "finish_reason": null}]),
                        ),
                    );
                }
                event(
                    &mut out,
                    &chunk(
                        json!([{"text": "", "index": index, "logprobs": null, "finish_reason": finish_reason.as_str()}]),
                    ),
                );
            }
            StreamKind::Chat => {
                event(
                    &mut out,
                    &chunk(
                        json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                    ),
                );
                for piece in token_pieces(text) {
                    event(
                        &mut out,
                        &chunk(
                            json!([{"index": index, "delta": {"content": piece}, "logprobs": null, "finish_reason": null}]),
                        ),
                    );
                }
                event(
                    &mut out,
                    &chunk(
                        json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": finish_reason.as_str()}]),
                    ),
                );
            }
        }
    }
    if opts.include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        });
        event(&mut out, &last);
    }
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::FinishReason;

    fn out(text: &str) -> Output {
        Output::Text {
            text: text.into(),
            prompt_tokens: 2,
            completion_tokens: text.split(' ').count() as u32,
            finish_reason: FinishReason::Length,
        }
    }

    #[test]
    fn token_pieces_concatenate_back_to_the_text() {
        let pieces: Vec<&str> = token_pieces("the quick fox").collect();
        assert_eq!(pieces, vec!["the", " quick", " fox"]);
        assert_eq!(pieces.concat(), "the quick fox");
        assert_eq!(token_pieces("").count(), 0);
    }

    #[test]
    fn chat_stream_has_role_deltas_finish_usage_and_done() {
        let e = events(
            StreamKind::Chat,
            "m",
            1,
            7,
            &[out("a b")],
            StreamOptions {
                include_usage: true,
            },
        );
        let texts: Vec<String> = e
            .iter()
            .map(|b| String::from_utf8(b.clone()).unwrap())
            .collect();
        assert_eq!(texts.len(), 6, "{texts:?}"); // role, a, b, finish, usage, DONE
        assert!(texts[0].contains(r#""role":"assistant""#));
        assert!(texts[1].contains(r#""content":"a""#));
        assert!(texts[2].contains(r#""content":" b""#));
        assert!(texts[3].contains(r#""finish_reason":"length""#));
        assert!(texts[4].contains(r#""total_tokens":4"#) && texts[4].contains(r#""choices":[]"#));
        assert_eq!(texts[5], "data: [DONE]\n\n");
        for t in &texts {
            assert!(t.starts_with("data: ") && t.ends_with("\n\n"));
        }
    }

    #[test]
    fn completion_stream_without_usage_ends_with_finish_and_done() {
        let e = events(
            StreamKind::Completion,
            "m",
            1,
            7,
            &[out("x y z")],
            StreamOptions::default(),
        );
        assert_eq!(e.len(), 5); // x, y, z, finish, DONE
        let finish = String::from_utf8(e[3].clone()).unwrap();
        assert!(finish.contains(r#""object":"text_completion""#));
        assert!(finish.contains(r#""finish_reason":"length""#));
    }
}
