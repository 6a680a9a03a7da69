//! Deterministic simulation of the runtime, after TigerBeetle's VOPR: the real engine
//! ([`Engine::turn`](abe::runtime::engine::Engine::turn)) over its real rings, submitters,
//! control queue, intake gate and pending table, built without threads by
//! `abe::runtime::dst`, in both batching modes (request-level over 2-3 routed backends with
//! retries and circuit breakers; continuous over 2-3 sim backends). One seeded scheduler
//! plays everything around it, one step at a time:
//!
//! - clients submit (tagged, or a blocking caller's waiter; random priority, kind, length,
//!   stream, model), cancel (live tags, stale tags, tags beyond the fast map), stop reading
//!   their completion ring for a while (slow consumers), flood an intake ring until it
//!   refuses, leave and join (submitter places reused);
//! - workers take jobs, answer them (ok, a whole-batch error, per-request errors, a 4xx the
//!   client must fix; late ones come back after their timeout), or hang for a while;
//! - the control ring gets strategy switches and a drain with a deadline (sometimes passed:
//!   an abort);
//! - the virtual clock advances; the engine turns.
//!
//! After every step: each answer a client reads is for a request it has outstanding (never
//! twice, never unknown); a waiter is answered at most once, one refused at the door never;
//! a submitter's in-flight count is its outstanding tagged requests; between turns, the
//! engine's pending table holds exactly the submissions it took and has not answered; the
//! published counters reconcile (`admitted = completed + failed + live`, `live` the table's
//! count); the executors' stop flag is set exactly when the engine aborted. And the sleep
//! check: after a turn that did nothing and whose re-check found nothing (the live loop
//! parks then, until the turn's deadline or a doorbell), a turn before that deadline with
//! nothing new must do nothing either; work there is work the live engine sleeps through.
//! At the end (a drain, the workers answering what they hold or hung past the deadline):
//! the engine exits; nothing is left in its table; every submission the gate let in was
//! answered exactly once, refusals at the door and at admission included; after an abort,
//! what workers still hold is only abandoned work (requests already answered); the engine
//! counters match the answers the clients read; a drained runtime refuses new work.
//!
//! A failure prints `DST_SEED=N`, which replays that seed alone (`DST_MODE=request` or
//! `continuous` picks the mode when both failed); `DST_SEEDS=N` runs more
//! (RELIABILITY.md).

use abe::core::circuit::CircuitParams;
use abe::core::continuous::{Continuous, ContinuousConfig};
use abe::core::strategy::StrategyKind;
use abe::core::{Core, CoreConfig, Kind, Nanos, Priority};
use abe::exec::latency::LatencyModel;
use abe::exec::sim::{FaultSettings, Faults, SimConfig, SimExecutor};
use abe::exec::{ExecError, Executor, TokenSink, Work};
use abe::router::{BackendConfig, NameId, Need, Router, RoutingConfig};
use abe::runtime::dst::{DstConfig, Sim, WorkerEnd};
use abe::runtime::engine::{IterationLevel, RequestLevel, Routing};
use abe::runtime::messages::{BatchEvent, BatchMsg, Reply, ResultMsg, StepMsg, StepResult};
use abe::runtime::{Event, Outcome, Request, RequestError, RouteRequest, Submitter, Waiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// Tag keys a client uses: more than any submitter's in-flight limit here (rings of at
/// most 8), so some keys fall beyond the engine's fast map.
const TAG_KEYS: u32 = 24;

/// `DST_TRACE=1` with `DST_SEED`: print each step.
fn tracing() -> bool {
    std::env::var_os("DST_TRACE").is_some()
}

/// Counts of what the runs did, summed over seeds to show every fault kind was reached.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    submitted: u64,
    waiters: u64,
    ok: u64,
    failed: u64,
    refused_at_admission: u64,
    refused_busy: u64,
    refused_draining: u64,
    ring_full_floods: u64,
    cancels: u64,
    cancelled: u64,
    stale_cancels: u64,
    tokens: u64,
    slow_consumers: u64,
    jobs_taken: u64,
    answers_ok: u64,
    batch_errors: u64,
    item_errors: u64,
    client_errors: u64,
    late_answers: u64,
    hangs: u64,
    switches: u64,
    drains: u64,
    aborts: u64,
    clients_left: u64,
    clients_joined: u64,
    batch_timeouts: u64,
    /// Continuous: KV-exhaustion preemptions (requests re-queued after they started).
    preemptions: u64,
    /// Requests queued behind a circuit that opened, with no other backend to move to
    /// (request-level) or waiting for its slots (continuous), answered at once (503
    /// `ExecError::Unavailable`).
    failed_fast: u64,
    quiet_turns: u64,
    turns: u64,
    steps: u64,
}

macro_rules! tally_add {
    ($a:expr, $b:expr, $($f:ident),*) => { $( $a.$f += $b.$f; )* };
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        tally_add!(
            self,
            o,
            submitted,
            waiters,
            ok,
            failed,
            refused_at_admission,
            refused_busy,
            refused_draining,
            ring_full_floods,
            cancels,
            cancelled,
            stale_cancels,
            tokens,
            slow_consumers,
            jobs_taken,
            answers_ok,
            batch_errors,
            preemptions,
            item_errors,
            client_errors,
            late_answers,
            hangs,
            switches,
            drains,
            aborts,
            clients_left,
            clients_joined,
            batch_timeouts,
            failed_fast,
            quiet_turns,
            turns,
            steps
        );
    }
}

/// How a worker answers a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// The whole batch or step failed (the backend's fault: retried elsewhere).
    BatchError,
    /// Some requests of an ok batch failed alone (the backend's fault).
    ItemErrors,
    /// Some requests of an ok batch are the client's to fix (a 4xx: never retried).
    ClientError,
}

/// What the simulated worker does with a job: the mode's half of the world.
trait Play: abe::runtime::engine::Mode + Sized {
    /// Answers `job` on `exec` as `answer` says at virtual time `now`, pushing the reply
    /// (and any token events, never into the reserve) to `end`.
    fn answer(
        job: Self::Job,
        exec: &mut SimExecutor,
        answer: Answer,
        end: &mut WorkerEnd<Self::Job>,
        rng: &mut SmallRng,
        now: Nanos,
    );
    /// Request ids (from the prompts) of the requests in `job`.
    fn ids(job: &Self::Job, out: &mut Vec<u64>);
    /// Builds the mode and its routes for `seed`.
    fn build(rng: &mut SmallRng, seed: u64) -> (Sim<Self>, Vec<RouteRequest>);
    const NAME: &'static str;
}

/// The request id a prompt carries (its first word).
fn id_of(work: &Work) -> u64 {
    work.prompt
        .split(' ')
        .next()
        .and_then(|w| w.parse().ok())
        .expect("every simulated prompt starts with its id")
}

/// Relays streamed text as token events when the reply ring has room beyond the reserve.
struct Tokens<'a> {
    end: &'a mut WorkerEnd<BatchMsg>,
    tickets: Vec<abe::core::Ticket>,
}

impl TokenSink for Tokens<'_> {
    fn token(&mut self, item: usize, offset: u32, text: String) {
        let Some(&ticket) = self.tickets.get(item) else {
            return;
        };
        if self.end.replies.free_slots() > self.end.reserve {
            let _ = self.end.replies.push(BatchEvent::Token {
                ticket,
                offset,
                text,
            });
        }
    }
}

