//! Server-Sent Events for `stream: true` on completions and chat completions: OpenAI's
//! chunk shapes (`text_completion` chunks, `chat.completion.chunk` with `delta`), an optional
//! usage chunk (`stream_options.include_usage`), then `data: [DONE]`; and on
//! `/v1/responses`, the Responses API's named events. Injected stream faults
//! ([`super::faults`]), tools and structured output ([`super::structured`]), vLLM's
//! continuous usage stats and `X-Request-Id` ids are applied here too.
//!
//! In request-level batching a request's tokens all arrive when its batch completes, so the
//! whole stream is rendered at once; each event is one chunk of the chunked response. The
//! event shapes do not depend on that: an iteration-level engine can emit them token by
//! token. Runs on io threads only.

use super::faults::{StreamFault, StreamFaultKind};
use super::json_out;
use super::structured::{self, Shape};
use crate::exec::synth::token_pieces;
use crate::exec::Output;
use crate::http::response::write_request_id;

/// Streaming options from the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`) before `[DONE]`.
    pub include_usage: bool,
    /// Choices per prompt and log-probabilities.
    pub choices: ChoiceOptions,
    /// An injected mid-stream failure ([`super::faults`]), drawn when the request arrived.
    pub fault: Option<StreamFault>,
    /// vLLM's `stream_options.continuous_usage_stats`: every chunk carries `usage` so far;
    /// the job's prompt tokens (counted when the request arrived).
    pub continuous_usage: Option<u64>,
}

/// How a text job's choices are laid out and annotated (both endpoints, whole answers and
/// streams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChoiceOptions {
    /// Choices per prompt (`n`; 0 reads as 1). Choice `i` answers prompt `i / n`; a
    /// prompt's tokens count once in `usage`, not once per choice.
    pub n: u32,
    /// Synthetic log-probabilities with this many alternatives per token.
    pub logprobs: Option<u8>,
}

impl ChoiceOptions {
    /// Choices per prompt, at least 1.
    pub fn per_prompt(&self) -> usize {
        self.n.max(1) as usize
    }
}

/// Which chunk shape to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Completion,
    Chat,
    /// `POST /v1/responses`: named events (`response.created` .. `response.completed`),
    /// no `[DONE]`.
    Response,
}

/// The longest chunk-size line: 16 hex digits and CRLF.
const CHUNK_SIZE_MAX: usize = 16 + 2;

/// Writes the chunk-size line of `len` to the front of `line`; returns its length.
fn chunk_size_line(line: &mut [u8; CHUNK_SIZE_MAX], len: usize) -> usize {
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, d) in line[..digits].iter_mut().enumerate() {
        *d = b"0123456789abcdef"[(len >> (4 * (digits - 1 - i))) & 0xf];
    }
    line[digits..digits + 2].copy_from_slice(b"\r\n");
    digits + 2
}

/// Appends one SSE event (`data: <json>\n\n`, or the final `data: [DONE]\n\n`) as one
/// chunk, the JSON written by `json` straight into `out` (no `Value`, no intermediate buffer): the payload goes after a gap
/// for the longest size line, then moves down behind the real one (one short memmove).
///
/// Every JSON object here is written with its keys in sorted order, compact, strings
/// escaped like serde_json: the bytes `serde_json::Value::to_string` wrote before.
fn event(out: &mut Vec<u8>, json: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.resize(start + CHUNK_SIZE_MAX, 0);
    out.extend_from_slice(b"data: ");
    json(out);
    out.extend_from_slice(b"\n\n");
    let payload_at = start + CHUNK_SIZE_MAX;
    let len = out.len() - payload_at;
    let mut line = [0u8; CHUNK_SIZE_MAX];
    let n = chunk_size_line(&mut line, len);
    out[start..start + n].copy_from_slice(&line[..n]);
    out.copy_within(payload_at.., start + n);
    out.truncate(start + n + len);
    out.extend_from_slice(b"\r\n");
}

/// Appends one named SSE event (`event: <name>`, then `data: <json>`) as one chunk.
fn named_event(out: &mut Vec<u8>, name: &str, json: &str) {
    let mut line = [0u8; CHUNK_SIZE_MAX];
    let len = "event: ".len() + name.len() + "\ndata: ".len() + json.len() + 2;
    let n = chunk_size_line(&mut line, len);
    out.extend_from_slice(&line[..n]);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n\r\n");
}

/// Where one choice of a stream is.
#[derive(Clone, Copy, Debug, Default)]
struct PartState {
    /// Bytes of the choice's text already streamed (a piece is kept only if it starts here).
    sent_bytes: usize,
    /// Chat: the role delta went out.
    role_sent: bool,
    /// Completions with `echo`: the prompt's chunk went out.
    echo_sent: bool,
    /// Bytes of the echoed prompt before this choice's text (log-probability offsets count
    /// them, as in a whole answer).
    echo_len: usize,
    /// Tools and structured output: tokens of this choice's shape written so far.
    shaped_tokens: u32,
    /// Where the next token of the shape starts: the tool call (0 for text) and the byte
    /// offset in its text or arguments, so each token is found in O(1), not by walking
    /// the shape from its start (which made a long structured stream quadratic).
    shaped_call: usize,
    shaped_at: usize,
}

