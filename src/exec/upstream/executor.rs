//! The `upstream` executor: turns a batch into as few backend requests as the backend allows
//! (one array request per group of compatible completions or embeddings, one request per
//! chat or streaming item), runs them concurrently, and writes each item's output or error.
//!
//! What must never happen here: a panic or a batch-wide failure because one request failed
//! (errors are per item), more than `CONCURRENT_REQUESTS_MAX` requests in flight per
//! batch, a new request started after `stop` is set, or a token piece delivered out of order.

use super::client::{Call, UpstreamClient, RESPONSE_BYTES_MAX};
use super::slot::UpstreamSlot;
use super::sse::{SseEvent, SseReader};
use super::wire::{self, BackendUsage, Choice, ChunkError, TextResponse};
use crate::core::Kind;
use crate::exec::{
    prompt_tokens, BatchItem, ExecError, Executor, FinishReason, Output, TokenSink, Work,
};
use crate::sync::AtomicBool;
use std::io::BufReader;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

/// Requests one batch may have in flight at once (the threads a batch may spawn).
pub const CONCURRENT_REQUESTS_MAX: usize = 16;

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const EMBEDDINGS: &str = "/v1/embeddings";

/// Runs batches against one backend. One per worker thread; the client (and its connection
/// pool) is shared by all of the backend's workers.
pub struct UpstreamExecutor {
    client: UpstreamClient,
    /// A backend slot's cell: `client` is taken from it at the start of every batch (the
    /// slot may have been filled with another address since the last one).
    slot: Option<UpstreamSlot>,
    /// Set at shutdown: no new request starts once it is.
    stop: Arc<AtomicBool>,
}

impl UpstreamExecutor {
    pub fn new(client: UpstreamClient, stop: Arc<AtomicBool>) -> UpstreamExecutor {
        UpstreamExecutor {
            client,
            slot: None,
            stop,
        }
    }

    /// An executor for a backend slot: each batch goes to the slot's address of the moment.
    pub fn in_slot(slot: UpstreamSlot, stop: Arc<AtomicBool>) -> UpstreamExecutor {
        UpstreamExecutor {
            client: slot.current(),
            slot: Some(slot),
            stop,
        }
    }
}

