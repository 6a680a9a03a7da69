//! The `upstream` executor and the health checker against a mock OpenAI-compatible backend:
//! batching into array requests, splitting answers back per item, streaming relay, error
//! mapping per item, probes, and health transitions.

use crate::common;

use abe::core::{Kind, Ticket};
use abe::exec::health::{spawn_health_checker, HealthBoard};
use abe::exec::upstream::{
    UpstreamClient, UpstreamExecutor, UpstreamTarget, UpstreamTimeouts, CONCURRENT_REQUESTS_MAX,
};
use abe::exec::{BatchItem, ExecError, Executor, FinishReason, NoTokens, Output, TokenSink, Work};
use common::mock_upstream::{
    mock_embedding, mock_pieces, mock_text, mock_tokens, MockUpstream, Mode, DEFAULT_DIMENSIONS,
    MOCK_MODEL,
};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const EMBEDDINGS: &str = "/v1/embeddings";

fn timeouts(request: Duration) -> UpstreamTimeouts {
    UpstreamTimeouts {
        connect: Duration::from_secs(2),
        request,
    }
}

fn client_for(base_url: String, prompt_array: bool, request: Duration) -> UpstreamClient {
    let target = UpstreamTarget {
        name: "mock".into(),
        base_url,
        api_key: None,
        prompt_array,
    };
    UpstreamClient::new(target, timeouts(request))
}

/// An executor on `client` whose stop flag is never set.
fn executor_on(client: UpstreamClient) -> UpstreamExecutor {
    UpstreamExecutor::new(client, Arc::new(AtomicBool::new(false)))
}

fn executor(mock: &MockUpstream, prompt_array: bool) -> UpstreamExecutor {
    let client = client_for(mock.base_url(), prompt_array, Duration::from_secs(10));
    executor_on(client)
}

fn completion(prompt: &str, max_tokens: u32) -> Work {
    Work {
        kind: Kind::Completion,
        prompt: prompt.into(),
        max_tokens,
        model: Some(MOCK_MODEL.into()),
        ..Work::default()
    }
}

fn embedding(input: &str, dimensions: u32) -> Work {
    Work {
        kind: Kind::Embedding,
        prompt: input.into(),
        dimensions,
        model: Some(MOCK_MODEL.into()),
        ..Work::default()
    }
}

fn chat(content: &str, max_tokens: u32) -> Work {
    let body = json!({
        "model": "client-alias",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "response_format": {"type": "text"},
        "stream_options": {"include_usage": true},
    });
    Work {
        chat_body: Some(body.to_string().into()),
        ..completion(&format!("user: {content}"), max_tokens)
    }
}

fn batch(works: Vec<Work>) -> Vec<BatchItem> {
    works
        .into_iter()
        .enumerate()
        .map(|(k, w)| {
            let ticket = Ticket {
                index: k as u32,
                generation: 1,
            };
            BatchItem::new(ticket, w)
        })
        .collect()
}

fn text_of(item: &BatchItem) -> (&str, u32, u32, FinishReason) {
    assert_eq!(item.error, None, "item {} failed", item.ticket);
    match item.output.as_ref().expect("output") {
        Output::Text {
            text,
            prompt_tokens,
            completion_tokens,
            finish_reason,
            ..
        } => (text, *prompt_tokens, *completion_tokens, *finish_reason),
        other => panic!("not text: {other:?}"),
    }
}

fn error_of(item: &BatchItem) -> &ExecError {
    item.error.as_ref().expect("the item failed")
}

/// Records every piece a streaming run sends.
#[derive(Default)]
struct Recorder {
    pieces: Vec<(usize, u32, String)>,
}

impl TokenSink for Recorder {
    fn token(&mut self, item: usize, offset: u32, text: String) {
        self.pieces.push((item, offset, text));
    }
}

impl Recorder {
    /// Item `item`'s pieces, checking each starts where the previous ended.
    fn text_of(&self, item: usize) -> (Vec<String>, String) {
        let mut pieces = Vec::new();
        let mut text = String::new();
        for (i, offset, piece) in &self.pieces {
            if *i == item {
                assert_eq!(
                    *offset as usize,
                    text.len(),
                    "piece {piece:?} of item {item}"
                );
                text.push_str(piece);
                pieces.push(piece.clone());
            }
        }
        (pieces, text)
    }
}

