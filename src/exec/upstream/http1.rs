//! HTTP/1.1 for the event loop's connections to a backend (`mux`): a request's bytes, and
//! an incremental reader of a response fed whatever bytes a non-blocking read returned
//! (the head through `httparse`, then a body by `Content-Length`, chunked, or to the close).
//!
//! What must never happen here: a body or a head read past its limit, a byte after a
//! response taken as this response's, or any I/O (the caller reads and writes).

use crate::http::number;

/// Longest response head (status line and headers).
const HEAD_BYTES_MAX: usize = 64 << 10;
/// Most headers a response may have.
const HEADERS_MAX: usize = 64;
/// Longest chunk-size line (hex digits and extensions).
const CHUNK_LINE_MAX: usize = 1024;

/// Appends a POST of `body` (JSON) to `path` on `host` to `out`.
pub(super) fn post(out: &mut Vec<u8>, host: &str, path: &str, auth: Option<&str>, body: &str) {
    // Pieces appended as bytes: this runs once a forwarded request (`format!` cost ~600
    // instructions of a request's ~20,000 on the event loop).
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(
        concat!(
            "\r\nUser-Agent: abe/",
            env!("CARGO_PKG_VERSION"),
            "\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: "
        )
        .as_bytes(),
    );
    number::uint(out, body.len() as u64);
    out.extend_from_slice(b"\r\n");
    if let Some(auth) = auth {
        out.extend_from_slice(b"Authorization: ");
        out.extend_from_slice(auth.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
}

/// Where a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// The head is not complete yet.
    Head,
    /// This many bytes remain.
    Length(u64),
    /// Chunked: the state of the chunk being read.
    Chunked(Chunk),
    /// Until the backend closes the connection.
    ToClose,
    /// The whole response is in.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    /// This many data bytes of the chunk remain.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, until an empty one.
    Trailers,
}

/// One response, read incrementally.
#[derive(Debug)]
pub(super) struct ResponseReader {
    body_state: Body,
    /// Bytes received and not yet consumed (part of a head, a chunk-size line).
    raw: Vec<u8>,
    /// The body as decoded so far (the caller may take it piecewise, see `take_body`).
    body: Vec<u8>,
    /// Body bytes decoded over the whole response (the limit counts these).
    body_total: u64,
    limit: u64,
    status: u16,
    /// The backend keeps the connection open after this response.
    keep_alive: bool,
}

impl ResponseReader {
    /// A reader for a body of at most `limit` bytes.
    pub(super) fn new(limit: u64) -> ResponseReader {
        ResponseReader {
            body_state: Body::Head,
            raw: Vec::new(),
            body: Vec::new(),
            body_total: 0,
            limit,
            status: 0,
            keep_alive: false,
        }
    }

    /// Status code, once the head is in (0 before).
    pub(super) fn status(&self) -> u16 {
        self.status
    }

    /// Whether the head is complete.
    pub(super) fn has_head(&self) -> bool {
        self.body_state != Body::Head
    }

    /// Whether the whole response is in.
    pub(super) fn is_done(&self) -> bool {
        self.body_state == Body::Done
    }

    /// Whether the connection may carry another request (the response is whole and the
    /// backend did not ask to close it).
    pub(super) fn reusable(&self) -> bool {
        self.is_done() && self.keep_alive
    }

    /// The body decoded so far, taken out.
    pub(super) fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }

    /// The body decoded so far.
    pub(super) fn body(&self) -> &[u8] {
        &self.body
    }

    /// Feeds bytes read from the connection. Bytes beyond the end of the response are an
    /// error (a backend does not send before it is asked).
    pub(super) fn feed(&mut self, mut input: &[u8]) -> Result<(), String> {
        while !input.is_empty() {
            match self.body_state {
                Body::Head if self.raw.is_empty() => {
                    // The usual case, a whole head in one read: parsed where it lies.
                    match self.parse_head(input)? {
                        // The rest goes through the body states (or the next head, after a
                        // 1xx).
                        Some(used) => input = &input[used..],
                        None => {
                            self.raw.extend_from_slice(input);
                            return self.head_fits();
                        }
                    }
                }
                Body::Head => {
                    let mut raw = std::mem::take(&mut self.raw);
                    raw.extend_from_slice(input);
                    return match self.parse_head(&raw)? {
                        Some(used) => self.feed(&raw[used..]),
                        None => {
                            self.raw = raw;
                            self.head_fits()
                        }
                    };
                }
                Body::Length(remaining) => {
                    let n = (remaining.min(input.len() as u64)) as usize;
                    self.push_body(&input[..n])?;
                    input = &input[n..];
                    self.body_state = if remaining == n as u64 {
                        Body::Done
                    } else {
                        Body::Length(remaining - n as u64)
                    };
                }
                Body::ToClose => {
                    self.push_body(input)?;
                    input = &[];
                }
                Body::Chunked(chunk) => input = self.chunked(chunk, input)?,
                Body::Done => {
                    return Err(format!(
                        "{} bytes after the end of the response",
                        input.len()
                    ))
                }
            }
        }
        Ok(())
    }

    /// The backend closed the connection: the end of a body read to the close, an error
    /// anywhere else.
    pub(super) fn closed(&mut self) -> Result<(), String> {
        match self.body_state {
            Body::ToClose => {
                self.body_state = Body::Done;
                Ok(())
            }
            Body::Done => Ok(()),
            Body::Head if self.raw.is_empty() => Err("closed before any answer".into()),
            Body::Head => Err("closed in the middle of the response head".into()),
            _ => Err(format!(
                "closed after {} bytes of the response body",
                self.body_total
            )),
        }
    }

    /// An incomplete head within its limit.
    fn head_fits(&self) -> Result<(), String> {
        if self.raw.len() > HEAD_BYTES_MAX {
            return Err(format!(
                "a response head longer than {HEAD_BYTES_MAX} bytes"
            ));
        }
        Ok(())
    }

    /// Parses the head at the start of `bytes`: the bytes it took, or `None` if incomplete.
    /// An interim answer (1xx) is taken and skipped: the state stays `Head`.
    fn parse_head(&mut self, bytes: &[u8]) -> Result<Option<usize>, String> {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut response = httparse::Response::new(&mut headers);
        let used = match response.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("an invalid response head: {e}")),
        };
        let status = response.code.unwrap_or(0);
        if (100..200).contains(&status) {
            // An interim answer (100 Continue): the real one follows.
            return Ok(Some(used));
        }
        let http11 = response.version == Some(1);
        let mut keep_alive = http11;
        let mut length: Option<u64> = None;
        let mut chunked = false;
        for h in response.headers.iter() {
            // Decoded only for the three names read here (a backend sends others too).
            let value = || std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                let value = value();
                let n: u64 = value
                    .parse()
                    .map_err(|_| format!("an invalid Content-Length '{value}'"))?;
                if length.is_some_and(|l| l != n) {
                    return Err("two different Content-Length headers".into());
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value()
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in value().split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case("keep-alive") {
                        keep_alive = true;
                    }
                }
            }
        }
        self.status = status;
        self.keep_alive = keep_alive;
        self.body_state = if status == 204 || status == 304 {
            Body::Done
        } else if chunked {
            Body::Chunked(Chunk::Size)
        } else if let Some(n) = length {
            if n > self.limit {
                return Err(format!(
                    "a response body of {n} bytes, over the limit of {}",
                    self.limit
                ));
            }
            if n == 0 {
                Body::Done
            } else {
                // Room for the body at once (up to a MiB: the length is the backend's word).
                self.body.reserve(n.min(1 << 20) as usize);
                Body::Length(n)
            }
        } else {
            self.keep_alive = false;
            Body::ToClose
        };
        Ok(Some(used))
    }

    /// Advances the chunked decoder over `input`; what is left of it.
    fn chunked<'a>(&mut self, chunk: Chunk, input: &'a [u8]) -> Result<&'a [u8], String> {
        match chunk {
            Chunk::Data(remaining) => {
                let n = (remaining.min(input.len() as u64)) as usize;
                self.push_body(&input[..n])?;
                self.body_state = Body::Chunked(if remaining == n as u64 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(remaining - n as u64)
                });
                Ok(&input[n..])
            }
            Chunk::Size | Chunk::DataEnd | Chunk::Trailers => {
                let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                    self.raw.extend_from_slice(input);
                    if self.raw.len() > CHUNK_LINE_MAX {
                        return Err("a chunk line without an end".into());
                    }
                    return Ok(&[]);
                };
                self.raw.extend_from_slice(&input[..nl]);
                let line = std::mem::take(&mut self.raw);
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                self.body_state = match chunk {
                    Chunk::DataEnd if line.is_empty() => Body::Chunked(Chunk::Size),
                    Chunk::DataEnd => return Err("no line end after a chunk".into()),
                    Chunk::Trailers if line.is_empty() => Body::Done,
                    Chunk::Trailers => Body::Chunked(Chunk::Trailers),
                    _ => {
                        let text = std::str::from_utf8(line).unwrap_or("");
                        let hex = text.split(';').next().unwrap_or("").trim();
                        let size = u64::from_str_radix(hex, 16)
                            .map_err(|_| format!("an invalid chunk size '{hex}'"))?;
                        if size == 0 {
                            Body::Chunked(Chunk::Trailers)
                        } else {
                            Body::Chunked(Chunk::Data(size))
                        }
                    }
                };
                Ok(&input[nl + 1..])
            }
        }
    }

    /// Keeps `bytes` of the body. The limit holds what is kept: a stream whose body the
    /// caller takes as it comes (`take_body`) may run longer.
    fn push_body(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.body_total += bytes.len() as u64;
        if (self.body.len() + bytes.len()) as u64 > self.limit {
            return Err(format!(
                "a response body over the limit of {} bytes",
                self.limit
            ));
        }
        self.body.extend_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes.
    fn read(input: &[u8], step: usize) -> Result<ResponseReader, String> {
        let mut r = ResponseReader::new(1 << 20);
        for piece in input.chunks(step) {
            r.feed(piece)?;
        }
        Ok(r)
    }

    #[test]
    fn length_and_chunked_bodies_in_any_pieces() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nTrailer: t\r\n\r\n";
        for step in [1, 2, 7, 1000] {
            for input in [&plain[..], &chunked[..]] {
                let r = read(input, step).unwrap();
                assert!(r.is_done() && r.reusable(), "step {step}");
                assert_eq!(r.status(), 200);
                assert_eq!(r.body(), b"hello");
            }
        }
    }

    #[test]
    fn close_interim_and_limits() {
        let r = read(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            3,
        )
        .unwrap();
        assert!(r.is_done() && !r.reusable());
        for step in [4, 1000] {
            let r = read(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 1\r\n\r\nx",
                step,
            )
            .unwrap();
            assert_eq!((r.status(), r.body()), (404, &b"x"[..]), "step {step}");
        }
        let mut r = read(b"HTTP/1.0 200 OK\r\n\r\npartial", 5).unwrap();
        assert!(!r.is_done());
        r.closed().unwrap();
        assert!(r.is_done() && !r.reusable());
        assert_eq!(r.body(), b"partial");
        let mut r = read(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", 100).unwrap();
        assert!(r.closed().unwrap_err().contains("3 bytes"));
        let mut small = ResponseReader::new(4);
        assert!(small
            .feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            .is_err());
        let mut small = ResponseReader::new(4);
        assert!(small
            .feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", 100).is_err());
        assert!(read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            100
        )
        .is_err());
    }

    #[test]
    fn a_request_carries_length_and_key() {
        let mut out = Vec::new();
        post(
            &mut out,
            "127.0.0.1:8000",
            "/v1/completions",
            Some("Bearer k"),
            "{}",
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.contains("Authorization: Bearer k\r\n"));
        assert!(text.ends_with("\r\n\r\n{}"));
    }
}
