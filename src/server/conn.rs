//! One HTTP/1.1 connection: its buffers, the requests it has in flight (pipelining), and
//! the deadlines that bound it.
//!
//! Responses leave in request order: each parsed request gets a [`Slot`] at the back of the
//! queue; only finished slots at the front are written. Buffers never grow past the limits
//! (a head larger than `max_header_bytes` is 431, a body larger than `max_body_bytes` is
//! 413), so a connection's memory is bounded.
//!
//! Its invariants (`written` within the write buffer; slots in request order, each
//! numbered below `next_seq`) are asserted in debug builds at every method that changes
//! them ([`Conn::check`]); release builds check nothing more.

use crate::api::Job;
use crate::http::parse::Head;
use crate::http::response::Response;
use crate::metrics::http_stats::Endpoint;
use crate::runtime::Outcome;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

/// A streaming response in progress (Server-Sent Events over chunked encoding).
pub struct StreamSlot {
    pub writer: crate::api::stream::StreamWriter,
    /// Framed chunks not yet moved to the write buffer.
    pub pending: Vec<u8>,
    pub head_written: bool,
    /// The last chunk is in `pending` (or written): the stream is complete.
    pub done: bool,
    /// The first error among the parts, reported when all parts are in.
    pub error: Option<crate::runtime::RequestError>,
}

/// The outcomes of a job's parts, by part. Inline for the usual single part (one prompt),
/// so a request allocates nothing for it.
pub type Outcomes = smallvec::SmallVec<[Option<Outcome>; 1]>;

/// One request's place in the response order.
pub struct Slot {
    pub seq: u64,
    pub endpoint: Endpoint,
    /// Close the connection after writing this response.
    pub close: bool,
    /// HEAD request: write the head only.
    pub head_only: bool,
    /// HTTP/1.0 request that asked for keep-alive: say `Connection: keep-alive`.
    pub keep_alive_header: bool,
    /// Set for `stream: true` requests until the stream is complete. Boxed: a stream's state
    /// is over a third of a slot's size, and slots are moved per request (queued, taken off
    /// the front) where most requests are not streams (560 -> 344 bytes a move).
    pub stream: Option<Box<StreamSlot>>,
    /// Set once the response is known.
    pub response: Option<Response>,
    /// For engine jobs: how to render, and the outcomes gathered so far. Once `remaining`
    /// is 0 the job is rendered straight into the write buffer when it reaches the front.
    pub job: Option<Job>,
    pub outcomes: Outcomes,
    pub remaining: usize,
    /// Where the engine routed the job (the first of its parts to be answered): the
    /// `x-abe-route` header.
    pub route: Option<crate::router::Decision>,
    /// The response id of a finished job (`cmpl-<id>`), set when its last part arrives.
    pub response_id: u64,
    /// `GET /events`: a telemetry stream that never ends (the connection closes with it).
    pub events: Option<crate::metrics::events::EventsSlot>,
    /// An answer another thread fills (`POST /admin/reload`); taken into `response`.
    pub deferred: Option<Arc<crate::api::deferred::Deferred>>,
}

/// Unwritten bytes below which an `/events` connection takes more from its subscriber.
const EVENTS_UNWRITTEN_MAX: usize = 64 * 1024;

/// A request head parsed, waiting for its body.
pub struct Partial {
    pub head: Head,
    pub continue_sent: bool,
}

/// Connection state.
pub struct Conn {
    pub stream: TcpStream,
    /// Distinguishes this connection from an earlier one in the same slab slot.
    pub generation: u32,
    /// Bytes read and not yet consumed by the parser.
    pub read_buf: Vec<u8>,
    /// Bytes to write; `written` of them are already on the wire.
    pub write_buf: Vec<u8>,
    pub written: usize,
    pub slots: VecDeque<Slot>,
    pub next_seq: u64,
    /// The head of the request being read, once parsed.
    pub partial: Option<Partial>,
    /// When the first byte of the request being read arrived (for the read deadline).
    pub request_started: Option<Instant>,
    /// Last time anything was read or written.
    pub last_activity: Instant,
    /// When the write buffer last became non-empty (for the write deadline).
    pub write_started: Option<Instant>,
    /// No more requests are read (an error, `Connection: close`, or peer EOF).
    pub read_done: bool,
    /// The socket may hold unread bytes: set by a readable event, cleared when a read
    /// would block or comes back short. mio is edge-triggered, so reading is retried only
    /// while this is set (saves a failing `recv` per pass of the service loop).
    pub readable: bool,
    /// A readable event said the peer closed (or the socket has an error): keep reading
    /// until the read that reports it, even after a short read.
    pub read_closed_hint: bool,
    /// Close once every slot is written.
    pub close_when_flushed: bool,
    /// An injected stream reset struck: reset the connection once the write buffer is out
    /// and the client had a tick to read it (`reset_at`, set then).
    pub reset_when_flushed: bool,
    pub reset_at: Option<Instant>,
}

