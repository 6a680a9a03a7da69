//! One io thread: a mio event loop that accepts connections, parses every pipelined request,
//! submits engine work through its own [`Submitter`], and writes responses in order.
//!
//! Events are hints: every readable connection is read until WouldBlock (or a short read,
//! which says the same on a stream socket), every response batch is written once. Nothing
//! here may block: answers arrive on this thread's completion ring (from the engine) and its
//! reply lane (from workers, `runtime::direct_reply`), and a mio `Waker` says when to look.

use super::conn::{Conn, Outcomes, Partial, ReadResult, Slot, StreamSlot};
use super::eviction::{self, DataRate, Standing};
use crate::api::{self, ApiContext, Routed};
use crate::http::parse::{self, Method};
use crate::http::response::{Response, Status};
use crate::metrics::http_stats::{Endpoint, Eviction};
use crate::runtime::doorbell::SleepFlag;
use crate::runtime::idle::Idler;
use crate::runtime::{Event, Submitter};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// How often deadlines are checked.
const TICK: Duration = Duration::from_millis(50);

/// State shared by all io threads of a server.
pub struct ServerShared {
    /// Stop accepting and exit once every admitted request is answered and written.
    pub stopping: AtomicBool,
    /// Exit now, closing what is left (after the drain deadline).
    pub hard_stop: AtomicBool,
    /// Connections open across all io threads.
    pub open_connections: AtomicUsize,
}

/// One engine request in flight for a connection slot.
#[derive(Clone, Copy)]
struct InFlight {
    conn: usize,
    generation: u32,
    seq: u64,
    part: usize,
}

/// Everything one io thread owns.
pub struct IoThread {
    pub poll: Poll,
    pub listener: Option<TcpListener>,
    pub submitter: Submitter,
    /// Set while this thread sleeps in `poll`; the engine wakes it only then.
    sleep_flag: Arc<SleepFlag>,
    /// How long to keep polling for completions before sleeping (`[engine] idle`, `spin_us`).
    idler: Idler,
    pub ctx: Arc<ApiContext>,
    /// The `x-abe-route` line of the last decision written; cleared with a new `ctx`.
    route_headers: crate::api::render::RouteHeaderCache,
    pub shared: Arc<ServerShared>,
    conns: Vec<Option<Conn>>,
    free_conns: Vec<usize>,
    generation: u32,
    /// In-flight engine requests by slab index. A request's tag is `index | generation << 32`,
    /// so a tag that was freed and reused is never mistaken for the old one (a late cancel
    /// must not hit the new request).
    inflight: Vec<Option<InFlight>>,
    inflight_gen: Vec<u32>,
    free_inflight: Vec<usize>,
    inflight_count: usize,
    touched: Vec<usize>,
    /// The connections being serviced in a round of [`IoThread::flush_touched`]; swapped
    /// with `touched` so neither list allocates after the first turns (a request answered
    /// in its own round touches its connection again, which used to free one list and
    /// allocate another every turn).
    servicing: Vec<usize>,
    next_response_id: u64,
    /// The earliest end of an injected stream stall (api::faults) seen at the front of a
    /// connection: the poll timeout honours it, so a stall of T ms ends at T, not at the
    /// next tick. Cleared when it passes (the holding streams are looked at again, and any
    /// still held put their own deadline back).
    stall_deadline: Option<Instant>,
    /// Read scratch, allocated once (a stack array would be zeroed on every read).
    read_chunk: Vec<u8>,
    /// Completions taken off the ring in one turn; empty between turns, kept for its
    /// allocation.
    completions: Vec<crate::runtime::TaggedEvent>,
}