fn backend_error(rng: &mut SmallRng) -> ExecError {
    match rng.gen_range(0..3) {
        0 => ExecError::Injected("dst"),
        1 => ExecError::Backend("dst: backend down".into()),
        _ => ExecError::Timeout {
            backend: "dst".into(),
            message: "dst".into(),
        },
    }
}

/// Two or three backends over models `m` and `n` (and the alias `mm`), with random context
/// lengths, priorities and routing strategy; the routes clients ask for.
fn router(rng: &mut SmallRng, seed: u64, all_m: bool) -> (Router, Vec<RouteRequest>, usize) {
    let backends = rng.gen_range(2..=3);
    let configs: Vec<BackendConfig> = (0..backends)
        .map(|b| {
            let model = if all_m || b == 0 || rng.gen_ratio(1, 2) {
                "m"
            } else {
                "n"
            };
            let mut c = BackendConfig::default_sim(model, rng.gen_range(64..=8192));
            c.name = format!("b{b}");
            c.priority = rng.gen_range(0..10);
            c.max_concurrent_batches = rng.gen_range(1..=4);
            if !all_m && b == backends - 1 && model == "m" {
                let mut n = c.models[0].clone();
                n.name = "n".into();
                c.models.push(n);
            }
            c
        })
        .collect();
    let strategies = [
        "smart",
        "round_robin",
        "least_loaded",
        "power_of_two",
        "priority_only",
        "random",
    ];
    let mut cfg = RoutingConfig {
        strategy: strategies[rng.gen_range(0..strategies.len())].into(),
        max_retries: rng.gen_range(0..=2),
        ..Default::default()
    };
    cfg.aliases.insert("mm".into(), "m".into());
    let (router, _) = Router::build(&configs, &cfg, seed).expect("a valid router");
    let mut names: Vec<NameId> = vec![router.lookup("m").unwrap(), router.lookup("mm").unwrap()];
    if let Ok(n) = router.lookup("n") {
        names.push(n);
    }
    let routes = names
        .into_iter()
        .map(|name| RouteRequest {
            name,
            need: Need::default(),
            session: None,
        })
        .collect();
    (router, routes, backends)
}

impl Play for RequestLevel {
    const NAME: &'static str = "request";

    fn answer(
        job: BatchMsg,
        exec: &mut SimExecutor,
        answer: Answer,
        end: &mut WorkerEnd<BatchMsg>,
        rng: &mut SmallRng,
        now: Nanos,
    ) {
        let BatchMsg {
            batch,
            mut items,
            dispatched_ns,
            mut direct,
        } = job;
        let result = if answer == Answer::BatchError {
            Err(backend_error(rng))
        } else {
            let tickets = items.iter().map(|i| i.ticket).collect();
            let mut sink = Tokens { end, tickets };
            // The sim executor does not stream request-level batches; an upstream one does:
            // a token reached the client, so the request may no longer move elsewhere.
            for (i, item) in items.iter().enumerate() {
                if item.work.stream && rng.gen_ratio(1, 2) {
                    sink.token(i, 0, "tok".into());
                }
            }
            let r = exec.execute(&mut items, &mut sink);
            for item in items.iter_mut() {
                if answer == Answer::ItemErrors && rng.gen_ratio(1, 2) {
                    item.error = Some(backend_error(rng));
                } else if answer == Answer::ClientError && rng.gen_ratio(1, 2) {
                    item.error = Some(ExecError::Invalid {
                        backend: "dst".into(),
                        message: "too long".into(),
                    });
                }
            }
            r
        };
        // As a live worker does: answer what it can straight to the submitters, then
        // return the batch.
        abe::runtime::direct_reply::deliver(&mut direct, &mut items, &result, || now);
        let reply = BatchEvent::Done(ResultMsg {
            batch,
            items,
            result,
            dispatched_ns,
            direct,
        });
        assert!(
            end.replies.push(reply).is_ok(),
            "a worker's reply ring full: the engine sent more jobs than its reserve"
        );
    }

    fn ids(job: &BatchMsg, out: &mut Vec<u64>) {
        out.extend(job.items.iter().map(|i| id_of(&i.work)));
    }

    fn build(rng: &mut SmallRng, seed: u64) -> (Sim<RequestLevel>, Vec<RouteRequest>) {
        let (router, routes, backends) = router(rng, seed, false);
        let strategies = StrategyKind::ALL;
        let strategy = strategies[rng.gen_range(0..strategies.len())];
        let inflight = rng.gen_range(1..=2);
        let mut core = CoreConfig {
            queue_capacity: rng.gen_range(2..=32),
            max_batch_size: rng.gen_range(1..=6),
            strategy,
            max_inflight_per_worker: inflight,
            request_timeout_ns: rng.gen_range(5..=300) * MS,
            batch_timeout_ns: rng.gen_range(5..=300) * MS,
            dispatch_when_idle: rng.gen(),
            seed,
            ..CoreConfig::default()
        };
        core.circuit.recovery_ns = rng.gen_range(1..=200) * MS;
        let cores = (0..backends)
            .map(|l| {
                Core::new(CoreConfig {
                    workers: rng.gen_range(1..=2),
                    seed: seed.wrapping_add(l as u64),
                    ..core.clone()
                })
            })
            .collect();
        let name = routes[0].name;
        let mode = RequestLevel::new(cores, Routing::new(router, name, None));
        let cfg = DstConfig {
            ring_capacity: rng.gen_range(2..=8),
            max_submitters: rng.gen_range(1..=3),
            jobs_per_worker: inflight as usize,
            backends,
            strategy,
            request_level: true,
        };
        (Sim::new(mode, cfg), routes)
    }
}

impl Play for IterationLevel {
    const NAME: &'static str = "continuous";

    fn answer(
        job: StepMsg,
        exec: &mut SimExecutor,
        answer: Answer,
        end: &mut WorkerEnd<StepMsg>,
        rng: &mut SmallRng,
        _now: Nanos,
    ) {
        let StepMsg {
            mut items,
            dispatched,
        } = job;
        let result = match answer {
            Answer::Ok | Answer::ItemErrors | Answer::ClientError => {
                exec.step(&mut items, dispatched)
            }
            Answer::BatchError => Err(backend_error(rng)),
        };
        assert!(
            end.replies.push(StepResult { items, result }).is_ok(),
            "a replica's reply ring full"
        );
    }

    fn ids(job: &StepMsg, out: &mut Vec<u64>) {
        out.extend(job.items.iter().filter_map(|i| i.work.as_ref()).map(id_of));
    }

