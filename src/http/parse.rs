//! Request head parsing and framing (RFC 9112) with hard limits.
//!
//! A partial head is "not yet", not an error. Only what the server needs is extracted from
//! the head; client bytes are never `unwrap()`ed. Limits reject instead of growing:
//! head bytes (431), header count (431), body bytes (413), chunked bodies (411).
//!
//! Framing follows RFC 9112 with one reading only (anything two parsers could read two ways
//! is refused, and a refused head closes the connection): Content-Length is `1*DIGIT`, and a
//! repeated or listed one must repeat the same value (6.3); Content-Length with
//! Transfer-Encoding, or Transfer-Encoding in HTTP/1.0, is 400 (6.1); obsolete line folding
//! is 400 (5.2); whitespace before a field's colon is 400 (5.1); a second Host is 400 (3.2);
//! a bare CR is 400 and a bare LF ends a line like CRLF (2.2, httparse). A request without
//! Host is accepted (a deliberate leniency: nothing here routes by Host).
//!
//! What each function assumes and guarantees is asserted in debug builds (`debug_assert!`,
//! TigerBeetle's habit): a parsed head lies within the buffer and the limits, ends its last
//! line, and frames a body within its limit. Release builds check nothing more.

use super::header_name::HeaderName;
use super::response::Status;

/// Most headers in one request head (more is 431).
pub const HEADERS_MAX: usize = 64;

/// Request method, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Head,
    /// `DELETE /admin/backends/{name}` only.
    Delete,
    Other,
}

/// The paths abe serves, kept without allocating when a request names one of them.
const KNOWN_PATHS: [&str; 19] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/ready",
    "/metrics",
    "/metrics/json",
    "/admin/strategy",
    "/metrics/history",
    "/events",
    "/admin/faults",
    "/tokenize",
    "/detokenize",
    "/",
    "/dashboard",
    "/dashboard/",
    "/dashboard/dashboard.js",
    "/dashboard/dashboard.css",
];

/// A request path without its query string: one of [`KNOWN_PATHS`] (no allocation, the
/// usual case) or a copy of whatever the client sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPath(std::borrow::Cow<'static, str>);

