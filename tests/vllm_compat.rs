//! The request fields a client built for vLLM sends, over real TCP on 127.0.0.1: `n`,
//! `best_of`, `logprobs` / `top_logprobs` (whole and streamed), `echo` (whole and streamed), `ignore_eos`,
//! `min_tokens`, `max_model_len`'s 400, `/tokenize` and `/detokenize`.

use crate::common;

use abe::core::BatchingMode;
use common::{start, test_config, Client};

fn post(c: &mut Client, path: &str, body: &str) -> (u16, serde_json::Value, String) {
    let r = c.request("POST", path, Some(body));
    let text = r.text();
    let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    (r.status, v, text)
}

#[test]
fn n_choices_are_distinct_deterministic_and_counted_once_per_prompt() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let body = r#"{"prompt":"Hello there, abe","max_tokens":5,"n":3}"#;
    let (status, v, text) = post(&mut c, "/v1/completions", body);
    assert_eq!(status, 200, "{text}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert!(
        texts[0] != texts[1] && texts[1] != texts[2] && texts[0] != texts[2],
        "{texts:?}"
    );
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i);
    }
    assert_eq!(v["usage"]["prompt_tokens"], 4, "the prompt counts once");
    assert_eq!(v["usage"]["completion_tokens"], 15);
    let (_, again, _) = post(&mut c, "/v1/completions", body);
    assert_eq!(again["choices"], v["choices"], "same request, same texts");
    // Choice 0 is what n = 1 gets.
    let (_, one, _) = post(
        &mut c,
        "/v1/completions",
        r#"{"prompt":"Hello there, abe","max_tokens":5}"#,
    );
    assert_eq!(one["choices"][0]["text"], v["choices"][0]["text"]);
    // Two prompts x n = 2: prompt-major order, as OpenAI numbers them.
    let (_, v, _) = post(
        &mut c,
        "/v1/completions",
        r#"{"prompt":["a","b"],"max_tokens":2,"n":2}"#,
    );
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    let (status, v, text) = post(
        &mut c,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"n":2,"best_of":4}"#,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    for (body, needle) in [
        (r#"{"prompt":"x","n":0}"#, "'n' must be between 1 and 128"),
        (
            r#"{"prompt":"x","n":2,"best_of":1}"#,
            "'best_of' must be between n (2)",
        ),
        (
            r#"{"prompt":"x","n":1,"best_of":2,"stream":true}"#,
            "cannot be streamed",
        ),
        (
            r#"{"prompt":"x","max_tokens":4,"min_tokens":5}"#,
            "'min_tokens' must be between 0",
        ),
        (
            r#"{"prompt":"x","logprobs":6}"#,
            "'logprobs' must be between 0 and 5",
        ),
    ] {
        let (status, _, text) = post(&mut c, "/v1/completions", body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
    abe.shutdown();
}

#[test]
fn logprobs_are_well_formed_in_both_endpoints_and_in_streams() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let (status, v, text) = post(
        &mut c,
        "/v1/completions",
        r#"{"prompt":"lp","max_tokens":4,"logprobs":2,"echo":true}"#,
    );
    assert_eq!(status, 200, "{text}");
    let ch = &v["choices"][0];
    assert!(ch["text"].as_str().unwrap().starts_with("lp"), "echo: {ch}");
    let lp = &ch["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["text_offset"][0], 2, "offsets count the echoed prompt");
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let (status, v, text) = post(
        &mut c,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"logprobs":true,"top_logprobs":3}"#,
    );
    assert_eq!(status, 200, "{text}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    assert!(content[0]["logprob"].as_f64().unwrap() < 0.0);
    let (status, _, text) = post(
        &mut c,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":3}"#,
    );
    assert_eq!(status, 400, "{text}");
    for (path, body) in [
        (
            "/v1/completions",
            r#"{"prompt":"lp","max_tokens":3,"logprobs":1,"stream":true}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"logprobs":true,"stream":true}"#,
        ),
    ] {
        let (status, _, text) = post(&mut c, path, body);
        assert_eq!(status, 200, "{text}");
        let with_logprobs = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
            .filter(|v| v["choices"][0]["logprobs"].is_object())
            .count();
        assert_eq!(with_logprobs, 3, "one per token: {text}");
    }
    abe.shutdown();
}

#[test]
fn a_streamed_echo_begins_each_choice_with_its_prompt() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        let (status, _, text) = post(
            &mut c,
            "/v1/completions",
            r#"{"prompt":["ab","cde"],"n":2,"max_tokens":3,"logprobs":1,"echo":true,"stream":true}"#,
        );
        assert_eq!(status, 200, "{mode:?}: {text}");
        let chunks: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        for index in 0..4u64 {
            let mine: Vec<&serde_json::Value> = chunks
                .iter()
                .map(|v| &v["choices"][0])
                .filter(|ch| ch["index"] == index)
                .collect();
            let prompt = if index < 2 { "ab" } else { "cde" };
            assert_eq!(mine[0]["text"], prompt, "{mode:?} choice {index}: {text}");
            assert!(mine[0]["logprobs"].is_null(), "the prompt has no logprobs");
            let tokens: Vec<&&serde_json::Value> = mine
                .iter()
                .skip(1)
                .filter(|ch| ch["logprobs"].is_object())
                .collect();
            assert_eq!(tokens.len(), 3, "{mode:?} choice {index}: {text}");
            assert_eq!(
                tokens[0]["logprobs"]["text_offset"][0],
                prompt.len(),
                "offsets count the echoed prompt, as in a whole answer"
            );
            let whole: String = mine.iter().filter_map(|ch| ch["text"].as_str()).collect();
            assert!(whole.starts_with(prompt) && whole.len() > prompt.len());
            assert_eq!(mine.last().unwrap()["finish_reason"], "length");
        }
        abe.shutdown();
    }
}

