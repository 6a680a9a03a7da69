//! The engine thread: the only owner of the scheduling core in the live runtime.
//!
//! Each turn it reads the clock once, drains submitter rings (highest priority first),
//! drains worker results, polls the core and carries out its actions, then idles per policy
//! until the core's next deadline or a doorbell. After start-up it must not allocate, lock
//! (other than `try_lock` to publish a snapshot), or block; `tests/no_alloc.rs` checks the
//! allocation part over 100,000 requests.

use super::clock::Clock;
use super::doorbell::Doorbell;
use super::idle::Idler;
use super::messages::{
    BatchMsg, Completion, Control, Event, FromWorker, Outcome, Reply, RequestError, ResultMsg,
    Submission, ToWorker,
};
use super::ring::{Consumer, Producer};
use super::snapshot::{WorkerSnapshot, SNAPSHOT_INTERVAL_NS};
use super::Shared;
use crate::core::{
    Action, BatchOutcome, Completion as CoreCompletion, Core, FailReason, Nanos, Priority,
    BUCKET_COUNT, CLASS_COUNT,
};
use crate::exec::{BatchItem, Work};
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Samples buffered between publishes (latencies and batch sizes each).
const SAMPLE_BUFFER: usize = 16 * 1024;

/// The `tag_slots` key of a tag: its low 32 bits (io threads put a slab index there and a
/// generation above; the live check compares the whole tag).
fn tag_key(tag: u64) -> usize {
    (tag & 0xffff_ffff) as usize
}

/// Which sample buffer a value goes to.
#[derive(Clone, Copy)]
enum SampleKind {
    Latency,
    BatchSize,
}

/// Most submissions admitted per turn, so results keep flowing under a flood.
const ADMIT_BUDGET_PER_TURN: usize = 4096;

/// The engine's end of one submitter.
pub struct SubmitterLink {
    /// One ring per class, indexed by `class_index(priority, bucket)`.
    pub inputs: Vec<Consumer<Submission>>,
    pub completions: Producer<Completion>,
    /// Called after completions were pushed in a turn (e.g. a mio Waker); `None` for
    /// submitters that poll.
    pub wake: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Bit `c` is set by the submitter after it pushes into `inputs[c]` (Release), and taken
    /// by the engine with a swap (Acquire), so an idle submitter costs one load per turn
    /// instead of a look at every ring.
    pub ready: Arc<AtomicU32>,
    /// Engine-local: classes that may still hold items (taken from `ready`, not yet drained).
    pub unread: u32,
    /// Tags whose client went away (a closed connection): best-effort cancellation.
    pub cancels: Consumer<u64>,
    /// Engine-local: table slot of each live tagged request by tag, for tags below its
    /// length (io threads' tags are small slab indices); `u32::MAX` when none.
    pub tag_slots: Vec<u32>,
}

/// A request the engine holds between admission and its answer, by table slot.
pub(super) struct PendingSlot {
    /// The client went away: cancel at the next opportunity.
    pub(super) cancelled: bool,
    pub(super) work: Option<Work>,
    pub(super) reply: Option<Reply>,
    pub(super) submitter: u16,
    pub(super) arrival_ns: Nanos,
    /// Continuous batching: when the first output token was sampled (0: not yet).
    pub(super) first_token_ns: Nanos,
}

/// The engine's end of one worker.
pub struct WorkerLink {
    pub batches: Producer<ToWorker>,
    pub results: Consumer<FromWorker>,
    pub bell: Arc<Doorbell>,
}

/// Everything except the scheduler, so closures over it can run while the scheduler is
/// borrowed. Shared by the request-level engine and the continuous one.
pub(super) struct EngineIo {
    pub(super) clock: Clock,
    pub(super) shared: Arc<Shared>,
    pub(super) submitters: Vec<SubmitterLink>,
    /// Submitters that got completions this turn and need a wake.
    needs_wake: Vec<bool>,
    pub(super) pending: Vec<PendingSlot>,
    pub(super) workers: Vec<WorkerLink>,
    free_bufs: Vec<Vec<BatchItem>>,
    /// Latencies (ns) and batch sizes recorded since the last publish. Moved into the
    /// snapshot's histograms at publish time, so publishing costs O(new samples), not
    /// O(histogram size). Capacity fixed at start; when full, the engine publishes at once.
    pub(super) new_latencies_ns: Vec<u64>,
    pub(super) new_batch_sizes: Vec<u64>,
    /// Samples that could not be published because a reader held the snapshot lock while
    /// the buffers were full (exported, expected to stay 0).
    pub(super) samples_dropped: u64,
    pub(super) published_at_ns: Nanos,
}

