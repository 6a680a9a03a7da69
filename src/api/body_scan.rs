//! A hand-written scanner for the common text request bodies, in front of serde.
//!
//! Almost every completion body is `{"model":..,"prompt":"..","max_tokens":..}` and almost
//! every chat body is `{"model":..,"messages":[{"role":..,"content":".."}],..}`: a flat
//! object of a few known keys with plain strings, integers and booleans. serde_json's
//! derived visitor spends ~1,800 instructions on the small completion body (the field
//! matching, the `Option` and `Inputs` visitors, a whole-body UTF-8 check); this scanner
//! reads the same body in one pass, borrowing every string from it.
//!
//! The rule it keeps: it returns a body only when serde would return the *same* body
//! (`wire::parse_body`, compared field for field by the property test below and by the
//! `body_scan` fuzz campaign in `tests/fuzz_api.rs`). Anything it does not know, it does not
//! guess: an unknown key, an escape or a control character in a string, a float, an array
//! prompt, a duplicate key, a number with a leading zero or past `i64`, trailing bytes. It
//! answers `None` and the caller falls back to serde, which also writes the error messages.
//!
//! What must never happen here: accepting a body serde rejects, reading a body differently
//! from serde, or an error message of its own (errors are serde's, on the fallback).

use super::wire::{
    self, BodyError, ChatBody, CompletionBody, Content, Inputs, Message, PriorityField, Str,
};
use std::borrow::Cow;

/// `POST /v1/completions`'s body: scanned when it is of the common shape, else serde's
/// (`wire::parse_body`), with its error messages.
pub fn completion_body(body: &[u8]) -> Result<CompletionBody<'_>, BodyError> {
    // Filled in place (a body is a few hundred bytes; returning it through an `Option`
    // and a `Result` copied it twice); a scan that gives up leaves it half-filled, unused.
    let mut b = CompletionBody::default();
    match scan_completion_into(body, &mut b) {
        Some(()) => Ok(b),
        None => wire::parse_body(body),
    }
}

/// `POST /v1/chat/completions`'s body: scanned when it is of the common shape, else
/// serde's (`wire::parse_body`), with its error messages.
pub fn chat_body(body: &[u8]) -> Result<ChatBody<'_>, BodyError> {
    let mut b = ChatBody::default();
    match scan_chat_into(body, &mut b) {
        Some(()) => Ok(b),
        None => wire::parse_body(body),
    }
}

/// The completion body when it is a flat object of the keys below with plain values, else
/// `None` (serde decides).
pub fn scan_completion(body: &[u8]) -> Option<CompletionBody<'_>> {
    let mut b = CompletionBody::default();
    scan_completion_into(body, &mut b).map(|()| b)
}

/// [`scan_completion`] into `b` (a default body); on `None`, `b` is half-filled.
fn scan_completion_into<'a>(body: &'a [u8], b: &mut CompletionBody<'a>) -> Option<()> {
    let mut s = Scanner { b: body, i: 0 };
    let mut seen = 0u32;
    s.object(|s, key| {
        // One bit per key: serde refuses a duplicate field, so the scanner leaves it to it.
        let (bit, ok) = match key {
            b"model" => (0, s.opt(|s| s.str().map(Str)).map(|v| b.model = v)),
            b"prompt" => (
                1,
                s.opt(|s| s.str().map(|p| Inputs(smallvec::smallvec![Str(p)])))
                    .map(|v| b.prompt = v),
            ),
            b"max_tokens" => (2, s.opt(Scanner::int).map(|v| b.max_tokens = v)),
            b"n" => (3, s.opt(Scanner::int).map(|v| b.n = v)),
            b"stream" => (4, s.opt(Scanner::bool).map(|v| b.stream = v)),
            b"seed" => (5, s.opt(Scanner::int).map(|v| b.seed = v)),
            b"user" => (6, s.opt(|s| s.str().map(Str)).map(|v| b.user = v)),
            b"echo" => (7, s.opt(Scanner::bool).map(|v| b.echo = v)),
            b"logprobs" => (8, s.opt(Scanner::int).map(|v| b.logprobs = v)),
            b"priority" => (
                9,
                s.opt(|s| s.str().map(PriorityField))
                    .map(|v| b.priority = v),
            ),
            b"min_tokens" => (10, s.opt(Scanner::int).map(|v| b.min_tokens = v)),
            b"ignore_eos" => (11, s.opt(Scanner::bool).map(|v| b.ignore_eos = v)),
            b"best_of" => (12, s.opt(Scanner::int).map(|v| b.best_of = v)),
            _ => return None,
        };
        once(&mut seen, bit)?;
        ok
    })?;
    Some(())
}

