//! `POST /v1/responses` and `GET /v1/responses/{id}` over loopback, in both batching modes:
//! the response object, its stream of named events (deltas adding up to the final text, no
//! `[DONE]`), the store (and `store: false`), message-list input with instructions.

use crate::common;

use common::{start_in, Client, MODES};
use serde_json::Value;

/// (event name, data) of each SSE event.
fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').expect("event and data lines");
            let name = name
                .strip_prefix("event: ")
                .expect("an event line")
                .to_string();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name, data)
        })
        .collect()
}

fn output_text(r: &Value) -> &str {
    r["output"][0]["content"][0]["text"].as_str().unwrap()
}

#[test]
fn a_response_is_answered_stored_and_fetched_again() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let r = c.request(
            "POST",
            "/v1/responses",
            Some(r#"{"model":"abe-sim","input":"tell me a story","max_output_tokens":5}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "response");
        assert!(v["id"].as_str().unwrap().starts_with("resp_"));
        assert_eq!(output_text(&v).split(' ').count(), 5, "{v}");
        assert_eq!(v["output"][0]["role"], "assistant");
        assert_eq!(v["usage"]["output_tokens"], 5);
        assert_eq!(
            v["usage"]["total_tokens"].as_u64().unwrap(),
            v["usage"]["input_tokens"].as_u64().unwrap() + 5
        );
        // Cut by max_output_tokens: incomplete, and says why.
        assert_eq!(v["status"], "incomplete");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
        let id = v["id"].as_str().unwrap();
        let got = c.request("GET", &format!("/v1/responses/{id}"), None);
        assert_eq!(got.status, 200);
        assert_eq!(got.json(), v, "{mode:?}: the stored copy is the answer");
        // store: false is not kept; an unknown id is a 404 saying so.
        let r = c.request(
            "POST",
            "/v1/responses",
            Some(r#"{"input":"x","max_output_tokens":2,"store":false}"#),
        );
        let id = r.json()["id"].as_str().unwrap().to_string();
        assert_eq!(r.json()["store"], false);
        let got = c.request("GET", &format!("/v1/responses/{id}"), None);
        assert_eq!(got.status, 404);
        assert!(got.error_message().contains("not stored"));
        // A message list with parts, and instructions; without max_output_tokens it completes.
        let r = c.request(
            "POST",
            "/v1/responses",
            Some(
                r#"{"instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"role":"assistant","content":"hello"},{"role":"user","content":"again"}]}"#,
            ),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], "completed");
        assert_eq!(r.json()["instructions"], "Be brief.");
        for (body, says) in [
            (r#"{"max_output_tokens":2}"#, "'input'"),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"f","parameters":{}}]}"#,
                "'tools' in /v1/responses",
            ),
        ] {
            let r = c.request("POST", "/v1/responses", Some(body));
            assert_eq!(r.status, 400, "{body}");
            assert!(r.error_message().contains(says), "{}", r.text());
        }
        abe.shutdown();
    }
}

#[test]
fn a_streamed_response_sends_the_responses_event_types_in_order() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let r = c.request(
            "POST",
            "/v1/responses",
            Some(r#"{"input":"stream a story","max_output_tokens":4,"stream":true}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(!r.text().contains("[DONE]"));
        let events = named_events(&r.text());
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        let mut expected = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        expected.extend(["response.output_text.delta"; 4]);
        expected.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]);
        assert_eq!(names, expected, "{mode:?}");
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], name.as_str());
            assert_eq!(data["sequence_number"], i as u64);
        }
        let deltas: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        let last = &events.last().unwrap().1["response"];
        assert_eq!(output_text(last), deltas);
        assert_eq!(events[8].1["text"], deltas.as_str());
        assert_eq!(events[0].1["response"]["status"], "in_progress");
        let id = last["id"].as_str().unwrap();
        assert_eq!(events[0].1["response"]["id"], id);
        let got = c.request("GET", &format!("/v1/responses/{id}"), None);
        assert_eq!(
            got.json()["output"][0]["content"][0]["text"],
            deltas.as_str()
        );
        abe.shutdown();
    }
}