impl IoThread {
    /// An io thread over `listener`, submitting through `submitter`.
    pub fn new(
        poll: Poll,
        mut listener: TcpListener,
        submitter: Submitter,
        sleep_flag: Arc<SleepFlag>,
        ctx: Arc<ApiContext>,
        shared: Arc<ServerShared>,
        thread_index: u64,
    ) -> std::io::Result<IoThread> {
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(IoThread {
            poll,
            listener: Some(listener),
            submitter,
            sleep_flag,
            idler: Idler::new(
                ctx.config.engine.idle,
                Duration::from_micros(ctx.config.engine.spin_us),
            ),
            ctx,
            route_headers: Default::default(),
            shared,
            conns: Vec::new(),
            free_conns: Vec::new(),
            generation: 0,
            inflight: Vec::new(),
            inflight_gen: Vec::new(),
            free_inflight: Vec::new(),
            inflight_count: 0,
            touched: Vec::new(),
            servicing: Vec::new(),
            next_response_id: thread_index << 48,
            stall_deadline: None,
            read_chunk: vec![0; 16 * 1024],
            completions: Vec::new(),
        })
    }

    /// Runs the event loop until the server stops.
    ///
    /// Never inlined: `tools/bench/instruction_budget.sh` finds this thread by the name.
    #[inline(never)]
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut next_tick = Instant::now() + TICK;
        // The last poll found events and was not itself a second look, and the idle policy
        // yields between polls: look once more before yielding. Requests that arrived
        // while this turn ran then join this cycle's batch instead of the next one, and on
        // a core the io thread shares with the engine and a worker each cycle costs them
        // three context switches (4.6 requests a batch instead of 2.9 at eight
        // connections; BENCHMARKS.md, "One more look"). Once, not until a poll comes back
        // empty: a stream of arrivals must not keep the engine from the core. Not when the
        // policy parks: the sleeping poll returns at once for what arrived, and a look
        // first was one more system call.
        let mut look_again = false;
        loop {
            let looking = look_again;
            let polled = if self.submitter.has_completions() || !self.touched.is_empty() || looking
            {
                self.poll.poll(&mut events, Some(Duration::ZERO))
            } else if self.inflight_count > 0 && self.idler.keep_polling(Instant::now()) {
                // Completions for requests in flight are microseconds away: poll again (after
                // the idle policy's yield) instead of sleeping in epoll_wait, whose wake-up
                // costs the engine an eventfd write and this thread a context switch.
                self.poll.poll(&mut events, Some(Duration::ZERO))
            } else {
                self.sleep_flag.before_sleep();
                // Re-check after announcing the sleep: completions pushed before the engine
                // could see the flag must not wait for the next tick.
                let timeout = if self.submitter.has_completions() {
                    Duration::ZERO
                } else if let Some(t) = self.stall_deadline {
                    TICK.min(t.saturating_duration_since(Instant::now()))
                } else {
                    TICK
                };
                let polled = self.poll.poll(&mut events, Some(timeout));
                self.sleep_flag.after_sleep();
                polled
            };
            look_again = !looking && !events.is_empty() && self.idler.yields();
            if !events.is_empty() || self.submitter.has_completions() || self.inflight_count == 0 {
                self.idler.busy();
            }
            if let Err(e) = polled {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "io thread poll failed; stopping");
                    return;
                }
            }
            let now = Instant::now();
            // Backends or names changed live (`crate::live`): take the new router copy.
            if let Some(ctx) = self.ctx.refreshed() {
                self.ctx = Arc::new(ctx);
                self.route_headers.clear();
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(now),
                    WAKER => {}
                    Token(t) => {
                        let idx = t - FIRST_CONN;
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(idx, ev.is_read_closed() || ev.is_error());
                        }
                        if ev.is_writable() {
                            self.touched.push(idx);
                        }
                    }
                }
            }
            // Completions may arrive without a waker event if they raced with this turn.
            self.drain_completions();
            self.flush_touched(now);
            if self.stall_deadline.is_some_and(|t| now >= t) {
                // Serviced next turn: their held chunks go out, later stalls re-arm.
                self.stall_deadline = None;
                self.touch_event_streams();
            }
            // A comparison, not `duration_since` (a subtraction of timespecs): once per turn.
            if now >= next_tick {
                next_tick = now + TICK;
                self.touch_event_streams();
                self.check_deadlines(now);
            }
            if self.shared.stopping.load(Ordering::Acquire) {
                if let Some(mut l) = self.listener.take() {
                    let _ = self.poll.registry().deregister(&mut l);
                }
                let quiet = self.inflight_count == 0
                    && self.conns.iter().flatten().all(|c| c.write_buf.is_empty());
                if quiet || self.shared.hard_stop.load(Ordering::Acquire) {
                    self.close_all();
                    return;
                }
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            let max = self.ctx.config.server.max_connections;
            if self.shared.open_connections.load(Ordering::Relaxed) >= max
                && !self.evict_for_newcomer(now)
            {
                self.ctx.http_stats.connection_refused();
                let mut out = Vec::new();
                Response::error(
                    Status::ServiceUnavailable,
                    "too_many_connections",
                    format!("the server is at its connection limit ({max}); retry later"),
                )
                .write_to(&mut out, true, false);
                let _ = stream.write(&out);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let idx = match self.free_conns.pop() {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(idx + FIRST_CONN),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, "could not register connection");
                self.free_conns.push(idx);
                continue;
            }
            self.generation = self.generation.wrapping_add(1);
            self.conns[idx] = Some(Conn::new(stream, self.generation, now));
            self.shared.open_connections.fetch_add(1, Ordering::Relaxed);
            self.ctx.http_stats.connection_opened();
        }
    }

    /// The minimum request data rate from `[server]`.
    fn data_rate(&self) -> DataRate {
        let server = &self.ctx.config.server;
        DataRate {
            min_bytes_per_sec: server.min_data_rate_bytes_per_sec,
            grace: server.min_data_rate_grace.duration(),
        }
    }

    /// At the connection limit: closes the connection of this thread that gives way to a
    /// newcomer ([`eviction::victim`]). A slow one is told why (best effort: it is closed
    /// at once, the slot is needed now). Returns false when none may be evicted.
    fn evict_for_newcomer(&mut self, now: Instant) -> bool {
        let rate = self.data_rate();
        let standings = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, Standing::of(c.as_ref()?))));
        let Some((idx, why)) = eviction::victim(standings, &rate, now) else {
            return false;
        };
        if why == Eviction::SlowAtLimit {
            if let Some(conn) = self.conns[idx].as_mut() {
                let mut out = Vec::new();
                Response::error(
                    Status::RequestTimeout,
                    "request_too_slow",
                    format!(
                        "the request arrived below {} bytes/s while the server was at its \
                         connection limit (server.min_data_rate_bytes_per_sec)",
                        rate.min_bytes_per_sec
                    ),
                )
                .write_to(&mut out, true, false);
                let _ = conn.stream.write(&out);
            }
        }
        self.evicted(idx, why);
        self.close(idx);
        true
    }

    fn on_readable(&mut self, idx: usize, closed: bool) {
        if let Some(conn) = self.conns.get_mut(idx).and_then(|c| c.as_mut()) {
            conn.readable = true;
            conn.read_closed_hint |= closed;
        }
        self.touched.push(idx);
    }

    /// Drives one connection as far as it can go: read (when allowed), parse and route
    /// complete requests, stage finished responses in order, write, close when done;
    /// repeated until a pass makes no progress. mio is edge-triggered, so a socket is read
    /// until it would block whenever reading is allowed; while reading is paused (pipelining
    /// window full, unwritten responses over `max_write_buffer_bytes`) the bytes wait in the
    /// kernel and this loop resumes reading as soon as the pause lifts.
    fn service(&mut self, idx: usize, now: Instant) {
        let server = &self.ctx.config.server;
        let buffer_limit = server.max_header_bytes + server.max_body_bytes + 1;
        let max_pipelined = server.max_pipelined;
        let max_write = server.max_write_buffer_bytes;
        loop {
            // Stats and router are borrowed from `ctx` next to `conn`: no `Arc` clone per call.
            let Some(conn) = self.conns.get_mut(idx).and_then(|c| c.as_mut()) else {
                return;
            };
            let stats = &self.ctx.http_stats;
            let mut progress = false;
            if !conn.read_done
                && conn.readable
                && conn.slots.len() < max_pipelined
                && conn.unwritten() <= max_write
                && conn.read_buf.len() < buffer_limit
            {
                match conn.read_available(&mut self.read_chunk, buffer_limit, now) {
                    Ok((ReadResult::Open, n)) => {
                        stats.add_bytes_in(n as u64);
                        progress |= n > 0;
                    }
                    Ok((ReadResult::Eof, n)) => {
                        stats.add_bytes_in(n as u64);
                        conn.read_done = true;
                        conn.close_when_flushed = true;
                        progress = true;
                    }
                    Err(_) => {
                        self.close(idx);
                        return;
                    }
                }
            }
            progress |= self.process(idx, now);
            let Some(conn) = self.conns.get_mut(idx).and_then(|c| c.as_mut()) else {
                return;
            };
            let stats = &self.ctx.http_stats;
            progress |= conn.stage_ready(
                &self.ctx.router,
                &mut self.route_headers,
                |endpoint, code| stats.record_response(endpoint, code),
            );
            if let Some(t) = conn.stalled_until() {
                self.stall_deadline = Some(self.stall_deadline.map_or(t, |d| d.min(t)));
            }
            match conn.flush(now) {
                Ok(n) => {
                    stats.add_bytes_out(n as u64);
                    progress |= n > 0;
                }
                Err(_) => {
                    self.close(idx);
                    return;
                }
            }
            if conn.reset_when_flushed && conn.unwritten() == 0 {
                // An injected reset (api::faults): a tick after the bytes before it went
                // out, so the client reads them before the RST discards what it has not.
                let at = *conn.reset_at.get_or_insert(now + TICK);
                if now >= at {
                    conn.set_reset_on_close();
                    self.close(idx);
                }
                return;
            }
            if conn.should_close() {
                self.close(idx);
                return;
            }
            if !progress {
                return;
            }
        }
    }

    /// Parses and routes every complete request in the read buffer (up to `max_pipelined`
    /// unanswered and while unwritten responses stay under the write bound). Returns true
    /// if it consumed anything. Starts the read deadline only while a request is incomplete
    /// (a request held back by the window is not the client's fault).
    fn process(&mut self, idx: usize, now: Instant) -> bool {
        let max_header = self.ctx.config.server.max_header_bytes;
        let max_body = self.ctx.config.server.max_body_bytes;
        let max_pipelined = self.ctx.config.server.max_pipelined;
        let max_write = self.ctx.config.server.max_write_buffer_bytes;
        let mut consumed = false;
        loop {
            let Some(conn) = self.conns.get_mut(idx).and_then(|c| c.as_mut()) else {
                return consumed;
            };
            if conn.slots.back().is_some_and(|s| s.close) {
                // Nothing after a `Connection: close` request is served.
                conn.read_buf.clear();
                conn.partial = None;
                conn.request_started = None;
                return consumed;
            }
            if conn.slots.len() >= max_pipelined || conn.unwritten() > max_write {
                conn.request_started = None;
                return consumed;
            }
            // The head: the one parked while its body arrives, else parsed now. A request
            // whose body is already here (the usual case) is routed without parking its head
            // in the connection and taking it back (two moves of a `Head` a request).
            let mut partial = match conn.partial.take() {
                Some(partial) => partial,
                None => {
                    if conn.read_buf.is_empty() {
                        conn.request_started = None;
                        return consumed;
                    }
                    match parse::parse_head(&conn.read_buf, max_header, max_body) {
                        Ok(None) => {
                            if conn.read_done {
                                // Peer closed mid-head: nothing to answer.
                                conn.read_buf.clear();
                                conn.request_started = None;
                            } else {
                                conn.request_started.get_or_insert(now);
                            }
                            return consumed;
                        }
                        Ok(Some(head)) => Partial {
                            head,
                            continue_sent: false,
                        },
                        Err(e) => {
                            let endpoint = Endpoint::Other;
                            let response = Response::error(e.status, "bad_request", e.message);
                            conn.read_buf.clear();
                            conn.read_done = true;
                            conn.request_started = None;
                            self.push_ready(idx, endpoint, response, true, false);
                            return true;
                        }
                    }
                }
            };
            let need = partial.head.head_len + partial.head.content_length;
            if conn.read_buf.len() < need {
                if partial.head.expect_continue
                    && !partial.continue_sent
                    && conn.slots.is_empty()
                    && conn.write_buf.is_empty()
                {
                    partial.continue_sent = true;
                    conn.write_buf
                        .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                if conn.read_done {
                    // Peer closed mid-body: nothing to answer.
                    conn.read_buf.clear();
                    conn.request_started = None;
                } else {
                    conn.partial = Some(partial);
                    conn.request_started.get_or_insert(now);
                }
                return consumed;
            }
            let head = &partial.head;
            // The body is parsed where it lies in the read buffer (no copy); the request is
            // consumed once routing is done with it.
            let routed = api::route(&self.ctx, head, &conn.read_buf[head.head_len..need]);
            conn.read_buf.drain(..need);
            // When this request's first bytes were read (`None` for one that followed
            // another in the same read): its latencies count from then.
            let received = conn.request_started.take();
            consumed = true;
            let close = head.close;
            if close {
                conn.read_done = true;
            }
            // The head's path has no query string: the parser split it off.
            let endpoint = Endpoint::of_path(&head.path);
            let head_only = head.method == Method::Head;
            let keep_alive_header = head.http10 && !close;
            match routed {
                Routed::Now(response) => {
                    let response = if keep_alive_header {
                        response.with_header("Connection: keep-alive")
                    } else {
                        response
                    };
                    self.push_ready(idx, endpoint, response, close, head_only)
                }
                Routed::Submit(job) => {
                    self.submit_job(idx, endpoint, job, close, keep_alive_header, received)
                }
                Routed::Later(deferred) => {
                    // A placeholder response, taken away: the slot waits for `deferred`.
                    self.push_ready(
                        idx,
                        endpoint,
                        Response::json(Status::Ok, Vec::new()),
                        close,
                        head_only,
                    );
                    let conn = self.conns[idx].as_mut().expect("live connection");
                    let slot = conn.slots.back_mut().expect("pushed above");
                    slot.response = None;
                    slot.deferred = Some(deferred);
                }
                Routed::Subscribe(subscriber) => {
                    // A placeholder response, replaced by the stream just below.
                    self.push_ready(
                        idx,
                        endpoint,
                        Response::json(Status::Ok, Vec::new()),
                        true,
                        false,
                    );
                    let conn = self.conns[idx].as_mut().expect("live connection");
                    let slot = conn.slots.back_mut().expect("pushed above");
                    slot.response = None;
                    slot.events = Some(crate::metrics::events::EventsSlot {
                        subscriber,
                        head_written: false,
                    });
                }
            }
        }
    }

    /// Appends a slot whose response is already known.
    fn push_ready(
        &mut self,
        idx: usize,
        endpoint: Endpoint,
        response: Response,
        close: bool,
        head_only: bool,
    ) {
        let conn = self.conns[idx].as_mut().expect("live connection");
        let seq = conn.next_seq;
        conn.next_seq += 1;
        conn.slots.push_back(Slot {
            seq,
            endpoint,
            close,
            head_only,
            keep_alive_header: false,
            stream: None,
            response: Some(response),
            job: None,
            outcomes: Outcomes::new(),
            remaining: 0,
            route: None,
            response_id: 0,
            events: None,
            deferred: None,
        });
        self.touched.push(idx);
    }

    /// Appends a slot for an engine job and submits its requests.
    fn submit_job(
        &mut self,
        idx: usize,
        endpoint: Endpoint,
        mut job: api::Job,
        close: bool,
        keep_alive_header: bool,
        received: Option<Instant>,
    ) {
        let requests = std::mem::take(&mut job.requests);
        let parts = requests.len();
        let stream = match job.extras.as_deref_mut() {
            Some(
                extras @ api::JobExtras {
                    stream: Some(_), ..
                },
            ) => {
                // A stream writes its echo itself; a whole answer renders it from the job.
                let echo = extras.echo.take();
                let opts = extras.stream.expect("matched above");
                self.next_response_id += 1;
                let kind = match job.kind {
                    api::JobKind::Chat => api::stream::StreamKind::Chat,
                    api::JobKind::Response { .. } => api::stream::StreamKind::Response,
                    _ => api::stream::StreamKind::Completion,
                };
                Some(Box::new(StreamSlot {
                    writer: api::stream::StreamWriter::new(
                        kind,
                        opts,
                        &job.model,
                        job.created_unix,
                        self.next_response_id,
                        parts,
                    )
                    .with_echo(echo)
                    .with_request_id(extras.request_id.clone())
                    .with_structured(extras.structured.clone())
                    .with_response(extras.response.clone()),
                    pending: Vec::new(),
                    head_written: false,
                    done: false,
                    error: None,
                }))
            }
            _ => None,
        };
        let (seq, generation) = {
            let conn = self.conns[idx].as_mut().expect("live connection");
            let seq = conn.next_seq;
            conn.next_seq += 1;
            conn.slots.push_back(Slot {
                seq,
                endpoint,
                close,
                head_only: false,
                keep_alive_header,
                stream,
                response: None,
                job: Some(job),
                outcomes: (0..parts).map(|_| None).collect(),
                remaining: parts,
                route: None,
                response_id: 0,
                events: None,
                deferred: None,
            });
            (seq, conn.generation)
        };
        for (part, request) in requests.into_iter().enumerate() {
            let tag = self.alloc_inflight(InFlight {
                conn: idx,
                generation,
                seq,
                part,
            });
            if let Err(e) = self.submitter.submit_received(request, tag, received) {
                self.free_inflight_tag(tag);
                self.complete_part(idx, generation, seq, part, Err(e), None);
            }
        }
    }

    fn alloc_inflight(&mut self, f: InFlight) -> u64 {
        self.inflight_count += 1;
        let i = match self.free_inflight.pop() {
            Some(i) => {
                self.inflight[i] = Some(f);
                i
            }
            None => {
                self.inflight.push(Some(f));
                self.inflight_gen.push(0);
                self.inflight.len() - 1
            }
        };
        self.inflight_gen[i] = self.inflight_gen[i].wrapping_add(1);
        let tag = i as u64 | (u64::from(self.inflight_gen[i]) << 32);
        // Guarantees: the tag names this request, and the index fits the tag's low half.
        debug_assert!(i <= u32::MAX as usize);
        debug_assert!(self.inflight_of(tag).is_some_and(|(j, _)| j == i));
        tag
    }

    /// The in-flight request `tag` names, if it is still the one the tag was made for.
    fn inflight_of(&self, tag: u64) -> Option<(usize, InFlight)> {
        let i = (tag & 0xffff_ffff) as usize;
        let f = (*self.inflight.get(i)?)?;
        (u64::from(self.inflight_gen[i]) == tag >> 32).then_some((i, f))
    }

    fn free_inflight_tag(&mut self, tag: u64) -> Option<InFlight> {
        let (i, f) = self.inflight_of(tag)?;
        debug_assert!(
            self.inflight_count > 0,
            "an in-flight request counted out twice"
        );
        self.inflight[i] = None;
        self.free_inflight.push(i);
        self.inflight_count -= 1;
        Some(f)
    }

    /// The slot `seq` of connection `idx`, if the connection is still the one that asked.
    fn slot_mut(&mut self, idx: usize, generation: u32, seq: u64) -> Option<&mut Slot> {
        let conn = self.conns.get_mut(idx).and_then(|c| c.as_mut())?;
        if conn.generation != generation {
            return None; // connection gone: the answer has nobody to go to
        }
        let front = conn.slots.front()?.seq;
        let slot = conn.slots.get_mut(seq.checked_sub(front)? as usize)?;
        debug_assert_eq!(slot.seq, seq);
        Some(slot)
    }

    /// A token of a streaming request: written to its stream at once.
    fn stream_token(
        &mut self,
        f: InFlight,
        offset: u32,
        text: &str,
        route: Option<crate::router::Decision>,
    ) {
        let Some(slot) = self.slot_mut(f.conn, f.generation, f.seq) else {
            return;
        };
        if slot.route.is_none() {
            slot.route = route;
        }
        if let Some(st) = slot.stream.as_mut() {
            st.writer.token(f.part, offset, text, &mut st.pending);
            self.touched.push(f.conn);
        }
    }

    /// Records one part's outcome; renders the response when the job is complete (or, for a
    /// stream, finishes that choice and ends the stream after the last).
    fn complete_part(
        &mut self,
        idx: usize,
        generation: u32,
        seq: u64,
        part: usize,
        outcome: crate::runtime::Outcome,
        route: Option<crate::router::Decision>,
    ) {
        self.next_response_id += 1;
        let response_id = self.next_response_id;
        let Some(slot) = self.slot_mut(idx, generation, seq) else {
            return;
        };
        debug_assert!(
            part < slot.outcomes.len(),
            "part {part} of a job with fewer"
        );
        if slot.outcomes[part].is_some() {
            return;
        }
        // Assumes: `remaining` counts the parts still unanswered (one is, here).
        debug_assert_eq!(
            slot.remaining,
            slot.outcomes.iter().filter(|o| o.is_none()).count()
        );
        slot.remaining -= 1;
        if slot.route.is_none() {
            slot.route = route;
        }
        if let Some(st) = slot.stream.as_mut() {
            match &outcome {
                Ok(output) => st.writer.finish_part(part, output, &mut st.pending),
                Err(e) => {
                    if st.error.is_none() {
                        st.error = Some(e.clone());
                    }
                }
            }
            slot.outcomes[part] = Some(outcome);
            if slot.remaining == 0 {
                let st = slot.stream.as_mut().expect("checked above");
                match st.error.take() {
                    // Nothing streamed yet: answer with a plain HTTP error instead.
                    Some(e) if !st.writer.started() => {
                        slot.stream = None;
                        let mut response = api::error_response(&e);
                        if let Some(rid) = slot.job.as_ref().and_then(|j| j.request_id()) {
                            response.echo_request_id(rid);
                        }
                        slot.response = Some(response);
                    }
                    Some(e) => {
                        st.writer.error(&e.to_string(), &mut st.pending);
                        st.writer.end(&mut st.pending);
                        st.done = true;
                    }
                    None => {
                        st.writer.end(&mut st.pending);
                        st.done = true;
                    }
                }
            }
            self.touched.push(idx);
            return;
        }
        slot.outcomes[part] = Some(outcome);
        if slot.remaining == 0 {
            // Rendered straight into the write buffer when the slot reaches the front.
            slot.response_id = response_id;
            self.touched.push(idx);
        }
    }

    fn drain_completions(&mut self) {
        let mut events = std::mem::take(&mut self.completions);
        self.submitter.drain_completions(|c| events.push(c));
        for c in events.drain(..) {
            match c.event {
                Event::Token { offset, text } => {
                    if let Some((_, f)) = self.inflight_of(c.tag) {
                        self.stream_token(f, offset, &text, c.route);
                    }
                }
                Event::Done(outcome) => {
                    if let Some(f) = self.free_inflight_tag(c.tag) {
                        self.complete_part(f.conn, f.generation, f.seq, f.part, outcome, c.route);
                    }
                }
            }
        }
        self.completions = events; // keep the allocation
    }

    /// Services every connection touched this turn (read, parse, stage, write, close).
    /// Servicing can touch connections again (a request answered at once, a completion);
    /// a few rounds settle that, and anything left is picked up next turn without sleeping.
    fn flush_touched(&mut self, now: Instant) {
        for _ in 0..4 {
            if self.touched.is_empty() {
                return;
            }
            debug_assert!(self.servicing.is_empty(), "left empty by the round before");
            std::mem::swap(&mut self.touched, &mut self.servicing);
            self.servicing.sort_unstable();
            self.servicing.dedup();
            for i in 0..self.servicing.len() {
                self.service(self.servicing[i], now);
            }
            self.servicing.clear();
        }
    }

    /// `/events` connections take what their subscriber gathered since the last tick.
    fn touch_event_streams(&mut self) {
        for (idx, conn) in self.conns.iter().enumerate() {
            // Streams in an injected stall or reset (api::faults) are looked at too.
            if conn.as_ref().is_some_and(|c| {
                c.reset_when_flushed
                    || c.slots.front().is_some_and(|s| {
                        s.events.is_some()
                            || s.deferred.is_some()
                            || s.stream.as_ref().is_some_and(|st| st.writer.holding())
                    })
            }) {
                self.touched.push(idx);
            }
        }
    }

    /// Enforces the read deadline (408), the minimum data rate (408), the keep-alive idle
    /// timeout, and the write deadline; each closure is counted by its [`Eviction`] kind.
    fn check_deadlines(&mut self, now: Instant) {
        let server = &self.ctx.config.server;
        let read_timeout = server.read_timeout.duration();
        let idle_timeout = server.keep_alive_timeout.duration();
        let write_timeout = server.write_timeout.duration();
        let rate = self.data_rate();
        let mut to_close = Vec::new();
        let mut timed_out = Vec::new();
        for (idx, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            if conn
                .write_started
                .is_some_and(|t| now.duration_since(t) > write_timeout)
            {
                to_close.push((idx, Eviction::WriteStalled));
            } else if !conn.read_done
                && conn
                    .request_started
                    .is_some_and(|t| now.duration_since(t) > read_timeout)
            {
                timed_out.push((idx, Eviction::ReadTimeout));
            } else if rate.too_slow(Standing::of(conn), now) {
                timed_out.push((idx, Eviction::SlowRequest));
            } else if conn.is_quiet()
                && conn.read_buf.is_empty()
                && conn.partial.is_none()
                && now.duration_since(conn.last_activity) > idle_timeout
            {
                to_close.push((idx, Eviction::IdleTimeout));
            }
        }
        for (idx, why) in timed_out {
            if let Some(conn) = self.conns[idx].as_mut() {
                conn.read_buf.clear();
                conn.partial = None;
                conn.read_done = true;
                conn.request_started = None;
            }
            self.evicted(idx, why);
            let message = if why == Eviction::SlowRequest {
                let (min, grace) = (rate.min_bytes_per_sec, rate.grace.as_secs_f64());
                (
                    "request_too_slow",
                    format!(
                        "the request arrived below {min} bytes/s after a grace of {grace} s \
                         (server.min_data_rate_bytes_per_sec, server.min_data_rate_grace)"
                    ),
                )
            } else {
                let secs = read_timeout.as_secs_f64();
                (
                    "request_timeout",
                    format!("the request was not received within {secs} s (server.read_timeout)"),
                )
            };
            self.push_ready(
                idx,
                Endpoint::Other,
                Response::error(Status::RequestTimeout, message.0, message.1),
                true,
                false,
            );
        }
        for (idx, why) in to_close {
            self.evicted(idx, why);
            self.close(idx);
        }
        self.flush_touched(now);
    }

    /// Counts connection `idx` evicted for `why` (`abe_http_connections_evicted_total`) and
    /// says so at debug level: a client that sees its connection closed can find out why.
    fn evicted(&self, idx: usize, why: Eviction) {
        self.ctx.http_stats.connection_evicted(why);
        tracing::debug!(
            connection = idx,
            reason = why.as_str(),
            "connection evicted (abe_http_connections_evicted_total)"
        );
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut conn) = self.conns.get_mut(idx).and_then(|c| c.take()) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.free_conns.push(idx);
            self.shared.open_connections.fetch_sub(1, Ordering::Relaxed);
            self.ctx.http_stats.connection_closed();
            if !conn.slots.is_empty() {
                // Nobody will read these answers: let the engine drop queued requests and
                // free the slots of generating ones. Their final answers still come back
                // (and free the tags); they are discarded here.
                for (i, f) in self.inflight.iter().enumerate() {
                    if f.is_some_and(|f| f.conn == idx && f.generation == conn.generation) {
                        let tag = i as u64 | (u64::from(self.inflight_gen[i]) << 32);
                        self.submitter.cancel(tag);
                    }
                }
            }
        }
    }

    fn close_all(&mut self) {
        for idx in 0..self.conns.len() {
            self.close(idx);
        }
    }
}