impl RequestPath {
    /// `path`, borrowed from [`KNOWN_PATHS`] when it is one of them.
    pub fn new(path: &str) -> RequestPath {
        let kept = match KNOWN_PATHS.iter().find(|k| **k == path) {
            Some(k) => RequestPath(std::borrow::Cow::Borrowed(k)),
            None => RequestPath(std::borrow::Cow::Owned(path.to_string())),
        };
        debug_assert_eq!(kept.as_str(), path, "a path is kept as sent");
        kept
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for RequestPath {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for RequestPath {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What the server keeps of a parsed request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub method: Method,
    /// Path without the query string.
    pub path: RequestPath,
    /// Bytes of the head, including the final CRLFCRLF.
    pub head_len: usize,
    /// Body length from Content-Length (0 when absent).
    pub content_length: usize,
    /// The client asked to close after this request (or HTTP/1.0 without keep-alive).
    pub close: bool,
    /// HTTP/1.0 request (keep-alive must then be confirmed in the response).
    pub http10: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    /// Value of `X-Priority`, if any.
    pub priority: Option<String>,
    /// Value of `Authorization`, if any.
    pub authorization: Option<String>,
    /// Value of `X-Session-Id`, if any: a client's session, for session-affinity routing.
    pub session_id: Option<String>,
    /// Value of `X-Request-Id`, if any: echoed, and the response's id (as vLLM does).
    pub request_id: Option<String>,
    /// The query string after `?`, if any (only the few GET endpoints with parameters read
    /// it, e.g. `/metrics/history?seconds=N`).
    pub query: Option<String>,
}

/// Why a head was refused; the connection answers with `status` and closes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadError {
    pub status: Status,
    pub message: String,
}

fn head_error(status: Status, message: impl Into<String>) -> HeadError {
    HeadError {
        status,
        message: message.into(),
    }
}

/// `s` as a Content-Length: `1*DIGIT` (RFC 9112 6.3; no sign, no space), no overflow.
fn decimal_usize(s: &str) -> Option<usize> {
    decimal_bytes(s.as_bytes())
}

/// [`decimal_usize`] over bytes: `1*DIGIT`, no overflow.
fn decimal_bytes(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    let mut n: usize = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(usize::from(b - b'0'))?;
    }
    // Guarantees: only `1*DIGIT` is read, and no digit was lost to overflow (a number of
    // k significant digits is at least 10^(k-1)).
    debug_assert!(!digits.is_empty() && digits.iter().all(u8::is_ascii_digit));
    debug_assert!({
        let significant = digits.iter().skip_while(|&&b| b == b'0').count();
        significant == 0 || n.checked_ilog10() == Some(significant as u32 - 1)
    });
    Some(n)
}

/// Parses a request head from the front of `buf`. `Ok(None)`: incomplete, read more (the
/// caller enforces `max_header_bytes` on what it buffers before a head completes).
pub fn parse_head(
    buf: &[u8],
    max_header_bytes: usize,
    max_body_bytes: usize,
) -> Result<Option<Head>, HeadError> {
    // The common head in one pass (`head_scan`); anything else, and every error, httparse's.
    let mut fields = Fields::new();
    let scanned = super::head_scan::scan(buf, HEADERS_MAX, |name, value| {
        fields.header(name, value).is_ok()
    });
    if let Some(line) = scanned {
        return finish(
            line.method,
            line.target,
            line.http10,
            line.head_len,
            fields,
            max_header_bytes,
            max_body_bytes,
        )
        .map(Some);
    }
    // Header storage stays uninitialised: httparse writes only the entries it fills (saves
    // zeroing all HEADERS_MAX of them for every request).
    let mut headers = [std::mem::MaybeUninit::<httparse::Header>::uninit(); HEADERS_MAX];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > max_header_bytes {
                return Err(head_error(
                    Status::HeaderTooLarge,
                    format!("request head exceeds {max_header_bytes} bytes"),
                ));
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(head_error(
                Status::HeaderTooLarge,
                format!("more than {HEADERS_MAX} request headers"),
            ))
        }
        Err(e) => {
            let message = if obs_fold(buf) {
                // RFC 9112 5.2: reject (or unfold); rejecting keeps one reading of the head.
                "obsolete line folding (a header line starting with a space or tab) is not \
                 accepted: send each header on one line"
                    .to_string()
            } else {
                format!("malformed HTTP request: {e}")
            };
            return Err(head_error(Status::BadRequest, message));
        }
    };
    // httparse: a complete head is a non-empty prefix of `buf` that ends its last line
    // (CRLF CRLF, or a bare LF ending a line).
    debug_assert!(
        head_len > 0 && head_len <= buf.len(),
        "head of {head_len} bytes"
    );
    debug_assert_eq!(buf[head_len - 1], b'\n', "a head ends with an empty line");
    // A head too large is refused before anything in it is read.
    check_head_len(head_len, max_header_bytes)?;
    let http10 = req.version == Some(0);
    let mut fields = Fields::new();
    for h in req.headers.iter() {
        fields.header(h.name, h.value)?;
    }
    finish(
        req.method.unwrap_or(""),
        req.path.unwrap_or("/"),
        http10,
        head_len,
        fields,
        max_header_bytes,
        max_body_bytes,
    )
    .map(Some)
}

/// What the headers of a head said, read one header at a time.
struct Fields {
    /// What the last `close` or `keep-alive` token of `Connection` said (`None`: the
    /// version's default).
    connection_close: Option<bool>,
    content_length: Option<usize>,
    transfer_encoding: bool,
    hosts: u32,
    expect_continue: bool,
    priority: Option<String>,
    authorization: Option<String>,
    session_id: Option<String>,
    request_id: Option<String>,
}

impl Fields {
    fn new() -> Fields {
        Fields {
            connection_close: None,
            content_length: None,
            transfer_encoding: false,
            hosts: 0,
            expect_continue: false,
            priority: None,
            authorization: None,
            session_id: None,
            request_id: None,
        }
    }

