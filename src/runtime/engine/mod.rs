//! The engine thread: the only owner of the scheduler (and, request-level, the router) in
//! the live runtime.
//!
//! Each turn ([`Engine::turn`], written once for both batching modes; [`Engine::run`]
//! calls it with the clock's time, `runtime::dst` with a virtual one) takes new submitters
//! and control messages, drains the submitter rings (highest priority first, up to a
//! budget), takes cancellations, drains worker replies, aborts what is left once a drain's
//! deadline passed, lets the scheduler act (dispatch batches, or run a tick), wakes the
//! submitters that got answers, publishes a snapshot every 50 ms, and says whether the
//! drain is done; `run` then exits, or idles per policy until the earliest deadline or a
//! doorbell. The turn reads no clock: its `now` is the only time it sees. What differs
//! between the modes is a [`Mode`], chosen at start and statically dispatched (the turn is
//! generic over it, so the hot path has no virtual calls):
//!
//! - `request`: request-level batching: a core per backend and the router;
//! - `continuous`: iteration-level batching: the slot scheduler, one replica group per
//!   (`sim`) backend, and the router (at admission).
//!
//! `io` is the I/O half both share (submitter links, the pending table, worker links,
//! samples); `routing` the request-level routing state.
//!
//! After start-up the engine must not allocate (error answers excepted), lock (other than
//! `try_lock` to publish a snapshot), or block; `tests/no_alloc.rs` checks the allocation
//! part over 100,000 requests, routed across backends too. It answers every request it
//! took exactly once, through [`EngineIo::send`].

mod continuous;
mod io;
mod pending;
pub use pending::places_fit;
mod request;
mod routing;

pub use continuous::IterationLevel;
pub use io::{EngineIo, SubmitterLink, WorkerLink};
pub use request::RequestLevel;
pub use routing::{BackendHealth, Routing};

use super::clock::Clock;
use super::idle::Idler;
use super::messages::{Control, Submission};
use super::ready;
use super::snapshot::{Snapshot, SNAPSHOT_INTERVAL_NS};
use super::sync::{AtomicBool, Ordering};
use super::worker::Job;
use super::Shared;
use crate::core::strategy::StrategyKind;
use crate::core::Nanos;
use std::sync::Arc;

/// What a batching mode does in the engine's turn. Every method runs on the engine thread;
/// none may allocate per request, lock or block. `io` is the engine's I/O half, lent for
/// the call.
pub trait Mode {
    /// What the engine sends a worker (its reply type is what comes back).
    type Job: Job;

    /// The capacity of each lane of the pending table, whose indexes the mode addresses
    /// (its requests' places in `io.pending`, `pending::PendingLayout`).
    fn pending_lanes(&self) -> Vec<usize>;

    /// Worker links the mode dispatches to.
    fn workers(&self) -> usize;

    /// Start of a turn, before any intake (request-level: backend health and circuits).
    #[inline]
    fn begin_turn(&mut self, _now: Nanos) {}

    /// Switches the batching strategy; nothing queued is lost.
    fn set_strategy(&mut self, kind: StrategyKind);

    /// Stops admitting: what is admitted finishes, later submissions are refused.
    fn begin_drain(&mut self);

    /// Forgets LoRA adapter `adapter` in every slot table (a `ForgetAdapter` control).
    fn forget_adapter(&mut self, adapter: crate::core::lora::AdapterId);

    /// The routing state, for controls that change it between turns (`SetSlot`,
    /// `SetRouting`); the mode marks a draining slot empty once it holds nothing.
    fn routing(&mut self) -> &mut Routing;

    /// Admits one submission from submitter `submitter`, or answers it with a refusal.
    fn admit(&mut self, io: &mut EngineIo<Self::Job>, now: Nanos, submitter: u16, sub: Submission);

    /// The client of live pending slot `index` went away (already marked `cancelled`):
    /// cancel what can be cancelled now.
    fn cancel(&mut self, io: &mut EngineIo<Self::Job>, now: Nanos, index: u32);

    /// A reply from worker `worker`.
    fn on_reply(
        &mut self,
        io: &mut EngineIo<Self::Job>,
        now: Nanos,
        worker: usize,
        reply: <Self::Job as Job>::Reply,
    );

    /// After the replies, before the drain-deadline check: fail requests past their own
    /// deadline (a mode whose scheduler does this in `poll` keeps the default).
    #[inline]
    fn expire(&mut self, _io: &mut EngineIo<Self::Job>, _now: Nanos) {}

    /// Lets the scheduler act: dispatch batches or run a tick. Returns whether it sent
    /// anything, and when it next needs a turn without being woken.
    fn poll(&mut self, io: &mut EngineIo<Self::Job>, now: Nanos) -> (bool, Option<Nanos>);

    /// The drain deadline passed: answer every request left with an error.
    fn abort(&mut self, io: &mut EngineIo<Self::Job>, now: Nanos);

    /// Nothing admitted is left (queued, or out at a worker).
    fn is_idle(&self) -> bool;

    /// After an abort (everything answered): nothing is still out at a worker either.
    fn nothing_out(&self) -> bool;

