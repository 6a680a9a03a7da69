//! Tools and structured output for `sim`-served requests: what a request asks for (`tools`
//! with `tool_choice` and `parallel_tool_calls`; `response_format` `json_object` /
//! `json_schema`; vLLM's `guided_json`, `guided_choice` and `structured_outputs`) becomes,
//! per choice, a [`Shape`]: JSON text valid against the schema, one of the choices, or
//! synthetic tool calls whose arguments are valid against each function's `parameters`,
//! all deterministic in the request's seed and prompt.
//!
//! The engine still runs the request: the endpoint sets its output tokens to what the shape
//! needs (4 bytes a token, abe's count everywhere; at most the client's `max_tokens`, which
//! truncates with finish_reason `length`, as vLLM does), so timing and `usage` are a real
//! run's; the renderers ([`super::render`], [`super::stream`]) write the shape in place of
//! the synthetic words. Only when no backend is `upstream` (an upstream answers tools
//! itself).
//!
//! What must never happen here: a shape that does not match its schema (the generator
//! refuses what it cannot satisfy: a 400), or a different shape for the same seed.

use super::schema_gen::{self, Draw};
use super::wire::{body_error, BodyError, ResponseFormat};
use crate::exec::{FinishReason, Output};
use serde_json::Value;

/// What a request asks of its output, as parsed from its body.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asks<'a> {
    pub tools: Option<&'a [Value]>,
    pub tool_choice: Option<&'a Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<&'a ResponseFormat>,
    pub guided_json: Option<&'a Value>,
    pub guided_choice: Option<&'a [String]>,
    pub guided_regex: bool,
    pub structured_outputs: Option<&'a Value>,
}

/// The output a request asked for, before its seed picks values.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// JSON text valid against this schema.
    Json(Value),
    /// One of these strings.
    Choice(Vec<String>),
    /// Calls of these functions (name, `parameters` schema): one picked by the seed, or,
    /// with `all`, each of them (`parallel_tool_calls`).
    Tools {
        functions: Vec<(String, Value)>,
        all: bool,
    },
}

/// One synthetic tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// JSON text, valid against the function's `parameters`.
    pub arguments: String,
}

/// What one choice answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Text(String),
    Calls(Vec<Call>),
}

/// `json_object` without a schema: any object will do; this one.
fn json_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})
}

fn invalid(message: impl Into<String>) -> BodyError {
    body_error("invalid_value", message)
}

/// A schema given as an object, or (vLLM accepts both) as JSON text.
fn schema_value(field: &str, v: &Value) -> Result<Value, BodyError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| invalid(format!("'{field}' is not a JSON schema: {e}"))),
        _ => Err(invalid(format!("'{field}' must be a JSON schema object"))),
    }
}

/// What `a` asks for (`None`: plain text), checked: a 400 says what is wrong.
pub fn plan(a: &Asks<'_>) -> Result<Option<Plan>, BodyError> {
    if let Some(p) = tools_plan(a)? {
        return Ok(Some(p));
    }
    if a.guided_regex {
        return Err(body_error(
            "unsupported_value",
            "'guided_regex' is not supported by abe's synthetic output (guided_json, \
             guided_choice, response_format are)",
        ));
    }
    if let Some(so) = a.structured_outputs {
        let o = so
            .as_object()
            .ok_or_else(|| invalid("'structured_outputs' must be an object"))?;
        if let Some(s) = o.get("json") {
            return Ok(Some(Plan::Json(schema_value(
                "structured_outputs.json",
                s,
            )?)));
        }
        if let Some(c) = o.get("choice") {
            return choice_plan("structured_outputs.choice", c).map(Some);
        }
        return Err(body_error(
            "unsupported_value",
            "'structured_outputs' supports 'json' and 'choice' in abe",
        ));
    }
    if let Some(s) = a.guided_json {
        return Ok(Some(Plan::Json(schema_value("guided_json", s)?)));
    }
    if let Some(c) = a.guided_choice {
        return choice_plan("guided_choice", &Value::from(c.to_vec())).map(Some);
    }
    let Some(rf) = a.response_format else {
        return Ok(None);
    };
    match rf.kind.as_deref() {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Plan::Json(json_object_schema()))),
        Some("json_schema") => {
            let schema = rf
                .json_schema
                .as_ref()
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| invalid("'response_format.json_schema.schema' is required"))?;
            Ok(Some(Plan::Json(schema_value(
                "response_format.json_schema.schema",
                schema,
            )?)))
        }
        Some(other) => Err(invalid(format!(
            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \
             \"{other}\""
        ))),
    }
}