#[test]
fn completions_with_prompt_array_go_as_one_request_and_land_in_their_items() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let prompts = [
        "the quick brown fox",
        "jumps",
        "over the lazy dog today friend",
    ];
    let mut items = batch(prompts.iter().map(|p| completion(p, 3)).collect());
    exec.execute(&mut items, &mut NoTokens).unwrap();

    assert_eq!(mock.requests(COMPLETIONS), 1);
    let sent = mock.last_json(COMPLETIONS).unwrap();
    assert_eq!(sent["prompt"], json!(prompts));
    assert_eq!(sent["model"], MOCK_MODEL);
    assert_eq!(sent["max_tokens"], 3);
    let (mut prompt_total, mut completion_total) = (0, 0);
    for (item, prompt) in items.iter().zip(prompts) {
        let (text, p, c, finish) = text_of(item);
        assert_eq!(text, mock_text(prompt, 3));
        let cut = format!("echo:{prompt}").split_whitespace().count() > 3;
        let expected = if cut {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        assert_eq!(finish, expected, "{prompt}");
        prompt_total += u64::from(p);
        completion_total += u64::from(c);
    }
    // The backend's usage is split between the items, not invented.
    let words = |t: &str| t.split_whitespace().count() as u64;
    assert_eq!(
        prompt_total,
        prompts.iter().map(|p| mock_tokens(p)).sum::<u64>()
    );
    assert_eq!(
        completion_total,
        prompts.iter().map(|p| words(&mock_text(p, 3))).sum::<u64>()
    );
}

#[test]
fn different_sampling_parameters_are_separate_array_requests() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let mut hot = completion("b", 4);
    hot.sampling.temperature = Some(1.5);
    let mut items = batch(vec![completion("a", 4), hot, completion("c", 4)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(mock.requests(COMPLETIONS), 2);
    for (item, p) in items.iter().zip(["a", "b", "c"]) {
        assert_eq!(text_of(item).0, mock_text(p, 4));
    }
}

#[test]
fn without_prompt_array_each_completion_is_its_own_request() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, false);
    let prompts = ["one", "two", "three", "four"];
    let mut items = batch(prompts.iter().map(|p| completion(p, 8)).collect());
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(mock.requests(COMPLETIONS), 4);
    assert!(mock.last_json(COMPLETIONS).unwrap()["prompt"].is_string());
    for (item, p) in items.iter().zip(prompts) {
        let (text, prompt_tokens, completion_tokens, _) = text_of(item);
        assert_eq!(text, mock_text(p, 8));
        // One item per request: the backend's usage as it is.
        assert_eq!(u64::from(prompt_tokens), mock_tokens(p));
        assert_eq!(completion_tokens as usize, text.split_whitespace().count());
    }
}

#[test]
fn embeddings_are_grouped_by_dimensions_and_split_by_index() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let mut items = batch(vec![
        embedding("alpha", 4),
        embedding("beta", 0),
        embedding("gamma", 4),
    ]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(mock.requests(EMBEDDINGS), 2);
    let expected = [
        mock_embedding("alpha", 4),
        mock_embedding("beta", DEFAULT_DIMENSIONS),
        mock_embedding("gamma", 4),
    ];
    for (item, want) in items.iter().zip(expected) {
        assert_eq!(item.error, None);
        match item.output.as_ref().unwrap() {
            Output::Embedding {
                vector,
                prompt_tokens,
            } => {
                assert_eq!(vector, &want);
                assert_eq!(*prompt_tokens, 1);
            }
            other => panic!("not an embedding: {other:?}"),
        }
    }
    // The last request was one of the two groups; whichever, its shape is OpenAI's.
    let sent = mock.last_json(EMBEDDINGS).unwrap();
    assert_eq!(sent["encoding_format"], "float");
    match sent["input"].as_array().map(Vec::len) {
        Some(2) => assert_eq!(sent["dimensions"], 4),
        Some(1) => assert!(sent.get("dimensions").is_none(), "{sent}"),
        _ => panic!("unexpected input: {sent}"),
    }
}

