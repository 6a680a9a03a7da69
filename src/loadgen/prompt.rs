//! Request bytes for one workload request: a deterministic prompt of the requested length and
//! the `POST /v1/completions` HTTP/1.1 request that carries it (or, with
//! [`BodyOptions::embeddings`], the `POST /v1/embeddings` request with it as `input`).
//!
//! abe (like the simulator's `SimRequest::meta`) estimates prompt tokens as prompt bytes / 4,
//! so a request of `n` prompt tokens gets exactly `4 n` bytes of text: three-letter words and
//! a space, drawn from a hash of (seed, request index, word index). Same inputs, same bytes;
//! different requests get different text (so no server can answer from a prefix cache what it
//! would have to compute). Only `a-z` and spaces: nothing in a prompt needs JSON escaping.
//! Everything is written into caller-owned buffers; nothing here allocates once they are
//! warm, reads a clock or does I/O.

use crate::core::Priority;
use crate::sim::workload::SimRequest;
use std::io::Write as _;

/// The content of an empty prompt. Servers refuse `""`, so a zero-token request sends one
/// word (abe then estimates 1 prompt token instead of 0).
const EMPTY_PROMPT_WORDS: u32 = 1;

/// SplitMix64: a well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Appends `4 x max(tokens, 1)` bytes of prompt text for request `index` of run `seed`.
pub fn push_prompt(out: &mut Vec<u8>, tokens: u32, seed: u64, index: u64) {
    let words = tokens.max(EMPTY_PROMPT_WORDS);
    let base = mix(seed ^ mix(index));
    for w in 0..u64::from(words) {
        let h = mix(base ^ w);
        out.extend_from_slice(&[
            b'a' + (h % 26) as u8,
            b'a' + ((h >> 8) % 26) as u8,
            b'a' + ((h >> 16) % 26) as u8,
            b' ',
        ]);
    }
}

/// How the JSON body is shaped.
#[derive(Clone, Debug, Default)]
pub struct BodyOptions {
    /// `model` field; absent: omitted (abe uses its served model).
    pub model: Option<String>,
    /// Send abe's extensions: `priority` when not `normal`, and `predicted_output_tokens`
    /// (what the simulator tells the core). Off for servers that refuse unknown fields.
    pub abe_extensions: bool,
    /// Send embeddings requests: the prompt as `input`, no `max_tokens` and no
    /// `predicted_output_tokens` (the request's output length is ignored).
    pub embeddings: bool,
}

impl BodyOptions {
    /// The endpoint these bodies go to.
    pub fn path(&self) -> &'static str {
        if self.embeddings {
            "/v1/embeddings"
        } else {
            "/v1/completions"
        }
    }
}