/// The engine: core plus its I/O.
pub struct Engine {
    core: Core,
    io: EngineIo,
    idler: Idler,
    drain_deadline_ns: Option<Nanos>,
    /// Set once the drain deadline passed and everything left was aborted.
    aborted: bool,
    /// Tells workers (and their executors) to cut work short and exit.
    stop: Arc<AtomicBool>,
}

impl Engine {
    /// Builds the engine; every buffer it will use is allocated here.
    pub fn new(
        core: Core,
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink>,
        idler: Idler,
        max_submitters: usize,
        stop: Arc<AtomicBool>,
    ) -> Engine {
        let cfg = core.config().clone();
        let batch_len = core.max_batch_len();
        let slots = workers.len() * cfg.max_inflight_per_worker as usize;
        let io = EngineIo::new(
            clock,
            shared,
            workers,
            max_submitters,
            cfg.queue_capacity,
            slots,
            batch_len,
        );
        Engine {
            core,
            io,
            idler,
            drain_deadline_ns: None,
            aborted: false,
            stop,
        }
    }

    /// Runs until drained (after a `Drain` control) and every batch has come back.
    pub fn run(mut self) {
        self.io.shared.engine_bell.bind_current();
        loop {
            let now = self.io.clock.now();
            let mut worked = self.io.accept_submitters();
            worked |= self.read_controls(now);
            worked |= self.admit_submissions(now);
            worked |= self.drain_cancels(now);
            worked |= self.drain_results(now);
            if let Some(deadline) = self.drain_deadline_ns {
                if now >= deadline && !self.aborted && !self.core.is_idle() {
                    let io = &mut self.io;
                    self.core.abort_all(now, &mut |a| io.act(now, a));
                    self.aborted = true;
                    // Executors still running abandoned batches may stop early now.
                    self.stop.store(true, Ordering::Release);
                }
            }
            let mut dispatched = false;
            let io = &mut self.io;
            let next = self.core.poll(now, &mut |a| {
                dispatched = true;
                io.act(now, a)
            });
            worked |= dispatched;
            self.io.flush_wakes();
            if now.saturating_sub(self.io.published_at_ns) >= SNAPSHOT_INTERVAL_NS {
                self.publish(now);
            }
            // Done when drained; after an abort, do not wait for abandoned batches.
            let finished = self.core.is_idle() || (self.aborted && self.core.live_requests() == 0);
            if self.drain_deadline_ns.is_some()
                && finished
                && self.io.shared.entering.load(Ordering::SeqCst) == 0
                && !self.io.any_input()
            {
                self.publish(now);
                return;
            }
            if worked {
                self.idler.busy();
            } else {
                let io = &self.io;
                let deadline = next.map(|n| io.clock.instant(n));
                self.idler.idle(
                    io.clock.instant(now),
                    deadline,
                    &io.shared.engine_bell,
                    || io.has_work(),
                );
            }
        }
    }

    fn read_controls(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        while let Some(c) = self.io.shared.control.pop() {
            worked = true;
            match c {
                Control::SetStrategy(kind) => self.core.set_strategy(kind),
                Control::Drain { deadline_ns } => {
                    // Admit what is already in the rings before refusing new work.
                    self.admit_all(now);
                    self.core.begin_drain();
                    self.drain_deadline_ns = Some(deadline_ns);
                }
            }
        }
        worked
    }

    fn admit_all(&mut self, now: Nanos) {
        while self.admit_submissions(now) {}
    }

    /// Admits up to the per-turn budget, highest priority first across all submitters.
    fn admit_submissions(&mut self, now: Nanos) -> bool {
        let core = &mut self.core;
        self.io
            .drain_submissions(|io, s, sub| Self::admit_one(core, io, now, s, sub))
    }

    fn admit_one(core: &mut Core, io: &mut EngineIo, now: Nanos, submitter: u16, sub: Submission) {
        let Submission { meta, work, reply } = sub;
        match core.admit(now, meta) {
            Ok(ticket) => {
                let tag = match reply {
                    Reply::Tag(t) => Some(t),
                    Reply::Waiter(_) => None,
                };
                io.note_admitted(submitter, tag, ticket.index);
                let slot = &mut io.pending[ticket.index as usize];
                debug_assert!(slot.reply.is_none(), "pending slot reused while live");
                slot.work = Some(work);
                slot.reply = Some(reply);
                slot.submitter = submitter;
                slot.arrival_ns = meta.arrival_ns;
            }
            Err(reject) => {
                drop(work);
                io.send(submitter, reply, Err(RequestError::Rejected(reject)));
            }
        }
    }

