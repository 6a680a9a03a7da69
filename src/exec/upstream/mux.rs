//! The `upstream` executor as an event loop: every batch of a backend's workers runs on one
//! thread, over non-blocking keep-alive connections (mio), one request per connection at a
//! time, as many connections as requests in flight. A worker thread per request in flight
//! spent most of a forwarded request's CPU on waking and sleeping (BENCHMARKS.md, "The proxy
//! path"); here a request costs a write, a read and a parse.
//!
//! A batch is planned as on a thread (`plan::plan`: array requests, chats and streams on
//! their own); each request goes on an idle connection to the batch's address (one the
//! backend has not closed: an event said so, or for one idle `PEEK_AFTER_IDLE` or more, a
//! peek) or a new one, to the backend's addresses in turn
//! until one takes it. A request whose write fails on a kept-alive connection (the backend
//! closed it meanwhile, so it did not get the request whole) goes once more, on a new
//! connection, within its first deadline; a failure after the request went out whole is
//! never retried here (the backend may have served it: the router retries elsewhere). A
//! stream is answered at `data: [DONE]`; its connection reads the body on to its end (then
//! it is kept) or to the request's deadline (then it is closed).
//! Once `stop` is set, what is in flight fails at once and queued requests are not sent.
//! A host name is looked up on this thread the first time a connection is opened, and
//! refreshed by a thread of its own after that (`resolve::NameCache`): only the first lookup
//! holds the loop.
//!
//! What must never happen here: a blocking socket call, a batch never reported done, a
//! request started after `stop` is set, a request sent again after it went out whole, a
//! body kept past `RESPONSE_BYTES_MAX`, or a token piece relayed out of order.

use super::client::{Call, UpstreamClient, RESPONSE_BYTES_MAX};
use super::http1::{self, ResponseReader};
use super::plan::{answer, plan, BackendRequest, StreamState, CONCURRENT_REQUESTS_MAX};
use super::resolve::NameCache;
use super::slot::UpstreamSlot;
use super::sse::{SseEvent, SseReader, EVENT_BYTES_MAX};
use crate::exec::concurrent::{ConcurrentExecutor, ItemResult, Progress};
use crate::exec::{BatchItem, ExecError, Output};
use crate::sync::AtomicBool;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The waker's token; a connection's is its index plus one.
const WAKE: Token = Token(0);
/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 << 10;
/// Idle keep-alive connections kept (as many as the default workers, each one request).
const IDLE_MAX: usize = 64;
/// An idle connection kept this long or longer is peeked before reuse, in case its close
/// came after the loop last polled; a younger one is reused on the events alone. Backends
/// close idle connections at a keep-alive timeout of a second or more (uvicorn, under
/// vLLM and SGLang, 5 s; nginx 75 s; Node 5 s), never within a millisecond of an answer
/// unless they said `Connection: close` (then the connection is not kept). Under load a
/// connection idles well under this between requests, and the peek, one system call a
/// request, was one in three of the loop's and one in six of the front's
/// (`tools/bench/proxy_syscalls.sh`).
const PEEK_AFTER_IDLE: Duration = Duration::from_millis(1);

/// One backend's batches, on the thread that calls it.
pub struct Mux {
    poll: Poll,
    events: Events,
    waker: Arc<Waker>,
    slot: UpstreamSlot,
    stop: Arc<AtomicBool>,
    conns: Vec<Option<Conn>>,
    /// Indices of `conns` that are `None`.
    free: Vec<usize>,
    /// Indices of idle connections (checked when taken: a closed one may be listed).
    idle: Vec<usize>,
    /// The batch of each seat.
    batches: Vec<Option<Batch>>,
    /// The address the idle connections go to (a slot filled again closes them).
    base: String,
    /// The backend's address, when it is a host name.
    names: NameCache,
    buf: Vec<u8>,
    /// Connections with events this turn: whether each was readable, and whether the
    /// backend closed its side (reused across turns).
    ready: Vec<(usize, bool, bool)>,
    /// When the last poll returned: what an answer's connection goes idle at (one clock
    /// read a turn, not one an answer; an earlier stamp only peeks sooner).
    polled_at: Instant,
}