/// Writes one stream's events, token by token or all at the end, as HTTP/1.1 chunks.
#[derive(Debug)]
pub struct StreamWriter {
    kind: StreamKind,
    opts: StreamOptions,
    /// What follows the `choices` array in every chunk of this stream (the same each
    /// time, so rendered once): `],"created":..,"id":"..","model":"..","object":".."`.
    after_choices: Vec<u8>,
    parts: Vec<PartState>,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// Prompt tokens found in the prefix cache, summed like `prompt_tokens` (`None`: no
    /// output reported any, and the usage chunk leaves the field out).
    cached_tokens: Option<u64>,
    /// Completions with `echo`: the prompts, one per `n` choices; each choice's stream
    /// begins with its prompt's chunk.
    echo: Option<Vec<std::sync::Arc<str>>>,
    /// Anything (a token or a finish) was written.
    started: bool,
    /// Where an injected fault ([`StreamOptions::fault`]) stands; idle without one.
    fault: FaultState,
    /// Token pieces streamed so far, all choices (continuous usage's completion tokens).
    pieces: u64,
    /// The client's `X-Request-Id`, echoed in the head.
    request_id: Option<std::sync::Arc<str>>,
    /// Tools and structured output: each choice's shape, streamed a token per token event
    /// in place of the engine's words ([`super::structured`]).
    structured: Option<std::sync::Arc<[Shape]>>,
    /// `POST /v1/responses`: the response's fields, its text so far, its finished output,
    /// and the events' sequence number.
    response: Option<std::sync::Arc<super::response_object::ResponseMeta>>,
    response_text: String,
    response_output: Option<Output>,
    sequence: u64,
}

/// An injected stream fault in progress. Events pass until `after_chunks` went out; then
/// a cut drops every event but the last chunk, a reset drops everything and asks the
/// connection to reset, a stall holds everything back until its deadline.
#[derive(Debug, Default)]
struct FaultState {
    /// SSE events let through so far.
    events_out: u32,
    /// The fault struck (a cut or reset dropped something, a stall began).
    tripped: bool,
    /// A stall: held back until this instant.
    stall_until: Option<std::time::Instant>,
    /// A stall's held-back chunks.
    held: Vec<u8>,
    /// Fresh chunks of one write, before the fault filters them.
    scratch: Vec<u8>,
}