fn choice_plan(field: &str, c: &Value) -> Result<Plan, BodyError> {
    let choices: Vec<String> = c
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if choices.is_empty() {
        return Err(invalid(format!(
            "'{field}' must be a non-empty list of strings"
        )));
    }
    Ok(Plan::Choice(choices))
}

/// The functions of `tools`, by name with their `parameters`.
fn functions(tools: &[Value]) -> Result<Vec<(String, Value)>, BodyError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = t.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            match (t.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) if !name.is_empty() => {
                    let params = f
                        .and_then(|f| f.get("parameters"))
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
                    Ok((name.to_string(), params))
                }
                _ => Err(invalid(format!(
                    "'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}"
                ))),
            }
        })
        .collect()
}

fn tools_plan(a: &Asks<'_>) -> Result<Option<Plan>, BodyError> {
    let tools = a.tools.unwrap_or(&[]);
    let choice = a.tool_choice;
    if tools.is_empty() {
        return match choice {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s == "none" => Ok(None),
            Some(_) => Err(invalid("'tool_choice' needs 'tools'")),
        };
    }
    let mut functions = functions(tools)?;
    let all = a.parallel_tool_calls == Some(true);
    match choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" || s == "required" => {}
        Some(Value::String(s)) => {
            return Err(invalid(format!(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, \
                 got \"{s}\""
            )))
        }
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    invalid("'tool_choice' names a function as {\"type\": \"function\", \"function\": {\"name\": ..}}")
                })?;
            functions.retain(|(n, _)| n == name);
            if functions.is_empty() {
                return Err(invalid(format!(
                    "'tool_choice' names '{name}', which is not among 'tools'"
                )));
            }
            functions.truncate(1);
        }
    }
    // Every schema is checked now: an unsatisfiable one is the request's 400, whichever
    // function a seed would pick.
    for (name, params) in &functions {
        schema_gen::generate(params, &mut Draw::new(0))
            .map_err(|e| body_error("invalid_value", format!("tool '{name}' parameters: {e}")))?;
    }
    Ok(Some(Plan::Tools { functions, all }))
}

/// The shape of one choice whose draws come from `seed`.
pub fn shape(plan: &Plan, seed: u64) -> Result<Shape, BodyError> {
    let mut draw = Draw::new(seed);
    let schema_error = |e: schema_gen::Unsatisfiable| body_error("invalid_value", e.to_string());
    match plan {
        Plan::Json(schema) => {
            let v = schema_gen::generate(schema, &mut draw).map_err(schema_error)?;
            Ok(Shape::Text(v.to_string()))
        }
        Plan::Choice(c) => Ok(Shape::Text(draw.pick(c).clone())),
        Plan::Tools { functions, all } => {
            let picked: Vec<&(String, Value)> = if *all {
                functions.iter().take(8).collect()
            } else {
                vec![draw.pick(functions)]
            };
            picked
                .into_iter()
                .map(|(name, params)| {
                    let args = schema_gen::generate(params, &mut draw).map_err(schema_error)?;
                    Ok(Call {
                        id: format!("call_{:016x}", draw.next_u64()),
                        name: name.clone(),
                        arguments: args.to_string(),
                    })
                })
                .collect::<Result<_, _>>()
                .map(Shape::Calls)
        }
    }
}

/// Bytes per token of structured output (abe counts 4 bytes a token everywhere).
const TOKEN_BYTES: usize = 4;

/// `s` in token pieces: 4 bytes each, the last shorter, never splitting a character.
pub fn pieces(s: &str) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = TOKEN_BYTES.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// The first `tokens` pieces of `s`.
fn prefix(s: &str, tokens: u32) -> &str {
    let len: usize = pieces(s).take(tokens as usize).map(str::len).sum();
    &s[..len]
}