    fn build(rng: &mut SmallRng, seed: u64) -> (Sim<IterationLevel>, Vec<RouteRequest>) {
        let (router, routes, backends) = router(rng, seed, false);
        let lane_workers: Vec<usize> = (0..backends).map(|_| rng.gen_range(1..=2)).collect();
        let replicas = lane_workers.iter().sum();
        let ccfg = ContinuousConfig {
            replicas,
            max_slots: rng.gen_range(1..=4),
            prefill_chunk: rng.gen_range(8..=512),
            n_batch: rng.gen_range(16..=1024),
            kv_capacity_tokens: rng.gen_range(64..=8192),
            max_queue: rng.gen_range(1..=16),
            prefix_caching: rng.gen_bool(0.5),
            block_tokens: rng.gen_range(1..=32),
            max_loras: 1,
        };
        let sched = Continuous::with_groups(ccfg, &lane_workers);
        let circuit = CircuitParams {
            recovery_ns: rng.gen_range(1..=200) * MS,
            ..CircuitParams::default()
        };
        let name = routes[0].name;
        let mode = IterationLevel::new(
            sched,
            Routing::new(router, name, None),
            rng.gen_range(5..=300) * MS,
            rng.gen_range(5..=300) * MS,
            circuit,
        );
        let cfg = DstConfig {
            ring_capacity: rng.gen_range(2..=8),
            max_submitters: rng.gen_range(1..=3),
            jobs_per_worker: 1,
            backends,
            strategy: StrategyKind::Fixed,
            request_level: false,
        };
        (Sim::new(mode, cfg), routes)
    }
}

/// One client: a submitter and what it has outstanding.
struct Client {
    sub: Submitter,
    /// Tagged requests not yet answered: tag -> request id.
    live: BTreeMap<u64, u64>,
    /// Free fast-map keys (the low 32 bits of a tag), like an io thread's slab.
    free_keys: Vec<u32>,
    /// Slow consumer: does not read its completion ring before this time.
    slow_until: Nanos,
    /// Answered tags (with their generation): a cancel of one is stale.
    answered_tags: Vec<u64>,
}

/// A blocking caller's request.
struct Waiting {
    id: u64,
    waiter: Arc<Waiter>,
    /// Its answer was read.
    answered: bool,
}

/// A simulated worker: the jobs it took, and whether it hangs.
struct Worker {
    exec: SimExecutor,
    /// Jobs taken, oldest first, with when (this mode's job type, boxed).
    held: VecDeque<(Nanos, Box<dyn std::any::Any>)>,
    hung_until: Nanos,
}

/// The world around one engine.
struct World<M: Play> {
    rng: SmallRng,
    sim: Sim<M>,
    routes: Vec<RouteRequest>,
    now: Nanos,
    clients: Vec<Option<Client>>,
    waiters: Vec<Waiting>,
    /// Waiters refused at the door (never answered by the engine).
    refused_waiters: Vec<Arc<Waiter>>,
    workers: Vec<Worker>,
    /// Request ids answered (by any route), to catch a second answer.
    answered: BTreeSet<u64>,
    /// Request ids the gate let in (pushed), not yet answered.
    outstanding: BTreeSet<u64>,
    next_id: u64,
    next_gen: u64,
    /// Answers the clients read, by kind: (ok, failed after admission, refused at admission).
    seen: (u64, u64, u64),
    /// Some client left with requests outstanding (its answers cannot be read).
    orphaned: bool,
    drain_asked: bool,
    exited: bool,
    tally: Tally,
    ids: Vec<u64>,
    trace: bool,
    /// Something the engine reads changed since its last turn (a push into a ring it
    /// reads, a control, a registration, a submitter gone).
    poked: bool,
    /// The last turn's deadline, whether it worked, and whether the live loop would have
    /// slept after it (its re-check found nothing).
    last_turn: Option<(Option<Nanos>, bool, bool)>,
}