#[test]
fn chat_forwards_the_client_body_with_the_routed_model() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let mut items = batch(vec![chat("hello there friend", 2)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(mock.requests(CHAT), 1);
    let sent = mock.last_json(CHAT).unwrap();
    assert_eq!(sent["model"], MOCK_MODEL);
    assert_eq!(sent["stream"], false);
    assert!(sent.get("stream_options").is_none(), "{sent}");
    assert_eq!(sent["messages"][1]["content"], "hello there friend");
    assert_eq!(sent["response_format"]["type"], "text");
    let (text, _, completion_tokens, finish) = text_of(&items[0]);
    assert_eq!(text, mock_text("hello there friend", 2));
    assert_eq!(completion_tokens, 2);
    assert_eq!(finish, FinishReason::Length);
}

#[test]
fn streams_relay_pieces_in_order_and_the_output_is_their_concatenation() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let mut streamed = completion("a b c d e f", 5);
    streamed.stream = true;
    let mut streamed_chat = chat("one two three", 10);
    streamed_chat.stream = true;
    // A non-streaming item in the same batch runs beside them.
    let mut items = batch(vec![streamed, streamed_chat, completion("plain", 4)]);
    let mut sink = Recorder::default();
    exec.execute(&mut items, &mut sink).unwrap();

    let sent = mock.last_json(CHAT).unwrap();
    assert_eq!(sent["stream"], true);
    assert!(sent.get("stream_options").is_none(), "{sent}");
    for (k, prompt, max) in [(0, "a b c d e f", 5), (1, "one two three", 10)] {
        let (pieces, relayed) = sink.text_of(k);
        assert_eq!(pieces, mock_pieces(prompt, max), "item {k}");
        let (text, _, completion_tokens, _) = text_of(&items[k]);
        assert_eq!(text, relayed);
        assert_eq!(completion_tokens as usize, pieces.len());
    }
    assert_eq!(text_of(&items[0]).3, FinishReason::Length);
    assert_eq!(text_of(&items[1]).3, FinishReason::Stop);
    assert_eq!(text_of(&items[2]).0, mock_text("plain", 4));
    assert!(sink.pieces.iter().all(|(i, _, _)| *i != 2));
}

#[test]
fn a_single_stream_runs_on_the_calling_thread() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, false);
    let mut work = completion("x y z", 16);
    work.stream = true;
    let mut items = batch(vec![work]);
    let mut sink = Recorder::default();
    exec.execute(&mut items, &mut sink).unwrap();
    let (pieces, relayed) = sink.text_of(0);
    assert_eq!(pieces, mock_pieces("x y z", 16));
    assert_eq!(text_of(&items[0]).0, relayed);
    assert_eq!(relayed, mock_text("x y z", 16));
}

#[test]
fn sequential_batches_reuse_one_keep_alive_connection() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    for round in 0..5 {
        let mut items = batch(vec![completion(&format!("round {round}"), 4)]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        assert_eq!(items[0].error, None);
    }
    assert_eq!(mock.requests(COMPLETIONS), 5);
    assert_eq!(mock.connections(), 1);
}