impl Shape {
    /// Output tokens the whole shape takes (at least 1).
    pub fn tokens(&self) -> u32 {
        let n = match self {
            Shape::Text(t) => pieces(t).count(),
            Shape::Calls(calls) => calls.iter().map(|c| pieces(&c.arguments).count()).sum(),
        };
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// The `tool_calls` array (JSON text) of the first `tokens` tokens of argument text.
    pub fn calls_json(calls: &[Call], tokens: u32) -> String {
        let mut left = tokens;
        let list: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args = prefix(&c.arguments, left);
                left = left.saturating_sub(pieces(&c.arguments).count() as u32);
                serde_json::json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": args},
                })
            })
            .collect();
        Value::Array(list).to_string()
    }

    /// The engine's `output` with this shape in place of its words: as much as its
    /// `completion_tokens` cover; cut short (finish_reason `length`) when they fall short.
    pub fn output(&self, output: &Output) -> Output {
        let Output::Text {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            ..
        } = output
        else {
            return output.clone();
        };
        let whole = *completion_tokens >= self.tokens();
        let (text, tool_calls, finish_reason) = match self {
            Shape::Text(t) => (
                prefix(t, *completion_tokens).to_string(),
                None,
                if whole {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                },
            ),
            Shape::Calls(calls) => (
                String::new(),
                Some(Shape::calls_json(calls, *completion_tokens).into()),
                if whole {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Length
                },
            ),
        };
        Output::Text {
            text,
            prompt_tokens: *prompt_tokens,
            completion_tokens: *completion_tokens,
            finish_reason,
            tool_calls,
            cached_tokens: *cached_tokens,
        }
    }
}

/// The seed of choice `choice` of a request: its `seed` (0 without) and its prompt, so the
/// same request gets the same shape and different prompts differ.
pub fn seed_of(sampling_seed: Option<u64>, prompt: &str, choice: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in prompt.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^ sampling_seed.unwrap_or(0).rotate_left(17)
        ^ u64::from(choice).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Vec<Value> {
        vec![
            json!({"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}),
            json!({"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"enum":["UTC","CET"]}}}}}),
        ]
    }

    #[test]
    fn tool_choice_picks_one_a_named_one_or_all_with_parallel_calls() {
        let tools = weather();
        let plan_of = |choice: Option<Value>, parallel: Option<bool>| {
            plan(&Asks {
                tools: Some(&tools),
                tool_choice: choice.as_ref(),
                parallel_tool_calls: parallel,
                ..Default::default()
            })
        };
        let named = json!({"type":"function","function":{"name":"get_time"}});
        match plan_of(Some(named), None).unwrap() {
            Some(Plan::Tools {
                functions,
                all: false,
            }) => {
                assert_eq!(functions.len(), 1);
                assert_eq!(functions[0].0, "get_time");
            }
            other => panic!("{other:?}"),
        }
        let Shape::Calls(calls) = shape(&plan_of(None, Some(true)).unwrap().unwrap(), 3).unwrap()
        else {
            panic!("calls")
        };
        assert_eq!(calls.len(), 2);
        assert_eq!(plan_of(Some(json!("none")), None).unwrap(), None);
        let unknown = json!({"type":"function","function":{"name":"nope"}});
        assert!(plan_of(Some(unknown), None)
            .unwrap_err()
            .message
            .contains("'nope'"));
        assert!(plan_of(Some(json!("sometimes")), None).is_err());
    }

    #[test]
    fn a_shape_cut_short_by_its_tokens_finishes_with_length() {
        let s = Shape::Text(r#"{"answer":"amber river"}"#.into());
        let full = s.tokens();
        let out = |n| Output::Text {
            text: "x".into(),
            prompt_tokens: 1,
            completion_tokens: n,
            finish_reason: FinishReason::Length,
            tool_calls: None,
            cached_tokens: None,
        };
        let Output::Text {
            text,
            finish_reason,
            ..
        } = s.output(&out(full))
        else {
            unreachable!()
        };
        assert_eq!(
            (&*text, finish_reason),
            (r#"{"answer":"amber river"}"#, FinishReason::Stop)
        );
        let Output::Text {
            text,
            finish_reason,
            ..
        } = s.output(&out(2))
        else {
            unreachable!()
        };
        assert_eq!(
            (&*text, finish_reason),
            (r#"{"answer"#, FinishReason::Length)
        );
    }

    #[test]
    fn pieces_never_split_a_character() {
        let s = "aé€😀bcdefg";
        let joined: String = pieces(s).collect();
        assert_eq!(joined, s);
        assert!(pieces(s).all(|p| !p.is_empty()));
    }
}
