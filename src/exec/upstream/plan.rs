//! A batch as requests to an `upstream` backend and their answers back: as few requests as
//! the backend allows (one array request per group of compatible completions or
//! embeddings, one request per chat or streaming item), each answer split into its items'
//! outputs, and a stream's pieces gathered into its output. The event loop (`mux`) sends
//! them.
//!
//! What must never happen here: I/O, a panic or a batch-wide failure because one request
//! failed (errors are per item), or a token piece delivered out of order.

use super::client::Call;
use super::wire::{self, BackendUsage, Choice, ChunkError, TextResponse};
use crate::core::Kind;
use crate::exec::concurrent::ItemResult;
use crate::exec::{prompt_tokens, BatchItem, ExecError, FinishReason, Output, Work};
use std::sync::Arc;

/// Requests one batch may have in flight at once (the rest wait for one of them).
pub const CONCURRENT_REQUESTS_MAX: usize = 16;

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const EMBEDDINGS: &str = "/v1/embeddings";

/// Which endpoint a request goes to and how its answer is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    Completions,
    Chat,
    Embeddings,
}

impl Shape {
    pub(super) fn path(self) -> &'static str {
        match self {
            Shape::Completions => COMPLETIONS,
            Shape::Chat => CHAT,
            Shape::Embeddings => EMBEDDINGS,
        }
    }
}

/// One request to the backend (a job for `run_concurrently`'s threads), built on the calling
/// thread before any is sent.
#[derive(Debug)]
pub(super) struct BackendRequest {
    pub(super) shape: Shape,
    pub(super) stream: bool,
    pub(super) body: String,
    /// The batch items it answers, in the order of its prompts (inputs). Never empty.
    pub(super) items: Vec<JobItem>,
}

#[derive(Debug)]
pub(super) struct JobItem {
    /// Position in the batch.
    pub(super) index: usize,
    /// For estimating prompt tokens when the backend reports none.
    prompt: Arc<str>,
}

/// Groups a batch into requests; items that cannot be sent at all come back as errors.
pub(super) fn plan(
    items: &[BatchItem],
    backend: &str,
    prompt_array: bool,
) -> (Vec<BackendRequest>, Vec<(usize, ExecError)>) {
    let mut jobs: Vec<BackendRequest> = Vec::new();
    let mut failed = Vec::new();
    // Array groups under construction: (shape, first item's work, job index in `jobs`).
    let mut groups: Vec<(Shape, usize, usize)> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let work = &item.work;
        let Some(model) = work.model.as_deref() else {
            // The engine sets the model when it routes; without one there is nothing to ask.
            failed.push((
                index,
                ExecError::Protocol {
                    backend: backend.to_string(),
                    message: "no model routed for this request".into(),
                },
            ));
            continue;
        };
        let job_item = JobItem {
            index,
            prompt: work.prompt.clone(),
        };
        let single = |shape, body| BackendRequest {
            shape,
            stream: work.stream,
            body,
            items: vec![JobItem {
                index,
                prompt: work.prompt.clone(),
            }],
        };
        match (work.kind, &work.chat_body) {
            (Kind::Completion, Some(chat)) => match wire::chat_body(chat, model, work.stream) {
                Ok((body, stream)) => jobs.push(BackendRequest {
                    stream,
                    ..single(Shape::Chat, body)
                }),
                Err(e) => failed.push((index, ExecError::Backend(e))),
            },
            (Kind::Completion, None) if work.stream || !prompt_array => jobs.push(single(
                Shape::Completions,
                wire::completions_body(model, &[work], work.stream),
            )),
            (kind, _) => {
                let shape = match kind {
                    Kind::Completion => Shape::Completions,
                    Kind::Embedding => Shape::Embeddings,
                };
                let group = groups.iter().find(|&&(s, first, _)| {
                    s == shape && same_request(shape, &items[first].work, work)
                });
                match group {
                    Some(&(_, _, job)) => jobs[job].items.push(job_item),
                    None => {
                        groups.push((shape, index, jobs.len()));
                        jobs.push(BackendRequest {
                            shape,
                            stream: false,
                            body: String::new(),
                            items: vec![job_item],
                        });
                    }
                }
            }
        }
    }
    // Array bodies are built once their groups are complete.
    for &(shape, first, job) in &groups {
        let first = &items[first].work;
        let model = first.model.as_deref().unwrap_or_default();
        let job = &mut jobs[job];
        job.body = match shape {
            Shape::Embeddings => {
                let inputs: Vec<&str> = job.items.iter().map(|i| &*i.prompt).collect();
                wire::embeddings_body(model, &inputs, first.dimensions)
            }
            _ => {
                let works: Vec<&Work> = job.items.iter().map(|i| &items[i.index].work).collect();
                wire::completions_body(model, &works, false)
            }
        };
    }
    (jobs, failed)
}

