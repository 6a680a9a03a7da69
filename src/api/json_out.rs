//! A small JSON writer for the fixed response shapes of the hot path (completions, chat
//! completions): strings, integers and literal punctuation appended straight to a byte
//! buffer, with no intermediate `String`, `Value` or serializer state.
//!
//! Output is byte-for-byte what `serde_json` writes for the same values (strings are escaped
//! with the same rules: `"`, `\` and control characters; everything else, non-ASCII
//! included, is copied as UTF-8), so switching a shape to this writer changes no response.
//! Only writing lives here; requests are always parsed with serde. Numbers are written by
//! [`crate::http::number`], which the HTTP heads share; they are re-exported here so a
//! shape is written with one module.

use crate::http::number::HEX_DIGITS;
pub use crate::http::number::{hex16, uint};

/// What each byte turns into inside a JSON string: 0 = copied as is, `u` = `\u00XX`,
/// anything else = a backslash and that character (`\"`, `\\`, `\n`, ...). Same table as
/// serde_json's, so the output is identical.
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Appends `s` as a JSON string (quotes included), escaped.
#[inline]
pub fn string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    let n = bytes.len();
    loop {
        // Eight bytes at a time while none needs escaping (most text has none) ...
        while let Some(chunk) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            if needs_escape(word) {
                break;
            }
            i += 8;
        }
        // The last few bytes, as one word padded with spaces (names and short texts are
        // only that) ...
        if n - i < 8 {
            let mut pad = [b' '; 8];
            pad[..n - i].copy_from_slice(&bytes[i..]);
            if !needs_escape(u64::from_le_bytes(pad)) {
                break;
            }
        }
        // ... then byte by byte through the word that needs escaping, or the last bytes.
        let end = (i + 8).min(n);
        for (at, &b) in bytes.iter().enumerate().take(end).skip(i) {
            let esc = ESCAPE[usize::from(b)];
            if esc == 0 {
                continue;
            }
            // `at` is at an ASCII byte (every escaped byte is < 0x80), so the run before it
            // ends on a character boundary.
            out.extend_from_slice(&bytes[start..at]);
            if esc == b'u' {
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX_DIGITS[usize::from(b >> 4)],
                    HEX_DIGITS[usize::from(b & 0xf)],
                ]);
            } else {
                out.extend_from_slice(&[b'\\', esc]);
            }
            start = at + 1;
        }
        i = end;
        if i >= n {
            break;
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Whether any of the eight bytes of `word` is one [`ESCAPE`] escapes: below 0x20, `"` or
/// `\`. The classic "has less" and "has zero" tests: a borrow can flag a byte above a
/// flagged one, never a chunk with none, so `false` means all eight are copied as they are
/// (bytes of 0x80 and over never flag: their complement's top bit is clear).
#[inline]
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & TOPS;
    let control = word.wrapping_sub(ONES * 0x20) & !word & TOPS;
    let quote = zero_byte(word ^ (ONES * u64::from(b'"')));
    let backslash = zero_byte(word ^ (ONES * u64::from(b'\\')));
    control | quote | backslash != 0
}

/// `,"prompt_tokens_details":{"cached_tokens":N}` (OpenAI's usage field for prefix-cache hits).
pub fn prompt_tokens_details(out: &mut Vec<u8>, cached_tokens: u64) {
    out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    uint(out, cached_tokens);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRICKY: &[&str] = &[
        "",
        "plain",
        "quote \" and backslash \\ and slash /",
        "\\\"",
        "line\nfeed\r\ttab\u{8}bs\u{c}ff",
        "\u{0}\u{1}\u{1f} nul and unit separator",
        "\u{7f} del is not escaped",
        "non-ASCII: é ß 日本語 🙂 \u{2028}\u{2029}",
        "ends with escape\n",
        "\"",
        "mixed é\"\\\u{1}🙂\n",
    ];

    #[test]
    fn strings_match_serde_json_byte_for_byte_and_parse_back() {
        for s in TRICKY {
            let mut out = Vec::new();
            string(&mut out, s);
            assert_eq!(
                out,
                serde_json::to_vec(s).unwrap(),
                "escaping of {s:?} differs from serde_json"
            );
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(&back, s);
        }
    }

    #[test]
    fn every_char_below_0x80_at_every_place_of_a_long_string_matches_serde_json() {
        // The eight-byte scan: each character at each offset of a string longer than two
        // words, among plain ASCII and among non-ASCII bytes.
        for filler in ["abcdefghijklmnopqrstuvwx", "éééééééééééé"] {
            for c in (0u8..0x80).map(char::from) {
                for at in 0..=filler.chars().count() {
                    let mut s: String = filler.chars().take(at).collect();
                    s.push(c);
                    s.extend(filler.chars().skip(at));
                    let mut out = Vec::new();
                    string(&mut out, &s);
                    assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn every_single_char_below_0x80_round_trips() {
        for c in (0u8..0x80).map(char::from) {
            let s = format!("a{c}b");
            let mut out = Vec::new();
            string(&mut out, &s);
            assert_eq!(out, serde_json::to_vec(&s).unwrap(), "char {:#x}", c as u32);
        }
    }
}