/// Splits the first HTTP/1.1 chunk (size line, data, CRLF) off `framed`, as [`event`] and
/// [`StreamWriter::end`] write them: (the chunk, whether it is the last (size 0), the rest).
fn split_chunk(framed: &[u8]) -> (&[u8], bool, &[u8]) {
    let line_end = framed
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(framed.len());
    let size = std::str::from_utf8(&framed[..line_end])
        .ok()
        .and_then(|h| usize::from_str_radix(h, 16).ok())
        .unwrap_or(0);
    // Assumes: `framed` holds whole chunks written here (size line, data, CRLF).
    let end = (line_end + 2 + size + 2).min(framed.len());
    debug_assert!(line_end + 2 + size + 2 <= framed.len(), "a partial chunk");
    (&framed[..end], size == 0, &framed[end..])
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
        let (id_prefix, object) = match kind {
            StreamKind::Completion => (&b"cmpl-"[..], &b"text_completion"[..]),
            StreamKind::Chat => (&b"chatcmpl-"[..], &b"chat.completion.chunk"[..]),
            StreamKind::Response => (&b"resp_"[..], &b"response"[..]),
        };
        let mut after_choices = Vec::with_capacity(96 + model.len());
        after_choices.extend_from_slice(b"],\"created\":");
        json_out::uint(&mut after_choices, created);
        after_choices.extend_from_slice(b",\"id\":\"");
        after_choices.extend_from_slice(id_prefix);
        json_out::hex16(&mut after_choices, id);
        after_choices.extend_from_slice(b"\",\"model\":");
        json_out::string(&mut after_choices, model);
        after_choices.extend_from_slice(b",\"object\":\"");
        after_choices.extend_from_slice(object);
        after_choices.push(b'"');
        StreamWriter {
            kind,
            opts,
            after_choices,
            parts: vec![PartState::default(); parts],
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: None,
            echo: None,
            started: false,
            fault: FaultState::default(),
            pieces: 0,
            request_id: None,
            structured: None,
            response: None,
            response_text: String::new(),
            response_output: None,
            sequence: 0,
        }
    }

    /// A `POST /v1/responses` stream's fields.
    pub fn with_response(
        mut self,
        meta: Option<std::sync::Arc<super::response_object::ResponseMeta>>,
    ) -> StreamWriter {
        self.response = meta;
        self
    }

    /// One named event of a Responses stream: `event: <type>` and its JSON, with `type`
    /// and `sequence_number` added.
    fn response_event(&mut self, kind: &str, mut v: serde_json::Value, out: &mut Vec<u8>) {
        v["type"] = kind.into();
        v["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        named_event(out, kind, &v.to_string());
    }

    /// The opening events of a Responses stream, before its first delta (or its end).
    fn response_open(&mut self, out: &mut Vec<u8>) {
        let Some(meta) = self.response.clone() else {
            return;
        };
        let r = super::response_object::response_json(&meta, None);
        self.response_event(
            "response.created",
            serde_json::json!({ "response": r }),
            out,
        );
        self.response_event(
            "response.in_progress",
            serde_json::json!({ "response": r }),
            out,
        );
        let mut item = super::response_object::message_json(&meta, "", "in_progress");
        item["content"] = serde_json::json!([]);
        self.response_event(
            "response.output_item.added",
            serde_json::json!({ "output_index": 0, "item": item }),
            out,
        );
        self.response_event(
            "response.content_part.added",
            serde_json::json!({
                "item_id": meta.message_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            }),
            out,
        );
    }

    /// The closing events of a Responses stream (the answer stored when asked), then the
    /// last chunk.
    fn response_close(&mut self, out: &mut Vec<u8>) {
        let Some(meta) = self.response.clone() else {
            return;
        };
        if !self.started {
            self.started = true;
            self.response_open(out);
        }
        let text = std::mem::take(&mut self.response_text);
        let ids =
            serde_json::json!({"item_id": meta.message_id, "output_index": 0, "content_index": 0});
        let mut done = ids.clone();
        done["text"] = text.as_str().into();
        self.response_event("response.output_text.done", done, out);
        let mut part = ids;
        part["part"] = serde_json::json!({"type": "output_text", "text": text, "annotations": []});
        self.response_event("response.content_part.done", part, out);
        let item = super::response_object::message_json(&meta, &text, "completed");
        self.response_event(
            "response.output_item.done",
            serde_json::json!({ "output_index": 0, "item": item }),
            out,
        );
        let output = self.response_output.take().unwrap_or(Output::Text {
            text: String::new(),
            prompt_tokens: 0,
            completion_tokens: 0,
            finish_reason: crate::exec::FinishReason::Stop,
            tool_calls: None,
            cached_tokens: None,
        });
        let output = match output {
            Output::Text {
                prompt_tokens,
                completion_tokens,
                finish_reason,
                cached_tokens,
                ..
            } => Output::Text {
                text,
                prompt_tokens,
                completion_tokens,
                finish_reason,
                tool_calls: None,
                cached_tokens,
            },
            other => other,
        };
        let body = super::response_object::finish(&meta, &output);
        let response: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.response_event(kind, serde_json::json!({ "response": response }), out);
        out.extend_from_slice(b"0\r\n\r\n");
    }

    /// Streams these shapes (one per choice) in place of the engine's words.
    pub fn with_structured(mut self, shapes: Option<std::sync::Arc<[Shape]>>) -> StreamWriter {
        self.structured = shapes;
        self
    }

    /// The shape of choice `part`, if it has one.
    fn shape_of(&self, part: usize) -> Option<std::sync::Arc<[Shape]>> {
        self.structured.clone().filter(|s| part < s.len())
    }

    /// Writes the next token of choice `part`'s shape: a piece of its text, or of a tool
    /// call's arguments (a call's first piece comes with its id and name, as OpenAI
    /// streams them). Nothing once the shape is all out.
    fn shaped_token(&mut self, part: usize, shapes: &[Shape], out: &mut Vec<u8>) {
        let at = self.parts[part].shaped_at;
        match &shapes[part] {
            Shape::Text(s) => {
                let Some(p) = structured::pieces(s.get(at..).unwrap_or("")).next() else {
                    return;
                };
                self.parts[part].shaped_at = at + p.len();
                self.piece(part, p, out);
            }
            Shape::Calls(calls) => {
                let mut k = self.parts[part].shaped_call;
                let mut at = at;
                // A call with no argument bytes has no token of its own: skip to the next.
                while calls.get(k).is_some_and(|c| at >= c.arguments.len()) {
                    k += 1;
                    at = 0;
                }
                let Some(call) = calls.get(k) else {
                    self.parts[part].shaped_call = k;
                    self.parts[part].shaped_at = 0;
                    return;
                };
                let piece = structured::pieces(&call.arguments[at..])
                    .next()
                    .unwrap_or("");
                self.parts[part].shaped_call = k;
                self.parts[part].shaped_at = at + piece.len();
                self.call_delta(part, k, call, at == 0, piece, out);
            }
        }
        self.parts[part].shaped_tokens += 1;
    }

    /// One `tool_calls` delta of choice `part`: call `k`'s id, type and name with its first
    /// argument piece (`first`), or just the next piece.
    fn call_delta(
        &mut self,
        part: usize,
        k: usize,
        call: &structured::Call,
        first: bool,
        piece: &str,
        out: &mut Vec<u8>,
    ) {
        self.started = true;
        self.pieces += 1;
        if !self.parts[part].role_sent {
            self.parts[part].role_sent = true;
            self.chunk_event(out, |o| {
                o.extend_from_slice(b"{\"delta\":{\"content\":null,\"role\":\"assistant\"},\"finish_reason\":null,\"index\":");
                json_out::uint(o, part as u64);
                o.extend_from_slice(b",\"logprobs\":null}");
            });
        }
        self.chunk_event(out, |o| {
            o.extend_from_slice(b"{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":");
            json_out::string(o, piece);
            if first {
                o.extend_from_slice(b",\"name\":");
                json_out::string(o, &call.name);
                o.extend_from_slice(b"},\"id\":");
                json_out::string(o, &call.id);
                o.extend_from_slice(b",\"index\":");
                json_out::uint(o, k as u64);
                o.extend_from_slice(b",\"type\":\"function\"}");
            } else {
                o.extend_from_slice(b"},\"index\":");
                json_out::uint(o, k as u64);
                o.push(b'}');
            }
            o.extend_from_slice(b"]},\"finish_reason\":null,\"index\":");
            json_out::uint(o, part as u64);
            o.extend_from_slice(b",\"logprobs\":null}");
        });
    }

    /// Choice `part` is done with this shape: the rest of what its tokens cover is written;
    /// returns the output the usual finish writes (nothing left to stream, the shape's
    /// finish reason, no tool calls to repeat).
    fn finish_shape(
        &mut self,
        part: usize,
        shapes: &[Shape],
        output: &Output,
        out: &mut Vec<u8>,
    ) -> Output {
        let shaped = shapes[part].output(output);
        let Output::Text {
            completion_tokens, ..
        } = output
        else {
            return shaped;
        };
        let upto = (*completion_tokens).min(shapes[part].tokens());
        while self.parts[part].shaped_tokens < upto {
            self.shaped_token(part, shapes, out);
        }
        match shaped {
            Output::Text {
                text,
                prompt_tokens,
                completion_tokens,
                finish_reason,
                cached_tokens,
                ..
            } => Output::Text {
                text: if matches!(shapes[part], Shape::Calls(_)) {
                    String::new()
                } else {
                    text
                },
                prompt_tokens,
                completion_tokens,
                finish_reason,
                tool_calls: None,
                cached_tokens,
            },
            other => other,
        }
    }

    /// The client's `X-Request-Id` as the stream's id (`cmpl-<id>`, as vLLM), echoed in the
    /// head; the number given to [`StreamWriter::new`] without one.
    pub fn with_request_id(mut self, request_id: Option<std::sync::Arc<str>>) -> StreamWriter {
        if let Some(rid) = request_id.as_deref() {
            const ID_AT: &[u8] = b",\"id\":\"";
            let at = self
                .after_choices
                .windows(ID_AT.len())
                .position(|w| w == ID_AT)
                .map(|i| i + ID_AT.len());
            let prefix = match self.kind {
                StreamKind::Completion => "cmpl-".len(),
                StreamKind::Chat => "chatcmpl-".len(),
                StreamKind::Response => "resp_".len(),
            };
            if let Some(at) = at {
                let hex = at + prefix..at + prefix + 16;
                let quoted = serde_json::to_string(rid).unwrap_or_default();
                let inner = quoted.as_bytes()[1..quoted.len() - 1].to_vec();
                self.after_choices.splice(hex, inner);
            }
        }
        self.request_id = request_id;
        self
    }

    /// The extra head lines of this stream: `X-Request-Id` echoed, `x-abe-fault` when a
    /// fault was injected (each line ending in CRLF).
    pub fn write_headers(&self, out: &mut Vec<u8>) {
        if let Some(rid) = &self.request_id {
            write_request_id(out, rid);
        }
        if let Some(kind) = self.fault_name() {
            out.extend_from_slice(b"x-abe-fault: ");
            out.extend_from_slice(kind.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The injected fault's name for the `x-abe-fault` header, if this stream has one.
    pub fn fault_name(&self) -> Option<&'static str> {
        self.opts.fault.map(StreamFault::as_str)
    }

    /// An injected reset struck: the connection should be reset once what went out before
    /// it is written.
    pub fn wants_reset(&self) -> bool {
        self.fault.tripped
            && self
                .opts
                .fault
                .is_some_and(|f| f.kind == StreamFaultKind::Reset)
    }

    /// A stall holds chunks back (the stream is not complete while it does).
    pub fn holding(&self) -> bool {
        self.fault.stall_until.is_some()
    }

    /// When a stall holding chunks back ends (`None`: no stall holds any): the io thread
    /// wakes then, not at its next tick.
    pub fn stall_until(&self) -> Option<std::time::Instant> {
        self.fault.stall_until
    }

    /// A stall whose deadline passed lets its held chunks go, into `out`.
    pub fn release_due(&mut self, now: std::time::Instant, out: &mut Vec<u8>) {
        if self.fault.stall_until.is_some_and(|t| now >= t) {
            self.fault.stall_until = None;
            out.append(&mut self.fault.held);
        }
    }

    /// Runs `write` into `out`, through the injected fault's filter if there is one.
    fn faulted(&mut self, out: &mut Vec<u8>, write: impl FnOnce(&mut Self, &mut Vec<u8>)) {
        let Some(fault) = self.opts.fault else {
            return write(self, out);
        };
        let mut fresh = std::mem::take(&mut self.fault.scratch);
        fresh.clear();
        write(self, &mut fresh);
        let mut rest = &fresh[..];
        while !rest.is_empty() {
            let (chunk, last, tail) = split_chunk(rest);
            rest = tail;
            let before = self.fault.events_out < fault.after_chunks && !self.fault.tripped;
            match fault.kind {
                StreamFaultKind::Cut | StreamFaultKind::Reset if before && !last => {
                    out.extend_from_slice(chunk);
                    self.fault.events_out += 1;
                }
                // A cut still ends the chunked body: the stream stops, well framed.
                StreamFaultKind::Cut if last => out.extend_from_slice(chunk),
                StreamFaultKind::Cut | StreamFaultKind::Reset => self.fault.tripped = true,
                StreamFaultKind::Stall { ms } => {
                    if !before && !self.fault.tripped {
                        self.fault.tripped = true;
                        self.fault.stall_until = Some(
                            std::time::Instant::now()
                                + std::time::Duration::from_millis(u64::from(ms)),
                        );
                    }
                    if self.fault.stall_until.is_some() {
                        self.fault.held.extend_from_slice(chunk);
                    } else {
                        out.extend_from_slice(chunk);
                    }
                    self.fault.events_out += u32::from(!last);
                }
            }
        }
        self.fault.scratch = fresh;
    }

    /// Completions with `echo`: each choice's stream begins with its prompt (vLLM's
    /// streamed echo), written just before the choice's first token or its finish.
    pub fn with_echo(mut self, prompts: Option<Vec<std::sync::Arc<str>>>) -> StreamWriter {
        if self.kind == StreamKind::Completion {
            self.echo = prompts;
        }
        self
    }

    /// Writes choice `part`'s echoed prompt chunk, once, if there is one.
    fn echo_part(&mut self, part: usize, out: &mut Vec<u8>) {
        let Some(prompts) = self.echo.as_ref() else {
            return;
        };
        if self.parts[part].echo_sent {
            return;
        }
        self.parts[part].echo_sent = true;
        let Some(prompt) = prompts.get(part / self.opts.choices.per_prompt()).cloned() else {
            return;
        };
        self.parts[part].echo_len = prompt.len();
        self.started = true;
        self.chunk_event(out, |o| {
            o.extend_from_slice(b"{\"finish_reason\":null,\"index\":");
            json_out::uint(o, part as u64);
            o.extend_from_slice(b",\"logprobs\":null,\"text\":");
            json_out::string(o, &prompt);
            o.push(b'}');
        });
    }

    /// True once any event was written (after that, errors go in the stream).
    pub fn started(&self) -> bool {
        self.started
    }

    /// One chunk event whose `choices` array holds what `choice` writes (and, with
    /// continuous usage stats, `usage` so far).
    fn chunk_event(&self, out: &mut Vec<u8>, choice: impl FnOnce(&mut Vec<u8>)) {
        event(out, |o| {
            o.extend_from_slice(b"{\"choices\":[");
            choice(o);
            o.extend_from_slice(&self.after_choices);
            if let Some(prompt) = self.opts.continuous_usage {
                // Keys stay sorted: "usage" follows "object".
                let completion = self.pieces.max(self.completion_tokens);
                o.extend_from_slice(b",\"usage\":{\"completion_tokens\":");
                json_out::uint(o, completion);
                o.extend_from_slice(b",\"prompt_tokens\":");
                json_out::uint(o, prompt);
                o.extend_from_slice(b",\"total_tokens\":");
                json_out::uint(o, prompt + completion);
                o.push(b'}');
            }
            o.push(b'}');
        });
    }

    fn piece(&mut self, part: usize, piece: &str, out: &mut Vec<u8>) {
        if self.kind == StreamKind::Response {
            if !self.started {
                self.started = true;
                self.response_open(out);
            }
            if !piece.is_empty() {
                self.pieces += 1;
                self.response_text.push_str(piece);
                self.parts[part].sent_bytes += piece.len();
                let item_id = self.response.as_ref().map(|m| m.message_id.clone());
                self.response_event(
                    "response.output_text.delta",
                    serde_json::json!({
                        "item_id": item_id, "output_index": 0, "content_index": 0, "delta": piece,
                    }),
                    out,
                );
            }
            return;
        }
        self.echo_part(part, out);
        self.started = true;
        self.pieces += u64::from(!piece.is_empty());
        let offset = self.parts[part].sent_bytes;
        let echo_len = self.parts[part].echo_len;
        let logprobs = self.opts.choices.logprobs.filter(|_| !piece.is_empty());
        match self.kind {
            StreamKind::Completion => self.chunk_event(out, |o| {
                o.extend_from_slice(b"{\"finish_reason\":null,\"index\":");
                json_out::uint(o, part as u64);
                match logprobs {
                    None => o.extend_from_slice(b",\"logprobs\":null,\"text\":"),
                    Some(top) => {
                        o.extend_from_slice(b",\"logprobs\":");
                        super::logprobs::write_completion(
                            o,
                            std::iter::once((piece, offset)),
                            echo_len,
                            top,
                        );
                        o.extend_from_slice(b",\"text\":");
                    }
                }
                json_out::string(o, piece);
                o.push(b'}');
            }),
            StreamKind::Chat => {
                if !self.parts[part].role_sent {
                    self.parts[part].role_sent = true;
                    self.chunk_event(out, |o| {
                        o.extend_from_slice(
                            b"{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},\"finish_reason\":null,\"index\":",
                        );
                        json_out::uint(o, part as u64);
                        o.extend_from_slice(b",\"logprobs\":null}");
                    });
                }
                self.chunk_event(out, |o| {
                    o.extend_from_slice(b"{\"delta\":{\"content\":");
                    json_out::string(o, piece);
                    o.extend_from_slice(b"},\"finish_reason\":null,\"index\":");
                    json_out::uint(o, part as u64);
                    match logprobs {
                        None => o.extend_from_slice(b",\"logprobs\":null}"),
                        Some(top) => {
                            o.extend_from_slice(b",\"logprobs\":");
                            super::logprobs::write_chat(o, std::iter::once((piece, offset)), top);
                            o.push(b'}');
                        }
                    }
                });
            }
            StreamKind::Response => {} // written above
        }
        self.parts[part].sent_bytes += piece.len();
    }

    /// Text of choice `part` starting at byte `offset` of its output; kept only if it
    /// continues exactly where the stream stands (a repeat or a gap waits for the finish).
    /// With a shape (tools, structured output), each token event writes the shape's next
    /// token instead, whatever its text.
    pub fn token(&mut self, part: usize, offset: u32, text: &str, out: &mut Vec<u8>) {
        if let Some(shapes) = self.shape_of(part).filter(|_| !text.is_empty()) {
            return self.faulted(out, |w, o| w.shaped_token(part, &shapes, o));
        }
        if self
            .parts
            .get(part)
            .is_none_or(|p| p.sent_bytes != offset as usize)
            || text.is_empty()
        {
            return;
        }
        self.faulted(out, |w, o| w.piece(part, text, o));
    }

    /// Choice `part` is complete: streams whatever of its text did not go out token by
    /// token, then its finish chunk.
    pub fn finish_part(&mut self, part: usize, output: &Output, out: &mut Vec<u8>) {
        self.faulted(out, |w, o| w.finish_part_unfiltered(part, output, o));
    }

    fn finish_part_unfiltered(&mut self, part: usize, output: &Output, out: &mut Vec<u8>) {
        let shaped;
        let output = match self.shape_of(part) {
            Some(shapes) => {
                shaped = self.finish_shape(part, &shapes, output, out);
                &shaped
            }
            None => output,
        };
        let Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
            tool_calls,
            cached_tokens,
        } = output
        else {
            return;
        };
        // A prompt's tokens count once, not once per choice (`n`).
        if part % self.opts.choices.per_prompt() == 0 {
            self.prompt_tokens += u64::from(*prompt_tokens);
            if let Some(c) = cached_tokens {
                self.cached_tokens = Some(self.cached_tokens.unwrap_or(0) + u64::from(*c));
            }
        }
        self.completion_tokens += u64::from(*completion_tokens);
        self.echo_part(part, out);
        let sent = self.parts[part].sent_bytes.min(text.len());
        let rest = text.get(sent..).unwrap_or("");
        for piece in token_pieces(rest) {
            self.piece(part, piece, out);
        }
        if self.kind == StreamKind::Response {
            self.response_output = Some(output.clone());
            return;
        }
        if self.kind == StreamKind::Chat && !self.parts[part].role_sent {
            self.piece(part, "", out);
        }
        if let (StreamKind::Chat, Some(calls)) = (self.kind, tool_calls) {
            // Relayed whole in one delta; stream deltas number their calls with `index`.
            let calls = indexed_tool_calls(calls);
            self.chunk_event(out, |o| {
                o.extend_from_slice(b"{\"delta\":{\"tool_calls\":");
                o.extend_from_slice(calls.as_bytes());
                o.extend_from_slice(b"},\"finish_reason\":null,\"index\":");
                json_out::uint(o, part as u64);
                o.extend_from_slice(b",\"logprobs\":null}");
            });
        }
        let reason = finish_reason.as_str();
        match self.kind {
            StreamKind::Completion => self.chunk_event(out, |o| {
                o.extend_from_slice(b"{\"finish_reason\":\"");
                o.extend_from_slice(reason.as_bytes());
                o.extend_from_slice(b"\",\"index\":");
                json_out::uint(o, part as u64);
                o.extend_from_slice(b",\"logprobs\":null,\"text\":\"\"}");
            }),
            StreamKind::Chat => self.chunk_event(out, |o| {
                o.extend_from_slice(b"{\"delta\":{},\"finish_reason\":\"");
                o.extend_from_slice(reason.as_bytes());
                o.extend_from_slice(b"\",\"index\":");
                json_out::uint(o, part as u64);
                o.extend_from_slice(b",\"logprobs\":null}");
            }),
            StreamKind::Response => {} // returned above: the close writes its end
        }
        self.started = true;
    }

    /// An error after the stream started: an OpenAI-shaped error event.
    pub fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        if self.kind == StreamKind::Response {
            let v = serde_json::json!({"code": "stream_failed", "message": message});
            return self.faulted(out, |w, o| {
                w.response_event("error", v, o);
                o.extend_from_slice(b"0\r\n\r\n");
            });
        }
        self.faulted(out, |_, out| {
            event(out, |o| {
                o.extend_from_slice(b"{\"error\":{\"code\":\"stream_failed\",\"message\":");
                json_out::string(o, message);
                o.extend_from_slice(b",\"type\":\"server_error\"}}");
            })
        });
    }

    /// Ends the stream: the usage chunk if asked for, `data: [DONE]`, the last chunk.
    pub fn end(&mut self, out: &mut Vec<u8>) {
        self.faulted(out, |w, o| w.end_unfiltered(o));
    }

    fn end_unfiltered(&mut self, out: &mut Vec<u8>) {
        if self.kind == StreamKind::Response {
            if self.response_output.is_some() || !self.started {
                self.response_close(out);
            }
            return;
        }
        if self.opts.include_usage {
            let (prompt, completion) = (self.prompt_tokens, self.completion_tokens);
            event(out, |o| {
                o.extend_from_slice(b"{\"choices\":[");
                o.extend_from_slice(&self.after_choices);
                o.extend_from_slice(b",\"usage\":{\"completion_tokens\":");
                json_out::uint(o, completion);
                o.extend_from_slice(b",\"prompt_tokens\":");
                json_out::uint(o, prompt);
                o.extend_from_slice(b",\"total_tokens\":");
                json_out::uint(o, prompt + completion);
                if let Some(c) = self.cached_tokens {
                    json_out::prompt_tokens_details(o, c);
                }
                o.extend_from_slice(b"}}");
            });
        }
        event(out, |o| o.extend_from_slice(b"[DONE]"));
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

/// Appends [`head`] to `out` with the header lines `extra` writes (each ending in CRLF)
/// after the status line.
pub fn write_head(out: &mut Vec<u8>, close: bool, extra: impl FnOnce(&mut Vec<u8>)) {
    const STATUS_LINE: usize = "HTTP/1.1 200 OK\r\n".len();
    let head = head(close);
    out.extend_from_slice(&head[..STATUS_LINE]);
    extra(out);
    out.extend_from_slice(&head[STATUS_LINE..]);
}

/// A `tool_calls` array (JSON text) with `"index": i` in each call, as streamed deltas
/// carry it; the text unchanged when it is not an array of objects.
fn indexed_tool_calls(calls: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(calls) {
        Ok(serde_json::Value::Array(mut list)) => {
            for (i, call) in list.iter_mut().enumerate() {
                if let Some(obj) = call.as_object_mut() {
                    obj.entry("index").or_insert(i.into());
                }
            }
            serde_json::Value::Array(list).to_string()
        }
        _ => calls.to_string(),
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
            tool_calls: None,
            cached_tokens: None,
        }
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
    fn chunk_size_lines_are_hex_without_leading_zeros() {
        for len in [0usize, 1, 9, 10, 15, 16, 255, 256, 4095, 65_536, usize::MAX] {
            let mut line = [0u8; CHUNK_SIZE_MAX];
            let n = chunk_size_line(&mut line, len);
            assert_eq!(&line[..n], format!("{len:x}\r\n").as_bytes());
        }
    }

    /// Every event is exactly what `serde_json::Value::to_string` writes for its JSON
    /// (sorted keys, compact, serde_json's escaping): the bytes this writer replaced.
    #[test]
    fn events_are_canonical_json_with_the_openai_chunk_fields() {
        let tricky = "quote \" back \\ nl \n ctl \u{1} é 🙂";
        let model = "m\"odel\\é";
        for kind in [StreamKind::Completion, StreamKind::Chat] {
            let mut w = StreamWriter::new(
                kind,
                StreamOptions {
                    include_usage: true,
                    ..Default::default()
                },
                model,
                1_795_363_920,
                0xabc,
                12,
            );
            let mut body = vec![];
            w.token(11, 0, tricky, &mut body);
            let text = format!("{tricky} two");
            w.finish_part(11, &out(&text), &mut body);
            w.error(tricky, &mut body);
            w.end(&mut body);
            let texts = payloads(&body);
            assert_eq!(texts.last().unwrap(), "data: [DONE]\n\n");
            let mut streamed = String::new();
            for t in &texts[..texts.len() - 1] {
                let json = t
                    .strip_prefix("data: ")
                    .unwrap()
                    .strip_suffix("\n\n")
                    .unwrap();
                let v: serde_json::Value = serde_json::from_str(json).unwrap();
                assert_eq!(v.to_string(), json, "not canonical: {json}");
                if v.get("error").is_some() {
                    assert_eq!(v["error"]["message"], tricky);
                    assert_eq!(v["error"]["type"], "server_error");
                    continue;
                }
                assert_eq!(v["model"], model);
                assert_eq!(v["created"], 1_795_363_920u64);
                match kind {
                    StreamKind::Completion => {
                        assert_eq!(v["id"], "cmpl-0000000000000abc");
                        assert_eq!(v["object"], "text_completion");
                    }
                    StreamKind::Chat => {
                        assert_eq!(v["id"], "chatcmpl-0000000000000abc");
                        assert_eq!(v["object"], "chat.completion.chunk");
                    }
                    StreamKind::Response => unreachable!("not among the kinds tested here"),
                }
                if let Some(usage) = v.get("usage") {
                    assert_eq!(v["choices"], serde_json::json!([]));
                    assert_eq!(
                        usage["total_tokens"],
                        2 + usage["completion_tokens"].as_u64().unwrap()
                    );
                    continue;
                }
                let c = &v["choices"][0];
                assert_eq!(c["index"], 11);
                assert_eq!(c["logprobs"], serde_json::Value::Null);
                let piece = match kind {
                    StreamKind::Completion => c["text"].as_str().unwrap(),
                    StreamKind::Chat => c["delta"]["content"].as_str().unwrap_or(""),
                    StreamKind::Response => unreachable!("not among the kinds tested here"),
                };
                streamed.push_str(piece);
            }
            assert_eq!(streamed, text, "{kind:?}: the pieces are the text");
        }
    }

    #[test]
    fn chat_stream_has_role_deltas_finish_usage_and_done() {
        let mut w = StreamWriter::new(
            StreamKind::Chat,
            StreamOptions {
                include_usage: true,
                ..Default::default()
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

    #[test]
    fn a_structured_stream_rebuilds_each_call_and_text_from_its_deltas() {
        use super::structured::{Call, Shape};
        let call = |id: &str, args: &str| Call {
            id: id.into(),
            name: "f".into(),
            arguments: args.into(),
        };
        // Multi-byte characters, a call with no argument bytes, a long argument string.
        let long = format!("{{\"k\":\"{}\"}}", "é0".repeat(300));
        let calls = vec![call("a", "{\"x\":\"ü\"}"), call("b", ""), call("c", &long)];
        let shapes: std::sync::Arc<[Shape]> = vec![Shape::Calls(calls.clone())].into();
        let tokens = shapes[0].tokens();
        let mut w = StreamWriter::new(StreamKind::Chat, StreamOptions::default(), "m", 1, 7, 1)
            .with_structured(Some(shapes));
        let mut body = vec![];
        for t in 0..tokens + 3 {
            w.token(0, t, "w", &mut body); // more token events than the shape has: no extra deltas
        }
        let done = Output::Text {
            text: String::new(),
            prompt_tokens: 2,
            completion_tokens: tokens + 3,
            finish_reason: FinishReason::Stop,
            tool_calls: None,
            cached_tokens: None,
        };
        w.finish_part(0, &done, &mut body);
        w.end(&mut body);
        let mut args = vec![String::new(); calls.len()];
        let mut deltas = 0;
        for t in payloads(&body) {
            let Some(json) = t.strip_prefix("data: ").filter(|j| j.trim() != "[DONE]") else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
            for c in v["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let k = c["index"].as_u64().unwrap() as usize;
                args[k].push_str(c["function"]["arguments"].as_str().unwrap());
                deltas += 1;
            }
        }
        for (k, c) in calls.iter().enumerate() {
            assert_eq!(args[k], c.arguments, "call {k} rebuilt from its deltas");
        }
        assert_eq!(deltas, tokens, "one delta per token of argument text");
    }
}
