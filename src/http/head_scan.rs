//! A one-pass scanner for the common request head, in front of httparse.
//!
//! Almost every request head abe sees is `METHOD SP target SP HTTP/1.x CRLF`, a few
//! `Name: value CRLF` lines of printable ASCII, and `CRLF`. httparse reads any head,
//! including the odd ones RFC 9112 allows (bare LF line ends, obs-text in values, empty
//! lines before the request line) and the ones it refuses, and spends ~1,000 instructions on
//! the small completion POST (callgrind, BENCHMARKS.md "The hot path again"); this scanner
//! reads that head in one pass over a byte-class table.
//!
//! The rule it keeps, as the body scanner does: it returns a head only when httparse would
//! return the *same* head (the same method, target, version, header names and values, in
//! order, and the same length), which the `head_scan` fuzz campaign in `tests/fuzz_http.rs`
//! checks on mutated heads. Anything outside the strict subset below it does not guess: it
//! answers `None`, and the caller runs httparse, which also decides every error.
//!
//! The subset: a method of token characters, one space, a target of visible ASCII
//! (`!`..`~`), one space, `HTTP/1.0` or `HTTP/1.1`, CRLF; each header a name of token
//! characters, a colon, optional spaces and tabs, a value of visible ASCII, spaces and tabs
//! (trailing ones dropped, as httparse drops them), CRLF; at most `max_headers` of them;
//! then CRLF. A complete head only: a partial one is httparse's to call partial.
//!
//! What must never happen here: accepting a head httparse refuses, reading one differently,
//! or an error of its own. Nothing here allocates; the one `unsafe` takes as text bytes
//! the scan has checked are ASCII.

/// Token characters (RFC 9110 5.6.2), the bytes of a method and of a header name: the
/// table httparse uses for them.
const TOKEN: [bool; 256] = tokens();

const fn tokens() -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0usize;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
}

/// What the scanner read of a head besides its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    /// The request target as sent (path and query).
    pub target: &'a str,
    /// `HTTP/1.0` (else `HTTP/1.1`).
    pub http10: bool,
    /// Bytes of the head, including the empty line that ends it.
    pub head_len: usize,
}

/// Reads the head at the front of `buf` when it is of the common shape, calling
/// `header(name, value)` for each header in order; `None` when it is not (or is not complete
/// yet, has more than `max_headers` headers, or `header` returns `false`): the caller then
/// parses it with httparse from the start.
pub fn scan<'a>(
    buf: &'a [u8],
    max_headers: usize,
    mut header: impl FnMut(&'a str, &'a [u8]) -> bool,
) -> Option<RequestLine<'a>> {
    let method_end = token_run(buf, 0);
    if method_end == 0 || buf.get(method_end) != Some(&b' ') {
        return None;
    }
    let target_end = visible_run(buf, method_end + 1, b'!');
    if target_end == method_end + 1 || buf.get(target_end) != Some(&b' ') {
        return None;
    }
    let version = buf.get(target_end + 1..target_end + 11)?;
    let http10 = match version {
        b"HTTP/1.1\r\n" => false,
        b"HTTP/1.0\r\n" => true,
        _ => return None,
    };
    let method = ascii(&buf[..method_end]);
    let target = ascii(&buf[method_end + 1..target_end]);
    let mut at = target_end + 11;
    let mut count = 0;
    loop {
        if buf.get(at..at + 2)? == b"\r\n" {
            let head_len = at + 2;
            debug_assert!(head_len <= buf.len() && buf[..head_len].ends_with(b"\r\n"));
            return Some(RequestLine {
                method,
                target,
                http10,
                head_len,
            });
        }
        let name_end = token_run(buf, at);
        if name_end == at || buf.get(name_end) != Some(&b':') {
            return None;
        }
        let mut value_start = name_end + 1;
        while matches!(buf.get(value_start), Some(b' ' | b'\t')) {
            value_start += 1;
        }
        let line_end = value_run(buf, value_start);
        if buf.get(line_end..line_end + 2)? != b"\r\n" {
            return None;
        }
        let mut value_end = line_end;
        while value_end > value_start && matches!(buf[value_end - 1], b' ' | b'\t') {
            value_end -= 1;
        }
        count += 1;
        if count > max_headers {
            return None;
        }
        let name = ascii(&buf[at..name_end]);
        if !header(name, &buf[value_start..value_end]) {
            return None;
        }
        at = line_end + 2;
    }
}