fn assert_valid(schema: &Value, instance: &Value) {
    let v = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{instance} against {schema}: {errors:?}");
}

/// `text.format` `json_schema` and `json_object` make the output text schema-valid JSON, whole
/// and streamed (the deltas add up to it), and the response repeats the format; an unknown
/// format type is a 400 naming the field. Checked with the `jsonschema` crate.
#[test]
fn text_format_makes_schema_valid_output_whole_and_streamed() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": false
    });
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let format = serde_json::json!({"type": "json_schema", "name": "w", "schema": schema, "strict": true});
        let body = serde_json::json!({"input": "weather?", "text": {"format": format}});
        let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
        let v = r.json();
        assert_eq!(v["text"]["format"], format);
        assert_eq!(v["status"], "completed");
        assert_valid(&schema, &serde_json::from_str(output_text(&v)).unwrap());
        let mut streamed = body.clone();
        streamed["stream"] = Value::Bool(true);
        let r = c.request("POST", "/v1/responses", Some(&streamed.to_string()));
        assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
        let deltas: String = named_events(&r.text())
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .filter_map(|(_, d)| d["delta"].as_str().map(str::to_string))
            .collect();
        assert_valid(&schema, &serde_json::from_str(&deltas).unwrap());
        let body = serde_json::json!({"input": "json please", "text": {"format": {"type": "json_object"}}});
        let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
        let out: Value = serde_json::from_str(output_text(&r.json())).unwrap();
        assert!(out.is_object(), "{out}");
        let body = serde_json::json!({"input": "x", "text": {"format": {"type": "yaml"}}});
        let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
        assert_eq!(r.status, 400);
        assert!(
            r.error_message().contains("text.format.type"),
            "{}",
            r.text()
        );
        abe.shutdown();
    }
}

/// `previous_response_id` puts the stored response's input and output before the new input
/// (the prompt grows by at least the previous output, chains keep growing, the response
/// names its predecessor, streams too); an id abe does not hold is a 404, as OpenAI answers.
#[test]
fn previous_response_id_continues_the_stored_conversation() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let post = |c: &mut Client, body: Value| {
            let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
            assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
            r.json()
        };
        let first = post(
            &mut c,
            serde_json::json!({"input": "my name is Ada", "max_output_tokens": 20}),
        );
        let alone = post(
            &mut c,
            serde_json::json!({"input": "what is my name?", "max_output_tokens": 3}),
        );
        let id = first["id"].as_str().unwrap();
        let second = post(
            &mut c,
            serde_json::json!({"input": "what is my name?", "max_output_tokens": 3, "previous_response_id": id}),
        );
        assert_eq!(second["previous_response_id"], id);
        let tokens = |r: &Value| r["usage"]["input_tokens"].as_u64().unwrap();
        let first_out = first["usage"]["output_tokens"].as_u64().unwrap();
        assert!(
            tokens(&second) >= tokens(&alone) + first_out / 2 + tokens(&first) / 2,
            "{mode:?}: {} input tokens with the previous response, {} without; it had {} in, {first_out} out",
            tokens(&second),
            tokens(&alone),
            tokens(&first)
        );
        let third = post(
            &mut c,
            serde_json::json!({"input": "and again?", "max_output_tokens": 3, "stream": false,
                "previous_response_id": second["id"]}),
        );
        assert!(
            tokens(&third) > tokens(&second),
            "{mode:?}: the chain grows"
        );
        let body = serde_json::json!({"input": "go on", "max_output_tokens": 2, "stream": true,
            "previous_response_id": id});
        let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{}", r.text());
        let last = named_events(&r.text()).last().unwrap().1.clone();
        assert_eq!(last["response"]["previous_response_id"], id);
        assert!(tokens(&last["response"]) > tokens(&alone), "{mode:?}");
        let body = serde_json::json!({"input": "x", "previous_response_id": "resp_nope"});
        let r = c.request("POST", "/v1/responses", Some(&body.to_string()));
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
        assert!(r.error_message().contains("resp_nope"), "{}", r.text());
        abe.shutdown();
    }
}