/// Can `b` ride in the same array request as `a`?
fn same_request(shape: Shape, a: &Work, b: &Work) -> bool {
    a.model == b.model
        && match shape {
            Shape::Embeddings => a.dimensions == b.dimensions,
            _ => a.max_tokens == b.max_tokens && a.sampling == b.sampling,
        }
}

/// What a stream has brought so far: the text, its pieces, the finish reason and usage.
pub(super) struct StreamState {
    item: usize,
    prompt: Arc<str>,
    chat: bool,
    text: String,
    pieces: u32,
    finish: Option<FinishReason>,
    usage: Option<BackendUsage>,
}

impl StreamState {
    /// The state of `job`'s stream (a streaming job has one item).
    pub(super) fn new(job: &BackendRequest) -> StreamState {
        StreamState {
            item: job.items[0].index,
            prompt: job.items[0].prompt.clone(),
            chat: job.shape == Shape::Chat,
            text: String::new(),
            pieces: 0,
            finish: None,
            usage: None,
        }
    }

    /// One event's data: its piece of text goes to `emit` (item, offset, text).
    pub(super) fn data(
        &mut self,
        call: &Call<'_>,
        data: &str,
        emit: &mut dyn FnMut(usize, u32, String),
    ) -> Result<(), ExecError> {
        let chunk = wire::parse_chunk(data, self.chat).map_err(|e| match e {
            ChunkError::Upstream(m) => call.protocol(format_args!("error inside the stream: {m}")),
            ChunkError::Invalid(m) => call.protocol(m),
        })?;
        if let Some(piece) = chunk.text {
            let offset = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
            self.text.push_str(&piece);
            self.pieces = self.pieces.saturating_add(1);
            emit(self.item, offset, piece);
        }
        self.finish = chunk.finish_reason.or(self.finish);
        self.usage = chunk.usage.or(self.usage);
        Ok(())
    }

    /// The body ended without `[DONE]`: whole if a finish reason came (some servers end
    /// that way), an error otherwise.
    pub(super) fn ended(self, call: &Call<'_>) -> Result<Output, ExecError> {
        if self.finish.is_some() {
            return Ok(self.output());
        }
        Err(call.protocol(format_args!(
            "the stream ended after {} bytes without `data: [DONE]`",
            self.text.len()
        )))
    }

    /// The whole answer.
    pub(super) fn output(self) -> Output {
        let usage = self.usage.unwrap_or_default();
        Output::Text {
            prompt_tokens: usage
                .prompt_tokens
                .unwrap_or_else(|| prompt_tokens(&self.prompt)),
            completion_tokens: usage.completion_tokens.unwrap_or(self.pieces),
            finish_reason: self.finish.unwrap_or(FinishReason::Stop),
            text: self.text,
            tool_calls: None,
            cached_tokens: None,
        }
    }
}

/// Each item's answer from a backend's whole JSON answer `body` (a 2xx) to `job`.
pub(super) fn answer(
    call: &Call<'_>,
    job: &BackendRequest,
    body: &str,
) -> Result<Vec<ItemResult>, ExecError> {
    match job.shape {
        Shape::Completions => {
            let parsed = wire::parse_completions(body).map_err(|e| call.protocol(e))?;
            Ok(split_text(call, job, parsed))
        }
        Shape::Chat => {
            let parsed = wire::parse_chat(body).map_err(|e| call.protocol(e))?;
            Ok(split_text(call, job, parsed))
        }
        Shape::Embeddings => {
            let parsed = wire::parse_embeddings(body).map_err(|e| call.protocol(e))?;
            let mut vectors: Vec<Option<Vec<f32>>> = vec![None; job.items.len()];
            for (index, vector) in parsed.data {
                if let Some(slot) = vectors.get_mut(index) {
                    *slot = Some(vector);
                }
            }
            let prompt = prompt_shares(job, parsed.usage);
            Ok(job
                .items
                .iter()
                .zip(vectors)
                .zip(prompt)
                .enumerate()
                .map(|(k, ((item, vector), prompt_tokens))| {
                    let output = vector
                        .map(|vector| Output::Embedding {
                            vector,
                            prompt_tokens,
                        })
                        .ok_or_else(|| call.protocol(format_args!("no embedding for input {k}")));
                    (item.index, output)
                })
                .collect())
        }
    }
}