/// What a read found.
pub enum ReadResult {
    /// Read some bytes (maybe zero); the socket would block now.
    Open,
    /// The peer closed its side.
    Eof,
}

impl Conn {
    /// A connection for an accepted stream.
    pub fn new(stream: TcpStream, generation: u32, now: Instant) -> Conn {
        Conn {
            stream,
            generation,
            read_buf: Vec::with_capacity(4096),
            write_buf: Vec::with_capacity(4096),
            written: 0,
            slots: VecDeque::new(),
            next_seq: 0,
            partial: None,
            request_started: None,
            last_activity: now,
            write_started: None,
            read_done: false,
            readable: true,
            read_closed_hint: false,
            close_when_flushed: false,
            reset_when_flushed: false,
            reset_at: None,
        }
    }

    /// The connection's invariants, in debug builds: `written` within the write buffer,
    /// slots in request order and numbered below `next_seq`, and a connection that closes
    /// once flushed reads nothing more.
    fn check(&self) {
        debug_assert!(
            self.written <= self.write_buf.len(),
            "written past the buffer"
        );
        debug_assert!(
            self.written < self.write_buf.len() || self.written == 0,
            "a fully written buffer is cleared"
        );
        debug_assert!(
            self.slots
                .iter()
                .zip(self.slots.iter().skip(1))
                .all(|(a, b)| a.seq < b.seq),
            "slots out of request order"
        );
        debug_assert!(self.slots.back().is_none_or(|s| s.seq < self.next_seq));
        debug_assert!(!self.close_when_flushed || self.read_done);
    }