    /// Reads one header (in the order sent); an error refuses the head.
    fn header(&mut self, name: &str, raw: &[u8]) -> Result<(), HeadError> {
        // Every header value must be UTF-8 (httparse lets obs-text through); ASCII, the
        // usual case, needs no further check. Only the headers used below are converted.
        if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
            return Err(head_error(
                Status::BadRequest,
                format!("header {name} is not valid UTF-8"),
            ));
        }
        let value = || std::str::from_utf8(raw).unwrap_or_default().trim();
        match super::header_name::classify(name.as_bytes()) {
            HeaderName::ContentLength => {
                // The usual value, one bare number, is read from its bytes: the UTF-8 check,
                // trim and split below would each hand it back unchanged.
                if let Some(n) = decimal_bytes(raw) {
                    if self.content_length.is_some_and(|c| c != n) {
                        return Err(head_error(
                            Status::BadRequest,
                            "conflicting Content-Length values",
                        ));
                    }
                    self.content_length = Some(n);
                    return Ok(());
                }
                // RFC 9112 6.3 (5): a list is accepted only when every value is the same valid
                // length (`5, 5`); so are repeated headers. Anything else is no framing at all.
                for value in value().split(',') {
                    let value = value.trim();
                    let n = decimal_usize(value).ok_or_else(|| {
                        head_error(
                            Status::BadRequest,
                            format!("invalid Content-Length '{value}': must be digits only"),
                        )
                    })?;
                    if self.content_length.is_some_and(|c| c != n) {
                        return Err(head_error(
                            Status::BadRequest,
                            "conflicting Content-Length values",
                        ));
                    }
                    self.content_length = Some(n);
                }
            }
            HeaderName::TransferEncoding => {
                self.transfer_encoding = true;
            }
            HeaderName::Host => {
                self.hosts += 1;
            }
            HeaderName::Connection => {
                for token in value().split(',') {
                    let t = token.trim();
                    if t.eq_ignore_ascii_case("close") {
                        self.connection_close = Some(true);
                    } else if t.eq_ignore_ascii_case("keep-alive") {
                        self.connection_close = Some(false);
                    }
                }
            }
            HeaderName::Expect => {
                let value = value();
                if value.eq_ignore_ascii_case("100-continue") {
                    self.expect_continue = true;
                } else {
                    return Err(head_error(
                        Status::ExpectationFailed,
                        format!("unsupported Expect: {value}"),
                    ));
                }
            }
            HeaderName::XPriority => {
                self.priority = Some(value().to_string());
            }
            HeaderName::Authorization => {
                self.authorization = Some(value().to_string());
            }
            HeaderName::XSessionId => {
                self.session_id = Some(value().to_string());
            }
            HeaderName::XRequestId => {
                self.request_id = Some(value().to_string());
            }
            HeaderName::Other => {}
        }
        Ok(())
    }
}

/// A complete head longer than `max_header_bytes` is a 431.
fn check_head_len(head_len: usize, max_header_bytes: usize) -> Result<(), HeadError> {
    if head_len > max_header_bytes {
        return Err(head_error(
            Status::HeaderTooLarge,
            format!("request head exceeds {max_header_bytes} bytes"),
        ));
    }
    Ok(())
}

