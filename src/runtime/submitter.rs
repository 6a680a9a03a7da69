//! A submitter: one thread's way into the engine (an intake ring per class, a cancel ring)
//! and back (its own completion ring), registered with the engine up to `max_submitters`
//! at once; dropping it gives its place back.
//!
//! Submitting is the submit half of the submit/drain handshake (`gate`, `intake::submit`):
//! a submission either sees the drain and is refused, or is answered. Nothing here blocks
//! or waits for the engine.

use super::clock::Clock;
use super::engine::SubmitterLink;
use super::intake::{self, IntakeTx, Refused};
use super::messages::{Event, Reply, Request, RequestError, Submission, TaggedEvent};
use super::reply_lane::ReplyLane;
use super::ring::{self, Consumer, Producer};
use super::sync::Ordering;
use super::Shared;
use crate::core::{request, Nanos, RequestMeta, CLASS_COUNT};
use std::sync::Arc;
use std::time::Instant;

/// One thread's way in: its own ring per class into the engine, and its own completion
/// ring back for tagged submissions.
///
/// Invariant: `in_flight <= completion ring capacity`, so the engine never finds the
/// completion ring full.
pub struct Submitter {
    shared: Arc<Shared>,
    /// Tags whose client went away.
    cancels: Producer<u64>,
    /// A ring per class into the engine.
    intake: IntakeTx<Submission>,
    completions: Consumer<TaggedEvent>,
    in_flight: usize,
    max_in_flight: usize,
    /// The arrival stamped on the last submission: arrivals from one submitter never go
    /// back in time, so its requests reach the core in the order of their stamps.
    last_arrival_ns: Nanos,
    /// Final answers straight from workers (`runtime::direct_reply`), beside `completions`.
    lane: Arc<ReplyLane<TaggedEvent>>,
}

impl Submitter {
    pub(super) fn register(
        shared: Arc<Shared>,
        wake: Option<Arc<dyn Fn() + Send + Sync>>,
    ) -> Result<Submitter, RequestError> {
        // Counts this submitter in; `Drop` (or a failed registration below) counts it out.
        let n = shared.submitters.fetch_add(1, Ordering::AcqRel);
        if n >= shared.max_submitters {
            shared.submitters.fetch_sub(1, Ordering::AcqRel);
            return Err(RequestError::Busy);
        }
        let (intake, intake_rx) = intake::intake(CLASS_COUNT, shared.ring_capacity);
        // Twice the in-flight limit: final answers always fit (at most one per request in
        // flight), and the other half carries token events of streaming requests.
        let (ctx, crx) = ring::ring(shared.ring_capacity * 2);
        let max_in_flight = crx.capacity() / 2;
        let (cancel_tx, cancel_rx) = ring::ring(shared.ring_capacity);
        // At most `max_in_flight` final answers are out, by either way back.
        let lane = Arc::new(ReplyLane::new(max_in_flight, wake.clone()));
        let link = SubmitterLink {
            lane: lane.clone(),
            cancels: cancel_rx,
            tag_slots: vec![u32::MAX; max_in_flight],
            intake: intake_rx,
            completions: ctx,
            wake,
            live: 0,
        };
        if shared.registrations.push(link).is_err() {
            // Links of dropped submitters the engine has not taken yet fill the queue.
            shared.submitters.fetch_sub(1, Ordering::AcqRel);
            return Err(RequestError::Busy);
        }
        shared.engine_bell.ring();
        Ok(Submitter {
            shared,
            cancels: cancel_tx,
            intake,
            completions: crx,
            in_flight: 0,
            max_in_flight,
            last_arrival_ns: 0,
            lane,
        })
    }

    /// Submits a request whose answer comes back through [`Submitter::drain_completions`]
    /// with `tag`, arriving now.
    pub fn submit(&mut self, request: Request, tag: u64) -> Result<(), RequestError> {
        self.submit_received(request, tag, None)
    }

    /// [`Submitter::submit`] for a request whose first bytes were read at `received`: its
    /// latencies (end to end, queue wait, time to first token) count from then, so the time
    /// spent reading the rest of it, parsing and validating it is inside abe's own clock
    /// (as it is inside a client's). Clamped to now and to this submitter's last arrival.
    pub fn submit_received(
        &mut self,
        request: Request,
        tag: u64,
        received: Option<Instant>,
    ) -> Result<(), RequestError> {
        if self.in_flight >= self.max_in_flight {
            self.shared.rejected_busy.fetch_add(1, Ordering::Relaxed);
            return Err(RequestError::Busy);
        }
        self.submit_at(request, Reply::Tag(tag), received)?;
        self.in_flight += 1;
        Ok(())
    }

    pub(super) fn submit_reply(
        &mut self,
        request: Request,
        reply: Reply,
    ) -> Result<(), RequestError> {
        self.submit_at(request, reply, None)
    }

