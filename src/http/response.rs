//! HTTP responses: status codes, the head we write, OpenAI-shaped JSON errors, and the one
//! spelling of the `X-Request-Id` echo.
//!
//! Responses are rendered straight into a connection's write buffer. Every error body is
//! `{"error":{"message","type","code"}}` with a message a person can act on.

use super::number;

/// The statuses abe sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok,
    BadRequest,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    Conflict,
    LengthRequired,
    PayloadTooLarge,
    UnsupportedMediaType,
    ExpectationFailed,
    TooManyRequests,
    HeaderTooLarge,
    InternalError,
    BadGateway,
    ServiceUnavailable,
    GatewayTimeout,
}

impl Status {
    /// Numeric code.
    pub const fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::BadRequest => 400,
            Status::Unauthorized => 401,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::Conflict => 409,
            Status::LengthRequired => 411,
            Status::PayloadTooLarge => 413,
            Status::UnsupportedMediaType => 415,
            Status::ExpectationFailed => 417,
            Status::TooManyRequests => 429,
            Status::HeaderTooLarge => 431,
            Status::InternalError => 500,
            Status::BadGateway => 502,
            Status::ServiceUnavailable => 503,
            Status::GatewayTimeout => 504,
        }
    }

    /// Reason phrase.
    pub const fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadRequest => "Bad Request",
            Status::Unauthorized => "Unauthorized",
            Status::NotFound => "Not Found",
            Status::MethodNotAllowed => "Method Not Allowed",
            Status::RequestTimeout => "Request Timeout",
            Status::Conflict => "Conflict",
            Status::LengthRequired => "Length Required",
            Status::PayloadTooLarge => "Payload Too Large",
            Status::UnsupportedMediaType => "Unsupported Media Type",
            Status::ExpectationFailed => "Expectation Failed",
            Status::TooManyRequests => "Too Many Requests",
            Status::HeaderTooLarge => "Request Header Fields Too Large",
            Status::InternalError => "Internal Server Error",
            Status::BadGateway => "Bad Gateway",
            Status::ServiceUnavailable => "Service Unavailable",
            Status::GatewayTimeout => "Gateway Timeout",
        }
    }

    /// OpenAI's error `type` for this status.
    pub const fn error_type(self) -> &'static str {
        match self {
            Status::TooManyRequests => "rate_limit_error",
            Status::Unauthorized => "authentication_error",
            Status::InternalError
            | Status::BadGateway
            | Status::ServiceUnavailable
            | Status::GatewayTimeout => "server_error",
            _ => "invalid_request_error",
        }
    }
}