    /// Copies the mode's counters into the snapshot (locked by the caller; `at_ns` set).
    fn publish(
        &mut self,
        io: &mut EngineIo<Self::Job>,
        snap: &mut Snapshot,
        now: Nanos,
        aborted: bool,
    );
}

/// What one [`Engine::turn`] did, and what the engine waits for until the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnResult {
    /// Something was taken or sent (the live loop stays busy).
    pub worked: bool,
    /// When the scheduler next needs a turn without being woken (a flush, a timeout).
    pub next_deadline_ns: Option<Nanos>,
    /// Drained and everything answered: the engine waits only for the intake gate to
    /// empty (a submitter still between its gate check and its push).
    pub watch_gate: bool,
    /// Drained, everything answered, the gate empty and every intake ring read: the engine
    /// is done (its last snapshot published); no further turn may follow.
    pub exit: bool,
}

/// The engine: a batching mode and its I/O.
pub struct Engine<M: Mode> {
    mode: M,
    io: EngineIo<M::Job>,
    idler: Idler,
    /// Set by a `Drain` control: the deadline after which what is left is aborted.
    drain_deadline_ns: Option<Nanos>,
    /// Set once the drain deadline passed and everything left was aborted.
    aborted: bool,
    /// The executors' stop flag (`exec`'s): set at the abort, so executors still running
    /// abandoned work may cut it short.
    stop: Arc<AtomicBool>,
}

impl<M: Mode> Engine<M> {
    /// The engine over `mode`, with a link per worker (`workers[w]` is the mode's worker
    /// `w`). Every buffer it will use is allocated here.
    pub fn new(
        mode: M,
        clock: Clock,
        shared: Arc<Shared>,
        workers: Vec<WorkerLink<M::Job>>,
        max_submitters: usize,
        idler: Idler,
        stop: Arc<AtomicBool>,
    ) -> Engine<M> {
        assert_eq!(workers.len(), mode.workers(), "a worker link per worker");
        let io = EngineIo::new(
            clock,
            shared,
            workers,
            max_submitters,
            &mode.pending_lanes(),
        );
        Engine {
            mode,
            io,
            idler,
            drain_deadline_ns: None,
            aborted: false,
            stop,
        }
    }

    /// Runs until drained (after a `Drain` control) and every job has come back: a
    /// [`Engine::turn`] at the clock's time, then another at once if input is waiting, else
    /// idle per the idle policy until the turn's deadline or a doorbell.
    ///
    /// Never inlined: `tools/bench/instruction_budget.sh` finds this thread by the name.
    #[inline(never)]
    pub fn run(mut self) {
        self.io.shared.engine_bell.bind_current();
        loop {
            let now = self.io.clock.now();
            let turn = self.turn(now);
            if turn.exit {
                return;
            }
            if turn.worked {
                self.idler.busy();
            }
            // After a turn that worked, the next one is taken at once only if there is
            // input for it. Without input it would find nothing (the turn's deadline says
            // when the scheduler next has something to do) and only then idle: on one
            // connection that empty turn was a third of the engine's turns and ~1k
            // instructions per request (BENCHMARKS.md, "The hot path again"). The idle
            // path below re-checks the same `has_work` before it sleeps.
            if turn.worked && self.io.has_work() {
                continue;
            }
            let io = &self.io;
            let deadline = turn.next_deadline_ns.map(|n| io.clock.instant(n));
            let watch_gate = turn.watch_gate;
            self.idler.idle(
                io.clock.instant(now),
                deadline,
                &io.shared.engine_bell,
                || io.has_work() || (watch_gate && io.shared.gate.is_closed_and_empty()),
            );
        }
    }

    /// One turn at time `now` (the only time it reads): takes new submitters and control
    /// messages, admits, takes cancellations and worker replies, aborts past a drain's
    /// deadline, lets the scheduler act, wakes submitters, publishes when due. Never waits;
    /// what to do until the next turn is the caller's (the live loop idles, a simulation
    /// advances its virtual clock).
    #[inline]
    pub fn turn(&mut self, now: Nanos) -> TurnResult {
        self.mode.begin_turn(now);
        let mut worked = self.io.accept_submitters();
        worked |= self.read_controls(now);
        worked |= self.admit_submissions(now);
        worked |= self.drain_cancels(now);
        worked |= self.drain_replies(now);
        self.mode.expire(&mut self.io, now);
        if let Some(deadline) = self.drain_deadline_ns {
            if now >= deadline && !self.aborted && !self.mode.is_idle() {
                self.mode.abort(&mut self.io, now);
                self.aborted = true;
                // Executors still running abandoned work may stop early now.
                self.stop.store(true, Ordering::Release);
            }
        }
        let (dispatched, next) = self.mode.poll(&mut self.io, now);
        worked |= dispatched;
        self.io.flush_wakes();
        if now.saturating_sub(self.io.published_at_ns) >= SNAPSHOT_INTERVAL_NS {
            self.publish(now);
        }
        // Done when drained; after an abort, do not wait for abandoned work.
        let finished = self.mode.is_idle() || (self.aborted && self.mode.nothing_out());
        // Drained and finished, the engine waits only for the gate to empty: a submitter
        // leaving it rings, and the re-check before sleeping looks at the gate.
        let watch_gate = self.drain_deadline_ns.is_some() && finished;
        if watch_gate && self.io.shared.gate.is_closed_and_empty() {
            // A submitter registered while every place was held may have pushed before the
            // gate closed; no place will free up for it now.
            worked |= self.io.refuse_waiting_registrations();
        }
        let exit = watch_gate && self.io.intake_drained();
        if exit {
            self.publish(now);
        }
        // Not finished, the drain deadline is a deadline too: the abort happens at it, not
        // at the next wake-up (up to `MAX_PARK` late).
        let next = match self.drain_deadline_ns {
            Some(d) if !self.aborted && !finished => Some(next.map_or(d, |n| n.min(d))),
            _ => next,
        };
        TurnResult {
            worked,
            next_deadline_ns: next,
            watch_gate,
            exit,
        }
    }