    fn submit_at(
        &mut self,
        request: Request,
        reply: Reply,
        received: Option<Instant>,
    ) -> Result<(), RequestError> {
        let clock = self.shared.clock;
        // One clock conversion, not two: `received` is an `Instant` this process read
        // earlier, so (monotonic) it is never after now, and `submit_stamped` keeps arrivals
        // in order whatever they are.
        let arrival_ns = match received {
            Some(at) => clock.reading(at),
            None => clock.now(),
        };
        self.submit_stamped(request, reply, arrival_ns)
    }

    /// Simulation (`runtime::dst`): submits `request` with reply target `reply`, arriving
    /// at `arrival_ns` of the simulation's virtual clock instead of the runtime's. A tagged
    /// submission counts against the in-flight limit as [`Submitter::submit`]'s does; a
    /// waiter's does not, as `Handle::submit`'s does not.
    #[cfg(feature = "testing")]
    pub fn submit_at_ns(
        &mut self,
        request: Request,
        reply: Reply,
        arrival_ns: Nanos,
    ) -> Result<(), RequestError> {
        let tagged = reply.tag().is_some();
        if tagged && self.in_flight >= self.max_in_flight {
            self.shared.rejected_busy.fetch_add(1, Ordering::Relaxed);
            return Err(RequestError::Busy);
        }
        self.submit_stamped(request, reply, arrival_ns)?;
        if tagged {
            self.in_flight += 1;
        }
        Ok(())
    }

    /// Submits through the gate, stamped arriving at `arrival_ns` (clamped to this
    /// submitter's last arrival).
    fn submit_stamped(
        &mut self,
        request: Request,
        reply: Reply,
        arrival_ns: Nanos,
    ) -> Result<(), RequestError> {
        let arrival_ns = arrival_ns.max(self.last_arrival_ns);
        self.last_arrival_ns = arrival_ns;
        // The submit half of the submit/drain handshake (`gate`, `intake::submit`): either
        // this submission sees the drain and refuses, or the engine waits for its push.
        let shared = &*self.shared;
        let result = intake::submit(&shared.gate, &shared.engine_bell, &mut self.intake, || {
            Self::submission(arrival_ns, request, reply)
        });
        match result {
            Ok(()) => Ok(()),
            Err(Refused::Closed) => Err(RequestError::ShuttingDown),
            Err(Refused::Full) => {
                self.shared.rejected_busy.fetch_add(1, Ordering::Relaxed);
                Err(RequestError::Busy)
            }
        }
    }

    /// The submission for `request` (arrived at `arrival_ns`), and its class.
    fn submission(arrival_ns: Nanos, request: Request, reply: Reply) -> (usize, Submission) {
        let Request {
            priority,
            route,
            mut work,
        } = request;
        if work.kind == crate::core::Kind::Embedding {
            work.max_tokens = 0;
        }
        let mut meta = RequestMeta::new(
            priority,
            work.kind,
            work.prompt.len(),
            work.max_tokens,
            arrival_ns,
        );
        meta.predicted_output_tokens = work.predicted_output_tokens;
        meta.adapter = route.map_or(crate::core::lora::BASE_MODEL, |r| r.need.adapter);
        meta.own_request = work.chat_body.is_some() || work.stream;
        let class = request::class_index(priority, meta.bucket());
        let sub = Submission {
            meta,
            work,
            reply,
            route,
        };
        (class, sub)
    }

    /// Hands every event that arrived to `f`; returns how many requests finished.
    pub fn drain_completions(&mut self, mut f: impl FnMut(TaggedEvent)) -> usize {
        let mut n = 0;
        while let Some(c) = self.completions.pop() {
            if matches!(c.event, Event::Done(_)) {
                n += 1;
            }
            f(c);
        }
        // Final answers only, each for a request whose tokens (if any) came through
        // `completions`: a stream is never answered directly.
        n += self.lane.drain(&mut f);
        self.in_flight -= n;
        n
    }

    /// Asks the engine to cancel tagged submission `tag` (its client went away): a request
    /// still waiting is dropped and answered as cancelled; in continuous batching an active
    /// one frees its slot at the next step. Best effort: a full cancel ring drops the ask.
    ///
    /// A cancel may reach the engine after the request was answered, so never reuse a tag
    /// verbatim: io threads put a slab index in the low 32 bits (the engine's fast lookup
    /// key) and a generation in the high 32 bits, which the engine compares before it
    /// cancels anything.
    pub fn cancel(&mut self, tag: u64) {
        if self.cancels.push(tag).is_ok() {
            self.shared.engine_bell.ring();
        }
    }

    /// True when completions are waiting to be drained, from the engine or straight from a
    /// worker: the re-check before the submitter's thread sleeps, so it must cover both
    /// ways back (`runtime::reply_lane`).
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty() || !self.lane.is_empty()
    }

    /// Tagged submissions not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The runtime's clock.
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }
}

impl Drop for Submitter {
    /// Gives this submitter's place back: the engine reuses its link once everything it
    /// submitted is answered (answers still in flight go to a ring nobody reads).
    fn drop(&mut self) {
        self.intake.close();
        self.shared.submitters.fetch_sub(1, Ordering::AcqRel);
        // The engine may hold a registration back for want of a place.
        self.shared.engine_bell.ring();
    }
}