    /// Reads until the socket would block or `limit` bytes are buffered, through `chunk`
    /// (the io thread's scratch buffer, reused so nothing is zeroed per read).
    pub fn read_available(
        &mut self,
        chunk: &mut [u8],
        limit: usize,
        now: Instant,
    ) -> io::Result<(ReadResult, usize)> {
        debug_assert!(!chunk.is_empty(), "a read needs room");
        let buffered = self.read_buf.len();
        let mut total = 0;
        while self.read_buf.len() < limit && self.readable {
            let want = chunk.len().min(limit - self.read_buf.len());
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => return Ok((ReadResult::Eof, total)),
                Ok(n) => {
                    if self.read_buf.is_empty() && self.partial.is_none() {
                        self.request_started = Some(now);
                    }
                    self.read_buf.extend_from_slice(&chunk[..n]);
                    self.last_activity = now;
                    total += n;
                    if n < want && !self.read_closed_hint {
                        // A short read on a stream socket means its receive buffer is
                        // empty (epoll(7), Q9): bytes arriving later raise a new edge, so
                        // the `recv` that would only say WouldBlock is skipped. Not when
                        // the peer closed: that is seen only by reading on to EOF.
                        self.readable = false;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // Guarantees: nothing read past `limit` (the buffer never grows past the limits),
        // and `total` is what was appended.
        debug_assert!(self.read_buf.len() <= limit.max(buffered));
        debug_assert_eq!(self.read_buf.len(), buffered + total);
        Ok((ReadResult::Open, total))
    }

    /// When the stream at the front, held back by an injected stall, may go on.
    pub fn stalled_until(&self) -> Option<Instant> {
        self.slots.front()?.stream.as_ref()?.writer.stall_until()
    }

    /// Moves finished responses from the front of the queue into the write buffer, in
    /// order, reporting (endpoint, status) of each to `on_response` for stats. Returns true
    /// if it moved any.
    /// `router` names the backend of a routed job in its `x-abe-route` header, rendered
    /// through the io thread's `routes`.
    pub fn stage_ready(
        &mut self,
        router: &crate::router::Router,
        routes: &mut crate::api::render::RouteHeaderCache,
        mut on_response: impl FnMut(Endpoint, u16),
    ) -> bool {
        self.check();
        let staged_before = self.write_buf.len();
        let mut staged = false;
        while let Some(front) = self.slots.front_mut() {
            if let Some(ev) = front.events.as_mut() {
                // The telemetry stream: its head once, then whatever its subscriber holds,
                // while the unwritten bytes stay small (a slow reader loses events in its
                // subscriber buffer, which is bounded; nothing grows here).
                if !ev.head_written {
                    ev.head_written = true;
                    self.write_buf
                        .extend_from_slice(crate::api::stream::head(true));
                    on_response(front.endpoint, 200);
                    staged = true;
                }
                if self.write_buf.len() - self.written < EVENTS_UNWRITTEN_MAX {
                    staged |= ev.subscriber.take_into(&mut self.write_buf) > 0;
                }
                break;
            }
            if let (Some(st), None) = (front.stream.as_mut(), front.response.as_ref()) {
                // A stream at the front: its head goes out with its first bytes (until then
                // a failure can still be a plain HTTP error), then whatever is ready.
                st.writer.release_due(Instant::now(), &mut st.pending);
                if !st.head_written && (st.done || !st.pending.is_empty()) {
                    st.head_written = true;
                    let route = front.route;
                    let writer = &st.writer;
                    crate::api::stream::write_head(&mut self.write_buf, front.close, |out| {
                        if let Some(d) = &route {
                            out.extend_from_slice(routes.line(router, d));
                        }
                        writer.write_headers(out);
                    });
                }
                if st.head_written && !st.pending.is_empty() {
                    self.write_buf.extend_from_slice(&st.pending);
                    st.pending.clear();
                    staged = true;
                }
                if st.head_written && st.writer.wants_reset() {
                    // An injected reset (api::faults): what went before it is written, then
                    // the io thread resets the connection.
                    self.reset_when_flushed = true;
                    break;
                }
                if !st.done || st.writer.holding() {
                    break;
                }
                let slot = self.slots.pop_front().expect("front exists");
                on_response(slot.endpoint, 200);
                staged = true;
                if slot.close {
                    self.close_after_staged();
                    break;
                }
                continue;
            }
            if front.response.is_none() {
                if let Some(d) = &front.deferred {
                    front.response = d.take();
                }
            }
            let finished_job = front.job.is_some() && front.remaining == 0;
            if front.response.is_none() && !finished_job {
                break;
            }
            // Rendered where the slot lies; only then taken off the queue (moving a slot
            // out to render it copied all of it).
            let code = match (front.response.as_mut(), &front.job) {
                (Some(response), _) => {
                    if front.keep_alive_header {
                        response.headers.push("Connection: keep-alive".into());
                    }
                    response.write_to(&mut self.write_buf, front.close, front.head_only);
                    response.status.code()
                }
                (None, Some(job)) => crate::api::render::write_job(
                    job,
                    &front.outcomes,
                    front.response_id,
                    &mut self.write_buf,
                    front.close,
                    front.keep_alive_header,
                    front.head_only,
                    front.route.as_ref().map(|d| routes.line(router, d)),
                ),
                (None, None) => unreachable!("checked above: a response or a finished job"),
            };
            let (endpoint, close) = (front.endpoint, front.close);
            self.slots.pop_front();
            on_response(endpoint, code);
            staged = true;
            if close {
                self.close_after_staged();
                break;
            }
        }
        // Guarantees: staging only appends, and the order of what stays is kept.
        debug_assert!(self.write_buf.len() >= staged_before);
        debug_assert!(staged || self.write_buf.len() == staged_before);
        self.check();
        staged
    }

    /// A response that closes the connection is staged: nothing after it is read or
    /// answered, and the connection closes once it is written.
    fn close_after_staged(&mut self) {
        self.close_when_flushed = true;
        self.read_done = true;
        self.slots.clear();
        self.read_buf.clear();
        self.partial = None;
    }

    /// Response bytes staged and not yet written.
    pub fn unwritten(&self) -> usize {
        self.write_buf.len() - self.written
    }

    /// Resets the connection (TCP RST, not FIN) when it is closed: `SO_LINGER` with a zero
    /// timeout. For injected stream resets only.
    pub fn set_reset_on_close(&self) {
        use std::os::fd::AsRawFd;
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: the descriptor is this connection's open socket, owned by `self.stream`
        // for the whole call; `linger` is a valid `struct linger` that outlives the call,
        // and its exact size is passed.
        let _ = unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }

    /// Writes as much of the write buffer as the socket takes.
    pub fn flush(&mut self, now: Instant) -> io::Result<usize> {
        self.check();
        let mut total = 0;
        while self.written < self.write_buf.len() {
            match self.stream.write(&self.write_buf[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    total += n;
                    self.last_activity = now;
                    // The write deadline bounds a stall, not a slow but steady reader.
                    self.write_started = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if self.written == self.write_buf.len() {
            self.write_buf.clear();
            self.written = 0;
            self.write_started = None;
        } else if self.write_started.is_none() {
            self.write_started = Some(now);
        }
        // Guarantees: a write deadline runs exactly while bytes wait to be written.
        debug_assert_eq!(self.write_started.is_some(), self.unwritten() > 0);
        self.check();
        Ok(total)
    }

    /// Everything answered and written.
    pub fn is_quiet(&self) -> bool {
        self.slots.is_empty() && self.write_buf.is_empty()
    }

    /// True once the connection should be closed: asked to close (or the peer finished
    /// sending), every request read is answered, and everything is written.
    pub fn should_close(&self) -> bool {
        self.close_when_flushed
            && self.slots.is_empty()
            && self.write_buf.is_empty()
            && self.read_buf.is_empty()
            && self.partial.is_none()
    }
}