/// Each item's share of the prompt tokens the backend reported (in proportion to abe's
/// estimate), or abe's estimate when it reported none.
fn prompt_shares(job: &BackendRequest, usage: Option<BackendUsage>) -> Vec<u32> {
    let estimates: Vec<u32> = job.items.iter().map(|i| prompt_tokens(&i.prompt)).collect();
    match usage.and_then(|u| u.prompt_tokens) {
        Some(total) => wire::split_proportional(total, &estimates),
        None => estimates,
    }
}

/// Gives each item of a completions or chat job its choice, with its share of the usage.
fn split_text(call: &Call<'_>, job: &BackendRequest, parsed: TextResponse) -> Vec<ItemResult> {
    if let [item] = job.items.as_slice() {
        return vec![(item.index, alone(call, item, parsed))];
    }
    let mut choices: Vec<Option<Choice>> = vec![None; job.items.len()];
    for choice in parsed.choices {
        if let Some(slot) = choices.get_mut(choice.index) {
            // With `n` unset each prompt has one choice; keep the first if a backend sends more.
            slot.get_or_insert(choice);
        }
    }
    let prompt = prompt_shares(job, parsed.usage);
    let estimates: Vec<u32> = choices
        .iter()
        .map(|c| c.as_ref().map_or(0, |c| prompt_tokens(&c.text)))
        .collect();
    let completion = match parsed.usage.and_then(|u| u.completion_tokens) {
        Some(total) => wire::split_proportional(total, &estimates),
        None => estimates,
    };
    job.items
        .iter()
        .zip(choices)
        .enumerate()
        .map(|(k, (item, choice))| {
            let output = choice
                .map(|c| Output::Text {
                    text: c.text,
                    prompt_tokens: prompt[k],
                    completion_tokens: completion[k],
                    finish_reason: c.finish_reason,
                    tool_calls: c.tool_calls,
                    cached_tokens: None,
                })
                .ok_or_else(|| call.protocol(format_args!("no choice for prompt {k}")));
            (item.index, output)
        })
        .collect()
}

