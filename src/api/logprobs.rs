//! Synthetic log-probabilities for `logprobs` / `top_logprobs`, in OpenAI's and vLLM's
//! shapes: completions (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and chat
//! (`content: [{token, logprob, bytes, top_logprobs}]`), whole in a response or one token
//! per stream chunk.
//!
//! The numbers are made up but well-formed and deterministic: a token's log-probability is
//! a function of the token and where it starts in the choice's text (so a stream and a
//! whole answer agree), always in `[-2, -0.001]`, and its alternatives are distinct words of
//! the synthetic vocabulary, each less likely than the one before. Runs on io threads
//! while a response is written; nothing here touches the engine.

use super::json_out;
use crate::exec::synth;
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// Most alternatives a chat request may ask for (`top_logprobs`), as OpenAI allows.
pub const CHAT_TOP_MAX: u8 = 20;
/// Most alternatives a completion request may ask for (`logprobs`), as OpenAI allows.
pub const COMPLETION_TOP_MAX: u8 = 5;

fn key(token: &str, offset: usize) -> u64 {
    synth::stream_key(token, Some(offset as u64 + 1))
}

/// The log-probability of `token` starting at byte `offset`.
pub fn logprob(token: &str, offset: usize) -> f64 {
    -((key(token, offset) % 2000) as f64 / 1000.0) - 0.001
}

/// `top` alternatives to `token` at `offset`, most likely first: `(word, logprob)`.
fn alternatives(token: &str, offset: usize, top: u8) -> impl Iterator<Item = (String, f64)> {
    let mut rng = SmallRng::seed_from_u64(key(token, offset));
    let lp = logprob(token, offset);
    let space = if token.starts_with(' ') { " " } else { "" };
    let mut seen: smallvec::SmallVec<[String; 8]> = smallvec::smallvec![token.to_string()];
    (1..=top).map(move |rank| {
        let mut word = format!("{space}{}", synth::word(&mut rng));
        for _ in 0..8 {
            if !seen.contains(&word) {
                break;
            }
            word = format!("{space}{}", synth::word(&mut rng));
        }
        if seen.contains(&word) {
            word = format!("{word}{rank}");
        }
        seen.push(word.clone());
        (word, lp - 0.75 * f64::from(rank))
    })
}

fn float(out: &mut Vec<u8>, v: f64) {
    // Writing to a Vec cannot fail; `{}` is the shortest round-trip form.
    use std::io::Write;
    let _ = write!(out, "{v}");
}

/// `{"tok": lp, ...}` for the token and its `top` alternatives (completions' shape: the
/// sampled token is among them, as vLLM sends it).
fn completion_top(out: &mut Vec<u8>, token: &str, offset: usize, top: u8) {
    out.push(b'{');
    json_out::string(out, token);
    out.push(b':');
    float(out, logprob(token, offset));
    for (word, lp) in alternatives(token, offset, top.saturating_sub(1)) {
        out.push(b',');
        json_out::string(out, &word);
        out.push(b':');
        float(out, lp);
    }
    out.push(b'}');
}

/// The completions `logprobs` object for `pieces` (token text and its byte offset in the
/// choice's text; `text_offset` adds `base`, e.g. an echoed prompt's length).
pub fn write_completion<'a>(
    out: &mut Vec<u8>,
    pieces: impl Iterator<Item = (&'a str, usize)> + Clone,
    base: usize,
    top: u8,
) {
    out.extend_from_slice(b"{\"tokens\":[");
    for (i, (t, _)) in pieces.clone().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_out::string(out, t);
    }
    out.extend_from_slice(b"],\"token_logprobs\":[");
    for (i, (t, at)) in pieces.clone().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        float(out, logprob(t, at));
    }
    out.extend_from_slice(b"],\"top_logprobs\":");
    if top == 0 {
        out.extend_from_slice(b"null");
    } else {
        out.push(b'[');
        for (i, (t, at)) in pieces.clone().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            completion_top(out, t, at, top);
        }
        out.push(b']');
    }
    out.extend_from_slice(b",\"text_offset\":[");
    for (i, (_, at)) in pieces.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_out::uint(out, (base + at) as u64);
    }
    out.extend_from_slice(b"]}");
}

/// `{"token":..,"logprob":..,"bytes":[..]` (left open for the caller).
fn chat_token(out: &mut Vec<u8>, token: &str, lp: f64) {
    out.extend_from_slice(b"{\"token\":");
    json_out::string(out, token);
    out.extend_from_slice(b",\"logprob\":");
    float(out, lp);
    out.extend_from_slice(b",\"bytes\":[");
    for (i, b) in token.bytes().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_out::uint(out, u64::from(b));
    }
    out.push(b']');
}

/// The chat `logprobs` object (`{"content":[...]}`) for `pieces`.
pub fn write_chat<'a>(out: &mut Vec<u8>, pieces: impl Iterator<Item = (&'a str, usize)>, top: u8) {
    out.extend_from_slice(b"{\"content\":[");
    for (i, (t, at)) in pieces.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        chat_token(out, t, logprob(t, at));
        out.extend_from_slice(b",\"top_logprobs\":[");
        for (j, (word, lp)) in alternatives(t, at, top).enumerate() {
            if j > 0 {
                out.push(b',');
            }
            chat_token(out, &word, lp);
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
}

/// `text`'s tokens (as abe's synthetic text is tokenized: one word per token, with its
/// leading space) and their byte offsets.
pub fn pieces(text: &str) -> Vec<(&str, usize)> {
    let base = text.as_ptr() as usize;
    synth::token_pieces(text)
        .map(|p| (p, p.as_ptr() as usize - base))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_logprobs_are_well_formed_and_deterministic() {
        let text = "alpha beta gamma";
        let mut out = Vec::new();
        write_completion(&mut out, pieces(text).into_iter(), 3, 3);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["tokens"], serde_json::json!(["alpha", " beta", " gamma"]));
        assert_eq!(v["text_offset"], serde_json::json!([3, 8, 13]));
        let lps = v["token_logprobs"].as_array().unwrap();
        for (i, lp) in lps.iter().enumerate() {
            let lp = lp.as_f64().unwrap();
            assert!((-2.001..0.0).contains(&lp));
            let top = v["top_logprobs"][i].as_object().unwrap();
            assert_eq!(top.len(), 3, "the token and two alternatives, distinct");
            assert_eq!(top[v["tokens"][i].as_str().unwrap()].as_f64(), Some(lp));
        }
        let mut again = Vec::new();
        write_completion(&mut again, pieces(text).into_iter(), 3, 3);
        assert_eq!(out, again);
    }

    #[test]
    fn chat_logprobs_have_bytes_and_ranked_alternatives() {
        let mut out = Vec::new();
        write_chat(&mut out, pieces("hi there").into_iter(), 2);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let content = v["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[1]["token"], " there");
        assert_eq!(content[1]["bytes"][0], 32);
        let top = content[0]["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        let lp = content[0]["logprob"].as_f64().unwrap();
        assert!(top[0]["logprob"].as_f64().unwrap() < lp);
        assert!(top[1]["logprob"].as_f64().unwrap() < top[0]["logprob"].as_f64().unwrap());
    }
}