struct Batch {
    results: Vec<ItemResult>,
    /// Its requests sent and not answered yet.
    open: usize,
    /// Its requests waiting for one of those to finish (at most
    /// `CONCURRENT_REQUESTS_MAX` of a batch are in flight).
    queued: Vec<BackendRequest>,
    /// The client the batch took at its start (the slot's of that moment).
    client: UpstreamClient,
}

struct Conn {
    stream: TcpStream,
    /// The base URL it is connected to.
    base: String,
    exchange: Option<Box<Exchange>>,
    /// The backend closed its side (seen in an event): never reused.
    peer_closed: bool,
    /// When it went idle (about: the loop's last poll before): see `PEEK_AFTER_IDLE`.
    idle_since: Instant,
}

/// One request on a connection and its answer so far.
struct Exchange {
    seat: usize,
    client: UpstreamClient,
    job: BackendRequest,
    out: Vec<u8>,
    written: usize,
    connected: bool,
    connect_by: Instant,
    answer_by: Instant,
    reader: ResponseReader,
    /// On a connection that carried an earlier request (a failure while writing it is
    /// retried once, on a new connection: see the module doc).
    reused: bool,
    retried: bool,
    /// Addresses of the backend not tried yet for this request (a name may have several:
    /// `localhost` is `::1` and `127.0.0.1`; a refused one moves on to the next).
    addrs: Vec<SocketAddr>,
    /// A 2xx stream: its state, event bytes not yet a whole event, and its output once
    /// `[DONE]` came.
    stream: Option<Stream>,
    /// Its results went out (a stream at `[DONE]`); the connection still reads the body to
    /// its end, to be kept, or is closed at the deadline.
    answered: bool,
}

struct Stream {
    state: Option<StreamState>,
    pending: Vec<u8>,
    output: Option<Output>,
}