impl Executor for UpstreamExecutor {
    fn execute(
        &mut self,
        items: &mut [BatchItem],
        tokens: &mut dyn TokenSink,
    ) -> Result<(), ExecError> {
        if let Some(slot) = &self.slot {
            self.client = slot.current();
        }
        let (jobs, failed) = plan(items, self.client.name(), self.client.prompt_array());
        for (index, error) in failed {
            items[index].error = Some(error);
        }
        let ctx = JobContext {
            client: &self.client,
            stop: &self.stop,
        };
        if let [job] = jobs.as_slice() {
            // The common case (one array request, or a single item): no thread, no channel.
            let results = ctx.run(job, &mut |item, offset, text| {
                tokens.token(item, offset, text)
            });
            store(items, results);
        } else if !jobs.is_empty() {
            ctx.run_concurrently(&jobs, items, tokens);
        }
        for item in items.iter_mut() {
            if item.output.is_none() && item.error.is_none() {
                debug_assert!(false, "upstream executor left an item unanswered");
                item.error = Some(ExecError::Backend(
                    "upstream executor left the request unanswered".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Which endpoint a request goes to and how its answer is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Completions,
    Chat,
    Embeddings,
}

impl Shape {
    fn path(self) -> &'static str {
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
struct BackendRequest {
    shape: Shape,
    stream: bool,
    body: String,
    /// The batch items it answers, in the order of its prompts (inputs). Never empty.
    items: Vec<JobItem>,
}

#[derive(Debug)]
struct JobItem {
    /// Position in the batch.
    index: usize,
    /// For estimating prompt tokens when the backend reports none.
    prompt: Arc<str>,
}

/// One item's answer.
type ItemResult = (usize, Result<Output, ExecError>);

/// Groups a batch into requests; items that cannot be sent at all come back as errors.
fn plan(
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

fn store(items: &mut [BatchItem], results: Vec<ItemResult>) {
    for (index, result) in results {
        match result {
            Ok(output) => items[index].output = Some(output),
            Err(error) => items[index].error = Some(error),
        }
    }
}

/// What a job thread sends the calling thread.
enum Msg {
    Piece {
        item: usize,
        offset: u32,
        text: String,
    },
    Done(Vec<ItemResult>),
}

struct JobContext<'a> {
    client: &'a UpstreamClient,
    stop: &'a AtomicBool,
}

impl JobContext<'_> {
    /// Runs `jobs` on up to `CONCURRENT_REQUESTS_MAX` scoped threads; the calling thread
    /// relays their token pieces to `tokens` (a sink is not `Send`) and stores the results.
    fn run_concurrently(
        &self,
        jobs: &[BackendRequest],
        items: &mut [BatchItem],
        tokens: &mut dyn TokenSink,
    ) {
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<Msg>();
            for _ in 0..jobs.len().min(CONCURRENT_REQUESTS_MAX) {
                let tx = tx.clone();
                let next = &next;
                let spawned = std::thread::Builder::new()
                    .name(format!("abe-up-{}", self.client.name()))
                    .spawn_scoped(scope, move || {
                        // Relaxed: the counter only hands out distinct indices; the jobs
                        // themselves were written before the scope started.
                        while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                            let results = self.run(job, &mut |item, offset, text| {
                                // The receiver outlives every sender in the scope.
                                let _ = tx.send(Msg::Piece { item, offset, text });
                            });
                            let _ = tx.send(Msg::Done(results));
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(backend = self.client.name(), error = %e,
                        "cannot start an upstream request thread; running with fewer");
                    break;
                }
            }
            drop(tx);
            for msg in rx {
                match msg {
                    Msg::Piece { item, offset, text } => tokens.token(item, offset, text),
                    Msg::Done(results) => store(items, results),
                }
            }
        });
        // No thread could be started: run what is left here, one after another.
        while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
            let results = self.run(job, &mut |item, offset, text| {
                tokens.token(item, offset, text)
            });
            store(items, results);
        }
    }

    /// Sends one request and reads its answer; every item of the job gets a result.
    fn run(
        &self,
        job: &BackendRequest,
        emit: &mut dyn FnMut(usize, u32, String),
    ) -> Vec<ItemResult> {
        // Acquire: pairs with the Release store at shutdown (the flag guards no data, but
        // a stale read here only starts one more request, never loses one).
        if self.stop.load(Ordering::Acquire) {
            let e = ExecError::Backend("shutting down".into());
            return job
                .items
                .iter()
                .map(|i| (i.index, Err(e.clone())))
                .collect();
        }
        let call = Call::new(self.client, "POST", job.shape.path());
        let outcome = if job.stream {
            debug_assert_eq!(job.items.len(), 1);
            self.stream(&call, job, emit)
                .map(|o| vec![(job.items[0].index, Ok(o))])
        } else {
            self.request(&call, job)
        };
        outcome.unwrap_or_else(|e| {
            job.items
                .iter()
                .map(|i| (i.index, Err(e.clone())))
                .collect()
        })
    }

    /// A request whose whole answer is one JSON document.
    fn request(&self, call: &Call<'_>, job: &BackendRequest) -> Result<Vec<ItemResult>, ExecError> {
        let mut response = self.client.post_json(call, &job.body)?;
        let body = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|e| call.transport_error(e))?;
        match job.shape {
            Shape::Completions => {
                let parsed = wire::parse_completions(&body).map_err(|e| call.protocol(e))?;
                Ok(split_text(call, job, parsed))
            }
            Shape::Chat => {
                let parsed = wire::parse_chat(&body).map_err(|e| call.protocol(e))?;
                Ok(split_text(call, job, parsed))
            }
            Shape::Embeddings => {
                let parsed = wire::parse_embeddings(&body).map_err(|e| call.protocol(e))?;
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
                            .ok_or_else(|| {
                                call.protocol(format_args!("no embedding for input {k}"))
                            });
                        (item.index, output)
                    })
                    .collect())
            }
        }
    }

    /// A streaming request: relays each piece as it arrives, answers with the whole text.
    fn stream(
        &self,
        call: &Call<'_>,
        job: &BackendRequest,
        emit: &mut dyn FnMut(usize, u32, String),
    ) -> Result<Output, ExecError> {
        let item = &job.items[0];
        let chat = job.shape == Shape::Chat;
        let mut response = self.client.post_json(call, &job.body)?;
        let mut events = SseReader::new(BufReader::new(response.body_mut().as_reader()));
        let mut text = String::new();
        let mut pieces: u32 = 0;
        let mut finish: Option<FinishReason> = None;
        let mut usage: Option<BackendUsage> = None;
        loop {
            let data = match events.next_event().map_err(|e| call.io_error(e))? {
                SseEvent::Data(data) => data,
                SseEvent::Done => break,
                // Some servers end the body without [DONE]; a finish reason says it is whole.
                SseEvent::Eof if finish.is_some() => break,
                SseEvent::Eof => {
                    return Err(call.protocol(format_args!(
                        "the stream ended after {} bytes without `data: [DONE]`",
                        text.len()
                    )))
                }
            };
            let chunk = wire::parse_chunk(data, chat).map_err(|e| match e {
                ChunkError::Upstream(m) => {
                    call.protocol(format_args!("error inside the stream: {m}"))
                }
                ChunkError::Invalid(m) => call.protocol(m),
            })?;
            if let Some(piece) = chunk.text {
                let offset = u32::try_from(text.len()).unwrap_or(u32::MAX);
                text.push_str(&piece);
                pieces = pieces.saturating_add(1);
                emit(item.index, offset, piece);
            }
            finish = chunk.finish_reason.or(finish);
            usage = chunk.usage.or(usage);
        }
        let usage = usage.unwrap_or_default();
        Ok(Output::Text {
            text,
            prompt_tokens: usage
                .prompt_tokens
                .unwrap_or_else(|| prompt_tokens(&item.prompt)),
            completion_tokens: usage.completion_tokens.unwrap_or(pieces),
            finish_reason: finish.unwrap_or(FinishReason::Stop),
            tool_calls: None,
            cached_tokens: None,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Ticket;

    fn item(kind: Kind, prompt: &str, model: Option<&str>) -> BatchItem {
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

    #[test]
    fn stop_fails_every_item_without_a_request() {
        let target = super::super::UpstreamTarget {
            name: "nowhere".into(),
            // Port 9 (discard) on loopback: nothing should even be tried.
            base_url: "http://127.0.0.1:9".into(),
            api_key: None,
            prompt_array: true,
        };
        let timeouts = super::super::UpstreamTimeouts {
            connect: std::time::Duration::from_millis(50),
            request: std::time::Duration::from_millis(50),
        };
        let client = UpstreamClient::new(target, timeouts);
        let mut exec = UpstreamExecutor::new(client, Arc::new(AtomicBool::new(true)));
        let mut items = vec![
            item(Kind::Completion, "a", Some("m")),
            item(Kind::Embedding, "b", Some("m")),
        ];
        exec.execute(&mut items, &mut crate::exec::NoTokens)
            .unwrap();
        for item in &items {
            assert_eq!(item.error, Some(ExecError::Backend("shutting down".into())));
        }
    }
}