#[test]
fn the_api_key_is_sent_as_a_bearer_token() {
    let mock = MockUpstream::start();
    let target = UpstreamTarget {
        name: "keyed".into(),
        base_url: mock.base_url(),
        api_key: Some("sk-test".into()),
        prompt_array: true,
    };
    let client = UpstreamClient::new(target, timeouts(Duration::from_secs(10)));
    let mut exec = executor_on(client.clone());
    let mut items = batch(vec![completion("k", 1)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(
        mock.last_header(COMPLETIONS, "authorization").as_deref(),
        Some("Bearer sk-test")
    );
    client.probe("/v1/models", Duration::from_secs(5)).unwrap();
    assert_eq!(
        mock.last_header("/v1/models", "authorization").as_deref(),
        Some("Bearer sk-test")
    );
}

#[test]
fn an_item_without_a_model_fails_alone() {
    let mock = MockUpstream::start();
    let mut exec = executor(&mock, true);
    let mut lost = completion("lost", 4);
    lost.model = None;
    let mut items = batch(vec![completion("kept", 4), lost]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(text_of(&items[0]).0, mock_text("kept", 4));
    assert!(
        matches!(error_of(&items[1]), ExecError::Protocol { message, .. } if message.contains("no model")),
        "{:?}",
        items[1].error
    );
    assert_eq!(mock.requests(COMPLETIONS), 1);
}

#[test]
fn a_set_stop_flag_sends_nothing() {
    let mock = MockUpstream::start();
    let client = client_for(mock.base_url(), true, Duration::from_secs(10));
    let stop = Arc::new(AtomicBool::new(false));
    let mut exec = UpstreamExecutor::new(client, stop.clone());
    stop.store(true, Ordering::Release);
    let mut items = batch(vec![completion("a", 1), embedding("b", 0), chat("c", 1)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    for item in &items {
        assert_eq!(error_of(item), &ExecError::Backend("shutting down".into()));
    }
    assert_eq!(mock.total_requests(), 0);
}

#[test]
fn a_5xx_fails_every_item_as_a_backend_fault_with_the_upstream_message() {
    let mock = MockUpstream::start();
    mock.set_mode(Mode::Status(500));
    let mut exec = executor(&mock, true);
    let mut items = batch(vec![
        completion("a", 1),
        completion("b", 1),
        embedding("c", 0),
    ]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    for item in &items {
        let e = error_of(item);
        match e {
            ExecError::Status {
                backend,
                status,
                message,
            } => {
                assert_eq!(backend, "mock");
                assert_eq!(*status, 500);
                assert!(message.contains("mock upstream answers 500"), "{message}");
                assert!(message.contains("/v1/"), "{message}");
            }
            other => panic!("not a status error: {other:?}"),
        }
        assert!(e.is_backend_fault());
        assert_eq!(e.http_status(), 502);
    }
}

#[test]
fn a_4xx_is_the_request_s_own_fault() {
    let mock = MockUpstream::start();
    mock.set_mode(Mode::Status(400));
    let mut exec = executor(&mock, false);
    let mut items = batch(vec![chat("x", 1)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    let e = error_of(&items[0]);
    assert!(matches!(e, ExecError::Status { status: 400, .. }), "{e:?}");
    assert!(!e.is_backend_fault());
    assert_eq!(e.http_status(), 400);
}

#[test]
fn a_closed_connection_is_a_connect_or_protocol_error() {
    let mock = MockUpstream::start();
    mock.set_mode(Mode::Close);
    let mut exec = executor(&mock, true);
    let mut streamed = completion("s", 2);
    streamed.stream = true;
    let mut items = batch(vec![completion("a", 1), streamed]);
    exec.execute(&mut items, &mut Recorder::default()).unwrap();
    for item in &items {
        let e = error_of(item);
        assert!(
            matches!(e, ExecError::Connect { .. } | ExecError::Protocol { .. }),
            "{e:?}"
        );
        assert!(e.is_backend_fault());
    }
}

/// A backend that closes a kept-alive connection while it is idle (its keep-alive timeout):
/// the next request does not go on it. (A backend that closes right after an answer, without
/// `Connection: close`, races the next request: that one fails rather than being sent twice,
/// since the backend may have served it, and the router retries it elsewhere.)
#[test]
fn a_kept_alive_connection_the_backend_closed_is_not_used_again() {
    let mock = MockUpstream::start();
    mock.set_mode(Mode::OneThenClose);
    let mut exec = executor(&mock, true);
    for round in 0..3 {
        if round > 0 {
            // The connection is idle while the backend closes it.
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut items = batch(vec![completion(&format!("r{round}"), 2)]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        let (text, ..) = text_of(&items[0]);
        assert_eq!(text, mock_text(&format!("r{round}"), 2), "round {round}");
    }
    // Each batch after the first found the connection closed and opened a new one.
    assert_eq!(mock.connections(), 3);
    assert_eq!(mock.requests("/v1/completions"), 3, "nothing sent twice");
}

#[test]
fn a_hanging_backend_times_out() {
    let mock = MockUpstream::start();
    mock.set_mode(Mode::Hang);
    let client = client_for(mock.base_url(), true, Duration::from_millis(300));
    let mut exec = executor_on(client);
    let mut streamed = completion("s", 2);
    streamed.stream = true;
    let mut items = batch(vec![completion("a", 1), streamed]);
    exec.execute(&mut items, &mut Recorder::default()).unwrap();
    for item in &items {
        let e = error_of(item);
        assert!(matches!(e, ExecError::Timeout { .. }), "{e:?}");
        assert_eq!(e.http_status(), 504);
    }
}

#[test]
fn a_stream_that_stalls_past_the_request_timeout_fails_after_its_first_pieces() {
    let mock = MockUpstream::start();
    // Ten pieces 150 ms apart against a 400 ms budget: some arrive, the rest cannot.
    mock.set_piece_delay(Duration::from_millis(150));
    let client = client_for(mock.base_url(), true, Duration::from_millis(400));
    let mut exec = executor_on(client);
    let mut work = completion("1 2 3 4 5 6 7 8 9", 16);
    work.stream = true;
    let mut items = batch(vec![work]);
    let mut sink = Recorder::default();
    exec.execute(&mut items, &mut sink).unwrap();
    let e = error_of(&items[0]);
    assert!(matches!(e, ExecError::Timeout { .. }), "{e:?}");
    let (pieces, _) = sink.text_of(0);
    let all = mock_pieces("1 2 3 4 5 6 7 8 9", 16);
    assert!(pieces.len() < all.len(), "{pieces:?}");
    assert_eq!(pieces[..], all[..pieces.len()]);
}

#[test]
fn single_requests_run_concurrently_but_at_most_the_cap_at_once() {
    let mock = MockUpstream::start();
    // Slow answers, so requests overlap whenever the executor lets them.
    mock.set_delay(Duration::from_millis(50));
    let mut exec = executor(&mock, false);
    let n = CONCURRENT_REQUESTS_MAX * 2 + 3;
    let prompts: Vec<String> = (0..n).map(|k| format!("p{k}")).collect();
    let mut items = batch(prompts.iter().map(|p| completion(p, 4)).collect());
    exec.execute(&mut items, &mut NoTokens).unwrap();
    assert_eq!(mock.requests(COMPLETIONS), n as u64);
    for (item, p) in items.iter().zip(&prompts) {
        assert_eq!(text_of(item).0, mock_text(p, 4));
    }
    let peak = mock.in_flight_max();
    assert!(peak > 1, "requests never overlapped");
    assert!(
        peak <= CONCURRENT_REQUESTS_MAX as u64,
        "{peak} requests at once"
    );
}

/// A loopback port with nothing listening (bound, then released).
fn dead_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[test]
fn a_refused_connection_is_a_connect_error_naming_backend_and_url() {
    let url = dead_port_url();
    let client = client_for(url.clone(), true, Duration::from_secs(5));
    let mut exec = executor_on(client);
    let mut items = batch(vec![completion("a", 1), embedding("b", 0)]);
    exec.execute(&mut items, &mut NoTokens).unwrap();
    for item in &items {
        match error_of(item) {
            ExecError::Connect { backend, message } => {
                assert_eq!(backend, "mock");
                assert!(message.contains(&url), "{message}");
            }
            other => panic!("not a connect error: {other:?}"),
        }
    }
}

#[test]
fn probe_is_ok_on_2xx_and_an_error_otherwise() {
    let mock = MockUpstream::start();
    let client = client_for(mock.base_url(), true, Duration::from_secs(5));
    assert_eq!(client.name(), "mock");
    client.probe("/v1/models", Duration::from_secs(5)).unwrap();
    client.probe("/health", Duration::from_secs(5)).unwrap();
    assert!(matches!(
        client.probe("/nope", Duration::from_secs(5)),
        Err(ExecError::Status { status: 404, .. })
    ));
    mock.set_mode(Mode::Status(503));
    assert!(matches!(
        client.probe("/v1/models", Duration::from_secs(5)),
        Err(ExecError::Status { status: 503, .. })
    ));
    mock.set_mode(Mode::Hang);
    assert!(matches!(
        client.probe("/v1/models", Duration::from_millis(200)),
        Err(ExecError::Timeout { .. })
    ));
    let dead = client_for(dead_port_url(), true, Duration::from_secs(5));
    assert!(matches!(
        dead.probe("/v1/models", Duration::from_secs(5)),
        Err(ExecError::Connect { .. })
    ));
}

/// Polls `cond` every 10 ms for up to 5 s.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_health_checker_flips_the_board_both_ways() {
    let up = MockUpstream::start();
    let down = MockUpstream::start();
    down.set_mode(Mode::Status(503));
    let board = HealthBoard::new(3);
    let stop = Arc::new(AtomicBool::new(false));
    let targets = vec![
        (
            0,
            client_for(up.base_url(), true, Duration::from_secs(5)).into(),
        ),
        (
            2,
            client_for(down.base_url(), true, Duration::from_secs(5)).into(),
        ),
    ];
    let checker = spawn_health_checker(
        targets,
        board.clone(),
        Duration::from_millis(30),
        Duration::from_secs(1),
        "/v1/models".into(),
        stop.clone(),
    )
    .unwrap();

    eventually("backend 2 is marked down", || !board.healthy(2));
    let g = board.generation();
    assert!(g >= 1);
    assert!(board.healthy(0));
    assert!(
        board.healthy(1),
        "backend 1 is not probed and stays healthy"
    );

    down.set_mode(Mode::Ok);
    eventually("backend 2 is healthy again", || board.healthy(2));
    assert!(board.generation() > g);

    up.set_mode(Mode::Status(503));
    eventually("backend 0 is marked down", || !board.healthy(0));
    // A probe hanging on one backend must not keep the checker from stopping.
    let seen = up.requests("/v1/models");
    up.set_mode(Mode::Hang);
    eventually("a probe hangs on backend 0", || {
        up.requests("/v1/models") > seen
    });

    stop.store(true, Ordering::Release);
    checker.join().unwrap();
}
