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

/// Appends `payload` as one HTTP/1.1 chunk.
fn chunk(out: &mut Vec<u8>, payload: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "{:x}\r\n", payload.len());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Appends one SSE event (`data: <json>\n\n`) as one chunk.
fn event(out: &mut Vec<u8>, value: &serde_json::Value) {
    let mut e = b"data: ".to_vec();
    e.extend_from_slice(value.to_string().as_bytes());
    e.extend_from_slice(b"\n\n");
    chunk(out, &e);
}

/// Where one choice of a stream is.
#[derive(Clone, Copy, Debug, Default)]
struct PartState {
    /// Bytes of the choice's text already streamed (a piece is kept only if it starts here).
    sent_bytes: usize,
    /// Chat: the role delta went out.
    role_sent: bool,
}

/// Writes one stream's events, token by token or all at the end, as HTTP/1.1 chunks.
#[derive(Debug)]
pub struct StreamWriter {
    kind: StreamKind,
    opts: StreamOptions,
    id: String,
    object: &'static str,
    model: String,
    created: u64,
    parts: Vec<PartState>,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// Anything (a token or a finish) was written.
    started: bool,
}

impl StreamWriter {
    /// A writer for `parts` choices.
    pub fn new(
        kind: StreamKind,
        opts: StreamOptions,
        model: &str,
        created: u64,
        id: u64,
        parts: usize,
    ) -> StreamWriter {
        let (id, object) = match kind {
            StreamKind::Completion => (format!("cmpl-{id:016x}"), "text_completion"),
            StreamKind::Chat => (format!("chatcmpl-{id:016x}"), "chat.completion.chunk"),
        };
        StreamWriter {
            kind,
            opts,
            id,
            object,
            model: model.to_string(),
            created,
            parts: vec![PartState::default(); parts],
            prompt_tokens: 0,
            completion_tokens: 0,
            started: false,
        }
    }

    /// True once any event was written (after that, errors go in the stream).
    pub fn started(&self) -> bool {
        self.started
    }

    fn chunk_json(&self, choices: serde_json::Value) -> serde_json::Value {
        json!({"id": self.id, "object": self.object, "created": self.created,
               "model": self.model, "choices": choices})
    }

    fn piece(&mut self, part: usize, piece: &str, out: &mut Vec<u8>) {
        self.started = true;
        match self.kind {
            StreamKind::Completion => {
                let c = self.chunk_json(json!([{"text": piece, "index": part,
                    "logprobs": null, "finish_reason": null}]));
                event(out, &c);
            }
            StreamKind::Chat => {
                if !self.parts[part].role_sent {
                    self.parts[part].role_sent = true;
                    let c = self.chunk_json(json!([{"index": part,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null}]));
                    event(out, &c);
                }
                let c = self.chunk_json(json!([{"index": part, "delta": {"content": piece},
                    "logprobs": null, "finish_reason": null}]));
                event(out, &c);
            }
        }
        self.parts[part].sent_bytes += piece.len();
    }

    /// Text of choice `part` starting at byte `offset` of its output; kept only if it
    /// continues exactly where the stream stands (a repeat or a gap waits for the finish).
    pub fn token(&mut self, part: usize, offset: u32, text: &str, out: &mut Vec<u8>) {
        if self
            .parts
            .get(part)
            .is_none_or(|p| p.sent_bytes != offset as usize)
            || text.is_empty()
        {
            return;
        }
        self.piece(part, text, out);
    }

