//! Models worker shutdown: the real worker loop (`WorkerThread::run`: pop and run a job,
//! reply, ring the engine; exit only when `exit` is set AND the job ring is empty; else
//! wait on its doorbell with "ring non-empty or exit set" as the re-check) over the real
//! rings and doorbells, with a model job type and the `park` idle policy (loom parks
//! without a timeout, so a missed wake-up is a deadlock).
//!
//! The engine pushes a job, sets `exit` (Release), and then wakes the worker once, either
//! through the doorbell or, as the engine thread does after the engine returned, by
//! unparking the thread. What must hold: the job runs and its reply comes back exactly once
//! (nothing lost at shutdown), and then the worker exits (the join returns).
//!
//! The executors' `stop` flag: a job that runs until its executor sees `stop` (an upstream
//! call being abandoned) is ended by the engine thread's real last word
//! (`worker::signal_exit`, which sets `stop` then `exit`); its reply still comes back once
//! and the worker exits. Were `stop` not set, or set only after the join, the job would
//! never end and loom would report the model as not terminating.
#![cfg(feature = "loom")]

use abe::runtime::doorbell::Doorbell;
use abe::runtime::idle::IdlePolicy;
use abe::runtime::ready::{MarkedProducer, ReadyMask};
use abe::runtime::ring::ring;
use abe::runtime::sync::{Arc, AtomicBool, Ordering};
use abe::runtime::worker::{signal_exit, Events, Job, WorkerThread};
use loom::thread;
use loom_tests::model;
use std::time::Duration;

/// Ring capacity under loom: the smallest the ring allows.
const CAPACITY: usize = 2;
/// The one job the engine sends before stopping.
const JOB: u32 = 7;

/// A job that answers with its own number (the worker loop is what is under test).
struct Ping(u32);

impl Job for Ping {
    type Reply = u32;
    type Exec = ();

    fn run(self, _exec: &mut (), _events: &mut Events<'_, u32>) -> u32 {
        self.0
    }
}

/// How the engine wakes the worker after setting `exit`.
#[derive(Clone, Copy)]
enum Wake {
    /// `Doorbell::ring`, as after a dispatch.
    Doorbell,
    /// `JoinHandle::thread().unpark()`, as the engine thread does after the engine returned.
    Unpark,
}

fn exit_after_one_job(wake: Wake) {
    model(move || {
        let bell = Arc::new(Doorbell::new());
        let engine_bell = Arc::new(Doorbell::new());
        let exit = Arc::new(AtomicBool::new(false));
        let (mut jobs, jobs_rx) = ring::<Ping>(CAPACITY);
        let (replies_tx, mut replies) = ring::<u32>(CAPACITY);
        engine_bell.bind_current();

        let worker = WorkerThread {
            id: 0,
            jobs: jobs_rx,
            results: MarkedProducer::new(replies_tx, Arc::new(ReadyMask::new()), 0),
            executor: Box::new(()),
            bell: bell.clone(),
            engine_bell: engine_bell.clone(),
            exit: exit.clone(),
            idle: IdlePolicy::Park,
            spin: Duration::ZERO,
            reserve: 1,
        };
        let worker = thread::spawn(move || worker.run());

        assert!(jobs.push(Ping(JOB)).is_ok(), "job ring full");
        // Release: the push above happens before a worker that sees `exit`.
        exit.store(true, Ordering::Release);
        // A single wake-up has to cover both the job and the exit.
        match wake {
            Wake::Doorbell => bell.ring(),
            Wake::Unpark => worker.thread().unpark(),
        }

        worker.join().unwrap();
        assert_eq!(replies.pop(), Some(JOB), "job lost at shutdown");
        assert_eq!(replies.pop(), None, "job answered twice");
    });
}

#[test]
fn exit_with_a_doorbell_ring_runs_the_job_and_exits() {
    exit_after_one_job(Wake::Doorbell);
}

#[test]
fn exit_with_a_direct_unpark_runs_the_job_and_exits() {
    exit_after_one_job(Wake::Unpark);
}

/// What a job cut short by `stop` answers.
const ABANDONED: u32 = 0;

/// A job that runs until its executor's `stop` flag is set, as an executor abandoning
/// work at shutdown does, and then answers [`ABANDONED`].
struct UntilStopped;

/// The executor's side of `stop` (the engine holds the other `Arc`).
struct StopExec(Arc<AtomicBool>);

impl Job for UntilStopped {
    type Reply = u32;
    type Exec = StopExec;

    fn run(self, exec: &mut StopExec, _events: &mut Events<'_, u32>) -> u32 {
        // Acquire: pairs with `signal_exit`'s Release store, as the executors' loads do.
        while !exec.0.load(Ordering::Acquire) {
            thread::yield_now();
        }
        ABANDONED
    }
}

#[test]
fn signal_exit_ends_a_job_waiting_for_stop_and_the_worker_exits() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let engine_bell = Arc::new(Doorbell::new());
        let stop = Arc::new(AtomicBool::new(false));
        let exit = Arc::new(AtomicBool::new(false));
        let (mut jobs, jobs_rx) = ring::<UntilStopped>(CAPACITY);
        let (replies_tx, mut replies) = ring::<u32>(CAPACITY);
        engine_bell.bind_current();

        let worker = WorkerThread {
            id: 0,
            jobs: jobs_rx,
            results: MarkedProducer::new(replies_tx, Arc::new(ReadyMask::new()), 0),
            executor: Box::new(StopExec(stop.clone())),
            bell: bell.clone(),
            engine_bell: engine_bell.clone(),
            exit: exit.clone(),
            idle: IdlePolicy::Park,
            spin: Duration::ZERO,
            reserve: 1,
        };
        let worker = thread::spawn(move || worker.run());

        assert!(jobs.push(UntilStopped).is_ok(), "job ring full");
        bell.ring();
        // The engine returned with the job still out: what the engine thread does next.
        signal_exit(&stop, &exit);
        worker.thread().unpark();

        worker.join().unwrap();
        assert_eq!(
            replies.pop(),
            Some(ABANDONED),
            "abandoned job lost at shutdown"
        );
        assert_eq!(replies.pop(), None, "job answered twice");
    });
}