    /// Pending-table slots holding a request not yet answered (simulation checks).
    #[cfg(feature = "testing")]
    pub(crate) fn pending_live(&self) -> usize {
        self.io
            .pending
            .iter()
            .filter(|(_, p)| p.reply.is_some())
            .count()
    }

    /// Submissions taken from the intake rings and not yet answered, over every submitter
    /// (simulation checks: equals [`Engine::pending_live`] between turns).
    #[cfg(feature = "testing")]
    pub(crate) fn taken_unanswered(&self) -> usize {
        self.io.submitters.iter().map(|s| s.live as usize).sum()
    }

    /// What the live loop's re-check before it sleeps sees after a turn that reported
    /// `watch_gate` (simulation checks): anything for the engine to do now.
    #[cfg(feature = "testing")]
    pub(crate) fn has_work(&self, watch_gate: bool) -> bool {
        self.io.has_work() || (watch_gate && self.io.shared.gate.is_closed_and_empty())
    }

    /// Nothing admitted is left; nothing is out at a worker; the drain deadline passed and
    /// what was left was aborted (simulation checks).
    #[cfg(feature = "testing")]
    pub(crate) fn state(&self) -> (bool, bool, bool) {
        (self.mode.is_idle(), self.mode.nothing_out(), self.aborted)
    }

    fn read_controls(&mut self, now: Nanos) -> bool {
        let mut worked = false;
        while let Some(c) = self.io.shared.control.pop() {
            worked = true;
            match c {
                Control::SetStrategy(kind) => self.mode.set_strategy(kind),
                Control::SetSlot { backend, slot, seq } => {
                    self.mode.routing().set_slot_asked(backend, slot, seq)
                }
                Control::SwapTables => {
                    let routing = self.mode.routing();
                    self.io.shared.tables.answer(|t| routing.swap_tables(t));
                }
                Control::SetRouting(live) => self.mode.routing().router.set_live_routing(live),
                Control::ForgetAdapter(adapter) => self.mode.forget_adapter(adapter),
                Control::Drain { deadline_ns } => {
                    // Admit what is already in the rings before refusing new work.
                    while self.admit_submissions(now) {}
                    self.mode.begin_drain();
                    self.drain_deadline_ns = Some(deadline_ns);
                }
            }
        }
        worked
    }

    /// Admits up to the per-turn budget, highest priority first across all submitters.
    #[inline]
    fn admit_submissions(&mut self, now: Nanos) -> bool {
        let mode = &mut self.mode;
        self.io
            .drain_submissions(|io, s, sub| mode.admit(io, now, s, sub))
    }

    /// Takes the cancellations submitters sent (clients that went away).
    fn drain_cancels(&mut self, now: Nanos) -> bool {
        let mode = &mut self.mode;
        self.io
            .drain_cancels(|io, index| mode.cancel(io, now, index))
    }

    /// Takes every reply the workers sent, from the rings their mask marks (a turn with no
    /// reply looks at no ring).
    #[inline]
    fn drain_replies(&mut self, now: Nanos) -> bool {
        let groups = self.io.replies_ready.take();
        ready::pop_marked(groups, self.io.workers.len(), |w| {
            let mut popped = false;
            while let Some(reply) = self.io.workers[w].replies.pop() {
                popped = true;
                self.mode.on_reply(&mut self.io, now, w, reply);
            }
            popped
        })
    }

    /// Publishes a snapshot now (the turn does it every [`SNAPSHOT_INTERVAL_NS`]).
    pub(crate) fn publish(&mut self, now: Nanos) {
        self.io.published_at_ns = now;
        // A clone of the handle (no allocation), so the mode can take `io` mutably while
        // the snapshot is locked.
        let shared = self.io.shared.clone();
        let Ok(mut snap) = shared.snapshot.try_lock() else {
            return;
        };
        snap.at_ns = now;
        snap.finished = self.io.finished;
        self.io.telemetry.flush(&self.io.shared.telemetry_counters);
        self.mode
            .publish(&mut self.io, &mut snap, now, self.aborted);
    }
}