/// The chat body when it is a flat object of the keys below with plain values and messages
/// of a string `role` and a string (or null) `content`, else `None` (serde decides).
pub fn scan_chat(body: &[u8]) -> Option<ChatBody<'_>> {
    let mut b = ChatBody::default();
    scan_chat_into(body, &mut b).map(|()| b)
}

/// [`scan_chat`] into `b` (a default body); on `None`, `b` is half-filled.
fn scan_chat_into<'a>(body: &'a [u8], b: &mut ChatBody<'a>) -> Option<()> {
    let mut s = Scanner { b: body, i: 0 };
    let mut seen = 0u32;
    s.object(|s, key| {
        let (bit, ok) = match key {
            b"model" => (0, s.opt(|s| s.str().map(Str)).map(|v| b.model = v)),
            b"messages" => (1, s.opt(Scanner::messages).map(|v| b.messages = v)),
            b"max_tokens" => (2, s.opt(Scanner::int).map(|v| b.max_tokens = v)),
            b"max_completion_tokens" => {
                (3, s.opt(Scanner::int).map(|v| b.max_completion_tokens = v))
            }
            b"n" => (4, s.opt(Scanner::int).map(|v| b.n = v)),
            b"stream" => (5, s.opt(Scanner::bool).map(|v| b.stream = v)),
            b"seed" => (6, s.opt(Scanner::int).map(|v| b.seed = v)),
            b"user" => (7, s.opt(|s| s.str().map(Str)).map(|v| b.user = v)),
            b"logprobs" => (8, s.opt(Scanner::bool).map(|v| b.logprobs = v)),
            b"top_logprobs" => (9, s.opt(Scanner::int).map(|v| b.top_logprobs = v)),
            b"priority" => (
                10,
                s.opt(|s| s.str().map(PriorityField))
                    .map(|v| b.priority = v),
            ),
            b"min_tokens" => (11, s.opt(Scanner::int).map(|v| b.min_tokens = v)),
            b"ignore_eos" => (12, s.opt(Scanner::bool).map(|v| b.ignore_eos = v)),
            _ => return None,
        };
        once(&mut seen, bit)?;
        ok
    })?;
    Some(())
}

/// Marks key `bit` seen; `None` when it was seen before.
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    let mask = 1 << bit;
    if *seen & mask != 0 {
        return None;
    }
    *seen |= mask;
    Some(())
}

