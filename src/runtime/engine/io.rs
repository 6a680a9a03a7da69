//! The engine's I/O half: its end of every submitter (intake rings, completion ring,
//! cancels), the pending table (each admitted request's payload and reply target, by table
//! slot), its end of every worker, and the latency samples awaiting a publish.
//!
//! Shared by both batching modes; the scheduler (core or continuous) lives in the mode, so
//! closures over this can run while the scheduler is borrowed. Answers go out only through
//! [`EngineIo::send`], once per request. No allocation after [`EngineIo::new`] (error
//! messages excepted), no lock (other than `try_lock` on the snapshot), no blocking.

use super::pending::PendingTable;
use super::routing::RouteState;
use crate::core::{Nanos, Priority, Reject, RequestMeta, BUCKET_COUNT};
use crate::exec::{OutputSummary, Work};
use crate::router::Decision;
use crate::runtime::clock::Clock;
use crate::runtime::doorbell::Doorbell;
use crate::runtime::intake::{self, IntakeRx};
use crate::runtime::messages::{Event, Outcome, Reply, RequestError, Submission, TaggedEvent};
use crate::runtime::ready::ReadyMask;
use crate::runtime::reply_lane::ReplyLane;
use crate::runtime::ring::{Consumer, Producer};
use crate::runtime::snapshot::{FinishedStats, Snapshot};
use crate::runtime::telemetry::{TelemetryEvent, TelemetryTx};
use crate::runtime::worker::Job;
use crate::runtime::{sync, Shared};
use hdrhistogram::Histogram;
use std::sync::Arc;

/// Samples buffered between publishes (latencies and batch sizes each).
const SAMPLE_BUFFER: usize = 16 * 1024;

/// The `tag_slots` key of a tag: its low 32 bits (io threads put a slab index there and a
/// generation above; the live check compares the whole tag).
fn tag_key(tag: u64) -> usize {
    (tag & 0xffff_ffff) as usize
}

/// Records buffered samples into a snapshot histogram and empties the buffer.
pub(super) fn move_samples(samples: &mut Vec<u64>, into: &mut Histogram<u64>) {
    for &v in samples.iter() {
        let _ = into.record(v);
    }
    samples.clear();
}

/// A latency sample carries its request's priority in its top two bits (latencies are
/// below 2^62 ns, 146 years), so one buffer feeds the total and the per-priority histograms.
const PRIORITY_SHIFT: u32 = 62;
const _: () = assert!(Priority::COUNT <= 4);

/// A latency sample: `latency_ns` (clamped below 2^62) tagged with `priority`.
pub(super) fn latency_sample(latency_ns: u64, priority: Priority) -> u64 {
    latency_ns.min((1 << PRIORITY_SHIFT) - 1) | ((priority.index() as u64) << PRIORITY_SHIFT)
}

/// Records buffered latency samples ([`latency_sample`]) into the snapshot's total and
/// per-priority histograms and empties the buffer.
pub(super) fn move_latency_samples(samples: &mut Vec<u64>, snap: &mut Snapshot) {
    for &v in samples.iter() {
        let latency_ns = v & ((1 << PRIORITY_SHIFT) - 1);
        // Saturating: past `crate::latency_histogram::LATENCY_MAX_NS` a latency counts at the top.
        snap.latency.saturating_record(latency_ns);
        snap.latency_by_priority[(v >> PRIORITY_SHIFT) as usize].saturating_record(latency_ns);
    }
    samples.clear();
}

/// Which sample buffer a value goes to.
#[derive(Clone, Copy)]
pub(super) enum SampleKind {
    Latency,
    BatchSize,
}

/// Most submissions admitted per turn, so results keep flowing under a flood.
pub(super) const ADMIT_BUDGET_PER_TURN: usize = 4096;

/// The engine's end of one submitter.
pub struct SubmitterLink {
    /// One ring per class, indexed by `class_index(priority, bucket)`, with its ready mask.
    pub intake: IntakeRx<Submission>,
    pub completions: Producer<TaggedEvent>,
    /// Called after completions were pushed in a turn (e.g. a mio Waker); `None` for
    /// submitters that poll.
    pub wake: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Tags whose client went away (a closed connection): best-effort cancellation.
    pub cancels: Consumer<u64>,
    /// Engine-local: table slot of each live tagged request by tag, for tags below its
    /// length (io threads' tags are small slab indices); `u32::MAX` when none.
    pub tag_slots: Vec<u32>,
    /// Engine-local: submissions taken from `intake` and not yet answered (by the engine or,
    /// as far as the engine knows, by a worker).
    pub live: u32,
    /// Where workers answer this submitter's requests directly, when it has a `wake`
    /// (`runtime::direct_reply`).
    pub lane: Arc<ReplyLane<TaggedEvent>>,
}