    /// Choice `part` is complete: streams whatever of its text did not go out token by
    /// token, then its finish chunk.
    pub fn finish_part(&mut self, part: usize, output: &Output, out: &mut Vec<u8>) {
        let Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
        } = output
        else {
            return;
        };
        self.prompt_tokens += u64::from(*prompt_tokens);
        self.completion_tokens += u64::from(*completion_tokens);
        let sent = self.parts[part].sent_bytes.min(text.len());
        let rest = text.get(sent..).unwrap_or("");
        for piece in token_pieces(rest) {
            self.piece(part, piece, out);
        }
        if self.kind == StreamKind::Chat && !self.parts[part].role_sent {
            self.piece(part, "", out);
        }
        let finish = match self.kind {
            StreamKind::Completion => json!([{"text": "", "index": part, "logprobs": null,
                "finish_reason": finish_reason.as_str()}]),
            StreamKind::Chat => json!([{"index": part, "delta": {}, "logprobs": null,
                "finish_reason": finish_reason.as_str()}]),
        };
        let c = self.chunk_json(finish);
        event(out, &c);
        self.started = true;
    }

    /// An error after the stream started: an OpenAI-shaped error event.
    pub fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        event(
            out,
            &json!({"error": {"message": message, "type": "server_error", "code": "stream_failed"}}),
        );
    }

    /// Ends the stream: the usage chunk if asked for, `data: [DONE]`, the last chunk.
    pub fn end(&mut self, out: &mut Vec<u8>) {
        if self.opts.include_usage {
            let mut last = self.chunk_json(json!([]));
            last["usage"] = json!({
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            });
            event(out, &last);
        }
        chunk(out, b"data: [DONE]\n\n");
        out.extend_from_slice(b"0\r\n\r\n");
    }
}

/// The head of a streaming response.
pub fn head(close: bool) -> &'static [u8] {
    if close {
        b"HTTP/1.1 200 OK\r\nServer: abe\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    } else {
        b"HTTP/1.1 200 OK\r\nServer: abe\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
    }
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

    /// The SSE payloads of a chunked body written by a `StreamWriter`.
    fn payloads(body: &[u8]) -> Vec<String> {
        let text = String::from_utf8(body.to_vec()).unwrap();
        let mut out = vec![];
        let mut rest = text.as_str();
        loop {
            let (size, tail) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size, 16).unwrap();
            if n == 0 {
                return out;
            }
            out.push(tail[..n].to_string());
            rest = &tail[n + 2..];
        }
    }

    #[test]
    fn chat_stream_has_role_deltas_finish_usage_and_done() {
        let mut w = StreamWriter::new(
            StreamKind::Chat,
            StreamOptions {
                include_usage: true,
            },
            "m",
            1,
            7,
            1,
        );
        let mut body = vec![];
        w.finish_part(0, &out("a b"), &mut body);
        w.end(&mut body);
        let texts = payloads(&body);
        assert_eq!(texts.len(), 6, "{texts:?}"); // role, a, b, finish, usage, DONE
        assert!(texts[0].contains(r#""role":"assistant""#));
        assert!(texts[1].contains(r#""content":"a""#));
        assert!(texts[2].contains(r#""content":" b""#));
        assert!(texts[3].contains(r#""finish_reason":"length""#));
        assert!(texts[4].contains(r#""total_tokens":4"#) && texts[4].contains(r#""choices":[]"#));
        assert_eq!(texts[5], "data: [DONE]\n\n");
    }

    #[test]
    fn tokens_stream_in_order_duplicates_are_dropped_and_the_rest_comes_at_the_finish() {
        let mut w = StreamWriter::new(
            StreamKind::Completion,
            StreamOptions::default(),
            "m",
            1,
            7,
            1,
        );
        let mut body = vec![];
        w.token(0, 0, "x", &mut body);
        w.token(0, 0, "x", &mut body); // a recomputed token: dropped
        w.token(0, 3, " z", &mut body); // a gap (" y" was skipped): dropped
        assert!(w.started());
        w.finish_part(0, &out("x y z"), &mut body);
        w.end(&mut body);
        let texts = payloads(&body);
        let streamed: String = texts[..3]
            .iter()
            .map(|t| {
                let v: serde_json::Value =
                    serde_json::from_str(t.strip_prefix("data: ").unwrap().trim()).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(
            streamed, "x y z",
            "the pieces concatenate to the text exactly once"
        );
        assert_eq!(texts.len(), 5); // x, " y", " z", finish, DONE
    }
}