    /// Cancels requests whose client went away: a queued one is removed and answered
    /// (cancelled); a dispatched one runs to completion (its batch is already out).
    fn drain_cancels(&mut self, now: Nanos) -> bool {
        let core = &mut self.core;
        self.io.drain_cancels(|io, index| {
            let ticket = core.ticket_of(index);
            if let Some(ticket) = ticket {
                if core.cancel(ticket) {
                    io.finish(now, index, Err(RequestError::Failed(FailReason::Cancelled)));
                }
            }
        })
    }

    fn drain_results(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        for w in 0..self.io.workers.len() {
            while let Some(msg) = self.io.workers[w].results.pop() {
                let FromWorker::Batch(ResultMsg {
                    batch,
                    mut items,
                    result,
                }) = msg
                else {
                    unreachable!("request-level engine sent no steps");
                };
                worked = true;
                let outcome = if result.is_ok() {
                    BatchOutcome::Ok
                } else {
                    BatchOutcome::Failed
                };
                match self.core.complete(now, batch, outcome) {
                    CoreCompletion::Deliver => {
                        let error = result.err().map(|e| e.to_string());
                        for item in items.drain(..) {
                            let answer: Outcome = match (&error, item.output) {
                                (None, Some(out)) => Ok(out),
                                (None, None) => {
                                    Err(RequestError::Worker("executor gave no output".into()))
                                }
                                (Some(e), _) => Err(RequestError::Worker(e.clone())),
                            };
                            self.io.finish(now, item.ticket.index, answer);
                        }
                    }
                    CoreCompletion::Stale => items.clear(),
                }
                self.io.free_bufs.push(items);
            }
        }
        worked
    }

    fn publish(&mut self, now: Nanos) {
        self.io.published_at_ns = now;
        let Ok(mut snap) = self.io.shared.snapshot.try_lock() else {
            return;
        };
        snap.at_ns = now;
        snap.stats = *self.core.stats();
        snap.strategy = self.core.strategy();
        for c in 0..CLASS_COUNT {
            snap.queued_by_class[c] = self.core.queued_in_class(c);
        }
        snap.queued = self.core.queued();
        snap.live_requests = self.core.live_requests();
        snap.observed_p99_ns = self.core.observed_p99_ns();
        for (dst, w) in snap.workers.iter_mut().zip(self.core.workers()) {
            *dst = WorkerSnapshot::from_view(w, now);
        }
        EngineIo::move_samples(&mut self.io.new_latencies_ns, &mut snap.latency);
        EngineIo::move_samples(&mut self.io.new_batch_sizes, &mut snap.batch_size);
        snap.samples_dropped = self.io.samples_dropped;
        snap.rejected_busy = self.io.shared.rejected_busy.load(Ordering::Relaxed);
        snap.draining = self.core.is_draining();
        snap.research = self.core.research_snapshot();
    }
}

impl EngineIo {
    /// I/O state for `workers` with a pending table of `table_capacity` slots and
    /// `batch_bufs` batch buffers of capacity `batch_len` (0 of them for continuous mode).
    pub(super) fn new(
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink>,
        max_submitters: usize,
        table_capacity: usize,
        batch_bufs: usize,
        batch_len: usize,
    ) -> EngineIo {
        EngineIo {
            clock,
            shared,
            submitters: Vec::with_capacity(max_submitters),
            needs_wake: Vec::with_capacity(max_submitters),
            pending: (0..table_capacity.max(1))
                .map(|_| PendingSlot {
                    cancelled: false,
                    work: None,
                    reply: None,
                    submitter: 0,
                    arrival_ns: 0,
                    first_token_ns: 0,
                })
                .collect(),
            workers,
            free_bufs: (0..batch_bufs)
                .map(|_| Vec::with_capacity(batch_len))
                .collect(),
            new_latencies_ns: Vec::with_capacity(SAMPLE_BUFFER),
            new_batch_sizes: Vec::with_capacity(SAMPLE_BUFFER),
            samples_dropped: 0,
            published_at_ns: 0,
        }
    }