impl SubmitterLink {
    /// The submitter was dropped and everything it submitted is answered: its place can go
    /// to a new submitter.
    fn is_retired(&self) -> bool {
        self.live == 0 && self.intake.is_closed_and_empty()
    }
}

/// The engine's end of one worker: jobs out, replies back, the worker's doorbell.
pub struct WorkerLink<J: Job> {
    pub jobs: Producer<J>,
    pub replies: Consumer<J::Reply>,
    /// The mask the worker marks after each push into `replies`: one mask, shared by every
    /// worker link of an engine (`runtime::ready`).
    pub replies_ready: sync::Arc<ReadyMask>,
    pub bell: sync::Arc<Doorbell>,
}

/// Everything except the scheduler, so closures over it can run while the scheduler is
/// borrowed. Shared by the request-level engine and the continuous one; `J` is the mode's
/// worker job.
pub struct EngineIo<J: Job> {
    pub(super) clock: Clock,
    pub(super) shared: Arc<Shared>,
    /// Registered submitters by place (`PendingSlot::submitter`); a retired one's place is
    /// reused.
    pub(super) submitters: Vec<SubmitterLink>,
    max_submitters: usize,
    /// Submitters that got completions this turn and need a wake.
    needs_wake: Vec<bool>,
    pub(super) pending: PendingTable,
    pub(super) workers: Vec<WorkerLink<J>>,
    /// The workers' reply mask (every link's `replies_ready`): which reply rings to pop.
    pub(super) replies_ready: sync::Arc<ReadyMask>,
    /// Latencies (ns) and batch sizes recorded since the last publish. Moved into the
    /// snapshot's histograms at publish time, so publishing costs O(new samples), not
    /// O(histogram size). Capacity fixed at start; when full, the engine publishes at once.
    pub(super) new_latencies_ns: Vec<u64>,
    pub(super) new_batch_sizes: Vec<u64>,
    /// Samples that could not be published because a reader held the snapshot lock while
    /// the buffers were full (exported, expected to stay 0).
    pub(super) samples_dropped: u64,
    pub(super) published_at_ns: Nanos,
    /// Tokens and finish reasons of answered requests (copied into each snapshot).
    pub(super) finished: FinishedStats,
    /// The engine's end of the telemetry queue (`/events`).
    pub(super) telemetry: TelemetryTx,
}

impl<J: Job> EngineIo<J> {
    /// I/O state for `workers` with a pending table of a segment per lane of these
    /// capacities (`PendingTable`).
    pub(super) fn new(
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink<J>>,
        max_submitters: usize,
        pending_lanes: &[usize],
    ) -> EngineIo<J> {
        assert!(
            workers
                .iter()
                .all(|w| sync::Arc::ptr_eq(&w.replies_ready, &workers[0].replies_ready)),
            "every worker link marks the same reply mask"
        );
        EngineIo {
            clock,
            shared,
            submitters: Vec::with_capacity(max_submitters),
            max_submitters,
            needs_wake: Vec::with_capacity(max_submitters),
            pending: PendingTable::new(pending_lanes),
            replies_ready: workers.first().map_or_else(
                || sync::Arc::new(ReadyMask::new()),
                |w| w.replies_ready.clone(),
            ),
            workers,
            new_latencies_ns: Vec::with_capacity(SAMPLE_BUFFER),
            new_batch_sizes: Vec::with_capacity(SAMPLE_BUFFER),
            samples_dropped: 0,
            published_at_ns: 0,
            finished: FinishedStats::default(),
            telemetry: TelemetryTx::new(),
        }
    }

    /// Pops submissions, highest priority first across submitters, up to the per-turn
    /// budget, handing each to `admit(io, submitter, submission)`. True if any.
    pub(super) fn drain_submissions(
        &mut self,
        mut admit: impl FnMut(&mut EngineIo<J>, u16, Submission),
    ) -> bool {
        let mut any = 0u32;
        for link in self.submitters.iter_mut() {
            any |= link.intake.take_ready();
        }
        if any == 0 {
            return false;
        }
        let mut budget = ADMIT_BUDGET_PER_TURN;
        let mut worked = false;
        for p in Priority::HIGHEST_FIRST {
            let priority_bits = ((1u32 << BUCKET_COUNT) - 1) << (p.index() * BUCKET_COUNT);
            if any & priority_bits == 0 {
                // No submitter's ring of this priority may hold anything (`any` is every
                // unread class): nothing to pop.
                continue;
            }
            for s in 0..self.submitters.len() {
                while budget > 0 {
                    let link = &mut self.submitters[s];
                    let Some(sub) = link.intake.pop(priority_bits) else {
                        break;
                    };
                    link.live += 1;
                    budget -= 1;
                    worked = true;
                    admit(self, s as u16, sub);
                }
            }
        }
        worked
    }