impl<M: Play> World<M> {
    fn new(seed: u64) -> World<M> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (sim, routes) = M::build(&mut rng, seed);
        let workers = sim
            .workers
            .iter()
            .enumerate()
            .map(|(w, _)| Worker {
                exec: SimExecutor::new(
                    SimConfig {
                        latency: LatencyModel::None,
                        seed: seed.wrapping_add(w as u64),
                        natural_length_mean_tokens: rng.gen_range(0..=8),
                        ..SimConfig::default()
                    },
                    Faults::new(FaultSettings::default()),
                    Arc::new(AtomicBool::new(false)),
                ),
                held: VecDeque::new(),
                hung_until: 0,
            })
            .collect();
        let mut w = World {
            rng,
            sim,
            routes,
            now: 0,
            clients: Vec::new(),
            waiters: Vec::new(),
            refused_waiters: Vec::new(),
            workers,
            answered: BTreeSet::new(),
            outstanding: BTreeSet::new(),
            next_id: 0,
            next_gen: 1,
            seen: (0, 0, 0),
            orphaned: false,
            drain_asked: false,
            exited: false,
            tally: Tally::default(),
            ids: Vec::new(),
            trace: tracing(),
            poked: true,
            last_turn: None,
        };
        w.join();
        w
    }

    fn join(&mut self) {
        let Ok(sub) = self.sim.submitter() else {
            return;
        };
        self.tally.clients_joined += 1;
        self.poked = true;
        // Keys 0..in-flight limit hit the engine's fast map; a few beyond it take the slow
        // lookup.
        let keys = TAG_KEYS;
        let client = Client {
            sub,
            live: BTreeMap::new(),
            free_keys: (0..keys).rev().collect(),
            slow_until: 0,
            answered_tags: Vec::new(),
        };
        match self.clients.iter().position(Option::is_none) {
            Some(i) => self.clients[i] = Some(client),
            None => self.clients.push(Some(client)),
        }
    }

    fn request(&mut self) -> (u64, Request) {
        let id = self.next_id;
        self.next_id += 1;
        let rng = &mut self.rng;
        let kind = if rng.gen_ratio(1, 5) {
            Kind::Embedding
        } else {
            Kind::Completion
        };
        let words = rng.gen_range(0..=60);
        let mut prompt = id.to_string();
        for _ in 0..words {
            prompt.push_str(" word");
        }
        let route = self.routes[rng.gen_range(0..self.routes.len())];
        let priority = Priority::HIGHEST_FIRST[rng.gen_range(0..Priority::COUNT)];
        let request = Request {
            priority,
            route: if rng.gen_ratio(1, 8) {
                None
            } else {
                Some(route)
            },
            work: Work {
                kind,
                prompt: prompt.into(),
                max_tokens: if kind == Kind::Embedding {
                    0
                } else {
                    let most = if rng.gen_ratio(1, 10) { 4000 } else { 24 };
                    rng.gen_range(1..=most)
                },
                stream: kind == Kind::Completion && rng.gen_ratio(1, 2),
                ..Default::default()
            },
        };
        (id, request)
    }

    /// A client submits one request (tagged, or now and then a blocking caller's).
    fn submit(&mut self, c: usize, waiter: bool) -> Result<(), RequestError> {
        let (id, request) = self.request();
        let now = self.now;
        if waiter {
            let w = Arc::new(Waiter::default());
            let client = self.clients[c].as_mut().expect("a live client");
            let r = client
                .sub
                .submit_at_ns(request, Reply::Waiter(w.clone()), now);
            match &r {
                Ok(()) => {
                    self.tally.waiters += 1;
                    self.outstanding.insert(id);
                    self.waiters.push(Waiting {
                        id,
                        waiter: w,
                        answered: false,
                    });
                }
                Err(_) => self.refused_waiters.push(w),
            }
            return self.door(r);
        }
        let gen = self.next_gen;
        let client = self.clients[c].as_mut().expect("a live client");
        let Some(key) = client.free_keys.pop() else {
            return Ok(());
        };
        let tag = (gen << 32) | u64::from(key);
        let r = client.sub.submit_at_ns(request, Reply::Tag(tag), now);
        match &r {
            Ok(()) => {
                self.next_gen += 1;
                client.live.insert(tag, id);
                self.outstanding.insert(id);
            }
            Err(_) => client.free_keys.push(key),
        }
        self.door(r)
    }

    /// Checks a refusal at the door is a clean one.
    fn door(&mut self, r: Result<(), RequestError>) -> Result<(), RequestError> {
        self.poked |= r.is_ok();
        if self.trace {
            eprintln!("  submit {} -> {r:?}", self.next_id - 1);
        }
        match &r {
            Ok(()) => self.tally.submitted += 1,
            Err(RequestError::Busy) => self.tally.refused_busy += 1,
            Err(RequestError::ShuttingDown) => {
                assert!(
                    self.drain_asked,
                    "refused as shutting down before any drain"
                );
                self.tally.refused_draining += 1;
            }
            Err(e) => panic!("a refusal at the door other than busy or draining: {e}"),
        }
        // Draining, the in-flight limit may still answer first (busy): either refuses.
        assert!(
            !(self.drain_asked && r.is_ok()),
            "a drained runtime took new work"
        );
        r
    }

    /// Classifies a final answer and records it against request `id`.
    fn answer(&mut self, id: u64, outcome: &Outcome) {
        if self.trace {
            eprintln!("  answer {id}: {:?}", outcome.as_ref().map(|_| ()));
        }
        assert!(self.answered.insert(id), "request {id} answered twice");
        assert!(
            self.outstanding.remove(&id),
            "request {id} answered but never let in"
        );
        match outcome {
            Ok(_) => self.seen.0 += 1,
            Err(RequestError::Rejected(_)) | Err(RequestError::Route(_)) => self.seen.2 += 1,
            Err(RequestError::Failed(abe::core::FailReason::Cancelled)) => {
                self.tally.cancelled += 1;
                self.seen.1 += 1
            }
            Err(RequestError::Failed(abe::core::FailReason::Aborted)) => {
                self.tally.aborts += 1;
                self.seen.1 += 1
            }
            Err(RequestError::Failed(_))
            | Err(RequestError::Worker(_))
            | Err(RequestError::Backend(_)) => self.seen.1 += 1,
            Err(e @ (RequestError::Busy | RequestError::ShuttingDown)) => {
                panic!("request {id}: a door refusal came back from the engine: {e}")
            }
        }
        if let Err(RequestError::Backend(ExecError::Unavailable { .. })) = outcome {
            self.tally.failed_fast += 1;
        }
        match outcome {
            Ok(_) => self.tally.ok += 1,
            Err(RequestError::Rejected(_)) | Err(RequestError::Route(_)) => {
                self.tally.refused_at_admission += 1
            }
            Err(_) => self.tally.failed += 1,
        }
    }

    /// Client `c` reads its completion ring (unless it is a slow consumer now).
    fn read(&mut self, c: usize, force: bool) {
        let now = self.now;
        let Some(client) = self.clients[c].as_mut() else {
            return;
        };
        if !force && now < client.slow_until {
            return;
        }
        let mut events = Vec::new();
        client.sub.drain_completions(|e| events.push(e));
        for e in events {
            let client = self.clients[c].as_mut().expect("still here");
            let Some(&id) = client.live.get(&e.tag) else {
                panic!(
                    "an event for tag {:#x}, not outstanding at client {c}",
                    e.tag
                );
            };
            match e.event {
                Event::Token { .. } => self.tally.tokens += 1,
                Event::Done(outcome) => {
                    client.live.remove(&e.tag);
                    client.free_keys.push(e.tag as u32);
                    client.answered_tags.push(e.tag);
                    self.answer(id, &outcome);
                }
            }
        }
    }

    /// Reads every waiter's answer that arrived; a second one is a bug.
    fn read_waiters(&mut self) {
        for i in 0..self.waiters.len() {
            let got = self.waiters[i].waiter.wait_timeout(Duration::ZERO);
            let Some(outcome) = got else { continue };
            assert!(
                !self.waiters[i].answered,
                "waiter of request {} answered twice",
                self.waiters[i].id
            );
            self.waiters[i].answered = true;
            let id = self.waiters[i].id;
            self.answer(id, &outcome);
        }
        for w in &self.refused_waiters {
            assert!(
                w.wait_timeout(Duration::ZERO).is_none(),
                "a waiter refused at the door was answered by the engine"
            );
        }
    }

    /// A worker takes the next job of its ring.
    fn take(&mut self, w: usize) -> bool {
        if self.workers[w].hung_until > self.now {
            return false;
        }
        let Some(job) = self.sim.workers[w].jobs.pop() else {
            return false;
        };
        self.tally.jobs_taken += 1;
        let now = self.now;
        self.workers[w].held.push_back((now, Box::new(job)));
        true
    }

    /// A worker answers its oldest job.
    fn answer_job(&mut self, w: usize, answer: Answer) -> bool {
        if self.workers[w].hung_until > self.now {
            return false;
        }
        let Some((taken_at, job)) = self.workers[w].held.pop_front() else {
            return false;
        };
        if self.now.saturating_sub(taken_at) > 5 * MS {
            self.tally.late_answers += 1;
        }
        match answer {
            Answer::Ok => self.tally.answers_ok += 1,
            Answer::BatchError => self.tally.batch_errors += 1,
            Answer::ItemErrors => self.tally.item_errors += 1,
            Answer::ClientError => self.tally.client_errors += 1,
        }
        let job = *job.downcast::<M::Job>().expect("this mode's job");
        let worker = &mut self.workers[w];
        M::answer(
            job,
            &mut worker.exec,
            answer,
            &mut self.sim.workers[w],
            &mut self.rng,
            self.now,
        );
        self.poked = true;
        true
    }

    fn turn(&mut self) {
        if self.exited {
            return;
        }
        self.tally.turns += 1;
        // The live loop sleeps after a turn that did nothing, until that turn's deadline or
        // a doorbell: a turn with nothing new and before that deadline must do nothing.
        // (It does not sleep if its re-check finds work.)
        let quiet = !self.poked
            && self.last_turn.is_some_and(|(next, worked, would_sleep)| {
                !worked && would_sleep && next.is_none_or(|d| self.now < d)
            });
        let before = self.sim.state();
        let t = self.sim.turn(self.now);
        self.poked = false;
        if t.exit {
            self.exited = true;
        }
        let after = self.sim.state();
        if self.trace {
            let jobs: Vec<usize> = self.sim.workers.iter().map(|w| w.jobs.len()).collect();
            let held: Vec<usize> = self.workers.iter().map(|w| w.held.len()).collect();
            eprintln!(
                "  turn at {}: {t:?} quiet {quiet} {after:?} jobs {jobs:?} held {held:?}",
                self.now
            );
        }
        if quiet {
            self.tally.quiet_turns += 1;
            assert!(
                !t.worked
                    && before.pending_live == after.pending_live
                    && before.aborted == after.aborted,
                "the engine would have slept through this turn's work: after {:?} at {}, \
                 this turn {t:?}, {before:?} -> {after:?}",
                self.last_turn,
                self.now
            );
        }
        let would_sleep = !self.sim.has_work(t.watch_gate);
        self.last_turn = Some((t.next_deadline_ns, t.worked, would_sleep));
        self.check();
    }

    /// The invariants that hold between any two steps.
    fn check(&mut self) {
        for client in self.clients.iter().flatten() {
            assert_eq!(
                client.sub.in_flight(),
                client.live.len(),
                "a submitter's in-flight count is its outstanding tagged requests"
            );
        }
        let s = self.sim.state();
        assert_eq!(
            s.pending_live, s.taken_unanswered,
            "the pending table and the submitters' counts disagree: {s:?}"
        );
        if self.exited {
            assert!(
                s.idle || (s.aborted && s.nothing_out),
                "exited with work left: {s:?}"
            );
            assert_eq!(s.pending_live, 0, "leaked pending slots at exit: {s:?}");
        }
        assert_eq!(
            s.stop, s.aborted,
            "the executors' stop flag follows the abort"
        );
        self.sim.publish(self.now);
        self.sim.with_snapshot(|snap| {
            let st = &snap.stats;
            assert_eq!(
                st.admitted,
                st.completed + st.failed + snap.live_requests as u64,
                "counters do not reconcile: {st:?}, live {}",
                snap.live_requests
            );
            assert_eq!(
                snap.live_requests, s.pending_live,
                "published live requests and the pending table disagree"
            );
        });
    }

    fn pick_client(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.clients.len())
            .filter(|&c| self.clients[c].is_some())
            .collect();
        (!live.is_empty()).then(|| live[self.rng.gen_range(0..live.len())])
    }

    fn pick_answer(&mut self) -> Answer {
        match self.rng.gen_range(0..20) {
            0..=13 => Answer::Ok,
            14..=15 => Answer::BatchError,
            16..=18 => Answer::ItemErrors,
            _ => Answer::ClientError,
        }
    }

    fn step(&mut self) {
        self.tally.steps += 1;
        let roll = self.rng.gen_range(0..100);
        if self.trace {
            eprintln!(
                "step {} t={}us roll {roll} outstanding {:?} state {:?}",
                self.tally.steps,
                self.now / 1000,
                self.outstanding,
                self.sim.state()
            );
        }
        match roll {
            // A client submits.
            0..=21 => {
                if let Some(c) = self.pick_client() {
                    let waiter = self.rng.gen_ratio(1, 8);
                    let _ = self.submit(c, waiter);
                }
            }
            // A client goes away: cancels a live request, a stale tag, or one never sent.
            22..=26 => {
                if let Some(c) = self.pick_client() {
                    let client = self.clients[c].as_mut().expect("picked");
                    let tag = match self.rng.gen_range(0..4) {
                        0 if !client.answered_tags.is_empty() => {
                            self.tally.stale_cancels += 1;
                            client.answered_tags[self.rng.gen_range(0..client.answered_tags.len())]
                        }
                        1 => {
                            self.tally.stale_cancels += 1;
                            (u64::MAX << 32) | u64::from(self.rng.gen_range(0..8u32))
                        }
                        _ if !client.live.is_empty() => {
                            self.tally.cancels += 1;
                            let i = self.rng.gen_range(0..client.live.len());
                            *client.live.keys().nth(i).expect("in range")
                        }
                        _ => return,
                    };
                    client.sub.cancel(tag);
                    self.poked = true;
                }
            }
            // A client reads its answers.
            27..=36 => {
                if let Some(c) = self.pick_client() {
                    self.read(c, false);
                }
                self.read_waiters();
            }
            // A slow consumer: stops reading for a while.
            37..=38 => {
                if let Some(c) = self.pick_client() {
                    self.tally.slow_consumers += 1;
                    let until = self.now + self.rng.gen_range(1..=400) * MS;
                    self.clients[c].as_mut().expect("picked").slow_until = until;
                }
            }
            // A client floods one class until the door refuses (waiters skip the in-flight
            // limit, so the intake ring itself fills); the refusal must be clean.
            39 => {
                if let Some(c) = self.pick_client() {
                    self.tally.ring_full_floods += 1;
                    for _ in 0..64 {
                        if self.submit(c, true).is_err() {
                            break;
                        }
                    }
                }
            }
            // A worker takes a job.
            40..=51 => {
                let w = self.rng.gen_range(0..self.workers.len());
                self.take(w);
            }
            // A worker answers one.
            52..=63 => {
                let w = self.rng.gen_range(0..self.workers.len());
                let a = self.pick_answer();
                self.answer_job(w, a);
            }
            // A worker hangs.
            64..=65 => {
                let w = self.rng.gen_range(0..self.workers.len());
                self.tally.hangs += 1;
                self.workers[w].hung_until = self.now + self.rng.gen_range(1..=600) * MS;
            }
            // A strategy switch.
            66..=67 => {
                let kinds = StrategyKind::ALL;
                let k = kinds[self.rng.gen_range(0..kinds.len())];
                if self.sim.set_strategy(k).is_ok() {
                    self.poked = true;
                    self.tally.switches += 1;
                }
            }
            // A drain with a deadline (rare: the rest of the run is the drain).
            68 if !self.drain_asked && self.rng.gen_ratio(1, 8) => self.drain(),
            // A client leaves, or a new one joins (places are reused).
            69 => {
                if self.rng.gen_ratio(1, 4) {
                    if let Some(c) = self.pick_client() {
                        let client = self.clients[c].take().expect("picked");
                        self.poked = true;
                        self.tally.clients_left += 1;
                        if self.trace {
                            eprintln!("  client {c} leaves with {:?}", client.live);
                        }
                        if !client.live.is_empty() {
                            self.orphaned = true;
                            for id in client.live.values() {
                                self.outstanding.remove(id);
                            }
                        }
                    }
                } else if self.clients.iter().flatten().count() < 3 {
                    self.join();
                }
            }
            // The clock advances.
            70..=79 => {
                let dt = match self.rng.gen_range(0..10) {
                    0..=5 => self.rng.gen_range(0..=MS),
                    6..=8 => self.rng.gen_range(0..=20 * MS),
                    _ => self.rng.gen_range(0..=400 * MS),
                };
                self.now += dt;
            }
            // The engine turns.
            _ => self.turn(),
        }
        if self.clients.iter().all(Option::is_none) && !self.drain_asked {
            self.join();
        }
    }

    fn drain(&mut self) {
        let deadline = self.now + self.rng.gen_range(0..=500) * MS;
        self.poked = true;
        if self.sim.drain(deadline) {
            self.tally.drains += 1;
            self.drain_asked = true;
        }
        assert!(
            !self.sim.is_accepting(),
            "the gate stays open after a drain"
        );
    }

    /// Drains (if not yet), lets the workers answer what they hold (hung ones only once
    /// their hang is over) and the clients read, until the engine exits; then checks what
    /// is left.
    fn finish(&mut self) {
        if !self.drain_asked {
            self.drain();
            assert!(
                self.drain_asked,
                "the control queue refused the drain twice"
            );
        }
        let mut rounds = 0;
        while !self.exited {
            rounds += 1;
            assert!(rounds < 100_000, "the engine never exited after the drain");
            self.turn();
            for w in 0..self.workers.len() {
                while self.take(w) {}
                let a = self.pick_answer();
                while self.answer_job(w, a) {}
            }
            for c in 0..self.clients.len() {
                self.read(c, false);
            }
            self.read_waiters();
            self.now += self.rng.gen_range(0..=10 * MS);
        }
        for c in 0..self.clients.len() {
            self.read(c, true);
        }
        self.read_waiters();
        // Every submission the gate let in (of clients still here) was answered once.
        assert!(
            self.outstanding.is_empty(),
            "never answered: {:?}",
            self.outstanding
        );
        for w in &self.waiters {
            assert!(w.answered, "waiter of request {} never answered", w.id);
        }
        // What workers still hold, or was never taken, is abandoned work: answered already.
        for w in 0..self.workers.len() {
            let mut ids = std::mem::take(&mut self.ids);
            ids.clear();
            for (_, job) in &self.workers[w].held {
                M::ids(
                    job.downcast_ref::<M::Job>().expect("this mode's job"),
                    &mut ids,
                );
            }
            while let Some(job) = self.sim.workers[w].jobs.pop() {
                M::ids(&job, &mut ids);
            }
            for id in &ids {
                assert!(
                    self.answered.contains(id) || self.orphaned,
                    "request {id} out at worker {w} after exit but never answered"
                );
            }
            if !ids.is_empty() {
                assert!(
                    self.sim.state().aborted,
                    "work left at a worker without an abort"
                );
            }
            self.ids = ids;
        }
        // The counters match what the clients read.
        let (st, live, preemptions) = self.sim.with_snapshot(|snap| {
            let preemptions = snap.continuous.as_ref().map_or(0, |c| c.stats.preemptions);
            (snap.stats, snap.live_requests, preemptions)
        });
        assert_eq!(live, 0);
        self.tally.batch_timeouts += st.batch_timeouts;
        self.tally.preemptions += preemptions;
        if !self.orphaned {
            assert_eq!(
                (st.admitted, st.completed, st.failed),
                (self.seen.0 + self.seen.1, self.seen.0, self.seen.1),
                "counters vs answers read: {st:?}"
            );
        }
        // A drained runtime refuses new work.
        if let Some(c) = self.pick_client() {
            let r = self.submit(c, true);
            assert!(
                matches!(r, Err(RequestError::ShuttingDown)),
                "a drained runtime took new work: {r:?}"
            );
        }
    }
}

