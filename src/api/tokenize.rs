//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes, over abe's own tokenizer: a
//! token is 4 bytes of UTF-8 text (the last one fewer), which is exactly how abe counts
//! prompt tokens everywhere else (`exec::prompt_tokens`), so `count` agrees with `usage`.
//!
//! A token id packs its bytes and their count (`len << 32 | little-endian bytes`), so
//! detokenizing needs no vocabulary and gives the text back byte for byte. Runs on io
//! threads; never touches the engine.

use super::wire::{self, body_error, BodyError, Message, TextInputs};
use serde::Deserialize;
use serde_json::{json, Value};

/// Bytes per token.
const TOKEN_BYTES: usize = 4;

/// Body of `POST /tokenize`: a `prompt`, or chat `messages` (rendered as for a chat
/// completion).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<TextInputs>,
    pub messages: Option<Vec<Message>>,
}

/// Body of `POST /detokenize`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Option<Vec<i64>>,
}

/// The token ids of `text`.
pub fn encode(text: &str) -> Vec<u64> {
    text.as_bytes()
        .chunks(TOKEN_BYTES)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            ((c.len() as u64) << 32) | u64::from(u32::from_le_bytes(b))
        })
        .collect()
}

/// The text of `ids`, or which id is not one of abe's.
pub fn decode(ids: &[i64]) -> Result<String, BodyError> {
    let mut bytes = Vec::with_capacity(ids.len() * TOKEN_BYTES);
    for (i, &id) in ids.iter().enumerate() {
        let len = (id >> 32) as usize;
        if id < 0 || !(1..=TOKEN_BYTES).contains(&len) {
            return Err(body_error(
                "invalid_value",
                format!("tokens[{i}] = {id} is not a token id abe issued (see POST /tokenize)"),
            ));
        }
        bytes.extend_from_slice(&(id as u32).to_le_bytes()[..len]);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `{"count", "max_model_len", "tokens", "token_strs"}` for a body.
pub fn tokenize(body: &[u8], max_model_len: u32) -> Result<Value, BodyError> {
    let b: TokenizeBody = wire::parse_body(body)?;
    let text = match (b.prompt, b.messages) {
        (Some(TextInputs(p)), None) if p.len() == 1 => p.into_iter().next().unwrap_or_default(),
        (Some(_), None) => {
            return Err(body_error(
                "invalid_value",
                "'prompt' must be one string for /tokenize",
            ))
        }
        (None, Some(m)) => super::chat::render_prompt(Some(m))?,
        (Some(_), Some(_)) => {
            return Err(body_error(
                "invalid_value",
                "send 'prompt' or 'messages', not both",
            ))
        }
        (None, None) => {
            return Err(body_error(
                "missing_field",
                "missing required field 'prompt' (or 'messages')",
            ))
        }
    };
    let tokens = encode(&text);
    debug_assert_eq!(tokens.len(), crate::exec::prompt_tokens(&text) as usize);
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": (max_model_len > 0).then_some(max_model_len),
        "tokens": tokens,
        "token_strs": null,
    }))
}

/// `{"prompt"}` for a body.
pub fn detokenize(body: &[u8]) -> Result<Value, BodyError> {
    let b: DetokenizeBody = wire::parse_body(body)?;
    let Some(tokens) = b.tokens else {
        return Err(body_error(
            "missing_field",
            "missing required field 'tokens'",
        ));
    };
    Ok(json!({ "prompt": decode(&tokens)? }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_count_as_usage_does() {
        for text in ["", "a", "four", "Hello there, abe", "café ünïcode ✓"] {
            let ids = encode(text);
            assert_eq!(ids.len(), crate::exec::prompt_tokens(text) as usize);
            let ids: Vec<i64> = ids.into_iter().map(|i| i as i64).collect();
            assert_eq!(decode(&ids).unwrap(), text);
        }
        assert!(decode(&[7]).is_err(), "no length: not an id abe issued");
        assert!(decode(&[-1]).is_err());
    }

    #[test]
    fn tokenize_takes_a_prompt_or_messages() {
        let v = tokenize(br#"{"prompt":"Hello there, abe"}"#, 4096).unwrap();
        assert_eq!(v["count"], 4);
        assert_eq!(v["max_model_len"], 4096);
        let v = tokenize(br#"{"messages":[{"role":"user","content":"hi"}]}"#, 0).unwrap();
        assert!(v["count"].as_u64().unwrap() > 0);
        assert!(v["max_model_len"].is_null());
        assert!(tokenize(br#"{}"#, 0).is_err());
        let v = detokenize(br#"{"tokens":[4294967400]}"#).unwrap();
        assert_eq!(v["prompt"], "h");
    }
}