/// The head from its request line and header fields: the checks that need every header.
fn finish(
    method: &str,
    target: &str,
    http10: bool,
    head_len: usize,
    fields: Fields,
    max_header_bytes: usize,
    max_body_bytes: usize,
) -> Result<Head, HeadError> {
    check_head_len(head_len, max_header_bytes)?;
    let method = match method {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "HEAD" => Method::Head,
        "DELETE" => Method::Delete,
        _ => Method::Other,
    };
    let (path, query) = match target.bytes().position(|b| b == b'?') {
        Some(q) => (&target[..q], Some(target[q + 1..].to_string())),
        None => (target, None),
    };
    let path = RequestPath::new(path);
    if fields.transfer_encoding {
        // RFC 9112 6.1: with Content-Length too, the two framings disagree (the shape of
        // request smuggling); in HTTP/1.0 Transfer-Encoding is faulty framing. Either way the
        // connection closes after the answer (every head error closes it).
        if fields.content_length.is_some() {
            return Err(head_error(
                Status::BadRequest,
                "both Content-Length and Transfer-Encoding: send only Content-Length",
            ));
        }
        if http10 {
            return Err(head_error(
                Status::BadRequest,
                "Transfer-Encoding in an HTTP/1.0 request: send Content-Length",
            ));
        }
        // We do not implement chunked request bodies; refuse clearly.
        return Err(head_error(
            Status::LengthRequired,
            "chunked request bodies are not supported: send Content-Length",
        ));
    }
    if fields.hosts > 1 {
        // RFC 9112 3.2: more than one Host is a 400.
        return Err(head_error(Status::BadRequest, "more than one Host header"));
    }
    // RFC 9112 6.3: no Content-Length and no Transfer-Encoding means an empty body.
    let content_length = fields.content_length.unwrap_or(0);
    if content_length > max_body_bytes {
        return Err(head_error(
            Status::PayloadTooLarge,
            format!("request body of {content_length} bytes exceeds the limit of {max_body_bytes} bytes"),
        ));
    }
    let head = Head {
        method,
        path,
        head_len,
        content_length,
        close: fields.connection_close.unwrap_or(http10),
        http10,
        expect_continue: fields.expect_continue,
        priority: fields.priority,
        authorization: fields.authorization,
        session_id: fields.session_id,
        request_id: fields.request_id,
        query,
    };
    // Guarantees: the head fits its limit, the body its own, the path has no query.
    debug_assert!(head.head_len <= max_header_bytes && head.content_length <= max_body_bytes);
    debug_assert!(!head.path.contains('?'), "the query is split off the path");
    Ok(head)
}