/// A cursor over the body. Every method either consumes one JSON value of its kind (and the
/// whitespace after it) and answers `Some`, or answers `None`, after which the scan is
/// abandoned (the cursor's position no longer matters).
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips JSON whitespace (RFC 8259: space, tab, line feed, carriage return).
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek() == Some(c)).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end) == Some(word)).then(|| self.i = end)
    }

    /// A whole body: one object (keys handed to `field`, which reads the value), then only
    /// whitespace to the end.
    fn object(&mut self, field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.ws();
        self.members(field)?;
        (self.i == self.b.len()).then_some(())
    }

    /// `{ "key": value, ... }` and the whitespace after it; `field` reads each value.
    fn members(&mut self, mut field: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            self.ws();
            return Some(());
        }
        loop {
            // A key is only compared with the ASCII names above: its bytes need no UTF-8
            // check (a key that is not one of them ends the scan).
            let key = self.raw_bytes()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            field(self, key)?;
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b'}' => {
                    self.i += 1;
                    self.ws();
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `null` (then `Some(None)`) or a value read by `value`.
    fn opt<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            self.ws();
            return Some(None);
        }
        value(self).map(Some)
    }

    /// The bytes of a string without escapes or control characters, borrowed, and whether
    /// they are all ASCII; without the whitespace after it.
    fn raw_bytes_ascii(&mut self) -> Option<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let start = self.i;
        let mut high = 0u8;
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                // An escape needs unescaping (serde's job); a raw control character is an
                // error in JSON (serde's message).
                b'\\' | 0..=0x1f => return None,
                c => {
                    high |= c;
                    self.i += 1;
                }
            }
        }
        let bytes = &self.b[start..self.i];
        self.i += 1;
        Some((bytes, high < 0x80))
    }

    fn raw_bytes(&mut self) -> Option<&'a [u8]> {
        self.raw_bytes_ascii().map(|(bytes, _)| bytes)
    }

    /// A string without escapes or control characters, borrowed, without the whitespace
    /// after it.
    fn raw_str(&mut self) -> Option<&'a str> {
        let (bytes, ascii) = self.raw_bytes_ascii()?;
        if ascii {
            // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8. (The common
            // prompt is ASCII; `from_utf8` on it was ~100 instructions a string.)
            Some(unsafe { std::str::from_utf8_unchecked(bytes) })
        } else {
            std::str::from_utf8(bytes).ok()
        }
    }

    /// A plain string value, borrowed.
    fn str(&mut self) -> Option<Cow<'a, str>> {
        let s = self.raw_str()?;
        self.ws();
        Some(Cow::Borrowed(s))
    }

    /// An owned plain string value (a chat message's fields are `String`s).
    fn string(&mut self) -> Option<String> {
        let s = self.raw_str()?;
        self.ws();
        Some(s.to_owned())
    }

    fn bool(&mut self) -> Option<bool> {
        let v = match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => None,
        }?;
        self.ws();
        Some(v)
    }

    /// An integer as JSON writes one (`-?(0|[1-9][0-9]*)`) that fits an `i64`; not a
    /// fraction or an exponent (serde's `i64` refuses those, with its message).
    fn int(&mut self) -> Option<i64> {
        let negative = self.eat(b'-').is_some();
        let first = self.peek()?;
        if !first.is_ascii_digit() {
            return None;
        }
        let start = self.i;
        let mut magnitude: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            magnitude = magnitude
                .checked_mul(10)?
                .checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        // A leading zero before more digits ("01", "-00") is not JSON.
        if first == b'0' && self.i - start > 1 {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        let v = if negative {
            // serde_json reads "-0" as the float -0.0, which an `i64` refuses; and
            // i64::MIN's magnitude does not fit an i64: both left to serde.
            if magnitude == 0 {
                return None;
            }
            -(i64::try_from(magnitude).ok()?)
        } else {
            i64::try_from(magnitude).ok()?
        };
        self.ws();
        Some(v)
    }

    /// `[ {"role": "..", "content": ".." | null}, ... ]`.
    fn messages(&mut self) -> Option<Vec<Message>> {
        self.eat(b'[')?;
        self.ws();
        let mut out = Vec::new();
        if self.eat(b']').is_some() {
            self.ws();
            return Some(out);
        }
        loop {
            let mut role = None;
            let mut content = None;
            let mut seen = 0u32;
            self.members(|s, key| match key {
                b"role" => {
                    once(&mut seen, 0)?;
                    role = Some(s.string()?);
                    Some(())
                }
                b"content" => {
                    once(&mut seen, 1)?;
                    content = s.opt(|s| s.string().map(Content::Text))?;
                    Some(())
                }
                _ => None,
            })?;
            // A message without a role is serde's error to name.
            out.push(Message {
                role: role?,
                content,
            });
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b']' => {
                    self.i += 1;
                    self.ws();
                    return Some(out);
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Both scanners agree with serde on `body` ([`scan_agrees`]); whether each read it
    /// (completion, chat).
    fn agrees(body: &[u8]) -> (bool, bool) {
        (
            scan_agrees(body, scan_completion),
            scan_agrees(body, scan_chat),
        )
    }

    /// The scanner `scan` agrees with serde: whenever it reads `body`, serde reads the same
    /// one (every field, compared through `Debug`, which prints a borrowed and an owned
    /// string alike). Whether it read it.
    fn scan_agrees<'a, T>(body: &'a [u8], scan: fn(&'a [u8]) -> Option<T>) -> bool
    where
        T: std::fmt::Debug + serde::Deserialize<'a>,
    {
        let Some(scanned) = scan(body) else {
            return false;
        };
        let serde: T = wire::parse_body(body)
            .unwrap_or_else(|e| panic!("scanned but serde refused {body:?}: {e:?}"));
        assert_eq!(format!("{scanned:?}"), format!("{serde:?}"), "{body:?}");
        true
    }

    #[test]
    fn the_common_bodies_are_scanned_and_read_as_serde_reads_them() {
        for body in [
            &br#"{"prompt":"hi","max_tokens":1}"#[..],
            br#"{"model":"abe-sim","prompt":"Hello, world","max_tokens":16,"stream":true}"#,
            b" {\t\"model\" : \"m\" ,\r\n\"prompt\" : \"caf\xc3\xa9\" , \"n\" : 2 , \"seed\" : -7 } ",
            br#"{"prompt":"x","max_tokens":null,"user":"u1","priority":"high","echo":false}"#,
            br#"{"prompt":"x","max_tokens":0,"logprobs":3,"min_tokens":1,"best_of":2}"#,
            br#"{"prompt":"x","max_tokens":9223372036854775807,"ignore_eos":true}"#,
            br#"{}"#,
        ] {
            assert!(agrees(body).0, "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"model":"abe-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#
                [..],
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":null}],"max_completion_tokens":4,"logprobs":true,"top_logprobs":2}"#,
            br#"{"messages":[],"stream":false}"#,
        ] {
            assert!(agrees(body).1, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn bodies_outside_the_common_shape_are_left_to_serde() {
        for body in [
            &br#"{"prompt":"h\u0069"}"#[..],                        // an escape
            br#"{"prompt":["a","b"]}"#,                             // an array prompt
            br#"{"prompt":"x","temperature":0.5}"#,                 // a float
            br#"{"prompt":"x","max_tokens":01}"#,                   // a leading zero
            br#"{"prompt":"x","max_tokens":-0}"#,                   // a float -0.0 to serde_json
            br#"{"prompt":"x","max_tokens":1e3}"#,                  // an exponent
            br#"{"prompt":"x","max_tokens":9223372036854775808}"#,  // past i64
            br#"{"prompt":"x","max_tokens":-9223372036854775808}"#, // i64::MIN, left to serde
            br#"{"prompt":"x","prompt":"y"}"#,                      // a duplicate key
            br#"{"prompt":"x","other":1}"#,                         // an unknown key
            br#"{"prompt":"x"} x"#,                                 // trailing bytes
            br#"{"prompt":"x",}"#,                                  // a trailing comma
            b"{\"prompt\":\"a\x01b\"}",                             // a raw control character
            b"{\"prompt\":\"\xff\"}",                               // not UTF-8
            br#"{"prompt":"x","priority":3}"#,                      // an integer priority
            br#"{"messages":[{"content":"hi"}]}"#,                  // a message without a role
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
            br#"{"messages":[{"role":"user","role":"user"}]}"#,
            b"",
            b"[]",
        ] {
            // Neither scanner reads them (serde does, or refuses them), and `agrees` checks
            // the fallback gives serde's answer.
            let (c, m) = agrees(body);
            assert!(!c && !m, "scanned: {}", String::from_utf8_lossy(body));
        }
    }

    /// Pieces a random body is built from: the keys both scanners know (and some they do
    /// not), values of every JSON kind (the ones the scanner reads and the ones it leaves to
    /// serde), whitespace, and punctuation to break the syntax.
    fn piece() -> impl Strategy<Value = String> {
        let keys = prop::sample::select(vec![
            "\"model\"",
            "\"prompt\"",
            "\"max_tokens\"",
            "\"max_completion_tokens\"",
            "\"n\"",
            "\"stream\"",
            "\"seed\"",
            "\"user\"",
            "\"echo\"",
            "\"logprobs\"",
            "\"top_logprobs\"",
            "\"priority\"",
            "\"min_tokens\"",
            "\"ignore_eos\"",
            "\"best_of\"",
            "\"messages\"",
            "\"role\"",
            "\"content\"",
            "\"temperature\"",
            "\"pr\\u006fmpt\"",
        ]);
        let values = prop::sample::select(vec![
            "\"hi\"",
            "\"\"",
            "\"a\\\"b\"",
            "\"caf\u{e9}\"",
            "\"\u{1}\"",
            "0",
            "-0",
            "00",
            "01",
            "-1",
            "7",
            "1.5",
            "1e2",
            "-",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "18446744073709551616",
            "true",
            "false",
            "tru",
            "null",
            "nul",
            "[]",
            "[\"a\"]",
            "[{\"role\":\"user\",\"content\":\"hi\"}]",
            "[{\"role\":\"user\",\"content\":null},{\"role\":\"a\",\"content\":\"b\"}]",
            "[{\"content\":\"x\"}]",
            "{}",
        ]);
        let punct = prop::sample::select(vec!["{", "}", "[", "]", ",", ":", " ", "\n", "\t", "x"]);
        // Well-typed pairs, so that many bodies are of the common shape.
        let typed = prop::sample::select(vec![
            "\"model\":\"abe-sim\"",
            "\"prompt\":\"Hello \u{e9}\u{4e16} world\"",
            "\"max_tokens\":16",
            "\"max_tokens\":null",
            "\"n\":2",
            "\"stream\":true",
            "\"seed\":-42",
            "\"user\":\"u-1\"",
            "\"priority\":\"low\"",
            "\"min_tokens\":0",
            "\"ignore_eos\":false",
            "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
            "\"messages\":[ {\"content\" : null , \"role\":\"system\"} ]",
            "\"max_completion_tokens\":3",
            "\"top_logprobs\":1",
        ]);
        let space = prop::sample::select(vec!["", " ", "\n", "\r\n\t"]);
        prop_oneof![
            12 => (typed, space).prop_map(|(p, w)| format!("{w}{p}{w},")),
            4 => (keys, values).prop_map(|(k, v)| format!("{k}:{v},")),
            1 => punct.prop_map(str::to_string),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(piece(), 0..8),
            any::<bool>(),
            prop::option::weighted(0.25, (any::<prop::sample::Index>(), any::<u8>())),
        )
            .prop_map(|(pieces, trim, flip)| {
                let mut text = pieces.concat();
                if trim && text.ends_with(',') {
                    text.pop();
                }
                let mut bytes = format!("{{{text}}}").into_bytes();
                if let Some((at, byte)) = flip {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                bytes
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn a_scanned_body_is_exactly_serdes(body in body()) {
            let (c, m) = agrees(&body);
            // The scanners accept only what serde accepts.
            if wire::parse_body::<CompletionBody>(&body).is_err() {
                prop_assert!(!c);
            }
            if wire::parse_body::<ChatBody>(&body).is_err() {
                prop_assert!(!m);
            }
        }
    }
}