    /// Pops submissions, highest priority first across submitters, up to the per-turn
    /// budget, handing each to `admit(io, submitter, submission)`. True if any.
    pub(super) fn drain_submissions(
        &mut self,
        mut admit: impl FnMut(&mut EngineIo, u16, Submission),
    ) -> bool {
        let mut any = 0u32;
        for link in self.submitters.iter_mut() {
            // Acquire: pairs with the submitter's Release fetch_or after its push.
            link.unread |= link.ready.swap(0, Ordering::Acquire);
            any |= link.unread;
        }
        if any == 0 {
            return false;
        }
        let mut budget = ADMIT_BUDGET_PER_TURN;
        let mut worked = false;
        for p in Priority::HIGHEST_FIRST {
            let priority_bits = ((1u32 << BUCKET_COUNT) - 1) << (p.index() * BUCKET_COUNT);
            for s in 0..self.submitters.len() {
                let mut classes = self.submitters[s].unread & priority_bits;
                while classes != 0 && budget > 0 {
                    let class = classes.trailing_zeros() as usize;
                    classes &= classes - 1;
                    while budget > 0 {
                        let Some(sub) = self.submitters[s].inputs[class].pop() else {
                            self.submitters[s].unread &= !(1 << class);
                            break;
                        };
                        budget -= 1;
                        worked = true;
                        admit(self, s as u16, sub);
                    }
                }
            }
        }
        worked
    }

    /// Remembers that table slot `index` now holds the request of `reply` (for cancels).
    pub(super) fn note_admitted(&mut self, submitter: u16, reply_tag: Option<u64>, index: u32) {
        self.pending[index as usize].cancelled = false;
        if let Some(tag) = reply_tag {
            if let Some(t) = self.submitters[submitter as usize]
                .tag_slots
                .get_mut(tag_key(tag))
            {
                *t = index;
            }
        }
    }

    /// Takes the cancellations submitters sent, calling `cancel(io, table index)` for each
    /// request that is still live.
    pub(super) fn drain_cancels(&mut self, mut cancel: impl FnMut(&mut EngineIo, u32)) -> bool {
        let mut worked = false;
        for s in 0..self.submitters.len() {
            while let Some(tag) = self.submitters[s].cancels.pop() {
                worked = true;
                let index = match self.submitters[s].tag_slots.get(tag_key(tag)) {
                    Some(&i) if i != u32::MAX => Some(i),
                    // A tag beyond the map (not an io thread's): look it up the slow way.
                    _ => self
                        .pending
                        .iter()
                        .position(|p| {
                            matches!(p.reply, Some(Reply::Tag(t)) if t == tag)
                                && p.submitter as usize == s
                        })
                        .map(|i| i as u32),
                };
                let Some(index) = index else { continue };
                let p = &self.pending[index as usize];
                let live =
                    matches!(p.reply, Some(Reply::Tag(t)) if t == tag) && p.submitter as usize == s;
                if live {
                    self.pending[index as usize].cancelled = true;
                    cancel(self, index);
                }
            }
        }
        worked
    }

    /// Takes newly registered submitters.
    pub(super) fn accept_submitters(&mut self) -> bool {
        let mut worked = false;
        while self.submitters.len() < self.submitters.capacity() {
            let Some(link) = self.shared.registrations.pop() else {
                break;
            };
            self.submitters.push(link);
            self.needs_wake.push(false);
            worked = true;
        }
        worked
    }

    /// Carries out one core action.
    fn act(&mut self, now: Nanos, action: Action<'_>) {
        match action {
            Action::Dispatch {
                worker,
                batch,
                tickets,
                ..
            } => {
                let mut items = self
                    .free_bufs
                    .pop()
                    .expect("one buffer per batch slot: a dispatch always finds one");
                for t in tickets {
                    let work = self.pending[t.index as usize]
                        .work
                        .take()
                        .expect("a queued request still holds its work");
                    items.push(BatchItem::new(*t, work));
                }
                self.record_sample(SampleKind::BatchSize, tickets.len() as u64);
                let link = &mut self.workers[worker];
                if link
                    .batches
                    .push(ToWorker::Batch(BatchMsg { batch, items }))
                    .is_err()
                {
                    unreachable!("worker ring sized to max_inflight_per_worker");
                }
                link.bell.ring();
            }
            Action::Fail { ticket, reason } => {
                self.finish(now, ticket.index, Err(RequestError::Failed(reason)));
            }
        }
    }