fn run_seed<M: Play>(seed: u64, steps: u64) -> Tally {
    let mut w = World::<M>::new(seed);
    let steps = w.rng.gen_range(steps / 4..=steps);
    for _ in 0..steps {
        w.step();
        if w.exited {
            break;
        }
    }
    w.finish();
    w.tally
}

fn run_seeds<M: Play>(default_seeds: u64, steps: u64) -> (u64, Tally) {
    let mode_wanted = std::env::var("DST_MODE").ok();
    if let Ok(seed) = std::env::var("DST_SEED") {
        if mode_wanted.as_deref().is_none_or(|m| m == M::NAME) {
            run_seed::<M>(seed.parse().expect("DST_SEED is a number"), steps);
        }
        return (0, Tally::default());
    }
    let seeds: u64 = std::env::var("DST_SEEDS")
        .map(|s| s.parse().expect("DST_SEEDS is a number"))
        .unwrap_or(default_seeds);
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    let regressions = REGRESSION_SEEDS
        .iter()
        .filter(|(mode, _)| *mode == M::NAME)
        .map(|&(_, seed)| seed);
    for seed in regressions.chain(0..seeds) {
        match std::panic::catch_unwind(|| run_seed::<M>(seed, steps)) {
            Ok(t) => tally.add(&t),
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "{} mode, seed {seed} failed: {why}\n  replay: DST_SEED={seed} DST_MODE={} \
                     cargo test --features testing --test campaigns dst_engine::",
                    M::NAME,
                    M::NAME
                );
            }
        }
    }
    eprintln!(
        "dst_engine {}: {seeds} seeds in {:.1} s: {tally:?}",
        M::NAME,
        started.elapsed().as_secs_f64()
    );
    (seeds, tally)
}