impl Mux {
    /// A loop for a backend of `seats` workers whose address is `slot`'s of the moment.
    pub fn new(slot: UpstreamSlot, seats: usize, stop: Arc<AtomicBool>) -> io::Result<Mux> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        Ok(Mux {
            poll,
            events: Events::with_capacity(256),
            waker,
            slot,
            stop,
            conns: Vec::new(),
            free: Vec::new(),
            idle: Vec::new(),
            batches: (0..seats).map(|_| None).collect(),
            base: String::new(),
            names: NameCache::default(),
            buf: vec![0; READ_CHUNK],
            ready: Vec::new(),
            polled_at: Instant::now(),
        })
    }

    /// Sends `job` of `seat`'s batch, on an idle connection or a new one.
    fn send(
        &mut self,
        seat: usize,
        client: &UpstreamClient,
        job: BackendRequest,
        progress: &mut dyn Progress,
    ) {
        let now = Instant::now();
        let timeouts = client.timeouts();
        let mut out = Vec::with_capacity(job.body.len() + 256);
        let (authority, prefix) = split_base(client.base_url());
        let path = job.shape.path();
        let target: std::borrow::Cow<'_, str> = if prefix.is_empty() {
            path.into()
        } else {
            format!("{prefix}{path}").into()
        };
        http1::post(
            &mut out,
            authority,
            &target,
            client.authorization(),
            &job.body,
        );
        let exchange = Box::new(Exchange {
            seat,
            client: client.clone(),
            job,
            out,
            written: 0,
            connected: true,
            connect_by: now + timeouts.connect.min(timeouts.request),
            answer_by: now + timeouts.request,
            reader: ResponseReader::new(RESPONSE_BYTES_MAX),
            reused: false,
            retried: false,
            addrs: Vec::new(),
            stream: None,
            answered: false,
        });
        self.place(exchange, now, progress);
    }

    /// Puts `ex` on an idle connection (not for a retry) or a new one, and writes it; `now`
    /// is the time (what an idle connection's age is counted to).
    fn place(&mut self, mut ex: Box<Exchange>, now: Instant, progress: &mut dyn Progress) {
        let idle = if ex.retried {
            None
        } else {
            self.take_idle(ex.client.base_url(), now)
        };
        let index = match idle {
            Some(index) => {
                ex.reused = true;
                index
            }
            None => {
                ex.reused = false;
                ex.connected = false;
                match self.open(&mut ex) {
                    Ok(index) => index,
                    Err(e) => {
                        let error = Call::new(&ex.client, "POST", ex.job.shape.path()).io_error(e);
                        return self.answer(ex, Err(error), progress);
                    }
                }
            }
        };
        let conn = self.conns[index].as_mut().expect("a connection just taken");
        conn.exchange = Some(ex);
        // Write at once: a kept-alive connection is writable, and a new one says so later.
        self.ready(index, false, false, progress);
    }

    /// An idle connection to `base` that the backend has not closed, if one is open.
    fn take_idle(&mut self, base: &str, now: Instant) -> Option<usize> {
        while let Some(index) = self.idle.pop() {
            let Some(c) = &self.conns[index] else {
                continue;
            };
            if c.exchange.is_some() {
                continue;
            }
            // A closed connection (the backend's keep-alive timeout, a restart) is dropped:
            // its close came with its last answer (`peer_closed`), or in an event since
            // (then it is gone already), or after the loop last polled, which only a peek
            // sees in time (an end, or bytes nobody asked for, is not alive). Only a
            // connection idle for `PEEK_AFTER_IDLE` is peeked: a younger one is not at a
            // keep-alive timeout.
            let alive = c.base == base
                && !c.peer_closed
                && (now.saturating_duration_since(c.idle_since) < PEEK_AFTER_IDLE
                    || matches!(c.stream.peek(&mut [0u8; 1]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock));
            if alive {
                return Some(index);
            }
            self.close(index);
        }
        None
    }

    /// Opens a connection for `ex` to the next of its backend's addresses that takes one
    /// (its index), registered for both directions; the addresses not tried stay in `ex`.
    fn open(&mut self, ex: &mut Exchange) -> io::Result<usize> {
        let base = ex.client.base_url();
        if ex.addrs.is_empty() {
            let mut addrs = self.addresses(base)?;
            // Tried from the back: the first address first.
            addrs.reverse();
            ex.addrs = addrs;
        }
        let mut last = None;
        while let Some(addr) = ex.addrs.pop() {
            match self.connect(base, addr) {
                Ok(index) => return Ok(index),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
    }

    /// A connection to `addr` for `base`, registered for both directions.
    fn connect(&mut self, base: &str, addr: SocketAddr) -> io::Result<usize> {
        let mut stream = TcpStream::connect(addr)?;
        let index = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            Token(index + 1),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.free.push(index);
            return Err(e);
        }
        self.conns[index] = Some(Conn {
            stream,
            base: base.to_string(),
            exchange: None,
            peer_closed: false,
            idle_since: self.polled_at,
        });
        Ok(index)
    }

    /// The socket addresses of `base` (`http://host:port`): see `resolve::NameCache`.
    fn addresses(&mut self, base: &str) -> io::Result<Vec<SocketAddr>> {
        if !base.starts_with("http://") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "only http:// backends are supported",
            ));
        }
        self.names.addresses(split_base(base).0)
    }

    /// Closes connection `index` (its exchange, if any, was taken off it first).
    fn close(&mut self, index: usize) {
        if let Some(mut conn) = self.conns[index].take() {
            debug_assert!(
                conn.exchange.is_none(),
                "a connection closed under its request"
            );
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.free.push(index);
        }
    }

    /// Moves connection `index` on: connects, writes, reads, finishes its exchange.
    /// `readable`: the poll said so. A request written whole here is not followed by a read
    /// unless it was (its answer cannot be there yet; it will come as an event).
    /// `peer_closed`: the backend closed its side (the connection is not reused).
    fn ready(
        &mut self,
        index: usize,
        readable: bool,
        peer_closed: bool,
        progress: &mut dyn Progress,
    ) {
        let Some(conn) = self.conns[index].as_mut() else {
            return;
        };
        conn.peer_closed |= peer_closed;
        let Some(ex) = conn.exchange.as_mut() else {
            // Idle: a kept-alive connection has nothing to say; bytes or the close end it.
            match conn.stream.read(&mut self.buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => self.close(index),
            }
            return;
        };
        if !ex.connected {
            match conn.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return self.connect_failed(index, e, progress),
            }
            match conn.stream.peer_addr() {
                Ok(_) => {
                    ex.connected = true;
                    let _ = conn.stream.set_nodelay(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => return self.connect_failed(index, e, progress),
            }
        }
        let writing = ex.written < ex.out.len();
        while ex.written < ex.out.len() {
            match conn.stream.write(&ex.out[ex.written..]) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "the backend took no bytes");
                    return self.write_failed(index, e, progress);
                }
                Ok(n) => ex.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.write_failed(index, e, progress),
            }
        }
        if writing && !readable {
            return;
        }
        self.read_answer(index, progress);
    }

    /// Reads connection `index`'s answer until the socket has nothing more (edge-triggered:
    /// what is left unread would raise no event), finishing its exchange when it is whole.
    fn read_answer(&mut self, index: usize, progress: &mut dyn Progress) {
        loop {
            let Some(conn) = self.conns[index].as_mut() else {
                return;
            };
            let Some(ex) = conn.exchange.as_mut() else {
                return;
            };
            let n = match conn.stream.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail_io(index, e, progress),
            };
            let fed = if n == 0 {
                ex.reader.closed()
            } else {
                ex.reader.feed(&self.buf[..n])
            };
            if let Err(detail) = fed {
                let conn = self.conns[index].as_mut().expect("a connection in use");
                let ex = conn.exchange.as_ref().expect("an exchange in use");
                let call = Call::new(&ex.client, "POST", ex.job.shape.path());
                let error = if n == 0 {
                    call.connection_lost(detail)
                } else {
                    call.protocol(detail)
                };
                return self.fail(index, error, progress);
            }
            if let Err(error) = relay_stream(ex, progress) {
                return self.fail(index, error, progress);
            }
            if ex.reader.is_done() {
                return self.finish(index, progress);
            }
            // A stream is answered at `[DONE]`, whether or not its body ends then (some
            // servers send its end later); the connection reads on to the end.
            if !ex.answered && ex.stream.as_ref().is_some_and(|s| s.output.is_some()) {
                ex.answered = true;
                let outcome = outcome(ex);
                let results = results_of(&ex.job, outcome);
                let seat = ex.seat;
                self.record(seat, results, progress);
            }
            if n == 0 {
                return;
            }
        }
    }

    /// Connecting failed: the next address, if the backend has another, else the error.
    fn connect_failed(&mut self, index: usize, e: io::Error, progress: &mut dyn Progress) {
        let ex = self.take_exchange(index);
        if ex.addrs.is_empty() {
            let error = Call::new(&ex.client, "POST", ex.job.shape.path()).io_error(e);
            return self.answer(ex, Err(error), progress);
        }
        self.place(ex, Instant::now(), progress);
    }

    /// Writing the request failed. On a kept-alive connection the backend had closed it (a
    /// request not written whole was not served), so it goes once more, on a new connection
    /// and within its first deadline; anything else is the error. A failure after the
    /// request went out whole is never retried: the backend may have served it (the
    /// router may send it elsewhere).
    fn write_failed(&mut self, index: usize, e: io::Error, progress: &mut dyn Progress) {
        let mut ex = self.take_exchange(index);
        if !ex.reused || ex.retried {
            let error = Call::new(&ex.client, "POST", ex.job.shape.path()).io_error(e);
            return self.answer(ex, Err(error), progress);
        }
        ex.retried = true;
        ex.written = 0;
        self.place(ex, Instant::now(), progress);
    }

    /// Reading the answer failed: the error (never retried, see `write_failed`).
    fn fail_io(&mut self, index: usize, e: io::Error, progress: &mut dyn Progress) {
        let ex = self.take_exchange(index);
        let error = Call::new(&ex.client, "POST", ex.job.shape.path()).io_error(e);
        self.answer(ex, Err(error), progress);
    }

    /// Takes connection `index`'s exchange off it and closes it.
    fn take_exchange(&mut self, index: usize) -> Box<Exchange> {
        let ex = self.conns[index]
            .as_mut()
            .and_then(|c| c.exchange.take())
            .expect("an exchange in use");
        self.close(index);
        ex
    }

    /// Ends connection `index`'s exchange with `error` and closes the connection.
    fn fail(&mut self, index: usize, error: ExecError, progress: &mut dyn Progress) {
        let ex = self.take_exchange(index);
        self.answer(ex, Err(error), progress);
    }

    /// Connection `index`'s answer is whole: its items' results, and the connection kept
    /// if the backend keeps it.
    fn finish(&mut self, index: usize, progress: &mut dyn Progress) {
        let conn = self.conns[index].as_mut().expect("a connection in use");
        let mut ex = conn.exchange.take().expect("an exchange in use");
        if ex.reader.reusable() && !conn.peer_closed && self.idle.len() < IDLE_MAX {
            conn.idle_since = self.polled_at;
            self.idle.push(index);
        } else {
            // The backend closes it, or the pool is full.
            self.close(index);
        }
        let outcome = outcome(&mut ex);
        self.answer(ex, outcome, progress);
    }

    /// Records `outcome` for the exchange's items, unless they were answered already.
    fn answer(
        &mut self,
        ex: Box<Exchange>,
        outcome: Result<Vec<ItemResult>, ExecError>,
        progress: &mut dyn Progress,
    ) {
        if !ex.answered {
            let results = results_of(&ex.job, outcome);
            self.record(ex.seat, results, progress);
        }
    }

    /// Adds one request's `results` to `seat`'s batch; sends the batch's next queued
    /// request, or reports the batch done once its last request is answered.
    fn record(&mut self, seat: usize, results: Vec<ItemResult>, progress: &mut dyn Progress) {
        let Some(batch) = self.batches[seat].as_mut() else {
            debug_assert!(false, "an answer for seat {seat} without a batch");
            return;
        };
        batch.results.extend(results);
        batch.open -= 1;
        // Acquire: as in `start`. Requests queued behind the first ones are not started
        // once `stop` is set.
        if self.stop.load(Ordering::Acquire) {
            let e = ExecError::Backend("shutting down".into());
            for job in batch.queued.drain(..) {
                batch
                    .results
                    .extend(job.items.iter().map(|i| (i.index, Err(e.clone()))));
            }
        }
        if let Some(job) = batch.queued.pop() {
            batch.open += 1;
            let client = batch.client.clone();
            return self.send(seat, &client, job, progress);
        }
        if batch.open == 0 {
            let batch = self.batches[seat].take().expect("the batch just answered");
            progress.done(seat, batch.results);
        }
    }

    /// Fails every request in flight with "shutting down" (`answer` fails the queued ones).
    fn cut_short(&mut self, progress: &mut dyn Progress) {
        for index in 0..self.conns.len() {
            if self.conns[index]
                .as_ref()
                .is_some_and(|c| c.exchange.is_some())
            {
                self.fail(index, ExecError::Backend("shutting down".into()), progress);
            }
        }
    }

    /// The earliest deadline of a request in flight.
    fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .flatten()
            .filter_map(|c| c.exchange.as_ref())
            .map(|ex| {
                if ex.connected {
                    ex.answer_by
                } else {
                    ex.connect_by.min(ex.answer_by)
                }
            })
            .min()
    }

    /// Fails every request past its deadline.
    fn expire(&mut self, now: Instant, progress: &mut dyn Progress) {
        for index in 0..self.conns.len() {
            let Some(ex) = self.conns[index].as_ref().and_then(|c| c.exchange.as_ref()) else {
                continue;
            };
            let call = Call::new(&ex.client, "POST", ex.job.shape.path());
            let error = if !ex.connected && now >= ex.connect_by {
                call.connect_timeout()
            } else if now >= ex.answer_by {
                call.request_timeout()
            } else {
                continue;
            };
            self.fail(index, error, progress);
        }
    }
}