    /// Answers the request in table slot `index`.
    pub(super) fn finish(&mut self, now: Nanos, index: u32, outcome: Outcome) {
        let slot = &mut self.pending[index as usize];
        let reply = slot
            .reply
            .take()
            .expect("every live request has exactly one reply");
        slot.work = None;
        let submitter = slot.submitter;
        if outcome.is_ok() {
            let latency_ns = now.saturating_sub(slot.arrival_ns).max(1);
            self.record_sample(SampleKind::Latency, latency_ns);
        }
        self.send(submitter, reply, outcome);
    }

    /// Sends a token of a streaming request (table slot `index`) to its submitter, if the
    /// submitter's ring has room beyond what its final answers need. Skipped tokens are not
    /// lost: the final output carries the whole text.
    pub(super) fn send_token(&mut self, slot_index: u32, offset: u32, text: String) {
        let slot = &self.pending[slot_index as usize];
        let Some(Reply::Tag(tag)) = slot.reply else {
            return;
        };
        if !slot.work.as_ref().is_some_and(|w| w.stream) {
            return;
        }
        let s = slot.submitter as usize;
        let link = &mut self.submitters[s];
        // The ring holds 2x the submitter's in-flight limit; keep half for final answers.
        if link.completions.free_slots() <= link.completions.capacity() / 2 {
            return;
        }
        if link
            .completions
            .push(Completion {
                tag,
                event: Event::Token { offset, text },
            })
            .is_ok()
        {
            self.needs_wake[s] = true;
        }
    }

    /// Buffers one sample for the next publish; a full buffer is flushed into the snapshot
    /// at once (`try_lock`: if a reader holds the lock, the sample is counted as dropped).
    fn record_sample(&mut self, kind: SampleKind, value: u64) {
        let full = match kind {
            SampleKind::Latency => self.new_latencies_ns.len() == self.new_latencies_ns.capacity(),
            SampleKind::BatchSize => self.new_batch_sizes.len() == self.new_batch_sizes.capacity(),
        };
        if full && !self.flush_samples() {
            self.samples_dropped += 1;
            return;
        }
        match kind {
            SampleKind::Latency => self.new_latencies_ns.push(value),
            SampleKind::BatchSize => self.new_batch_sizes.push(value),
        }
    }

    /// Moves buffered samples into the snapshot's histograms. False if the lock was busy.
    fn flush_samples(&mut self) -> bool {
        let Ok(mut snap) = self.shared.snapshot.try_lock() else {
            return false;
        };
        Self::move_samples(&mut self.new_latencies_ns, &mut snap.latency);
        Self::move_samples(&mut self.new_batch_sizes, &mut snap.batch_size);
        true
    }

    pub(super) fn move_samples(samples: &mut Vec<u64>, into: &mut Histogram<u64>) {
        for &v in samples.iter() {
            let _ = into.record(v);
        }
        samples.clear();
    }

    /// Delivers an outcome to its reply target.
    pub(super) fn send(&mut self, submitter: u16, reply: Reply, outcome: Outcome) {
        match reply {
            Reply::Waiter(w) => w.complete(outcome),
            Reply::Tag(tag) => {
                let s = submitter as usize;
                // The submitter reuses a key only after it got this final answer, so the key
                // still maps to this request here.
                if let Some(t) = self.submitters[s].tag_slots.get_mut(tag_key(tag)) {
                    *t = u32::MAX;
                }
                if self.submitters[s]
                    .completions
                    .push(Completion {
                        tag,
                        event: Event::Done(outcome),
                    })
                    .is_err()
                {
                    unreachable!("submitter in-flight limit equals its completion ring size");
                }
                self.needs_wake[s] = true;
            }
        }
    }

    /// Wakes each submitter that got completions this turn, once.
    pub(super) fn flush_wakes(&mut self) {
        for (s, flag) in self.needs_wake.iter_mut().enumerate() {
            if std::mem::take(flag) {
                if let Some(wake) = &self.submitters[s].wake {
                    wake();
                }
            }
        }
    }

    /// Any submission waiting in a ring?
    pub(super) fn any_input(&self) -> bool {
        self.submitters
            .iter()
            .any(|s| s.unread != 0 || s.ready.load(Ordering::Relaxed) != 0)
    }

    /// Anything at all for the engine to do (the doorbell's re-check).
    pub(super) fn has_work(&self) -> bool {
        !self.shared.control.is_empty()
            || self.submitters.iter().any(|s| !s.cancels.is_empty())
            || !self.shared.registrations.is_empty()
            || self.any_input()
            || self.workers.iter().any(|w| !w.results.is_empty())
    }
}
