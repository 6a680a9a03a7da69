//! Tools and structured output from the `sim` backend (`api::structured`), as a client sees
//! them, in both batching modes: outputs checked against their schemas with the `jsonschema`
//! crate (not abe's own generator), tool calls in whole answers and as stream deltas,
//! determinism per seed, truncation by max_tokens, and the 400s.

use crate::common;

use common::{start, start_in, test_config, Client, MODES};
use serde_json::{json, Value};

fn assert_valid(schema: &Value, instance: &Value) {
    let v = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{instance} against {schema}: {errors:?}");
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 2},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "when": {"type": "string", "format": "date"},
            "hourly": {"type": "boolean"},
            "stations": {"type": "array", "items": {"$ref": "#/$defs/station"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["city", "days"],
        "additionalProperties": false,
        "$defs": {"station": {"type": "object", "properties": {"id": {"type": "integer"}, "lat": {"type": "number", "minimum": -90, "maximum": 90}}, "required": ["id"]}}
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather_schema()}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}}}
    ])
}

fn chat(c: &mut Client, extra: Value) -> common::Resp {
    let mut body =
        json!({"messages": [{"role": "user", "content": "what is the weather in Lyon"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c.request("POST", "/v1/chat/completions", Some(&body.to_string()))
}

fn sse_json(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect()
}

fn params_of(name: &str) -> Value {
    tools()
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap()["function"]["parameters"]
        .clone()
}

#[test]
fn json_schema_answers_are_valid_deterministic_and_counted() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": weather_schema()}}, "seed": 4});
        let r = chat(&mut c, rf.clone());
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_valid(&weather_schema(), &serde_json::from_str(content).unwrap());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            v["usage"]["completion_tokens"].as_u64().unwrap(),
            content.len().div_ceil(4) as u64,
            "{mode:?}: the engine ran the shape's tokens"
        );
        let again = chat(&mut c, rf.clone()).json();
        assert_eq!(
            again["choices"][0]["message"]["content"], content,
            "same seed, same JSON"
        );
        let other = chat(
            &mut c,
            json!({"response_format": rf["response_format"], "seed": 5}),
        )
        .json();
        assert_ne!(other["choices"][0]["message"]["content"], content);
        // json_object, guided_json, guided_choice, structured_outputs.
        let r = chat(&mut c, json!({"response_format": {"type": "json_object"}})).json();
        let content = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(serde_json::from_str::<Value>(content).unwrap().is_object());
        let r = chat(&mut c, json!({"guided_json": weather_schema()})).json();
        let content = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert_valid(&weather_schema(), &serde_json::from_str(content).unwrap());
        for extra in [
            json!({"guided_choice": ["yes", "no"]}),
            json!({"structured_outputs": {"choice": ["yes", "no"]}}),
        ] {
            let r = chat(&mut c, extra).json();
            let content = r["choices"][0]["message"]["content"].as_str().unwrap();
            assert!(["yes", "no"].contains(&content), "{content}");
        }
        // Completions take guided_json too.
        let body = json!({"prompt": "weather", "guided_json": weather_schema(), "max_tokens": 500});
        let r = c.request("POST", "/v1/completions", Some(&body.to_string()));
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert_valid(&weather_schema(), &serde_json::from_str(&text).unwrap());
        // A max_tokens too small cuts the JSON, as vLLM does: finish_reason length.
        let r = chat(
            &mut c,
            json!({"guided_json": weather_schema(), "max_tokens": 3}),
        )
        .json();
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        assert_eq!(r["usage"]["completion_tokens"], 3);
        assert_eq!(
            r["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .len(),
            12
        );
        abe.shutdown();
    }
}

#[test]
fn tool_calls_are_valid_for_their_function_in_answers_and_streams() {
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        for choice in [json!("auto"), json!("required"), Value::Null] {
            let mut extra = json!({"tools": tools()});
            if !choice.is_null() {
                extra["tool_choice"] = choice.clone();
            }
            let r = chat(&mut c, extra);
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            let msg = &v["choices"][0]["message"];
            assert!(msg["content"].is_null(), "{msg}");
            assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
            let calls = msg["tool_calls"].as_array().unwrap();
            assert_eq!(
                calls.len(),
                1,
                "{choice}: one call without parallel_tool_calls"
            );
            let f = &calls[0]["function"];
            let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            assert_valid(&params_of(f["name"].as_str().unwrap()), &args);
            assert_eq!(calls[0]["type"], "function");
            assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        }
        let named = json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_time"}}});
        let v = chat(&mut c, named).json();
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "get_time"
        );
        let v = chat(
            &mut c,
            json!({"tools": tools(), "parallel_tool_calls": true}),
        )
        .json();
        let calls = v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(calls.len(), 2);
        let v = chat(
            &mut c,
            json!({"tools": tools(), "tool_choice": "none", "max_tokens": 3}),
        )
        .json();
        assert!(v["choices"][0]["message"]["tool_calls"].is_null());

        // Streamed: deltas that, put together as a client does, are the same calls.
        let r = chat(
            &mut c,
            json!({"tools": tools(), "parallel_tool_calls": true, "stream": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let mut streamed: Vec<(String, String, String)> = Vec::new();
        let mut finish = None;
        for chunk in sse_json(&r.text()) {
            let choice = &chunk["choices"][0];
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
            for d in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let k = d["index"].as_u64().unwrap() as usize;
                if k == streamed.len() {
                    streamed.push((
                        d["id"].as_str().unwrap().into(),
                        d["function"]["name"].as_str().unwrap().into(),
                        String::new(),
                    ));
                }
                streamed[k]
                    .2
                    .push_str(d["function"]["arguments"].as_str().unwrap());
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{mode:?}");
        let whole: Vec<(String, String, String)> = calls
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().into(),
                    c["function"]["name"].as_str().unwrap().into(),
                    c["function"]["arguments"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(
            streamed, whole,
            "{mode:?}: the stream carries the same calls"
        );
        // A streamed JSON answer, put together, is valid too.
        let r = chat(
            &mut c,
            json!({"guided_json": weather_schema(), "stream": true}),
        );
        let text: String = sse_json(&r.text())
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
        assert_valid(&weather_schema(), &serde_json::from_str(&text).unwrap());
        abe.shutdown();
    }
}

#[test]
fn schemas_and_tool_choices_abe_cannot_honour_get_a_clear_400() {
    let abe = start(test_config());
    let mut c = Client::connect(abe.local_addr());
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}}}}),
            "#/properties/code: 'pattern' is not supported",
        ),
        (
            json!({"guided_json": {"type": "integer", "minimum": 5, "maximum": 1}}),
            "no number lies between",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "'nope', which is not among 'tools'",
        ),
        (
            json!({"tool_choice": "required"}),
            "'tool_choice' needs 'tools'",
        ),
        (
            json!({"guided_regex": "a+"}),
            "'guided_regex' is not supported",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "'response_format.type'",
        ),
    ];
    for (extra, says) in cases {
        let r = chat(&mut c, extra.clone());
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert!(r.error_message().contains(says), "{extra}: {}", r.text());
    }
    abe.shutdown();
}