/// Each of `job`'s items' result: `outcome`'s, or its error for every item.
fn results_of(
    job: &BackendRequest,
    outcome: Result<Vec<ItemResult>, ExecError>,
) -> Vec<ItemResult> {
    outcome.unwrap_or_else(|e| {
        job.items
            .iter()
            .map(|i| (i.index, Err(e.clone())))
            .collect()
    })
}

/// The results of a whole answer (of a stream: at `[DONE]`, or at the body's end).
fn outcome(ex: &mut Exchange) -> Result<Vec<ItemResult>, ExecError> {
    let call = Call::new(&ex.client, "POST", ex.job.shape.path());
    let status = ex.reader.status();
    if !(200..300).contains(&status) {
        return Err(call.status_error(status, &String::from_utf8_lossy(ex.reader.body())));
    }
    let Some(stream) = ex.stream.as_mut() else {
        return match std::str::from_utf8(ex.reader.body()) {
            Ok(body) => answer(&call, &ex.job, body),
            Err(e) => Err(call.protocol(format_args!("an answer that is not UTF-8: {e}"))),
        };
    };
    let output = match (stream.output.take(), stream.state.take()) {
        (Some(output), _) => output,
        (None, Some(state)) => state.ended(&call)?,
        (None, None) => return Err(call.protocol("a stream without a state")),
    };
    Ok(vec![(ex.job.items[0].index, Ok(output))])
}