/// Writes the complete HTTP/1.1 request for `r` (request `index` of run `seed`) into `out`
/// (cleared first), using `body` as scratch for the JSON.
#[allow(clippy::too_many_arguments)]
pub fn write_request(
    out: &mut Vec<u8>,
    body: &mut Vec<u8>,
    path: &str,
    host: &str,
    opts: &BodyOptions,
    r: &SimRequest,
    seed: u64,
    index: u64,
) {
    body.clear();
    body.push(b'{');
    if let Some(m) = &opts.model {
        body.extend_from_slice(b"\"model\":");
        // A JSON string literal (escaped) for any model name.
        let _ = serde_json::to_writer(&mut *body, m);
        body.push(b',');
    }
    if opts.embeddings {
        body.extend_from_slice(b"\"input\":\"");
        push_prompt(body, r.prompt_tokens, seed, index);
        body.push(b'"');
    } else {
        body.extend_from_slice(b"\"prompt\":\"");
        push_prompt(body, r.prompt_tokens, seed, index);
        // At least one token: servers refuse max_tokens = 0.
        let _ = write!(body, "\",\"max_tokens\":{}", r.output_tokens.max(1));
    }
    if opts.abe_extensions {
        if r.priority != Priority::Normal {
            let _ = write!(body, ",\"priority\":\"{}\"", r.priority.as_str());
        }
        if r.predicted_output_tokens > 0 && !opts.embeddings {
            let _ = write!(
                body,
                ",\"predicted_output_tokens\":{}",
                r.predicted_output_tokens
            );
        }
    }
    body.push(b'}');
    out.clear();
    let _ = write!(
        out,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    out.extend_from_slice(body);
}

/// `usage.prompt_tokens` and `usage.completion_tokens` from an OpenAI response body, found
/// by a scan (no JSON parse per response); `None` where absent.
pub fn usage(body: &[u8]) -> (Option<u32>, Option<u32>) {
    let Some(at) = find(body, b"\"usage\"") else {
        return (None, None);
    };
    let usage = &body[at..];
    (
        number_after(usage, b"\"prompt_tokens\""),
        number_after(usage, b"\"completion_tokens\""),
    )
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn number_after(hay: &[u8], key: &[u8]) -> Option<u32> {
    let at = find(hay, key)? + key.len();
    let rest = hay[at..]
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt: u32, out: u32, priority: Priority) -> SimRequest {
        SimRequest {
            arrival_ns: 0,
            prompt_tokens: prompt,
            output_tokens: out,
            predicted_output_tokens: out,
            priority,
            prefix: Default::default(),
        }
    }

    #[test]
    fn prompts_are_four_bytes_a_token_deterministic_and_distinct() {
        let mut a = Vec::new();
        push_prompt(&mut a, 37, 7, 3);
        assert_eq!(a.len(), 148);
        assert!(a.iter().all(|b| b.is_ascii_lowercase() || *b == b' '));
        let mut b = Vec::new();
        push_prompt(&mut b, 37, 7, 3);
        assert_eq!(a, b);
        b.clear();
        push_prompt(&mut b, 37, 7, 4);
        assert_ne!(a, b);
        b.clear();
        push_prompt(&mut b, 0, 7, 4);
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn the_request_is_valid_http_and_json_with_the_shape_asked_for() {
        let (mut out, mut body) = (Vec::new(), Vec::new());
        let opts = BodyOptions {
            model: Some("m\"x".into()),
            abe_extensions: true,
            embeddings: false,
        };
        let r = req(5, 9, Priority::High);
        write_request(
            &mut out,
            &mut body,
            "/v1/completions",
            "h:1",
            &opts,
            &r,
            1,
            0,
        );
        let text = String::from_utf8(out.clone()).unwrap();
        let (head, json) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /v1/completions HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(head.contains(&format!("Content-Length: {}", json.len())));
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["model"], "m\"x");
        assert_eq!(v["prompt"].as_str().unwrap().len(), 20);
        assert_eq!(v["max_tokens"], 9);
        assert_eq!(v["priority"], "high");
        assert_eq!(v["predicted_output_tokens"], 9);
        let plain = BodyOptions::default();
        let r = req(5, 9, Priority::Normal);
        write_request(&mut out, &mut body, "/p", "h", &plain, &r, 1, 0);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v.get("model").is_none() && v.get("priority").is_none());
        assert!(v.get("predicted_output_tokens").is_none());
        let embed = BodyOptions {
            embeddings: true,
            ..opts
        };
        assert_eq!(embed.path(), "/v1/embeddings");
        let r = req(5, 9, Priority::High);
        write_request(&mut out, &mut body, embed.path(), "h", &embed, &r, 1, 0);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["input"].as_str().unwrap().len(), 20);
        assert!(v.get("prompt").is_none() && v.get("max_tokens").is_none());
        assert!(v.get("predicted_output_tokens").is_none());
        assert_eq!(v["priority"], "high");
    }

    #[test]
    fn usage_is_found_without_parsing_the_body() {
        let body = br#"{"choices":[{"text":"prompt_tokens"}],"usage": {"prompt_tokens" : 12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(usage(body), (Some(12), Some(30)));
        assert_eq!(usage(b"{}"), (None, None));
    }
}