/// Every fault kind and hand-off was reached, not only the happy path.
fn assert_reached(seeds: u64, t: &Tally, continuous: bool) {
    if seeds < 200 {
        return;
    }
    let mut kinds = vec![
        ("submissions", t.submitted),
        ("waiter submissions", t.waiters),
        ("ok answers", t.ok),
        ("failed answers", t.failed),
        (
            "refusals at admission (queue full, no route)",
            t.refused_at_admission,
        ),
        (
            "busy refusals at the door (full ring, in-flight limit)",
            t.refused_busy,
        ),
        ("refusals at the door while draining", t.refused_draining),
        ("ring floods", t.ring_full_floods),
        ("cancels", t.cancels),
        ("cancelled requests", t.cancelled),
        ("stale cancels", t.stale_cancels),
        ("slow consumers", t.slow_consumers),
        ("jobs taken", t.jobs_taken),
        ("batch/step errors", t.batch_errors),
        ("late answers", t.late_answers),
        ("batch/step timeouts (stale replies)", t.batch_timeouts),
        ("hangs", t.hangs),
        ("drains", t.drains),
        ("aborts past the drain deadline", t.aborts),
        ("clients leaving", t.clients_left),
        ("stream tokens", t.tokens),
    ];
    if continuous {
        kinds.push(("preemptions", t.preemptions));
    }
    kinds.push(("requests failed fast behind an open circuit", t.failed_fast));
    if !continuous {
        kinds.push(("strategy switches", t.switches));
        kinds.push(("per-request errors", t.item_errors));
        kinds.push(("client (4xx) errors", t.client_errors));
    }
    for (what, n) in kinds {
        assert!(n > 0, "no {what} in {seeds} seeds: {t:?}");
    }
}

/// Seeds that found bugs, run first whatever `DST_SEEDS` says (each also has a directed
/// test below): a waiting registration's submissions lost at a drain (request 80,
/// continuous 164); the drain deadline missing from the turn's deadline (0, both modes);
/// waiting requests' deadlines missing from it (continuous 1); an open circuit's recovery
/// missing from it while requests held its replica's slots (continuous 24182, the long
/// run).
const REGRESSION_SEEDS: &[(&str, u64)] = &[
    ("request", 80),
    ("continuous", 164),
    ("request", 0),
    ("continuous", 0),
    ("continuous", 1),
    ("continuous", 24182),
];

/// Seeds per batching mode in the test command (`DST_SEEDS` overrides): both modes run in
/// parallel in well under 20 s in a debug build on the project's 2 vCPU.
const SEEDS: u64 = 3_000;

/// Steps per seed before the final drain (at most; each seed draws from a quarter of it up
/// to it).
const STEPS: u64 = 400;

#[test]
fn request_level_engine_answers_every_submission_exactly_once_under_faults() {
    let (seeds, t) = run_seeds::<RequestLevel>(SEEDS, STEPS);
    assert_reached(seeds, &t, false);
}

#[test]
fn continuous_engine_answers_every_submission_exactly_once_under_faults() {
    let (seeds, t) = run_seeds::<IterationLevel>(SEEDS, STEPS);
    assert_reached(seeds, &t, true);
}