/// Parses the whole events a 2xx stream has received, relaying their text.
fn relay_stream(ex: &mut Exchange, progress: &mut dyn Progress) -> Result<(), ExecError> {
    if !ex.job.stream || !ex.reader.has_head() || !(200..300).contains(&ex.reader.status()) {
        return Ok(());
    }
    let stream = ex.stream.get_or_insert_with(|| Stream {
        state: Some(StreamState::new(&ex.job)),
        pending: Vec::new(),
        output: None,
    });
    let fresh = ex.reader.take_body();
    if stream.output.is_some() || ex.answered {
        // After `[DONE]`: the rest of the body is read and dropped.
        return Ok(());
    }
    stream.pending.extend_from_slice(&fresh);
    let at_end = ex.reader.is_done();
    // Whole events only, unless the body has ended.
    let cut = if at_end {
        stream.pending.len()
    } else {
        match last_event_end(&stream.pending) {
            Some(cut) => cut,
            None if stream.pending.len() > EVENT_BYTES_MAX => {
                let call = Call::new(&ex.client, "POST", ex.job.shape.path());
                return Err(call.protocol(format_args!(
                    "a stream event is longer than {EVENT_BYTES_MAX} bytes"
                )));
            }
            None => return Ok(()),
        }
    };
    let call = Call::new(&ex.client, "POST", ex.job.shape.path());
    let seat = ex.seat;
    let mut emit = |item: usize, offset: u32, text: String| {
        progress.token(seat, item, offset, text);
    };
    let mut events = SseReader::new(&stream.pending[..cut]);
    loop {
        match events.next_event().map_err(|e| call.io_error(e))? {
            SseEvent::Data(data) => {
                if let Some(state) = stream.state.as_mut() {
                    state.data(&call, data, &mut emit)?;
                }
            }
            SseEvent::Done => {
                stream.output = stream.state.take().map(StreamState::output);
                break;
            }
            SseEvent::Eof => break,
        }
    }
    stream.pending.drain(..cut);
    Ok(())
}

