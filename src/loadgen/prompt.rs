//! Request bytes for one workload request: a deterministic prompt of the requested length and
//! the `POST /v1/completions` HTTP/1.1 request that carries it (or, with
//! [`BodyOptions::embeddings`], the `POST /v1/embeddings` request with it as `input`).
//!
//! abe (like the simulator's `SimRequest::meta`) estimates prompt tokens as prompt bytes / 4,
//! so a request of `n` prompt tokens gets exactly `4 n` bytes of text: three-letter words and
//! a space, drawn from a hash of (seed, request index, word index). Same inputs, same bytes;
//! different requests get different text (so no server can answer from a prefix cache what it
//! would have to compute). A request replayed from a trace with `hash_ids` (`abe loadgen
//! --trace`) instead gets, per 512-token trace block, 2048 bytes derived from the block id
//! alone ([`push_trace_prompt`]): equal ids give equal text, so a live server's prefix cache
//! sees exactly the reuse the trace has. Only `a-z` and spaces: nothing in a prompt needs
//! JSON escaping.
//! Everything is written into caller-owned buffers; nothing here allocates once they are
//! warm, reads a clock or does I/O.

use crate::core::prefix::TOKEN_BYTES;
use crate::core::Priority;
use crate::sim::prefix::MOONCAKE_BLOCK_TOKENS;
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
        push_word(out, mix(base ^ w));
    }
}

/// Bytes of text per trace block id: 512 tokens of 4 bytes.
pub const TRACE_BLOCK_BYTES: usize = MOONCAKE_BLOCK_TOKENS as usize * TOKEN_BYTES;

/// Appends one 4-byte word (three letters and a space) from hash `h`.
fn push_word(out: &mut Vec<u8>, h: u64) {
    out.extend_from_slice(&[
        b'a' + (h % 26) as u8,
        b'a' + ((h >> 8) % 26) as u8,
        b'a' + ((h >> 16) % 26) as u8,
        b' ',
    ]);
}

/// Appends `4 x max(tokens, 1)` bytes of prompt text for a trace request whose prompt blocks
/// have ids `ids` (512 tokens each, the last one cut at the prompt's end): block `k`'s text
/// depends on `ids[k]` only. Tokens past the last id get request `index`'s own text, as
/// [`push_prompt`] writes it from there.
pub fn push_trace_prompt(out: &mut Vec<u8>, tokens: u32, ids: &[u64], seed: u64, index: u64) {
    const BLOCK_WORDS: u64 = (TRACE_BLOCK_BYTES / TOKEN_BYTES) as u64;
    let words = u64::from(tokens.max(EMPTY_PROMPT_WORDS));
    let mut w = 0u64;
    for &id in ids {
        let base = mix(id ^ 0x7261_6365_5f62_6c6b); // "race_blk": apart from push_prompt's
        for j in 0..BLOCK_WORDS.min(words - w) {
            push_word(out, mix(base ^ j));
        }
        w += BLOCK_WORDS.min(words - w);
        if w == words {
            return;
        }
    }
    let base = mix(seed ^ mix(index));
    for j in w..words {
        push_word(out, mix(base ^ j));
    }
}

/// Request `r`'s block ids: its prefix span in `trace_ids` (the run's
/// `Generated::trace_ids`); empty when it has none.
pub fn request_ids<'a>(trace_ids: &'a [u64], r: &SimRequest) -> &'a [u64] {
    let start = r.prefix.start as usize;
    trace_ids
        .get(start..start + r.prefix.len as usize)
        .unwrap_or_default()
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

/// The prompt text of `r`: from its trace block `ids` if it has any, else its own.
fn push_request_prompt(out: &mut Vec<u8>, r: &SimRequest, ids: &[u64], seed: u64, index: u64) {
    if ids.is_empty() {
        push_prompt(out, r.prompt_tokens, seed, index);
    } else {
        push_trace_prompt(out, r.prompt_tokens, ids, seed, index);
    }
}

