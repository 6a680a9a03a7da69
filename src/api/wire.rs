//! OpenAI wire types for request bodies, with validation that names the offending field.
//!
//! Unknown fields are ignored, as OpenAI-compatible servers do. Parsing happens on io
//! threads; nothing here touches the engine. The text endpoints' bodies share their
//! generation and sampling fields, declared once ([`GenerationBody`]); `crate::api::payload`
//! turns them into the payload the worker gets.

use crate::core::Priority;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// Strings of a `prompt`, `input` or `stop`: inline when there is one (the usual case), so
/// a single prompt costs no list allocation.
pub type Texts = smallvec::SmallVec<[String; 1]>;

/// `prompt` / `input`: one string or an array of strings.
#[derive(Clone, Debug, PartialEq)]
pub struct TextInputs(pub Texts);

impl<'de> Deserialize<'de> for TextInputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextInputs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextInputs, E> {
                Ok(TextInputs(smallvec::smallvec![v.to_string()]))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<TextInputs, E> {
                Ok(TextInputs(smallvec::smallvec![v]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextInputs, A::Error> {
                let mut out = Texts::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(TextInputs(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `prompt` / `input` of a generation or embedding body: one string or an array of
/// strings, each borrowed from the body when it has no escapes (the usual case), so a
/// prompt is copied once, into the payload's shared text, and a single prompt costs no
/// list allocation.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs<'a>(pub smallvec::SmallVec<[Str<'a>; 1]>);

impl<'de: 'a, 'a> Deserialize<'de> for Inputs<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Inputs<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Inputs<'a>, E> {
                Ok(Inputs(smallvec::smallvec![Str(
                    std::borrow::Cow::Borrowed(v)
                )]))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Inputs<'a>, E> {
                Ok(Inputs(smallvec::smallvec![Str(std::borrow::Cow::Owned(
                    v.to_string()
                ))]))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Inputs<'a>, E> {
                Ok(Inputs(smallvec::smallvec![Str(std::borrow::Cow::Owned(v))]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inputs<'a>, A::Error> {
                let mut out = smallvec::SmallVec::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(s) = seq.next_element::<Str<'a>>()? {
                    out.push(s);
                }
                Ok(Inputs(out))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A string field borrowed from the request body when it has no escapes (the usual case),
/// owned only when unescaping had to build a new string. Reads as a `str`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Str<'a>(pub std::borrow::Cow<'a, str>);

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A `priority`: one of abe's names, or vLLM's integer (read as its decimal text; see
/// [`priority`]). Reads as a `str`. A JSON number with a fraction of zero (`1.0`) is that
/// integer, as vLLM's pydantic `int` takes it (lax mode); any other fraction is refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PriorityField<'a>(pub std::borrow::Cow<'a, str>);

impl std::ops::Deref for PriorityField<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for PriorityField<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PriorityField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a priority name or an integer")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(PriorityField(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PriorityField(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(PriorityField(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(PriorityField(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                // Past 2^63 every f64 is integral; the text then reads as "far past 0".
                if v.is_finite() && v.fract() == 0.0 {
                    return Ok(PriorityField(std::borrow::Cow::Owned(format!("{v:.0}"))));
                }
                Err(E::invalid_value(
                    de::Unexpected::Float(v),
                    &"an integer (vLLM's priority is an int; 1.0 is taken as 1)",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// `stream_options` of a streaming request.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptionsBody {
    pub include_usage: Option<bool>,
    /// vLLM: `usage` (so far) in every chunk.
    pub continuous_usage_stats: Option<bool>,
}

/// Declares the bodies of the text endpoints. `shared` lists the fields that
/// `/v1/completions` and `/v1/chat/completions` both accept, written once; each `body` lists
/// its own. Every body gets its own fields, then the shared ones, and a `generation()` that
/// moves the shared ones out as one value for the payload builder (`crate::api::payload`).
///
/// A macro rather than `#[serde(flatten)]`: flatten buffers every field it does not know
/// (a chat body's `tools`, ignored today) and loses the field path that error messages name
/// ("invalid value for 'temperature'").
macro_rules! text_bodies {
    (@shared $(#[$attr:meta])* $shared:ident
        { $( $(#[$field_attr:meta])* pub $field:ident: $ty:ty, )* }) => {
        $(#[$attr])*
        #[derive(Clone, Debug, Default)]
        pub struct $shared {
            $( $(#[$field_attr])* pub $field: $ty, )*
        }
    };
    (@body $(#[$attr:meta])* $name:ident $shared:ident { $($own:tt)* }
        { $( $(#[$field_attr:meta])* pub $field:ident: $ty:ty, )* }) => {
        $(#[$attr])*
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(default)]
        pub struct $name<'a> {
            $($own)*
            $( $(#[$field_attr])* pub $field: $ty, )*
        }

        impl $name<'_> {
            /// Moves the fields every text endpoint accepts out of the body.
            pub fn generation(&mut self) -> $shared {
                $shared { $( $field: std::mem::take(&mut self.$field), )* }
            }
        }
    };
    (
        $(#[$shared_attr:meta])* shared $shared:ident $fields:tt
        $( $(#[$attr:meta])* body $name:ident $own:tt )*
    ) => {
        text_bodies!(@shared $(#[$shared_attr])* $shared $fields);
        $( text_bodies!(@body $(#[$attr])* $name $shared $own $fields); )*
    };
}

text_bodies! {
    /// The fields both text endpoints accept, as sent: how much to generate, how to answer,
    /// and how to sample. A new OpenAI field of both endpoints goes here (one line), then
    /// into the payload builder, `crate::api::payload`.
    shared GenerationBody {
        pub max_tokens: Option<i64>,
        pub n: Option<i64>,
        /// vLLM: candidates per prompt of which `n` are returned (abe returns the first n).
        pub best_of: Option<i64>,
        /// vLLM: generate `max_tokens` even past a natural end of sequence.
        pub ignore_eos: Option<bool>,
        /// vLLM: no natural end of sequence before this many tokens.
        pub min_tokens: Option<i64>,
        pub stream: Option<bool>,
        pub stream_options: Option<StreamOptionsBody>,
        /// abe extension: predicted output length hint for length-aware strategies.
        pub predicted_output_tokens: Option<u32>,
        // Sampling (`exec::Sampling`).
        pub seed: Option<i64>,
        pub temperature: Option<f64>,
        pub top_p: Option<f64>,
        pub stop: Option<TextInputs>,
    }

    /// Body of `POST /v1/completions`.
    body CompletionBody {
        #[serde(borrow)]
        pub model: Option<Str<'a>>,
        #[serde(borrow)]
        pub prompt: Option<Inputs<'a>>,
        #[serde(borrow)]
        pub priority: Option<PriorityField<'a>>,
        /// Synthetic log-probabilities of this many alternatives per token (0..=5).
        pub logprobs: Option<i64>,
        /// Prepend the prompt to each choice's text.
        pub echo: Option<bool>,
        /// OpenAI: the end user; a session key for `session` routing when no
        /// `X-Session-Id` header is given.
        #[serde(borrow)]
        pub user: Option<Str<'a>>,
        /// Structured output (`api::structured`): vLLM accepts these on completions too.
        /// Boxed, as every rarely sent field of a body: a body is built and moved whole per
        /// request, and a box is 8 bytes where the value is up to 56.
        pub response_format: Option<Box<ResponseFormat>>,
        pub guided_json: Option<Box<serde_json::Value>>,
        pub guided_choice: Option<Box<Vec<String>>>,
        pub guided_regex: Option<serde::de::IgnoredAny>,
        pub structured_outputs: Option<Box<serde_json::Value>>,
    }

    /// Body of `POST /v1/chat/completions` (fields abe uses; others are ignored).
    body ChatBody {
        #[serde(borrow)]
        pub model: Option<Str<'a>>,
        pub messages: Option<Vec<Message>>,
        /// The newer name of `max_tokens`; wins when both are given.
        pub max_completion_tokens: Option<i64>,
        #[serde(borrow)]
        pub priority: Option<PriorityField<'a>>,
        /// Function-calling tools: routing needs a backend with the `tools` capability
        /// when there are any; a `sim` answer calls them (`api::structured`).
        pub tools: Option<Vec<serde_json::Value>>,
        /// Boxed, as the other rarely sent fields (see `CompletionBody`).
        pub tool_choice: Option<Box<serde_json::Value>>,
        pub parallel_tool_calls: Option<bool>,
        pub response_format: Option<Box<ResponseFormat>>,
        pub guided_json: Option<Box<serde_json::Value>>,
        pub guided_choice: Option<Box<Vec<String>>>,
        pub guided_regex: Option<serde::de::IgnoredAny>,
        pub structured_outputs: Option<Box<serde_json::Value>>,
        /// Synthetic log-probabilities of the output tokens...
        pub logprobs: Option<bool>,
        /// ...with this many alternatives each (0..=20; needs `logprobs: true`).
        pub top_logprobs: Option<i64>,
        /// OpenAI: the end user; a session key for `session` routing when no
        /// `X-Session-Id` header is given.
        #[serde(borrow)]
        pub user: Option<Str<'a>>,
    }
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: a string or an array of parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part of a message.
#[derive(Clone, Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `response_format`: its type (`json_object` needs JSON mode when routing) and, for
/// `json_schema`, the schema (`{"name": .., "schema": {..}}`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub json_schema: Option<serde_json::Value>,
}

/// Body of `POST /v1/embeddings`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct EmbeddingBody<'a> {
    #[serde(borrow)]
    pub model: Option<Str<'a>>,
    #[serde(borrow)]
    pub input: Option<Inputs<'a>>,
    #[serde(borrow)]
    pub encoding_format: Option<Str<'a>>,
    pub dimensions: Option<i64>,
    #[serde(borrow)]
    pub priority: Option<PriorityField<'a>>,
}

/// A request body problem: HTTP 400 with `code` and `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyError {
    pub code: &'static str,
    pub message: String,
}

pub(crate) fn body_error(code: &'static str, message: impl Into<String>) -> BodyError {
    BodyError {
        code,
        message: message.into(),
    }
}

/// Parses a JSON body into `T`, naming the field on a type error.
pub fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, BodyError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(body_error(
            "invalid_json",
            "request body is empty: send a JSON object",
        ));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(body_error(
            "invalid_json",
            "request body must be a JSON object, like {\"prompt\": \"...\"}",
        ));
    }
    // Fast path: plain serde_json. Only a failed parse pays for serde_path_to_error, which
    // re-parses to name the offending field.
    // A body that is valid UTF-8 as a whole (checked once) is parsed as a str, so serde_json
    // does not validate every string again.
    let fast = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    };
    if let Ok(v) = fast {
        return Ok(v);
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let err = match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        Err(body_error(
            "invalid_json",
            format!("request body is not valid JSON: {inner}"),
        ))
    } else if path == "." || path.is_empty() {
        Err(body_error(
            "invalid_json",
            format!("request body must be a JSON object: {inner}"),
        ))
    } else {
        Err(body_error(
            "invalid_type",
            format!(
                "invalid value for '{path}': {}",
                strip_position(&inner.to_string())
            ),
        ))
    }
}

/// Drops serde_json's " at line L column C" suffix (the field path says where).
fn strip_position(msg: &str) -> &str {
    msg.find(" at line ").map(|i| &msg[..i]).unwrap_or(msg)
}

/// Priority from the body field, else the `X-Priority` header, else normal. A name
/// (`critical`, `high`, `normal`, `low`), or vLLM's integer, where lower is served first
/// (vLLM's default is 0): -10 or lower is critical, -9..=-1 high, 0 normal, 1 or more low.
pub fn priority(body: Option<&str>, header: Option<&str>) -> Result<Priority, BodyError> {
    match body.or(header) {
        None => Ok(Priority::Normal),
        Some(s) if s.parse::<i64>().is_ok() => Ok(priority_of_level(s.parse().unwrap_or(0))),
        // An integer past i64 either way is still an integer: far past -10 or past 0.
        Some(s) if is_integer(s) => Ok(priority_of_level(if s.starts_with('-') {
            i64::MIN
        } else {
            i64::MAX
        })),
        Some(s) => s
            .parse()
            .map_err(|e: crate::core::request::UnknownPriority| {
                body_error("invalid_priority", e.to_string())
            }),
    }
}

/// An optional sign and at least one digit, nothing else.
fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// vLLM's integer priority (lower first) as one of abe's classes.
pub fn priority_of_level(level: i64) -> Priority {
    match level {
        i64::MIN..=-10 => Priority::Critical,
        -9..=-1 => Priority::High,
        0 => Priority::Normal,
        _ => Priority::Low,
    }
}

/// Validates `stop`: one string or up to 4, none empty.
pub fn stop_sequences(
    value: Option<TextInputs>,
) -> Result<Option<std::sync::Arc<[String]>>, BodyError> {
    let Some(TextInputs(stops)) = value else {
        return Ok(None);
    };
    if stops.len() > 4 {
        return Err(body_error(
            "invalid_value",
            format!(
                "'stop' has {} sequences; at most 4 are allowed",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(|s| s.is_empty()) {
        return Err(body_error(
            "invalid_value",
            "'stop' sequences must not be empty strings",
        ));
    }
    Ok((!stops.is_empty()).then(|| stops.into_vec().into()))
}

/// Validates text inputs: present, non-empty list, no empty string, at most `max` items.
pub fn inputs<'a>(
    field: &str,
    value: Option<Inputs<'a>>,
    max: usize,
) -> Result<smallvec::SmallVec<[Str<'a>; 1]>, BodyError> {
    let Some(Inputs(items)) = value else {
        return Err(body_error(
            "missing_field",
            format!("missing required field '{field}'"),
        ));
    };
    if items.is_empty() {
        return Err(body_error(
            "invalid_value",
            format!("'{field}' must not be an empty array"),
        ));
    }
    if items.len() > max {
        return Err(body_error(
            "invalid_value",
            format!(
                "'{field}' has {} items; at most {max} are allowed",
                items.len()
            ),
        ));
    }
    if let Some(i) = items.iter().position(|s| s.is_empty()) {
        let at = if items.len() == 1 {
            String::new()
        } else {
            format!(" (item {i})")
        };
        return Err(body_error(
            "invalid_value",
            format!("'{field}' must not be an empty string{at}"),
        ));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_accepts_a_string_or_an_array_and_names_bad_types() {
        let b: CompletionBody = parse_body(br#"{"prompt":"hi","extra":{"x":1}}"#).unwrap();
        assert_eq!(
            b.prompt,
            Some(Inputs(smallvec::smallvec![Str("hi".into())]))
        );
        let prompt = &b.prompt.as_ref().unwrap().0[0];
        assert!(
            matches!(prompt.0, std::borrow::Cow::Borrowed(_)),
            "borrowed"
        );
        let b: CompletionBody = parse_body(br#"{"prompt":["a","b"]}"#).unwrap();
        assert_eq!(b.prompt.unwrap().0.len(), 2);
        // Plain strings are borrowed from the body; escaped ones are unescaped copies.
        let b: CompletionBody = parse_body(br#"{"model":"m-1","priority":"h\u0069gh"}"#).unwrap();
        let model = b.model.unwrap();
        assert!(matches!(model.0, std::borrow::Cow::Borrowed("m-1")));
        assert_eq!(b.priority.as_deref(), Some("high"));
        let e = parse_body::<CompletionBody>(br#"{"model":7}"#).unwrap_err();
        assert!(
            e.message.starts_with("invalid value for 'model'"),
            "{}",
            e.message
        );
        let b: CompletionBody = parse_body(br#"{"prompt":["a","b"]}"#).unwrap();
        assert_eq!(b.prompt.unwrap().0.len(), 2);
        let e = parse_body::<CompletionBody>(br#"{"prompt":5}"#).unwrap_err();
        assert_eq!(e.code, "invalid_type");
        assert!(
            e.message.contains("'prompt'") && e.message.contains("a string or an array of strings"),
            "{}",
            e.message
        );
        let e = parse_body::<CompletionBody>(br#"{"max_tokens":"ten"}"#).unwrap_err();
        assert!(
            e.message.starts_with("invalid value for 'max_tokens'"),
            "{}",
            e.message
        );
        let e = parse_body::<CompletionBody>(br#"{"prompt": "x""#).unwrap_err();
        assert_eq!(e.code, "invalid_json");
        let e = parse_body::<CompletionBody>(b"[1,2]").unwrap_err();
        assert_eq!(e.code, "invalid_json");
        let e = parse_body::<CompletionBody>(b"").unwrap_err();
        assert!(e.message.contains("empty"));
    }

    #[test]
    fn vllm_integer_priorities_map_lower_to_earlier_classes() {
        let classes: Vec<Priority> = [-100, -10, -9, -1, 0, 1, 50]
            .into_iter()
            .map(priority_of_level)
            .collect();
        use Priority::*;
        assert_eq!(classes, [Critical, Critical, High, High, Normal, Low, Low]);
        assert_eq!(priority(Some("-3"), None).unwrap(), High);
        assert_eq!(priority(None, Some("2")).unwrap(), Low);
        // Past i64 either way: still an integer, not an unknown name.
        assert_eq!(priority(Some("18446744073709551615"), None).unwrap(), Low);
        assert_eq!(
            priority(Some("-99999999999999999999"), None).unwrap(),
            Critical
        );
        assert!(priority(Some("-"), None).is_err());
        let b: CompletionBody = parse_body(br#"{"priority":18446744073709551615}"#).unwrap();
        assert_eq!(b.priority.as_deref(), Some("18446744073709551615"));
        let b: CompletionBody = parse_body(br#"{"priority":-12}"#).unwrap();
        assert_eq!(b.priority.as_deref(), Some("-12"));
        // vLLM's pydantic int is lax: an integral float is that integer.
        for (json, level, class) in [
            ("1.0", "1", Low),
            ("-3.0", "-3", High),
            ("0.0", "0", Normal),
        ] {
            let body = format!(r#"{{"priority":{json}}}"#);
            let b: CompletionBody = parse_body(body.as_bytes()).unwrap();
            assert_eq!(b.priority.as_deref(), Some(level), "{json}");
            assert_eq!(priority(b.priority.as_deref(), None).unwrap(), class);
        }
        let b: CompletionBody = parse_body(br#"{"priority":1e300}"#).unwrap();
        assert_eq!(priority(b.priority.as_deref(), None).unwrap(), Low);
        let e = parse_body::<CompletionBody>(br#"{"priority":1.5}"#).unwrap_err();
        assert!(
            e.message.contains("'priority'") && e.message.contains("1.5"),
            "{}",
            e.message
        );
    }

    #[test]
    fn inputs_and_priority_are_validated_with_actionable_messages() {
        assert_eq!(
            inputs("prompt", None, 10).unwrap_err().message,
            "missing required field 'prompt'"
        );
        let e = inputs(
            "prompt",
            Some(Inputs(smallvec::smallvec![Str("a".into()), Str("".into())])),
            10,
        )
        .unwrap_err();
        assert_eq!(e.message, "'prompt' must not be an empty string (item 1)");
        let e = inputs(
            "input",
            Some(Inputs(smallvec::smallvec![Str("a".into()); 3])),
            2,
        )
        .unwrap_err();
        assert!(e.message.contains("at most 2"));
        assert_eq!(priority(None, Some("high")).unwrap(), Priority::High);
        assert_eq!(priority(Some("low"), Some("high")).unwrap(), Priority::Low);
        assert!(priority(Some("urgent"), None)
            .unwrap_err()
            .message
            .contains("low, normal, high, critical"));
    }
}