/// The end of the last whole event in `bytes` (just past its blank line), if any.
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let mut end = None;
    for i in 1..bytes.len() {
        if bytes[i] == b'\n' && (bytes[i - 1] == b'\n' || (i >= 2 && &bytes[i - 2..i] == b"\n\r")) {
            end = Some(i + 1);
        }
    }
    end
}

/// `host:port` of `http://host:port/prefix` (what the `Host` header says) and the path
/// prefix (`/prefix`, or empty) every request's path goes under.
fn split_base(base: &str) -> (&str, &str) {
    // `http://` (every backend's) first: the general search is a two-way string search,
    // ~200 instructions a forwarded request.
    let rest = base
        .strip_prefix("http://")
        .unwrap_or_else(|| base.split_once("://").map_or(base, |(_, r)| r));
    match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, ""),
    }
}

impl ConcurrentExecutor for Mux {
    fn start(&mut self, seat: usize, items: &[BatchItem], progress: &mut dyn Progress) {
        let client = self.slot.current();
        if client.base_url() != self.base {
            // The slot was filled again: connections to the old address are not reused.
            for index in std::mem::take(&mut self.idle) {
                self.close(index);
            }
            self.base = client.base_url().to_string();
        }
        let (mut jobs, failed) = plan(items, client.name(), client.prompt_array());
        let mut results: Vec<ItemResult> = Vec::with_capacity(items.len());
        results.extend(failed.into_iter().map(|(index, e)| (index, Err(e))));
        // Acquire: pairs with the Release store at shutdown (`runtime::worker::signal_exit`).
        if self.stop.load(Ordering::Acquire) {
            let e = ExecError::Backend("shutting down".into());
            for job in &jobs {
                results.extend(job.items.iter().map(|i| (i.index, Err(e.clone()))));
            }
            return progress.done(seat, results);
        }
        if jobs.is_empty() {
            return progress.done(seat, results);
        }
        debug_assert!(self.batches[seat].is_none(), "seat {seat} runs one batch");
        // The first `CONCURRENT_REQUESTS_MAX` go now, the rest as those finish (popped
        // from the end, so reversed to go in order).
        let queued: Vec<BackendRequest> = if jobs.len() > CONCURRENT_REQUESTS_MAX {
            jobs.drain(CONCURRENT_REQUESTS_MAX..).rev().collect()
        } else {
            Vec::new()
        };
        self.batches[seat] = Some(Batch {
            results,
            open: jobs.len(),
            queued,
            client: client.clone(),
        });
        for job in jobs {
            self.send(seat, &client, job, progress);
        }
    }