/// The unparseable head in `buf` folds a header line: a line inside it starts with a space
/// or tab (obs-fold, RFC 9112 5.2). Only asked on the error path.
fn obs_fold(buf: &[u8]) -> bool {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(buf.len());
    let head = &buf[..end];
    // The request line cannot be folded; a fold follows the end of some header line.
    head.windows(2)
        .skip(1)
        .any(|w| w[0] == b'\n' && (w[1] == b' ' || w[1] == b'\t'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_fixed_path_abe_serves_is_kept_without_a_copy() {
        // The paths `api::route` and `dashboard::asset` answer; a new endpoint belongs here
        // and in KNOWN_PATHS, or each of its requests allocates a copy of its path.
        for path in [
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/embeddings",
            "/v1/models",
            "/health",
            "/ready",
            "/metrics",
            "/metrics/json",
            "/metrics/history",
            "/tokenize",
            "/detokenize",
            "/events",
            "/admin/strategy",
            "/admin/faults",
            "/",
            "/dashboard",
            "/dashboard/",
            "/dashboard/dashboard.js",
            "/dashboard/dashboard.css",
        ] {
            let p = RequestPath::new(path);
            assert!(
                matches!(p.0, std::borrow::Cow::Borrowed(_)),
                "{path} is copied per request"
            );
            assert_eq!(p, path);
        }
        let other = RequestPath::new("/v1/unknown");
        assert!(matches!(other.0, std::borrow::Cow::Owned(_)));
        assert_eq!(other, "/v1/unknown");
    }

    use super::*;

    fn parse(s: &str) -> Result<Option<Head>, HeadError> {
        parse_head(s.as_bytes(), 1024, 100)
    }

    #[test]
    fn a_partial_head_is_not_an_error() {
        assert_eq!(
            parse("POST /v1/completions HTTP/1.1\r\nContent-Len"),
            Ok(None)
        );
    }

    #[test]
    fn a_complete_head_yields_framing_and_the_headers_we_use() {
        let h = parse(
            "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Priority: high\r\nX-Session-Id:  s-7 \r\nExpect: 100-continue\r\n\r\n{\"prompt\":1}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.method, Method::Post);
        assert_eq!(h.path, "/v1/completions");
        let odd = parse("GET /v1/other?q=1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(odd.path, "/v1/other");
        let bad = parse_head(b"GET / HTTP/1.1\r\nX-A: \xff\r\n\r\n", 1024, 100);
        assert_eq!(bad.unwrap_err().status, Status::BadRequest);
        assert_eq!(h.content_length, 12);
        assert_eq!(h.priority.as_deref(), Some("high"));
        assert_eq!(h.session_id.as_deref(), Some("s-7"));
        assert!(h.expect_continue && !h.close);
    }

    #[test]
    fn limits_and_unsupported_framing_are_refused_with_the_right_status() {
        let big = format!("GET / HTTP/1.1\r\nX-A: {}\r\n\r\n", "a".repeat(2000));
        assert_eq!(parse(&big).unwrap_err().status, Status::HeaderTooLarge);
        let partial_big = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(2000));
        assert_eq!(
            parse(&partial_big).unwrap_err().status,
            Status::HeaderTooLarge
        );
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse(chunked).unwrap_err().status, Status::LengthRequired);
        let no_len = parse("POST / HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(no_len.content_length, 0, "no Content-Length: empty body");
        let too_long = "POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n";
        assert_eq!(parse(too_long).unwrap_err().status, Status::PayloadTooLarge);
        let garbage = "\x01\x02 nonsense\r\n\r\n";
        assert_eq!(parse(garbage).unwrap_err().status, Status::BadRequest);
        let conflicting = "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse(conflicting).unwrap_err().status, Status::BadRequest);
    }

    #[test]
    fn content_length_is_digits_only_and_never_overflows() {
        for s in [
            "0",
            "30",
            "",
            "-1",
            "1a",
            " 1",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(decimal_usize(s), s.parse::<usize>().ok(), "{s:?}");
        }
        // A sign is not `1*DIGIT` (std accepts it; a proxy may not: one reading only).
        assert_eq!(decimal_usize("+7"), None);
        assert_eq!(decimal_usize("+"), None);
    }

    /// The status of parsing `s`, or 0 when it parses.
    fn status(s: &str) -> u16 {
        match parse(s) {
            Ok(Some(_)) => 0,
            Ok(None) => panic!("incomplete: {s:?}"),
            Err(e) => e.status.code(),
        }
    }

    #[test]
    fn rfc9112_6_1_content_length_with_transfer_encoding_is_refused_either_order() {
        let te_cl = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n";
        let cl_te = "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        for s in [te_cl, cl_te] {
            let e = parse(s).unwrap_err();
            assert_eq!(e.status, Status::BadRequest, "{s:?}");
            assert!(e
                .message
                .contains("both Content-Length and Transfer-Encoding"));
        }
        let te10 = "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(status(te10), 400);
        let te_only = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(status(te_only), 411);
    }

    #[test]
    fn rfc9112_6_3_duplicate_lengths_must_agree_and_be_digits() {
        let same_list = "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n";
        assert_eq!(parse(same_list).unwrap().unwrap().content_length, 5);
        let same_twice = "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(parse(same_twice).unwrap().unwrap().content_length, 5);
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5,\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        ] {
            assert_eq!(status(bad), 400, "{bad:?}");
        }
    }

    #[test]
    fn rfc9112_5_2_obsolete_line_folding_is_refused_with_a_reason() {
        for folded in [
            "GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
            "GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n",
        ] {
            let e = parse(folded).unwrap_err();
            assert_eq!(e.status, Status::BadRequest);
            assert!(e.message.contains("obsolete line folding"), "{}", e.message);
        }
        // RFC 9112 5.1: no whitespace between a field name and its colon.
        assert_eq!(status("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
    }

    #[test]
    fn rfc9112_2_2_a_bare_lf_ends_a_line_like_crlf_and_a_bare_cr_is_refused() {
        // A recipient MAY take a bare LF as a line end; httparse does, and the head it reads
        // is the same as with CRLF (only its length differs).
        let lf = parse("POST /v1/completions HTTP/1.1\nContent-Length: 2\nConnection: close\n\n{}")
            .unwrap()
            .unwrap();
        let crlf = parse(
            "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(lf.head_len + 4, crlf.head_len);
        assert_eq!(
            Head { head_len: 0, ..lf },
            Head {
                head_len: 0,
                ..crlf
            }
        );
        // A bare CR is never a line end (RFC 9112 2.2: MUST reject or replace with SP).
        assert_eq!(status("GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n"), 400);
    }

    #[test]
    fn rfc9112_3_2_more_than_one_host_is_refused() {
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    }

    #[test]
    fn http10_closes_unless_keep_alive() {
        let h = parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.close);
        let h = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.close);
        let h = parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.close);
    }
}