    /// Puts a request just admitted (or moved) into table slot `index`, and remembers its
    /// tag's slot for cancels. Always inlined: out of line, its work and route arguments
    /// are copied once more (callgrind: ~120 instructions a request).
    #[inline(always)]
    pub(super) fn occupy(
        &mut self,
        index: u32,
        submitter: u16,
        reply: Reply,
        work: Work,
        meta: RequestMeta,
        route: RouteState,
    ) {
        if let Some(tag) = reply.tag() {
            if let Some(t) = self.submitters[submitter as usize]
                .tag_slots
                .get_mut(tag_key(tag))
            {
                *t = index;
            }
        }
        let slot = self.pending.take_place(index);
        debug_assert!(slot.reply.is_none(), "pending slot reused while live");
        slot.cancelled = false;
        slot.stream = work.stream;
        slot.tokens_sent = false;
        slot.first_token_ns = 0;
        slot.dispatched_ns = 0;
        slot.work = Some(work);
        slot.reply = Some(reply);
        slot.submitter = submitter;
        slot.meta = meta;
        slot.route = route;
        slot.direct_batch = u32::MAX;
    }

    /// Takes the cancellations submitters sent, calling `cancel(io, table index)` for each
    /// request that is still live.
    pub(super) fn drain_cancels(&mut self, mut cancel: impl FnMut(&mut EngineIo<J>, u32)) -> bool {
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
                        .find(|(_, p)| {
                            matches!(p.reply, Some(Reply::Tag(t)) if t == tag)
                                && p.submitter as usize == s
                        })
                        .map(|(i, _)| i),
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

    /// Takes newly registered submitters, each in a new place or in the place of a retired
    /// one (see [`SubmitterLink::is_retired`]).
    pub(super) fn accept_submitters(&mut self) -> bool {
        let mut worked = false;
        while !self.shared.registrations.is_empty() {
            let place = if self.submitters.len() < self.max_submitters {
                None
            } else {
                match self.submitters.iter().position(SubmitterLink::is_retired) {
                    Some(s) => Some(s),
                    // Every place is taken: the registration waits for a retirement.
                    None => break,
                }
            };
            let Some(link) = self.shared.registrations.pop() else {
                break;
            };
            match place {
                None => {
                    self.submitters.push(link);
                    self.needs_wake.push(false);
                }
                Some(s) => {
                    self.submitters[s] = link;
                    self.needs_wake[s] = false;
                }
            }
            worked = true;
        }
        worked
    }

    /// Drained and done: refuses the registrations still waiting for a place (every place
    /// was held, by submitters gone or not, with answers outstanding when they came).
    /// Whatever they pushed before the gate closed is answered as a draining core answers
    /// it, refused `ShuttingDown`, so the engine does not exit with it unanswered. Call only
    /// once the gate is closed and empty (no push can follow). True if there were any.
    pub(super) fn refuse_waiting_registrations(&mut self) -> bool {
        let mut any = false;
        while let Some(mut link) = self.shared.registrations.pop() {
            any = true;
            link.intake.take_ready();
            while let Some(sub) = link.intake.pop(!0) {
                let outcome = Err(RequestError::Rejected(Reject::ShuttingDown));
                match sub.reply {
                    Reply::Waiter(w) => w.complete(outcome),
                    Reply::Tag(tag) => {
                        let done = TaggedEvent {
                            tag,
                            event: Event::Done(outcome),
                            route: None,
                        };
                        if link.completions.push(done).is_err() {
                            unreachable!(
                                "submitter in-flight limit equals its completion ring size"
                            );
                        }
                    }
                }
            }
            if let Some(wake) = &link.wake {
                wake();
            }
        }
        any
    }

    /// A registration is waiting and has a place to go.
    fn registration_ready(&self) -> bool {
        !self.shared.registrations.is_empty()
            && (self.submitters.len() < self.max_submitters
                || self.submitters.iter().any(SubmitterLink::is_retired))
    }

    /// backend's core), with its work back and its new route.
    pub(super) fn move_pending(&mut self, from: u32, to: u32, work: Work, route: RouteState) {
        let slot = &mut self.pending[from as usize];
        let reply = slot.reply.take().expect("a live request has its reply");
        slot.work = None;
        let (submitter, meta, cancelled) = (slot.submitter, slot.meta, slot.cancelled);
        let dispatched_ns = slot.dispatched_ns;
        self.occupy(to, submitter, reply, work, meta, route);
        // A cancel that came while the request was out still holds, and its queue wait
        // ended at its first dispatch.
        self.pending[to as usize].cancelled = cancelled;
        self.pending[to as usize].dispatched_ns = dispatched_ns;
    }

    /// Emits a telemetry event (sampled; dropped and counted when the queue is full).
    #[inline]
    pub(super) fn emit(&mut self, now: Nanos, event: TelemetryEvent) {
        let shared = &self.shared;
        self.telemetry
            .emit(now, event, &shared.telemetry, &shared.telemetry_counters);
    }

    /// Answers the request in table slot `index`.
    pub(super) fn finish(&mut self, now: Nanos, index: u32, outcome: Outcome) {
        let summary = outcome.as_ref().ok().map(crate::exec::Output::summary);
        let (submitter, reply, route) = self.release(index);
        self.book(now, index, outcome.is_ok(), summary.as_ref());
        self.send(submitter, reply, outcome, route);
    }

    /// Keeps the books of the request in table slot `index`, which a worker answered
    /// itself with an output of `summary`'s counts (`runtime::direct_reply`): as
    /// [`EngineIo::finish`], but nothing is sent.
    pub(super) fn finish_answered(&mut self, now: Nanos, index: u32, summary: &OutputSummary) {
        let (submitter, reply, _) = self.release(index);
        self.book(now, index, true, Some(summary));
        self.forget_reply(submitter, reply, index);
    }

    /// Frees the request in table slot `index` whose batch the engine abandoned after the
    /// worker had claimed it: the worker answers it (`runtime::direct_reply`). Its counts
    /// never reach the engine (the batch comes back stale), so nothing is recorded but the
    /// telemetry event; the core counted it failed, which the caller corrects.
    pub(super) fn finish_claimed_by_worker(&mut self, now: Nanos, index: u32) {
        let (submitter, reply, _) = self.release(index);
        self.book(now, index, true, None);
        self.forget_reply(submitter, reply, index);
    }

    /// Takes the reply target (and submitter and route) out of table slot `index`, which
    /// is free again after this; the slot's other fields stay readable until reused.
    fn release(&mut self, index: u32) -> (u16, Reply, Option<Decision>) {
        let slot = &mut self.pending[index as usize];
        let reply = slot
            .reply
            .take()
            .expect("every live request has exactly one reply");
        slot.work = None;
        let route = std::mem::replace(&mut slot.route, RouteState::NONE).decision;
        (slot.submitter, reply, route)
    }

    /// The telemetry event, and for a success the token counts (when known) and the
    /// latency sample, of the request just released from table slot `index`.
    fn book(&mut self, now: Nanos, index: u32, ok: bool, output: Option<&OutputSummary>) {
        let slot = &self.pending[index as usize];
        let (meta, first_token_ns, dispatched_ns) =
            (slot.meta, slot.first_token_ns, slot.dispatched_ns);
        let (completion_tokens, cached_tokens) =
            output.map_or((0, None), |o| (o.completion_tokens, o.cached_tokens));
        self.emit(
            now,
            TelemetryEvent::Request {
                at_ns: now,
                priority: meta.priority,
                ok,
                latency_ns: now.saturating_sub(meta.arrival_ns),
                ttft_ns: if first_token_ns > 0 {
                    first_token_ns.saturating_sub(meta.arrival_ns)
                } else {
                    0
                },
                queue_wait_ns: if dispatched_ns > 0 {
                    dispatched_ns.saturating_sub(meta.arrival_ns).max(1)
                } else {
                    0
                },
                completion_tokens,
                cached_tokens,
            },
        );
        if !ok {
            self.finished.record_abort();
            return;
        }
        if let Some(output) = output {
            self.finished.record_output(
                output,
                meta.max_tokens,
                meta.arrival_ns,
                first_token_ns,
                now,
            );
            let latency_ns = now.saturating_sub(meta.arrival_ns).max(1);
            let sample = latency_sample(latency_ns, meta.priority);
            self.record_sample(SampleKind::Latency, sample);
        }
    }

    /// A request answered by a worker leaves the submitter's books: one fewer live, and its
    /// tag's slot freed unless the submitter already reused the tag's key (it may, as soon as
    /// it has the answer, before the engine gets here).
    fn forget_reply(&mut self, submitter: u16, reply: Reply, index: u32) {
        let link = &mut self.submitters[submitter as usize];
        link.live -= 1;
        if let Reply::Tag(tag) = reply {
            if let Some(t) = link.tag_slots.get_mut(tag_key(tag)) {
                if *t == index {
                    *t = u32::MAX;
                }
            }
        }
    }

    /// Sends a token of a streaming request (table slot `index`) to its submitter, if the
    /// submitter's ring has room beyond what its final answers need. Skipped tokens are not
    /// lost: the final output carries the whole text.
    /// True if it was sent.
    pub(super) fn send_token(&mut self, slot_index: u32, offset: u32, text: String) -> bool {
        let slot = &self.pending[slot_index as usize];
        let Some(Reply::Tag(tag)) = slot.reply else {
            return false;
        };
        if !slot.stream {
            return false;
        }
        let s = slot.submitter as usize;
        let link = &mut self.submitters[s];
        // The ring holds 2x the submitter's in-flight limit; keep half for final answers.
        if link.completions.free_slots() <= link.completions.capacity() / 2 {
            return false;
        }
        if link
            .completions
            .push(TaggedEvent {
                tag,
                event: Event::Token { offset, text },
                route: slot.route.decision,
            })
            .is_ok()
        {
            self.needs_wake[s] = true;
            return true;
        }
        false
    }

    /// Buffers one sample for the next publish; a full buffer is flushed into the snapshot
    /// at once (`try_lock`: if a reader holds the lock, the sample is counted as dropped).
    pub(super) fn record_sample(&mut self, kind: SampleKind, value: u64) {
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
        move_latency_samples(&mut self.new_latencies_ns, &mut snap);
        move_samples(&mut self.new_batch_sizes, &mut snap.batch_size);
        true
    }

    /// Delivers an outcome to its reply target.
    pub(super) fn send(
        &mut self,
        submitter: u16,
        reply: Reply,
        outcome: Outcome,
        route: Option<Decision>,
    ) {
        match reply {
            Reply::Waiter(w) => {
                self.submitters[submitter as usize].live -= 1;
                w.complete(outcome)
            }
            Reply::Tag(tag) => {
                let s = submitter as usize;
                self.submitters[s].live -= 1;
                // The submitter reuses a key only after it got this final answer, so the key
                // still maps to this request here.
                if let Some(t) = self.submitters[s].tag_slots.get_mut(tag_key(tag)) {
                    *t = u32::MAX;
                }
                if self.submitters[s]
                    .completions
                    .push(TaggedEvent {
                        tag,
                        event: Event::Done(outcome),
                        route,
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
        self.submitters.iter().any(|s| s.intake.any())
    }

    /// The drain-exit check on the intake: the gate is closed and empty, and (read after
    /// that) no submission is left in a ring, so nothing that got in goes unanswered.
    pub(super) fn intake_drained(&self) -> bool {
        intake::drained(&self.shared.gate, self.submitters.iter().map(|s| &s.intake))
    }

    /// Anything at all for the engine to do (the doorbell's re-check).
    pub(super) fn has_work(&self) -> bool {
        !self.shared.control.is_empty()
            || self.submitters.iter().any(|s| !s.cancels.is_empty())
            || self.registration_ready()
            || self.any_input()
            || self.replies_ready.any()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_samples_carry_their_priority_to_the_class_histogram() {
        let mut snap = Snapshot::new(1, crate::core::strategy::StrategyKind::Fixed);
        let mut samples = vec![
            latency_sample(5_000_000, Priority::Critical),
            latency_sample(9_000_000, Priority::Low),
            latency_sample(u64::MAX, Priority::High),
        ];
        move_latency_samples(&mut samples, &mut snap);
        assert!(samples.is_empty());
        assert_eq!(snap.latency.len(), 3);
        let critical = &snap.latency_by_priority[Priority::Critical.index()];
        assert_eq!(critical.len(), 1);
        assert!(critical.equivalent(critical.max(), 5_000_000));
        assert_eq!(snap.latency_by_priority[Priority::Low.index()].len(), 1);
        assert_eq!(snap.latency_by_priority[Priority::High.index()].len(), 1);
        assert_eq!(snap.latency_by_priority[Priority::Normal.index()].len(), 0);
    }
}