    fn turn(&mut self, timeout: Duration, progress: &mut dyn Progress) -> bool {
        let now = Instant::now();
        let wait = match self.next_deadline() {
            Some(at) => timeout.min(at.saturating_duration_since(now)),
            None => timeout,
        };
        if let Err(e) = self.poll.poll(&mut self.events, Some(wait)) {
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!(error = %e, "upstream event loop: poll failed");
                // Not a busy loop on a poll that keeps failing.
                std::thread::sleep(wait.min(Duration::from_millis(10)));
            }
        }
        self.polled_at = Instant::now();
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        ready.extend(self.events.iter().filter(|e| e.token() != WAKE).map(|e| {
            let closed = e.is_read_closed();
            (e.token().0 - 1, e.is_readable() || closed, closed)
        }));
        let moved = !self.events.is_empty();
        for &(index, readable, closed) in &ready {
            self.ready(index, readable, closed, progress);
        }
        self.ready = ready;
        self.expire(Instant::now(), progress);
        // Acquire: as in `start`. Set once the engine has given up on what is in flight
        // (a drain's deadline, or its return): cut it short rather than wait for answers
        // nobody takes.
        if self.stop.load(Ordering::Acquire) {
            self.cut_short(progress);
        }
        moved
    }

    fn abandon(&mut self, progress: &mut dyn Progress) {
        for index in 0..self.conns.len() {
            if let Some(conn) = self.conns[index].as_mut() {
                conn.exchange = None;
            }
            self.close(index);
        }
        self.idle.clear();
        for seat in 0..self.batches.len() {
            if self.batches[seat].take().is_some() {
                progress.done(seat, Vec::new());
            }
        }
    }

    fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let waker = self.waker.clone();
        Arc::new(move || {
            let _ = waker.wake();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Kind, Ticket};
    use crate::exec::upstream::plan::tests::client;
    use crate::exec::Work;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    /// What a test's batch ended with.
    #[derive(Default)]
    struct Done(Option<Vec<ItemResult>>);

    impl Progress for Done {
        fn token(&mut self, _seat: usize, _item: usize, _offset: u32, _text: String) {}
        fn done(&mut self, _seat: usize, results: Vec<ItemResult>) {
            self.0 = Some(results);
        }
    }

    /// A backend on 127.0.0.1 that answers every completion with "hi"; its address.
    fn backend() -> SocketAddr {
        backend_with_idle_close(None)
    }

    /// [`backend`], closing a connection once it has been idle for `idle_close` (a
    /// keep-alive timeout, with no `Connection: close` said) when that is set.
    fn backend_with_idle_close(idle_close: Option<Duration>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Some(timeout) = idle_close {
                    stream.set_read_timeout(Some(timeout)).unwrap();
                }
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(&stream);
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            let mut body = vec![0; length];
                            reader.read_exact(&mut body).unwrap();
                            let answer =
                                r#"{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}"#;
                            let _ = (&stream).write_all(
                                format!(
                                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                                    answer.len()
                                )
                                .as_bytes(),
                            );
                        }
                    }
                });
            }
        });
        addr
    }

    /// A port on 127.0.0.1 where nothing listens (connecting is refused).
    fn refused() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// An upstream client for `base` with a one-seat loop over it.
    fn mux_for(base: String) -> Mux {
        let client = client(&base, false, Duration::from_secs(2), Duration::from_secs(5));
        let stop = Arc::new(AtomicBool::new(false));
        Mux::new(client.into(), 1, stop).unwrap()
    }

    /// One completion item routed to model `m`.
    fn one_item() -> [BatchItem; 1] {
        let work = Work {
            kind: Kind::Completion,
            prompt: "x".into(),
            max_tokens: 2,
            model: Some("m".into()),
            ..Work::default()
        };
        [BatchItem::new(
            Ticket {
                index: 0,
                generation: 0,
            },
            work,
        )]
    }

    /// Starts `items` on `mux` and turns it until the batch ends; its results.
    fn run_batch(mux: &mut Mux, items: &[BatchItem]) -> Vec<ItemResult> {
        let mut done = Done::default();
        mux.start(0, items, &mut done);
        let until = Instant::now() + Duration::from_secs(10);
        while done.0.is_none() && Instant::now() < until {
            mux.turn(Duration::from_millis(100), &mut done);
        }
        done.0.expect("the batch ends")
    }

    #[test]
    fn a_connection_closed_while_the_loop_did_not_poll_is_not_reused() {
        // The backend closes a connection idle for 20 ms. The loop does not poll between
        // the two batches (as under load, when jobs keep coming), so no event tells it of
        // the close: only the peek before reuse does. Without it the second request goes
        // out on the closed connection and fails after it was written whole.
        let live = backend_with_idle_close(Some(Duration::from_millis(20)));
        let mut mux = mux_for(format!("http://{live}"));
        let items = one_item();
        for round in 0..2 {
            match &run_batch(&mut mux, &items)[..] {
                [(0, Ok(Output::Text { text, .. }))] => assert_eq!(text, "hi"),
                other => panic!("round {round}: {other:?}"),
            }
            // Longer than the backend's idle timeout and `PEEK_AFTER_IDLE`.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn a_refused_address_of_a_name_moves_on_to_its_next() {
        let live = backend();
        let mut mux = mux_for(format!("http://backend.test:{}", live.port()));
        // The name's first address refuses (an IPv4-only backend behind `localhost`, whose
        // first address is often `::1`); its second answers.
        let first = SocketAddr::new(live.ip(), refused().port());
        mux.names
            .seed(&format!("backend.test:{}", live.port()), vec![first, live]);
        match &run_batch(&mut mux, &one_item())[..] {
            [(0, Ok(Output::Text { text, .. }))] => assert_eq!(text, "hi"),
            other => panic!("{other:?}"),
        }
    }
}