/// Bytes the scanner has read as token characters or visible ASCII, as text.
fn ascii(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: the callers pass only runs of token characters or of `!`..`~` (`token_run`,
    // `visible_run`), all below 0x80, and ASCII is valid UTF-8. (`from_utf8` here was ~45
    // instructions a string, four strings a small request.)
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// The end of the run of token bytes from `from` (`buf.len()` at most). Byte by byte: names
/// are short, and finding the end eight bytes at a time and checking the run after cost
/// more (tools/bench/http_head_instructions.sh: 3,777 against 2,797 on the OpenAI SDK's head).
fn token_run(buf: &[u8], from: usize) -> usize {
    let rest = buf.get(from..).unwrap_or_default();
    from + rest
        .iter()
        .position(|&b| !TOKEN[usize::from(b)])
        .unwrap_or(rest.len())
}

/// Eight bytes at a time: the bytes of `word` (little-endian) outside `low..=0x7e`, as the
/// top bit of each (`low` at most 0x80). Bytes below `low` by the classic "has less" test,
/// bytes of 0x7f and above because adding one sets their top bit (0x80 and above have it).
/// Borrows and carries can flag a byte above a flagged one, never below it: the lowest
/// flag is always the first byte out of range, and none means all eight are in it.
fn out_of_range(word: u64, low: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOPS: u64 = 0x8080_8080_8080_8080;
    let below = word.wrapping_sub(ONES * u64::from(low)) & !word & TOPS;
    let high = (word.wrapping_add(ONES) | word) & TOPS;
    below | high
}

/// The end of the run of bytes in `low..=0x7e` from `from`: eight at a time, the last few
/// byte by byte.
fn visible_run(buf: &[u8], from: usize, low: u8) -> usize {
    let mut i = from;
    while let Some(chunk) = buf.get(i..i + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let out = out_of_range(word, low);
        if out != 0 {
            return i + (out.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while matches!(buf.get(i), Some(&b) if b >= low && b <= b'~') {
        i += 1;
    }
    i
}

/// The end of a header value's bytes from `from`: visible ASCII and spaces, eight at a time,
/// and tabs.
fn value_run(buf: &[u8], from: usize) -> usize {
    let mut i = from;
    loop {
        i = visible_run(buf, i, b' ');
        if buf.get(i) != Some(&b'\t') {
            return i;
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head's headers, name and value, in order.
    type Headers<'a> = Vec<(&'a str, &'a [u8])>;

    fn headers_of(buf: &[u8]) -> Option<(RequestLine<'_>, Headers<'_>)> {
        let mut seen = Vec::new();
        let line = scan(buf, 64, |n, v| {
            seen.push((n, v));
            true
        })?;
        Some((line, seen))
    }

    #[test]
    fn eight_bytes_at_a_time_reads_as_one_at_a_time() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Bytes near the edges of the ranges, mostly.
            let bytes = rng.to_le_bytes().map(|b| match b % 4 {
                0 => b,
                1 => 0x1e + b % 5,
                2 => 0x7c + b % 6,
                _ => b'a',
            });
            for low in [b' ', b'!'] {
                let first_out = bytes.iter().position(|&b| b < low || b > b'~');
                let out = out_of_range(u64::from_le_bytes(bytes), low);
                let first_flag = (out != 0).then(|| (out.trailing_zeros() / 8) as usize);
                assert_eq!(first_flag, first_out, "{bytes:?}");
                let mut padded = bytes.to_vec();
                padded.extend_from_slice(b"abc\r\n");
                let run = visible_run(&padded, 0, low);
                assert_eq!(run, first_out.unwrap_or(11), "{bytes:?}");
            }
        }
    }

    #[test]
    fn token_runs_end_where_a_byte_by_byte_reading_ends() {
        let alphabet = b"aZ09-_.~!:;, \t\r\n\x7f\x80\xff\"(/@";
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..50_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 24) as usize;
            let buf: Vec<u8> = (0..len)
                .map(|i| alphabet[((rng >> (i % 8 * 8)) as usize + i * 7) % alphabet.len()])
                .collect();
            for from in 0..=len {
                let reference = from
                    + buf[from..]
                        .iter()
                        .position(|&b| !TOKEN[usize::from(b)])
                        .unwrap_or(len - from);
                assert_eq!(token_run(&buf, from), reference, "{buf:?} from {from}");
            }
        }
    }

    #[test]
    fn reads_the_common_head() {
        let buf = b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length:  30 \t\r\nX-Empty:\r\n\r\n{}";
        let (line, headers) = headers_of(buf).unwrap();
        assert_eq!(line.method, "POST");
        assert_eq!(line.target, "/v1/completions?x=1");
        assert!(!line.http10);
        assert_eq!(line.head_len, buf.len() - 2);
        assert_eq!(
            headers,
            vec![
                ("Host", &b"x"[..]),
                ("Content-Length", &b"30"[..]),
                ("X-Empty", &b""[..])
            ]
        );
    }

    #[test]
    fn leaves_everything_else_to_httparse() {
        for odd in [
            &b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"[..], // partial
            b"POST /v1/completions HTTP/1.1\nHost: x\n\n",        // bare LF
            b"\r\nGET / HTTP/1.1\r\n\r\n",                        // empty line first
            b"GET  / HTTP/1.1\r\n\r\n",                           // two spaces
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-A: \xc3\xa9\r\n\r\n", // obs-text
            b"GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n",     // bare CR
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",      // space before the colon
            b"GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",  // folded
            b"GET /\x7f HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(headers_of(odd), None, "{:?}", String::from_utf8_lossy(odd));
        }
        let many: String = (0..65).map(|i| format!("X-{i}: v\r\n")).collect();
        let buf = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(scan(buf.as_bytes(), 64, |_, _| true), None);
        assert!(scan(buf.as_bytes(), 65, |_, _| true).is_some());
        assert_eq!(
            scan(b"GET / HTTP/1.1\r\nA: b\r\n\r\n", 64, |_, _| false),
            None
        );
    }
}