/// Writes the complete HTTP/1.1 request for `r` (request `index` of run `seed`, its trace
/// block ids `ids`, empty if none) into `out` (cleared first), using `body` as scratch for
/// the JSON.
#[allow(clippy::too_many_arguments)]
pub fn write_request(
    out: &mut Vec<u8>,
    body: &mut Vec<u8>,
    path: &str,
    host: &str,
    opts: &BodyOptions,
    r: &SimRequest,
    ids: &[u64],
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
        push_request_prompt(body, r, ids, seed, index);
        body.push(b'"');
    } else {
        body.extend_from_slice(b"\"prompt\":\"");
        push_request_prompt(body, r, ids, seed, index);
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
            &[],
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
        write_request(&mut out, &mut body, "/p", "h", &plain, &r, &[], 1, 0);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v.get("model").is_none() && v.get("priority").is_none());
        assert!(v.get("predicted_output_tokens").is_none());
        let embed = BodyOptions {
            embeddings: true,
            ..opts
        };
        assert_eq!(embed.path(), "/v1/embeddings");
        let r = req(5, 9, Priority::High);
        write_request(
            &mut out,
            &mut body,
            embed.path(),
            "h",
            &embed,
            &r,
            &[],
            1,
            0,
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["input"].as_str().unwrap().len(), 20);
        assert!(v.get("prompt").is_none() && v.get("max_tokens").is_none());
        assert!(v.get("predicted_output_tokens").is_none());
        assert_eq!(v["priority"], "high");
    }

    #[test]
    fn equal_trace_ids_give_equal_text_and_equal_live_block_names() {
        use crate::core::prefix::text_block_hashes;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // Same first two blocks, then another; prompts cut inside their third block.
        push_trace_prompt(&mut a, 1100, &[5, 6, 7], 1, 0);
        push_trace_prompt(&mut b, 1300, &[5, 6, 8], 2, 9);
        assert_eq!((a.len(), b.len()), (4400, 5200));
        assert!(a.iter().all(|c| c.is_ascii_lowercase() || *c == b' '));
        assert_eq!(a[..2 * TRACE_BLOCK_BYTES], b[..2 * TRACE_BLOCK_BYTES]);
        assert_ne!(a[2 * TRACE_BLOCK_BYTES..], b[2 * TRACE_BLOCK_BYTES..4400]);
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        text_block_hashes(std::str::from_utf8(&a).unwrap(), 16, &mut ha);
        text_block_hashes(std::str::from_utf8(&b).unwrap(), 16, &mut hb);
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        assert_eq!(shared, 64, "two 512-token blocks are 64 KV blocks of 16");
        // A block's text depends on its id only, not on the request or the seed.
        let mut c = Vec::new();
        push_trace_prompt(&mut c, 512, &[6], 3, 3);
        assert_eq!(c[..], a[TRACE_BLOCK_BYTES..2 * TRACE_BLOCK_BYTES]);
        // Tokens past the ids: the request's own text.
        let mut d = Vec::new();
        push_trace_prompt(&mut d, 600, &[6], 3, 3);
        assert_eq!(d.len(), 2400);
        assert_eq!(d[..TRACE_BLOCK_BYTES], c[..]);
        let r = SimRequest {
            prefix: crate::sim::prefix::PrefixSpan { start: 1, len: 2 },
            ..req(5, 1, Priority::Normal)
        };
        assert_eq!(request_ids(&[1, 2, 3, 4], &r), &[2, 3]);
        assert_eq!(
            request_ids(&[1, 2, 3, 4], &req(5, 1, Priority::Normal)),
            &[] as &[u64]
        );
    }

    #[test]
    fn usage_is_found_without_parsing_the_body() {
        let body = br#"{"choices":[{"text":"prompt_tokens"}],"usage": {"prompt_tokens" : 12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(usage(body), (Some(12), Some(30)));
        assert_eq!(usage(b"{}"), (None, None));
    }
}