/// Found by this simulation (request mode seed 80, continuous seed 164, before the fix): a
/// submitter registered while every place was held by one whose client had left with
/// answers outstanding; it submitted, then the runtime drained. The engine exited once the
/// held place's requests were answered, with the waiting submitter's requests never
/// answered. Now they are refused (`ShuttingDown`, as a draining core refuses) before it
/// exits.
#[test]
fn a_submitter_waiting_for_a_place_at_a_drain_is_answered() {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut sim = small_request_sim();
    let request = numbered;
    // A holds the only place with a request out at a worker, then leaves.
    let mut a = sim.submitter().unwrap();
    a.submit_at_ns(request(0), Reply::Tag(0), 0).unwrap();
    sim.turn(0);
    sim.turn(0);
    let job = (0..sim.workers.len())
        .find_map(|w| sim.workers[w].jobs.pop().map(|j| (w, j)))
        .expect("dispatched");
    drop(a);
    // B registers (its link waits for a place) and submits.
    let mut b = sim.submitter().unwrap();
    b.submit_at_ns(request(1), Reply::Tag(1), 1).unwrap();
    sim.turn(1);
    assert!(sim.drain(10 * MS));
    // A's request comes back; the engine is done with every place it has.
    let (w, job) = job;
    let mut exec = SimExecutor::new(
        SimConfig {
            latency: LatencyModel::None,
            ..SimConfig::default()
        },
        Faults::new(FaultSettings::default()),
        Arc::new(AtomicBool::new(false)),
    );
    RequestLevel::answer(job, &mut exec, Answer::Ok, &mut sim.workers[w], &mut rng, 2);
    let mut exited = false;
    for t in 2..100 {
        if sim.turn(t).exit {
            exited = true;
            break;
        }
    }
    assert!(exited, "the engine never exited");
    let mut answers = Vec::new();
    b.drain_completions(|e| answers.push(e));
    assert_eq!(answers.len(), 1, "B's request answered once: {answers:?}");
    assert!(
        matches!(
            answers[0].outcome(),
            Some(Err(RequestError::Rejected(abe::core::Reject::ShuttingDown)))
        ),
        "{answers:?}"
    );
}

/// A request-level engine over two backends, one worker each (one job at a time), with one
/// submitter place of rings of 4.
fn small_request_sim() -> Sim<RequestLevel> {
    small_request_sim_timing_out_at(CoreConfig::default().batch_timeout_ns)
}

/// [`small_request_sim`] whose batches time out after `batch_timeout_ns`.
fn small_request_sim_timing_out_at(batch_timeout_ns: Nanos) -> Sim<RequestLevel> {
    let mut rng = SmallRng::seed_from_u64(7);
    let (router, routes, backends) = router(&mut rng, 7, true);
    let cores = (0..backends)
        .map(|_| {
            Core::new(CoreConfig {
                workers: 1,
                max_inflight_per_worker: 1,
                max_batch_size: 1,
                batch_timeout_ns,
                ..CoreConfig::default()
            })
        })
        .collect();
    let mode = RequestLevel::new(cores, Routing::new(router, routes[0].name, None));
    Sim::new(
        mode,
        DstConfig {
            ring_capacity: 4,
            max_submitters: 1,
            jobs_per_worker: 1,
            backends,
            strategy: StrategyKind::Fixed,
            request_level: true,
        },
    )
}