/// A response ready to be written: status, content type, extra headers, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub content_type: &'static str,
    /// Extra header lines, each without CRLF (e.g. "Retry-After: 1").
    pub headers: Vec<String>,
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON response.
    pub fn json(status: Status, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body,
        }
    }

    /// A plain-text response.
    pub fn text(status: Status, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// An OpenAI-shaped error: `{"error":{"message","type","code"}}`.
    pub fn error(status: Status, code: &str, message: impl Into<String>) -> Response {
        let body = serde_json::json!({
            "error": {
                "message": message.into(),
                "type": status.error_type(),
                "code": code,
            }
        });
        let mut r = Response::json(status, serde_json::to_vec(&body).unwrap_or_default());
        if status == Status::TooManyRequests || status == Status::ServiceUnavailable {
            r.headers.push("Retry-After: 1".into());
        }
        r
    }

    /// Adds a header line.
    pub fn with_header(mut self, line: impl Into<String>) -> Response {
        self.headers.push(line.into());
        self
    }

    /// Echoes the client's request id `id` in an `X-Request-Id` header line: the line
    /// [`write_request_id`] writes in place.
    pub fn echo_request_id(&mut self, id: &str) {
        let mut line = String::with_capacity(REQUEST_ID_HEADER.len() + id.len());
        line.push_str(REQUEST_ID_HEADER);
        line.push_str(id);
        self.headers.push(line);
    }

    /// Writes head and body to `out`. `head_only` omits the body (HEAD requests).
    pub fn write_to(&self, out: &mut Vec<u8>, close: bool, head_only: bool) {
        out.extend_from_slice(b"HTTP/1.1 ");
        number::uint(out, u64::from(self.status.code()));
        out.push(b' ');
        out.extend_from_slice(self.status.reason().as_bytes());
        out.extend_from_slice(b"\r\nServer: abe\r\nContent-Type: ");
        out.extend_from_slice(self.content_type.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: ");
        number::uint(out, self.body.len() as u64);
        out.extend_from_slice(b"\r\n");
        for h in &self.headers {
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
    }
}

/// The header echoing a client's `X-Request-Id` (as vLLM does), up to its value: the one
/// spelling of the echo, in a [`Response`] ([`Response::echo_request_id`]) and in a head
/// written in place ([`write_request_id`]).
const REQUEST_ID_HEADER: &str = "X-Request-Id: ";

/// Appends the header line echoing the client's request id `id`, CRLF included, to a head
/// being written in place (no allocation): the line [`Response::echo_request_id`] adds.
pub fn write_request_id(out: &mut Vec<u8>, id: &str) {
    out.extend_from_slice(REQUEST_ID_HEADER.as_bytes());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Start of every `200 OK` JSON head, up to the Content-Length value.
const JSON_OK_PREFIX: &[u8] =
    b"HTTP/1.1 200 OK\r\nServer: abe\r\nContent-Type: application/json\r\nContent-Length: ";

/// Where extra header lines go in [`JSON_OK_PREFIX`]: after the status line.
const JSON_OK_STATUS_LINE_BYTES: usize = "HTTP/1.1 200 OK\r\n".len();

/// The longest head tail after the Content-Length value: 20 digits, then the longest
/// `Connection` lines and the blank line.
const JSON_OK_TAIL_BYTES_MAX: usize =
    20 + "\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n".len();

/// Appends a `200 OK` `application/json` response to `out` whose body `body` writes straight
/// into `out` (no body buffer of its own): the same bytes [`Response::write_to`] writes for
/// `Response::json(Status::Ok, body)`, plus `Connection: keep-alive` when `keep_alive_header`
/// and `Connection: close` when `close`, and whatever header lines (each ending in CRLF)
/// `extra_head` writes. `head_only` leaves the body out (HEAD).
///
/// The body is written after a gap wide enough for the longest head tail; once its length
/// is known the tail is written and the body moved down over the rest of the gap (one
/// short `memmove`). If `body` fails, `out` is left as it was and the error is returned.
pub fn write_json_ok<E>(
    out: &mut Vec<u8>,
    close: bool,
    keep_alive_header: bool,
    head_only: bool,
    extra_head: impl FnOnce(&mut Vec<u8>),
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    out.extend_from_slice(&JSON_OK_PREFIX[..JSON_OK_STATUS_LINE_BYTES]);
    extra_head(out);
    out.extend_from_slice(&JSON_OK_PREFIX[JSON_OK_STATUS_LINE_BYTES..]);
    let tail_at = out.len();
    let body_at = tail_at + JSON_OK_TAIL_BYTES_MAX;
    out.resize(body_at, 0);
    if let Err(e) = body(out) {
        out.truncate(start);
        return Err(e);
    }
    let body_len = out.len() - body_at;
    let mut tail = [0u8; JSON_OK_TAIL_BYTES_MAX];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        tail[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    let mut digits = [0u8; 20];
    put(number::decimal(&mut digits, body_len as u64));
    put(b"\r\n");
    if keep_alive_header {
        put(b"Connection: keep-alive\r\n");
    }
    if close {
        put(b"Connection: close\r\n");
    }
    put(b"\r\n");
    out[tail_at..tail_at + n].copy_from_slice(&tail[..n]);
    if head_only {
        out.truncate(tail_at + n);
    } else {
        out.copy_within(body_at.., tail_at + n);
        out.truncate(tail_at + n + body_len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_openai_shape_and_overload_says_when_to_retry() {
        let r = Response::error(Status::TooManyRequests, "queue_full", "queue is full");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["message"], "queue is full");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "queue_full");
        let mut out = Vec::new();
        r.write_to(&mut out, true, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(text.contains("Retry-After: 1\r\n"));
        assert!(text.contains("Connection: close\r\n"));
        assert!(text.ends_with(&String::from_utf8(r.body.clone()).unwrap()));
    }

    #[test]
    fn a_request_id_is_echoed_alike_in_a_response_and_in_a_head_written_in_place() {
        let mut r = Response::error(Status::BadRequest, "invalid_json", "bad");
        r.echo_request_id("gw-7f3a");
        let mut rendered = Vec::new();
        r.write_to(&mut rendered, false, false);
        let mut in_place = Vec::new();
        write_json_ok::<()>(
            &mut in_place,
            false,
            false,
            false,
            |o| write_request_id(o, "gw-7f3a"),
            |o| {
                o.extend_from_slice(b"{}");
                Ok(())
            },
        )
        .unwrap();
        for head in [rendered, in_place] {
            let head = String::from_utf8(head).unwrap();
            assert_eq!(
                head.matches("\r\nX-Request-Id: gw-7f3a\r\n").count(),
                1,
                "{head}"
            );
        }
    }

    #[test]
    fn json_ok_written_in_place_matches_a_rendered_response() {
        let body = br#"{"a":"b \" c","n":[1,2,3]}"#;
        for (close, keep_alive, head_only) in [
            (false, false, false),
            (true, false, false),
            (false, true, false),
            (true, true, true),
        ] {
            let mut expected = b"earlier bytes".to_vec();
            let mut r = Response::json(Status::Ok, body.to_vec());
            if keep_alive {
                r = r.with_header("Connection: keep-alive");
            }
            r.write_to(&mut expected, close, head_only);
            let mut out = b"earlier bytes".to_vec();
            write_json_ok::<()>(
                &mut out,
                close,
                keep_alive,
                head_only,
                |_| {},
                |o| {
                    o.extend_from_slice(body);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(expected).unwrap()
            );
        }
        let mut out = b"kept".to_vec();
        let failed = write_json_ok(
            &mut out,
            false,
            false,
            false,
            |_| {},
            |o| {
                o.extend_from_slice(b"partial");
                Err("no")
            },
        );
        assert_eq!(failed, Err("no"));
        assert_eq!(out, b"kept");
    }
}
