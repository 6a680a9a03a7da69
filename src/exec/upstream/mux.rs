//! The `upstream` executor as an event loop: every batch of a backend's workers runs on one
//! thread, over non-blocking keep-alive connections (mio), one request per connection at a
//! time, as many connections as requests in flight. A worker thread per request in flight
//! spent most of a forwarded request's CPU on waking and sleeping (BENCHMARKS.md, "The proxy
//! path"); here a request costs a write, a read and a parse.
//!
//! A batch is planned as on a thread (`executor::plan`: array requests, chats and streams on
//! their own); each request goes on an idle connection to the batch's address or a new one.
//! A reused connection that fails before any byte of the answer (the backend closed it while
//! it was idle) is retried once on a new connection; nothing else is retried. A host name is
//! looked up on this thread the first time a connection is opened, and refreshed by a thread
//! of its own after that (`resolve::NameCache`): only the first lookup holds the loop.
//!
//! What must never happen here: a blocking socket call, a batch never reported done, a
//! request started after `stop` is set, a body read past `RESPONSE_BYTES_MAX`, or a token
//! piece relayed out of order.

use super::client::{Call, UpstreamClient, RESPONSE_BYTES_MAX};
use super::executor::CONCURRENT_REQUESTS_MAX;
use super::executor::{answer, plan, BackendRequest, StreamState};
use super::http1::{self, ResponseReader};
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
    /// Connections with events this turn, and whether each was readable (reused across
    /// turns).
    ready: Vec<(usize, bool)>,
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
    /// On a connection that carried an earlier request (a failure before any answer byte
    /// is retried once, see the module doc).
    reused: bool,
    retried: bool,
    /// A 2xx stream: its state, event bytes not yet a whole event, and its output once
    /// `[DONE]` came.
    stream: Option<Stream>,
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
        })
    }

    /// Sends `job` of `seat`'s batch, on an idle connection or a new one.
    fn send(
        &mut self,
        seat: usize,
        client: &UpstreamClient,
        job: BackendRequest,
        retried: bool,
        progress: &mut dyn Progress,
    ) {
        let now = Instant::now();
        let timeouts = client.timeouts();
        let mut out = Vec::with_capacity(job.body.len() + 256);
        http1::post(
            &mut out,
            authority(client.base_url()),
            job.shape.path(),
            client.authorization(),
            &job.body,
        );
        let mut exchange = Box::new(Exchange {
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
            retried,
            stream: None,
        });
        let index = match self.take_idle(client.base_url()) {
            Some(index) => {
                exchange.reused = true;
                index
            }
            None => match self.connect(client.base_url()) {
                Ok(index) => {
                    exchange.connected = false;
                    index
                }
                Err(e) => {
                    let call = Call::new(&exchange.client, "POST", exchange.job.shape.path());
                    let error = call.io_error(e);
                    self.answer(exchange, Err(error), progress);
                    return;
                }
            },
        };
        let conn = self.conns[index].as_mut().expect("a connection just taken");
        conn.exchange = Some(exchange);
        // Write at once: a kept-alive connection is writable, and a new one says so later.
        self.ready(index, false, progress);
    }

    /// An idle connection to `base`, if one is open.
    fn take_idle(&mut self, base: &str) -> Option<usize> {
        while let Some(index) = self.idle.pop() {
            match &self.conns[index] {
                Some(c) if c.exchange.is_none() && c.base == base => return Some(index),
                Some(c) if c.exchange.is_none() => self.close(index),
                _ => {}
            }
        }
        None
    }

    /// Opens a connection to `base` (its index), registered for both directions.
    fn connect(&mut self, base: &str) -> io::Result<usize> {
        let addr = self.address(base)?;
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
        });
        Ok(index)
    }

    /// The socket address of `base` (`http://host:port`): see `resolve::NameCache`.
    fn address(&mut self, base: &str) -> io::Result<SocketAddr> {
        if !base.starts_with("http://") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "only http:// backends are supported",
            ));
        }
        self.names.address(authority(base))
    }

    fn close(&mut self, index: usize) {
        if let Some(mut conn) = self.conns[index].take() {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.free.push(index);
        }
    }

    /// Moves connection `index` on: connects, writes, reads, finishes its exchange.
    /// `readable`: the poll said so. A request written whole here is not followed by a read
    /// unless it was (its answer cannot be there yet; it will come as an event).
    fn ready(&mut self, index: usize, readable: bool, progress: &mut dyn Progress) {
        let Some(conn) = self.conns[index].as_mut() else {
            return;
        };
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
                Ok(Some(e)) | Err(e) => return self.fail_io(index, e, progress),
            }
            match conn.stream.peer_addr() {
                Ok(_) => {
                    ex.connected = true;
                    let _ = conn.stream.set_nodelay(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => return self.fail_io(index, e, progress),
            }
        }
        let writing = ex.written < ex.out.len();
        while ex.written < ex.out.len() {
            match conn.stream.write(&ex.out[ex.written..]) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "the backend took no bytes");
                    return self.fail_io(index, e, progress);
                }
                Ok(n) => ex.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.fail_io(index, e, progress),
            }
        }
        if writing && !readable {
            return;
        }
        loop {
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
                if n == 0 && self.retry(index, progress) {
                    return;
                }
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
            if n == 0 {
                return;
            }
        }
    }

    /// Retries connection `index`'s request on a new connection if it went on a reused one
    /// and nothing of the answer came; true if it did.
    fn retry(&mut self, index: usize, progress: &mut dyn Progress) -> bool {
        let conn = self.conns[index].as_mut().expect("a connection in use");
        let ex = conn.exchange.as_ref().expect("an exchange in use");
        if !ex.reused || ex.retried || ex.reader.started() {
            return false;
        }
        let ex = conn.exchange.take().expect("an exchange in use");
        self.close(index);
        let Exchange {
            seat, client, job, ..
        } = *ex;
        self.send(seat, &client, job, true, progress);
        true
    }

    fn fail_io(&mut self, index: usize, e: io::Error, progress: &mut dyn Progress) {
        if self.retry(index, progress) {
            return;
        }
        let conn = self.conns[index].as_ref().expect("a connection in use");
        let ex = conn.exchange.as_ref().expect("an exchange in use");
        let error = Call::new(&ex.client, "POST", ex.job.shape.path()).io_error(e);
        self.fail(index, error, progress);
    }

    /// Ends connection `index`'s exchange with `error` and closes the connection.
    fn fail(&mut self, index: usize, error: ExecError, progress: &mut dyn Progress) {
        let ex = self.conns[index]
            .as_mut()
            .and_then(|c| c.exchange.take())
            .expect("an exchange in use");
        self.close(index);
        self.answer(ex, Err(error), progress);
    }

    /// Connection `index`'s answer is whole: its items' results, and the connection kept
    /// if the backend keeps it.
    fn finish(&mut self, index: usize, progress: &mut dyn Progress) {
        let conn = self.conns[index].as_mut().expect("a connection in use");
        let mut ex = conn.exchange.take().expect("an exchange in use");
        if ex.reader.reusable() && self.idle.len() < IDLE_MAX {
            self.idle.push(index);
        } else {
            self.close(index);
        }
        let outcome = outcome(&mut ex);
        self.answer(ex, outcome, progress);
    }

    /// Records `outcome` for the exchange's items; sends the batch's next queued request,
    /// or reports the batch done once its last request is answered.
    fn answer(
        &mut self,
        ex: Box<Exchange>,
        outcome: Result<Vec<ItemResult>, ExecError>,
        progress: &mut dyn Progress,
    ) {
        let results = outcome.unwrap_or_else(|e| {
            ex.job
                .items
                .iter()
                .map(|i| (i.index, Err(e.clone())))
                .collect()
        });
        let seat = ex.seat;
        let Some(batch) = self.batches[seat].as_mut() else {
            debug_assert!(false, "an answer for seat {seat} without a batch");
            return;
        };
        batch.results.extend(results);
        batch.open -= 1;
        if let Some(job) = batch.queued.pop() {
            batch.open += 1;
            let client = batch.client.clone();
            return self.send(seat, &client, job, false, progress);
        }
        if batch.open == 0 {
            let batch = self.batches[seat].take().expect("the batch just answered");
            progress.done(seat, batch.results);
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

/// The results of a whole answer.
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
    if stream.output.is_some() {
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

/// `host:port` of `http://host:port` (what the `Host` header says).
fn authority(base: &str) -> &str {
    let rest = base.split_once("://").map_or(base, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
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
        // Acquire: pairs with the Release store at shutdown (see `executor::JobContext::run`).
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
            self.send(seat, &client, job, false, progress);
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
            }
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        ready.extend(
            self.events
                .iter()
                .filter(|e| e.token() != WAKE)
                .map(|e| (e.token().0 - 1, e.is_readable() || e.is_read_closed())),
        );
        let moved = !self.events.is_empty();
        for &(index, readable) in &ready {
            self.ready(index, readable, progress);
        }
        self.ready = ready;
        self.expire(Instant::now(), progress);
        moved
    }

    fn abandon(&mut self, progress: &mut dyn Progress) {
        for index in 0..self.conns.len() {
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
