//! HTTP responses: status codes, the head we write, and OpenAI-shaped JSON errors.
//!
//! Responses are rendered straight into a connection's write buffer. Every error body is
//! `{"error":{"message","type","code"}}` with a message a person can act on.

use std::io::Write;

/// The statuses abe sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok,
    BadRequest,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
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

    /// Writes head and body to `out`. `head_only` omits the body (HEAD requests).
    pub fn write_to(&self, out: &mut Vec<u8>, close: bool, head_only: bool) {
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\nServer: abe\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status.code(),
            self.status.reason(),
            self.content_type,
            self.body.len()
        );
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
}