#[test]
fn max_model_len_is_refused_with_vllms_400() {
    let mut cfg = test_config();
    cfg.server.max_model_len = 16;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    // 15 bytes: 4 prompt tokens.
    let (status, _, text) = post(
        &mut c,
        "/v1/completions",
        r#"{"prompt":"Hello there, abe","max_tokens":12}"#,
    );
    assert_eq!(status, 200, "{text}");
    let (status, v, text) = post(
        &mut c,
        "/v1/completions",
        r#"{"prompt":"Hello there, abe","max_tokens":13}"#,
    );
    assert_eq!(status, 400, "{text}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("This model's maximum context length is 16 tokens. However, you requested 17 tokens (4 in the messages, 13 in the completion)"),
        "{msg}"
    );
    let (status, v, _) = post(&mut c, "/tokenize", r#"{"prompt":"Hello there, abe"}"#);
    assert_eq!(status, 200);
    assert_eq!(v["count"], 4);
    assert_eq!(v["max_model_len"], 16);
    let tokens = v["tokens"].to_string();
    let (status, v, _) = post(&mut c, "/detokenize", &format!(r#"{{"tokens":{tokens}}}"#));
    assert_eq!(status, 200);
    assert_eq!(v["prompt"], "Hello there, abe");
    let (status, _, _) = post(&mut c, "/detokenize", r#"{"tokens":[3]}"#);
    assert_eq!(status, 400);
    abe.shutdown();
}

#[test]
fn ignore_eos_and_min_tokens_change_where_generation_ends() {
    let mut cfg = test_config();
    cfg.batching.mode = BatchingMode::Continuous;
    cfg.continuous.natural_length_mean_tokens = 2;
    let abe = start(cfg);
    let mut c = Client::connect(abe.local_addr());
    let prompts = r#"["p0","p1","p2","p3","p4","p5","p6","p7"]"#;
    // Tokens per choice: the synthetic text is one word per token.
    let tokens = |v: &serde_json::Value| -> Vec<usize> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().split(' ').count())
            .collect()
    };
    let (_, natural, _) = post(
        &mut c,
        "/v1/completions",
        &format!(r#"{{"prompt":{prompts},"max_tokens":20}}"#),
    );
    assert!(
        tokens(&natural).iter().any(|&t| t < 20),
        "natural ends come early: {natural}"
    );
    let (_, v, _) = post(
        &mut c,
        "/v1/completions",
        &format!(r#"{{"prompt":{prompts},"max_tokens":20,"ignore_eos":true}}"#),
    );
    assert!(tokens(&v).iter().all(|&t| t == 20), "{v}");
    assert!(v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["finish_reason"] == "length"));
    let (_, v, _) = post(
        &mut c,
        "/v1/completions",
        &format!(r#"{{"prompt":{prompts},"max_tokens":20,"min_tokens":12}}"#),
    );
    assert!(tokens(&v).iter().all(|&t| t >= 12), "{v}");
    abe.shutdown();
}

#[test]
fn echo_text_mode_answers_with_the_prompt_in_both_modes() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let mut cfg = test_config();
        cfg.batching.mode = mode;
        cfg.workers.text = abe::exec::sim::TextMode::Echo;
        let abe = start(cfg);
        let mut c = Client::connect(abe.local_addr());
        let (status, v, text) = post(
            &mut c,
            "/v1/completions",
            r#"{"prompt":"the quick brown fox","max_tokens":10}"#,
        );
        assert_eq!(status, 200, "{text}");
        assert_eq!(v["choices"][0]["text"], "the quick brown fox", "{mode:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["completion_tokens"], 4);
        let (_, v, _) = post(
            &mut c,
            "/v1/completions",
            r#"{"prompt":"the quick brown fox","max_tokens":2}"#,
        );
        assert_eq!(v["choices"][0]["text"], "the quick");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let (_, v, _) = post(
            &mut c,
            "/v1/completions",
            r#"{"prompt":"one two","max_tokens":5,"ignore_eos":true}"#,
        );
        assert_eq!(v["choices"][0]["text"], "one two one two one", "{mode:?}");
        abe.shutdown();
    }
}