fn numbered(id: u64) -> Request {
    Request {
        work: Work {
            prompt: format!("{id} word").into(),
            max_tokens: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Found by this simulation's sleep check (request and continuous mode, seed 0, before the
/// fix): with work out at a hung worker, the turn's deadline left out the drain deadline,
/// so the live engine parked past it and aborted up to `MAX_PARK` (100 ms) late.
#[test]
fn a_draining_engine_wakes_at_the_drain_deadline() {
    let mut sim = small_request_sim();
    let mut a = sim.submitter().unwrap();
    a.submit_at_ns(numbered(0), Reply::Tag(0), 0).unwrap();
    sim.turn(0);
    sim.turn(0);
    // The worker took the job and hangs; the drain deadline is 3 ms away.
    let held = sim.workers.iter_mut().find_map(|w| w.jobs.pop());
    assert!(held.is_some(), "dispatched");
    assert!(sim.drain(3 * MS));
    let t = sim.turn(MS);
    assert!(!t.exit);
    assert!(
        t.next_deadline_ns.is_some_and(|d| d <= 3 * MS),
        "the engine must wake at the drain deadline: {t:?}"
    );
    assert!(sim.turn(3 * MS).exit, "aborted at the deadline and done");
    let mut answers = Vec::new();
    a.drain_completions(|e| answers.push(e));
    assert!(
        matches!(
            answers[0].outcome(),
            Some(Err(RequestError::Failed(abe::core::FailReason::Aborted)))
        ),
        "{answers:?}"
    );
}

/// Found by this simulation's sleep check (continuous mode, seed 1, before the fix): a
/// request waiting for a slot was failed at its deadline only at the engine's next wake-up
/// (up to `MAX_PARK` late): the turn's deadline left out waiting requests' deadlines.
#[test]
fn a_continuous_engine_wakes_when_a_waiting_request_expires() {
    let mut rng = SmallRng::seed_from_u64(3);
    let (router, routes, _) = router(&mut rng, 3, true);
    let backends = router.registry().len();
    let ccfg = ContinuousConfig {
        replicas: backends,
        max_slots: 1,
        max_queue: 8,
        ..ContinuousConfig::default()
    };
    let sched = Continuous::with_groups(ccfg, &vec![1; backends]);
    let mode = IterationLevel::new(
        sched,
        Routing::new(router, routes[0].name, None),
        20 * MS,
        1_000 * MS,
        CircuitParams::default(),
    );
    let mut sim = Sim::new(
        mode,
        DstConfig {
            ring_capacity: 8,
            max_submitters: 1,
            jobs_per_worker: 1,
            backends,
            strategy: StrategyKind::Fixed,
            request_level: false,
        },
    );
    let mut a = sim.submitter().unwrap();
    // More requests than slots: some wait, every replica's step is out (and hangs).
    for id in 0..(2 * backends as u64 + 2) {
        a.submit_at_ns(numbered(id), Reply::Tag(id), 0).unwrap();
    }
    sim.turn(0);
    let t = sim.turn(0);
    assert!(
        t.next_deadline_ns.is_some_and(|d| d <= 20 * MS),
        "the engine must wake when the first waiting request expires: {t:?}"
    );
    sim.turn(20 * MS);
    let mut expired = 0;
    a.drain_completions(|e| {
        if matches!(
            e.outcome(),
            Some(Err(RequestError::Failed(
                abe::core::FailReason::QueueTimeout
            )))
        ) {
            expired += 1;
        }
    });
    assert!(expired > 0, "waiting requests expired at their deadline");
}

/// Found by the long run's sleep check (continuous mode, seed 24182, before the fix): a step
/// failed and opened its replica's circuit while another request held a slot of that
/// replica outside the step (the step's token budget was spent); nothing was waiting, so
/// the turn's deadline left out the circuit's recovery and the request stalled until the
/// engine's next wake-up (up to `MAX_PARK` late). Since 2026-11-27 such a request does not
/// wait for the probe at all: its replica runs no step before it, so it is answered at once
/// (503, `ExecError::Unavailable`) in the turn that sees the circuit open.
#[test]
fn a_continuous_engine_answers_a_request_holding_a_slot_when_the_circuit_opens() {
    let backend = BackendConfig::default_sim("m", 100_000);
    let (router, _) = Router::build(&[backend], &RoutingConfig::default(), 1).unwrap();
    let name = router.lookup("m").unwrap();
    let ccfg = ContinuousConfig {
        replicas: 1,
        max_slots: 2,
        prefill_chunk: 8,
        n_batch: 8,
        max_queue: 4,
        ..ContinuousConfig::default()
    };
    let circuit = CircuitParams {
        failure_threshold: 1,
        recovery_ns: 50 * MS,
    };
    let mode = IterationLevel::new(
        Continuous::with_groups(ccfg, &[1]),
        Routing::new(router, name, None),
        10_000 * MS,
        10_000 * MS,
        circuit,
    );
    let mut sim = Sim::new(
        mode,
        DstConfig {
            ring_capacity: 4,
            max_submitters: 1,
            jobs_per_worker: 1,
            backends: 1,
            strategy: StrategyKind::Fixed,
            request_level: false,
        },
    );
    let mut a = sim.submitter().unwrap();
    let long = |id: u64| Request {
        work: Work {
            prompt: format!("{id}{}", " word".repeat(100)).into(),
            max_tokens: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    a.submit_at_ns(long(0), Reply::Tag(0), 0).unwrap();
    a.submit_at_ns(long(1), Reply::Tag(1), 0).unwrap();
    sim.turn(0);
    // The step (one slot's prefill chunk: the budget) fails; the circuit opens.
    let step = sim.workers[0].jobs.pop().expect("a step out");
    assert_eq!(step.items.len(), 1, "the other slot is outside the step");
    let mut exec = SimExecutor::new(
        SimConfig {
            latency: LatencyModel::None,
            ..SimConfig::default()
        },
        Faults::new(FaultSettings::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let mut rng = SmallRng::seed_from_u64(1);
    IterationLevel::answer(
        step,
        &mut exec,
        Answer::BatchError,
        &mut sim.workers[0],
        &mut rng,
        MS,
    );
    sim.turn(MS);
    assert_eq!(
        sim.state().pending_live,
        0,
        "the request holding its slot outside the failed step is answered, not kept for \
         the probe"
    );
    sim.turn(51 * MS);
    assert!(
        sim.workers[0].jobs.pop().is_none(),
        "nothing left for a probe step to run"
    );
}

/// Direct replies (`runtime::direct_reply`): a worker runs its batch and answers the
/// request itself; the batch times out before the engine gets it back. The worker claimed
/// the batch first, so its answer is the only one, and the counters say completed.
#[test]
fn a_batch_answered_by_its_worker_as_it_times_out_is_answered_once_with_the_output() {
    let mut sim = small_request_sim_timing_out_at(5 * MS);
    let (mut a, w, job) = one_request_at_a_worker(&mut sim);
    let reply = run_to_the_claim(job, 4 * MS);
    // The engine times the batch out while the worker is between its answer and its reply.
    sim.turn(6 * MS);
    let mut answers = Vec::new();
    a.drain_completions(|e| answers.push(e));
    assert_eq!(answers.len(), 1, "answered once: {answers:?}");
    assert!(
        matches!(answers[0].outcome(), Some(Ok(_))),
        "the worker's output, not the timeout: {answers:?}"
    );
    assert!(sim.workers[w].replies.push(reply).is_ok());
    sim.turn(7 * MS);
    a.drain_completions(|e| answers.push(e));
    assert_eq!(
        answers.len(),
        1,
        "the stale batch answers nothing: {answers:?}"
    );
    let s = sim.state();
    assert_eq!((s.pending_live, s.taken_unanswered), (0, 0), "{s:?}");
    sim.publish(7 * MS);
    sim.with_snapshot(|snap| {
        let st = &snap.stats;
        assert_eq!(
            (st.admitted, st.completed, st.failed, st.batch_timeouts),
            (1, 1, 0, 0),
            "{st:?}"
        );
    });
}

/// The other order: the engine times the batch out first, so the worker answers nothing
/// and the client gets the timeout, once.
#[test]
fn a_batch_timed_out_before_its_worker_answers_is_answered_once_with_the_timeout() {
    let mut sim = small_request_sim_timing_out_at(5 * MS);
    let (mut a, w, job) = one_request_at_a_worker(&mut sim);
    sim.turn(6 * MS);
    let reply = run_to_the_claim(job, 6 * MS);
    assert!(sim.workers[w].replies.push(reply).is_ok());
    sim.turn(7 * MS);
    let mut answers = Vec::new();
    a.drain_completions(|e| answers.push(e));
    assert_eq!(answers.len(), 1, "answered once: {answers:?}");
    assert!(
        matches!(
            answers[0].outcome(),
            Some(Err(RequestError::Failed(
                abe::core::FailReason::BatchTimeout
            )))
        ),
        "{answers:?}"
    );
    let s = sim.state();
    assert_eq!((s.pending_live, s.taken_unanswered), (0, 0), "{s:?}");
}

/// A submitter with one tagged request (tag 0, arrived at 0) that the engine has dispatched,
/// the worker it went to and the job, taken from that worker's ring.
fn one_request_at_a_worker(sim: &mut Sim<RequestLevel>) -> (Submitter, usize, BatchMsg) {
    let mut a = sim.submitter().unwrap();
    a.submit_at_ns(numbered(0), Reply::Tag(0), 0).unwrap();
    sim.turn(0);
    sim.turn(0);
    let (w, job) = (0..sim.workers.len())
        .find_map(|w| sim.workers[w].jobs.pop().map(|j| (w, j)))
        .expect("dispatched");
    (a, w, job)
}

/// What a live worker does with `job` (`BatchMsg::run`): runs it at virtual time `now`,
/// answers what it can straight to the submitters; the reply it would then push.
fn run_to_the_claim(job: BatchMsg, now: Nanos) -> BatchEvent {
    struct NoTokens;
    impl TokenSink for NoTokens {
        fn token(&mut self, _item: usize, _offset: u32, _text: String) {}
    }
    let BatchMsg {
        batch,
        mut items,
        dispatched_ns,
        mut direct,
    } = job;
    let mut exec = SimExecutor::new(
        SimConfig {
            latency: LatencyModel::None,
            ..SimConfig::default()
        },
        Faults::new(FaultSettings::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let result = exec.execute(&mut items, &mut NoTokens);
    abe::runtime::direct_reply::deliver(&mut direct, &mut items, &result, || now);
    BatchEvent::Done(ResultMsg {
        batch,
        items,
        result,
        dispatched_ns,
        direct,
    })
}

/// A request its worker answered is recorded with the instant the answer left the worker,
/// not the later one at which the engine took the batch back.
#[test]
fn a_direct_answer_is_recorded_at_the_instant_the_worker_sent_it() {
    let mut sim = small_request_sim();
    let (mut a, w, job) = one_request_at_a_worker(&mut sim);
    let reply = run_to_the_claim(job, 3 * MS);
    assert!(sim.workers[w].replies.push(reply).is_ok());
    // The engine takes the batch back 6 ms after the answer left.
    sim.turn(9 * MS);
    let mut answers = Vec::new();
    a.drain_completions(|e| answers.push(e));
    assert!(matches!(answers[..], [ref c] if matches!(c.outcome(), Some(Ok(_)))));
    sim.publish(9 * MS);
    sim.with_snapshot(|snap| {
        assert_eq!(snap.latency.len(), 1);
        assert!(
            snap.latency.equivalent(snap.latency.max(), 3 * MS),
            "recorded {} ns",
            snap.latency.max()
        );
    });
}