/// `oneOf` is valid only when exactly one alternative matches. Where the first alternative's
/// output also matches another (an enum value is also a string), abe answers with an
/// alternative whose output matches that one alone; where every alternative's output may
/// match another, a 400 names the place. Checked with the `jsonschema` crate, many seeds,
/// nested in an object and in a tool's parameters, both batching modes.
#[test]
fn one_of_output_matches_exactly_one_alternative_or_is_a_400() {
    let schema = json!({
        "type": "object",
        "properties": {
            "answer": {"oneOf": [{"enum": ["a", "b"]}, {"type": "string"}]},
            "size": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/size"}]},
            "shape": {"oneOf": [
                {"type": "object", "properties": {"r": {"type": "number"}}},
                {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}}, "required": ["kind"], "additionalProperties": false}
            ]}
        },
        "required": ["answer", "size", "shape"],
        "additionalProperties": false,
        "$defs": {"size": {"type": "integer", "minimum": 1}}
    });
    for mode in MODES {
        let abe = start_in(mode);
        let mut c = Client::connect(abe.local_addr());
        for seed in 0..12 {
            let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}, "seed": seed});
            let r = chat(&mut c, rf);
            assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
            let content = r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string();
            assert_valid(&schema, &serde_json::from_str(&content).unwrap());
            let tool =
                json!([{"type": "function", "function": {"name": "pick", "parameters": schema}}]);
            let r = chat(
                &mut c,
                json!({"tools": tool, "tool_choice": "required", "seed": seed}),
            );
            assert_eq!(r.status, 200, "{mode:?}: {}", r.text());
            let args = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string();
            assert_valid(&schema, &serde_json::from_str(&args).unwrap());
        }
        // A closed object whose `patternProperties` admit the other alternative's key: the
        // other's output may match it too, so it is not proven excluded (was a 200 whose
        // output matched both alternatives).
        let patterned = json!({"oneOf": [
            {"type": "object", "patternProperties": {"^a$": {}}, "additionalProperties": false},
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        ]});
        let r = chat(&mut c, json!({"guided_json": patterned}));
        if r.status == 200 {
            let content = r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string();
            assert_valid(&patterned, &serde_json::from_str(&content).unwrap());
        } else {
            assert_eq!(r.status, 400, "{mode:?}: {}", r.text());
            assert!(r.error_message().contains("oneOf"), "{}", r.text());
        }
        let ambiguous = json!({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 64}]}}});
        let r = chat(&mut c, json!({"guided_json": ambiguous}));
        assert_eq!(r.status, 400, "{mode:?}: {}", r.text());
        assert!(
            r.error_message().contains("#/properties/x/oneOf")
                && r.error_message().contains("exactly one alternative"),
            "{}",
            r.text()
        );
        abe.shutdown();
    }
}