/// The output of a job's only item (what `split_text` gives it, without splitting): its
/// first choice for prompt 0, with the whole usage, or abe's estimates where the backend
/// reported none.
fn alone(call: &Call<'_>, item: &JobItem, parsed: TextResponse) -> Result<Output, ExecError> {
    let usage = parsed.usage.unwrap_or_default();
    let choice = parsed.choices.into_iter().find(|c| c.index == 0);
    let choice = choice.ok_or_else(|| call.protocol(format_args!("no choice for prompt 0")))?;
    Ok(Output::Text {
        prompt_tokens: usage
            .prompt_tokens
            .unwrap_or_else(|| prompt_tokens(&item.prompt)),
        completion_tokens: usage
            .completion_tokens
            .unwrap_or_else(|| prompt_tokens(&choice.text)),
        text: choice.text,
        finish_reason: choice.finish_reason,
        tool_calls: choice.tool_calls,
        cached_tokens: None,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::core::Ticket;

    /// A client of backend `b` at `base` (test helpers of `plan`, `mux` and `executor`).
    pub(in crate::exec::upstream) fn client(
        base: &str,
        prompt_array: bool,
        connect: std::time::Duration,
        request: std::time::Duration,
    ) -> crate::exec::upstream::UpstreamClient {
        crate::exec::upstream::UpstreamClient::new(
            crate::exec::upstream::UpstreamTarget {
                name: "b".into(),
                base_url: base.into(),
                api_key: None,
                prompt_array,
            },
            crate::exec::upstream::UpstreamTimeouts { connect, request },
        )
    }

    /// An item of `kind` with `prompt`, routed to `model`.
    pub(in crate::exec::upstream) fn item(
        kind: Kind,
        prompt: &str,
        model: Option<&str>,
    ) -> BatchItem {
        let work = Work {
            kind,
            prompt: prompt.into(),
            max_tokens: 4,
            model: model.map(Arc::from),
            ..Work::default()
        };
        BatchItem::new(
            Ticket {
                index: 0,
                generation: 0,
            },
            work,
        )
    }

    #[test]
    fn plan_groups_compatible_requests_only() {
        let mut items = vec![
            item(Kind::Completion, "a", Some("m")),
            item(Kind::Completion, "b", Some("m")),
            item(Kind::Completion, "c", Some("other")),
            item(Kind::Embedding, "d", Some("m")),
            item(Kind::Embedding, "e", Some("m")),
            item(Kind::Completion, "f", None),
            item(Kind::Completion, "g", Some("m")),
            item(Kind::Completion, "h", Some("m")),
        ];
        items[6].work.stream = true;
        items[7].work.sampling.temperature = Some(0.1);
        let (jobs, failed) = plan(&items, "b", true);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, 5);
        let shape_of =
            |j: &BackendRequest| (j.shape, j.stream, j.items.iter().map(|i| i.index).collect());
        let got: Vec<(Shape, bool, Vec<usize>)> = jobs.iter().map(shape_of).collect();
        assert_eq!(
            got,
            vec![
                (Shape::Completions, false, vec![0, 1]),
                (Shape::Completions, false, vec![2]),
                (Shape::Embeddings, false, vec![3, 4]),
                (Shape::Completions, true, vec![6]),
                (Shape::Completions, false, vec![7]),
            ]
        );
        assert!(
            jobs[0].body.contains(r#""prompt":["a","b"]"#),
            "{}",
            jobs[0].body
        );
        assert!(jobs[1].body.contains(r#""prompt":"c""#), "{}", jobs[1].body);
        let (jobs, _) = plan(&items, "b", false);
        assert_eq!(
            jobs.iter()
                .filter(|j| j.shape == Shape::Completions)
                .count(),
            5
        );
    }

    /// The text, prompt and completion tokens of `answer`'s results, or the error's text.
    fn answered(items: &[BatchItem], body: &str) -> Vec<Result<(String, u32, u32), String>> {
        let second = std::time::Duration::from_secs(1);
        let client = client("http://127.0.0.1:9", true, second, second);
        let (jobs, _) = plan(items, "b", true);
        let call = Call::new(&client, "POST", COMPLETIONS);
        let results = answer(&call, &jobs[0], body).expect("a completions answer");
        results
            .into_iter()
            .map(|(_, r)| match r {
                Ok(Output::Text {
                    text,
                    prompt_tokens,
                    completion_tokens,
                    ..
                }) => Ok((text, prompt_tokens, completion_tokens)),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            })
            .collect()
    }

    #[test]
    fn one_prompt_takes_the_whole_usage_as_one_of_an_array_would() {
        let one = [item(Kind::Completion, "one two three", Some("m"))];
        let usage = r#","usage":{"prompt_tokens":7,"completion_tokens":5}"#;
        let body = |choices: &str, usage: &str| format!(r#"{{"choices":[{choices}]{usage}}}"#);
        let choice = |index: usize, text: &str| format!(r#"{{"index":{index},"text":"{text}"}}"#);
        assert_eq!(
            answered(&one, &body(&choice(0, "a b"), usage)),
            [Ok(("a b".to_string(), 7, 5))]
        );
        // No usage: abe's estimates, as for each prompt of an array.
        let estimated = answered(&one, &body(&choice(0, "a b"), ""));
        let (p, c) = (prompt_tokens("one two three"), prompt_tokens("a b"));
        assert_eq!(estimated, [Ok(("a b".to_string(), p, c))]);
        let two = [
            item(Kind::Completion, "one two three", Some("m")),
            item(Kind::Completion, "x", Some("m")),
        ];
        let pair = format!("{},{}", choice(0, "a b"), choice(1, "y"));
        assert_eq!(answered(&two, &body(&pair, ""))[0], estimated[0]);
        // The first choice for the prompt wins; one for another prompt is not its answer.
        let firsts = format!("{},{}", choice(0, "a b"), choice(0, "c"));
        assert_eq!(
            answered(&one, &body(&firsts, usage))[0],
            Ok(("a b".to_string(), 7, 5))
        );
        let missing = answered(&one, &body(&choice(1, "a b"), usage));
        assert!(
            matches!(&missing[..], [Err(e)] if e.contains("no choice for prompt 0")),
            "{missing:?}"
        );
    }
}
