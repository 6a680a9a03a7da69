//! Running a load: a fixed pool of connection threads playing a [`Schedule`] open-loop
//! against the target (or, in a closed loop, each thread acting as one client), and a
//! collector (the calling thread) that records every answer and reports progress once a
//! second.
//!
//! Open loop, no coordinated omission: a request's latency runs from its *scheduled* send
//! time to the last byte of its response. Each connection thread takes the next unsent
//! request in schedule order (an atomic index), sleeps until it is due, sends it and reads
//! the answer; when every connection is busy the next request simply waits for the first
//! free one, is counted as a late send, and its wait is part of its latency. The schedule is
//! never slowed down to match the server.
//!
//! Closed loop (`--clients N`, or a scenario whose arrivals are `closed`): N connection
//! threads, each one client that sends its next request a think time after the answer to
//! its last (the scenario's `think_ms` and `think_jitter`, or `--think-ms`), taking the
//! scenario's requests in order for their shapes. There is no schedule, so latency runs from
//! the actual send; the run ends after `--requests` requests or, with `--duration`, when the
//! first client finds the time is up (requests in flight are still answered and counted).
//! Throughput is completed requests over the first send to the last answer.
//!
//! Bounded: the schedule is finite, every socket read and write has a timeout, and each
//! scheduled request yields exactly one outcome (a status or a transport error), so the run
//! ends. What must never happen here: printing (progress goes to the caller's callback),
//! measuring latency from the actual send instead of the schedule, or dropping a request's
//! outcome.

use super::client::{ClientConn, TransportError};
use super::error::LoadgenError;
use super::prompt::{self, BodyOptions};
use super::report::{ClosedLoopSummary, LagSummary, LiveReport, LiveStats};
use super::schedule::Schedule;
use super::target::Target;
use crate::core::request::ms_to_nanos;
use crate::core::CoreStats;
use crate::latency_histogram::{LATENCY_MAX_NS, LATENCY_MIN_NS};
use crate::sim::arrivals::ClosedLoop;
use crate::sim::driver::RunOutput;
use crate::sim::record::Recorder;
use crate::sim::report::RunReport;
use crate::sim::scenario::Scenario;
use crate::sim::workload::{Digest, Generated, SimRequest};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A send more than this long after its scheduled time is a late send, ns.
pub const LATE_SEND_NS: u64 = 1_000_000;
/// Longest per-request timeout, ms (one day).
pub const TIMEOUT_MS_MAX: f64 = 86_400_000.0;
/// Most connection threads.
pub const CONNECTIONS_MAX: usize = 4096;
/// The schedule starts this long after every connection is open, so that no thread is
/// still waking from the start barrier when the first request is due.
const START_LEAD: Duration = Duration::from_millis(20);
/// Progress is reported this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Everything `abe loadgen` takes besides output paths.
#[derive(Clone, Debug)]
pub struct LoadgenOptions {
    /// Base URL of the target, `http://host:port[/prefix]`.
    pub url: String,
    /// Built-in scenario name or scenario file (as for `abe simulate`); with `trace` and
    /// this empty, the replay base ([`Scenario::replay`]).
    pub scenario: String,
    /// Replays this trace file (its arrivals and shapes; prompts from its `hash_ids`).
    pub trace: Option<std::path::PathBuf>,
    pub seed: u64,
    /// Requests to send (default: the scenario's).
    pub requests: Option<u64>,
    /// Send only requests scheduled within this many seconds.
    pub duration_s: Option<f64>,
    /// Connection threads, each with one keep-alive connection (open loop; a closed loop
    /// has one per client).
    pub connections: usize,
    /// Closed loop with this many clients (default: the scenario's, if its arrivals are
    /// `closed`; otherwise open loop).
    pub clients: Option<usize>,
    /// Closed loop: think time between an answer and the client's next request, ms
    /// (default: the scenario's, else 0). Implies a closed loop.
    pub think_ms: Option<f64>,
    /// Play the schedule this many times faster.
    pub rate_scale: f64,
    /// If set, `POST /admin/strategy/{name}` to the target before the run.
    pub strategy: Option<String>,
    /// Bearer token for `/admin/*`.
    pub admin_token: Option<String>,
    /// SLA for attainment, ms (default: the scenario's).
    pub sla_ms: Option<f64>,
    /// A request with no complete answer this long after it was sent fails with `timeout`.
    pub timeout_ms: f64,
    pub body: BodyOptions,
    /// Allow a non-loopback target.
    pub allow_remote: bool,
}

impl Default for LoadgenOptions {
    fn default() -> Self {
        LoadgenOptions {
            url: "http://127.0.0.1:8080".into(),
            scenario: "steady_state".into(),
            trace: None,
            seed: 7,
            requests: None,
            duration_s: None,
            connections: 64,
            clients: None,
            think_ms: None,
            rate_scale: 1.0,
            strategy: None,
            admin_token: None,
            sla_ms: None,
            timeout_ms: 60_000.0,
            body: BodyOptions {
                model: None,
                abe_extensions: true,
                embeddings: false,
            },
            allow_remote: false,
        }
    }
}

/// A progress snapshot, handed to the caller's callback about once a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Seconds since the schedule started.
    pub elapsed_s: f64,
    /// Requests scheduled in total.
    pub scheduled: u64,
    pub sent: u64,
    pub completed: u64,
    /// Answered with anything but 2xx, or not answered (transport errors).
    pub errors: u64,
    /// Completions per second over the last interval.
    pub rps: f64,
    /// p99 latency of completions so far, ms.
    pub p99_ms: f64,
    pub late_sends: u64,
}

impl Progress {
    /// One human line, e.g. for stderr.
    pub fn line(&self) -> String {
        format!(
            "loadgen {:7.1} s | sent {}/{} | completed {} | errors {} | {:.1} req/s | p99 {:.1} ms | late {}",
            self.elapsed_s,
            self.sent,
            self.scheduled,
            self.completed,
            self.errors,
            self.rps,
            self.p99_ms,
            self.late_sends
        )
    }
}

/// What became of one scheduled request.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Http {
        status: u16,
        prompt_tokens: Option<u32>,
        completion_tokens: Option<u32>,
    },
    Transport(TransportError),
}

/// One request's result, sent from a connection thread to the collector.
#[derive(Clone, Copy, Debug)]
struct Done {
    index: u32,
    /// Where this request's latency counts from, ns after the start: its scheduled send
    /// (open loop) or its actual send (closed loop).
    origin_ns: u64,
    /// When the last response byte arrived (or the failure happened), ns after the start.
    end_ns: u64,
    /// Actual send minus scheduled send, ns (0 if early, which a sleep never is).
    lag_ns: u64,
    outcome: Outcome,
}

/// Counters the connection threads bump and the collector reads for progress.
struct Shared {
    /// Next schedule index to take.
    next: AtomicUsize,
    sent: AtomicU64,
    late: AtomicU64,
    /// Idle keep-alive sockets the server had closed, replaced ([`ClientConn::reopened`]),
    /// added by each connection thread as it ends.
    reopened: AtomicU64,
}

/// Where connection threads wait until every connection is open and the start instant is
/// known (or the run is called off).
#[derive(Default)]
struct Gate {
    /// (threads arrived, `Some(start)` once open: `Some(None)` means abort).
    state: Mutex<(usize, Option<Option<Instant>>)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, Option<Option<Instant>>)> {
        // A poisoned gate only means another connection thread panicked; the state is
        // still two plain values.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection thread is ready; blocks until the gate opens. `None`: abort.
    fn arrive_and_wait(&self) -> Option<Instant> {
        let mut g = self.lock();
        g.0 += 1;
        self.changed.notify_all();
        loop {
            if let Some(open) = g.1 {
                return open;
            }
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until `threads` connection threads have arrived.
    fn wait_for(&self, threads: usize) {
        let mut g = self.lock();
        while g.0 < threads {
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets every waiting thread go with `start` (`None`: abort).
    fn open(&self, start: Option<Instant>) {
        self.lock().1 = Some(start);
        self.changed.notify_all();
    }
}

/// Resolves the scenario, runs the load, and returns the report. `on_progress` is called
/// about once a second while requests are outstanding, and once at the end.
pub fn run(
    opts: &LoadgenOptions,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<LiveReport, LoadgenError> {
    let scenario = match &opts.trace {
        Some(path) if opts.scenario.is_empty() => Scenario::replay(path),
        Some(path) => Scenario::resolve(&opts.scenario)?.with_trace(path),
        None => Scenario::resolve(&opts.scenario)?,
    };
    run_scenario(&scenario, opts, on_progress)
}

/// Runs `scenario` with `opts` (its `scenario` field is ignored).
pub fn run_scenario(
    scenario: &Scenario,
    opts: &LoadgenOptions,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<LiveReport, LoadgenError> {
    if !(1..=CONNECTIONS_MAX).contains(&opts.connections) {
        return Err(LoadgenError::invalid(
            "--connections",
            format!("{} must be in 1..={CONNECTIONS_MAX}", opts.connections),
        ));
    }
    if !(opts.timeout_ms.is_finite() && (1.0..=TIMEOUT_MS_MAX).contains(&opts.timeout_ms)) {
        return Err(LoadgenError::invalid(
            "--timeout-ms",
            format!("{} must be in 1..={TIMEOUT_MS_MAX}", opts.timeout_ms),
        ));
    }
    let sla_ms = opts.sla_ms.unwrap_or(scenario.sla_ms);
    if !(sla_ms.is_finite() && sla_ms >= 0.0) {
        return Err(LoadgenError::invalid(
            "--sla-ms",
            format!("{sla_ms} must be >= 0"),
        ));
    }
    let target = Target::parse(&opts.url, opts.allow_remote)?;
    let closed = closed_loop(scenario, opts)?;
    let schedule;
    let closed_requests;
    let plan = match closed {
        None => {
            schedule = Schedule::new(
                scenario,
                opts.seed,
                opts.requests,
                opts.duration_s,
                opts.rate_scale,
            )?;
            Plan::Open(&schedule)
        }
        Some(lp) => {
            closed_requests = closed_requests_for(scenario, opts)?;
            Plan::Closed {
                requests: &closed_requests.requests,
                trace_ids: &closed_requests.trace_ids,
                lp,
                duration_ns: opts.duration_s.map(|d| (d * 1e9) as u64),
            }
        }
    };
    let timeout = Duration::from_secs_f64(opts.timeout_ms / 1e3);
    let strategy = super::admin::prepare(
        &target,
        timeout,
        opts.strategy.as_deref(),
        opts.admin_token.as_deref(),
    )?;

    let out = drive(&target, &plan, opts, timeout, sla_ms, on_progress)?;
    let Collected {
        mut record,
        lag_ns,
        errors,
        sent,
        late,
        reopened,
        received,
        end_ns,
    } = out;

    // Open loop: every scheduled request; closed loop: those the clients sent (a run cut by
    // its duration offers fewer than it generated).
    let (n, digest, first_arrival_ns, offered_rps, connections) = match &plan {
        Plan::Open(schedule) => {
            let n = schedule.len() as u64;
            let span_s = schedule.span_s();
            (
                n,
                schedule.digest,
                schedule.send_at_ns.first().copied(),
                if span_s > 0.0 {
                    (n - 1) as f64 / span_s
                } else {
                    0.0
                },
                opts.connections,
            )
        }
        Plan::Closed { requests, lp, .. } => (
            sent,
            Digest::of(&requests[..sent as usize]),
            Some(0),
            0.0,
            lp.clients,
        ),
    };
    let rejected = errors.get("429").copied().unwrap_or(0);
    record.offered = n;
    let offered: &[SimRequest] = match &plan {
        Plan::Open(schedule) => &schedule.requests,
        Plan::Closed { requests, .. } => &requests[..sent as usize],
    };
    for r in offered {
        record.by_priority[r.priority.index()].offered += 1;
    }
    record.offered_digest = digest;
    record.first_arrival_ns = first_arrival_ns;
    record.rejected_full = rejected;
    record.admitted = n - rejected;
    let output = RunOutput {
        record,
        stats: CoreStats::default(),
        busy_ns: Vec::new(),
        end_ns,
        unfinished: n - received,
        memory_limit_hits: 0,
        cluster: None,
    };
    let mut run = RunReport::new(&strategy, Vec::new(), &output);
    run.label = format!("live {strategy}");
    let lag_ms = |q: f64| lag_ns.value_at_quantile(q) as f64 / 1e6;
    Ok(LiveReport {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        seed: opts.seed,
        requests: n,
        request_digest: digest.hex(),
        sla_ms,
        target: target.url.clone(),
        connections,
        rate_scale: opts.rate_scale,
        duration_s: opts.duration_s,
        closed_loop: closed.map(|lp| ClosedLoopSummary {
            clients: lp.clients,
            think_ms: lp.think_ns as f64 / 1e6,
            think_jitter: lp.think_jitter,
        }),
        strategies: vec![strategy],
        runs: vec![run],
        live: LiveStats {
            sent,
            late_sends: late,
            late_threshold_ms: LATE_SEND_NS as f64 / 1e6,
            send_lag_ms: LagSummary {
                p50: lag_ms(0.5),
                p99: lag_ms(0.99),
                max: lag_ns.max() as f64 / 1e6,
            },
            errors_by_status: errors,
            reopened_connections: reopened,
            offered_rps,
            wall_s: end_ns as f64 / 1e9,
        },
    })
}

/// The closed loop to run, if any: `--clients`/`--think-ms` over the scenario's `closed`
/// arrivals; `None` (open loop) when neither says so.
fn closed_loop(
    scenario: &Scenario,
    opts: &LoadgenOptions,
) -> Result<Option<ClosedLoop>, LoadgenError> {
    let from_scenario = scenario.workload.arrivals.closed_loop()?;
    if from_scenario.is_none() && opts.clients.is_none() && opts.think_ms.is_none() {
        return Ok(None);
    }
    let mut lp = from_scenario.unwrap_or(ClosedLoop {
        clients: 1,
        think_ns: 0,
        think_jitter: 0.0,
    });
    if let Some(c) = opts.clients {
        lp.clients = c;
    }
    if !(1..=CONNECTIONS_MAX).contains(&lp.clients) {
        return Err(LoadgenError::invalid(
            "--clients",
            format!("{} must be in 1..={CONNECTIONS_MAX}", lp.clients),
        ));
    }
    if let Some(t) = opts.think_ms {
        if !(t.is_finite() && (0.0..=TIMEOUT_MS_MAX).contains(&t)) {
            return Err(LoadgenError::invalid(
                "--think-ms",
                format!("{t} must be in 0..={TIMEOUT_MS_MAX}"),
            ));
        }
        lp.think_ns = ms_to_nanos(t);
    }
    Ok(Some(lp))
}

/// The request shapes a closed loop takes in order: the scenario's sequence for `--requests`
/// (default: the scenario's count), as `abe simulate` generates it.
fn closed_requests_for(
    scenario: &Scenario,
    opts: &LoadgenOptions,
) -> Result<Generated, LoadgenError> {
    if let Some(d) = opts.duration_s {
        if !(d.is_finite() && d > 0.0) {
            return Err(LoadgenError::invalid(
                "--duration",
                format!("{d} must be a finite number of seconds > 0"),
            ));
        }
    }
    let count = opts.requests.unwrap_or(scenario.requests);
    if count == 0 || count >= u64::from(u32::MAX) {
        return Err(LoadgenError::invalid(
            "--requests",
            format!("{count} must be in 1..{}", u32::MAX),
        ));
    }
    Ok(scenario.workload.generate_with_prefix(count, opts.seed)?)
}

/// What the connection threads play.
enum Plan<'a> {
    /// Each request at its scheduled time.
    Open(&'a Schedule),
    /// `lp.clients` clients, each sending its next request a think time after its answer,
    /// until `requests` are used up or `duration_ns` has passed.
    Closed {
        requests: &'a [SimRequest],
        /// The block ids the requests' prefix spans index.
        trace_ids: &'a [u64],
        lp: ClosedLoop,
        duration_ns: Option<u64>,
    },
}

impl Plan<'_> {
    fn requests(&self) -> &[SimRequest] {
        match self {
            Plan::Open(s) => &s.requests,
            Plan::Closed { requests, .. } => requests,
        }
    }

    fn threads(&self, connections: usize) -> usize {
        match self {
            Plan::Open(s) => connections.min(s.len()),
            Plan::Closed { requests, lp, .. } => lp.clients.min(requests.len()),
        }
    }
}

/// Turns the collector's state into [`Progress`] snapshots.
struct Ticker {
    start: Instant,
    /// When the previous snapshot was taken, and how many had completed then.
    last: Instant,
    completed_at_last: u64,
    scheduled: u64,
}

impl Ticker {
    fn tick(&mut self, now: Instant, record: &Recorder, errors: u64, shared: &Shared) -> Progress {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let rps = if dt > 0.0 {
            (record.completed - self.completed_at_last) as f64 / dt
        } else {
            0.0
        };
        self.last = now;
        self.completed_at_last = record.completed;
        Progress {
            elapsed_s: now.saturating_duration_since(self.start).as_secs_f64(),
            scheduled: self.scheduled,
            // Relaxed: progress counters; the final values are read after the threads join.
            sent: shared.sent.load(Ordering::Relaxed),
            completed: record.completed,
            errors,
            rps,
            p99_ms: if record.completed == 0 {
                0.0
            } else {
                record.latency_ns.value_at_quantile(0.99) as f64 / 1e6
            },
            late_sends: shared.late.load(Ordering::Relaxed),
        }
    }
}

/// What the collector gathered.
struct Collected {
    record: Recorder,
    lag_ns: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    sent: u64,
    late: u64,
    reopened: u64,
    /// Outcomes received (equals the schedule length unless a connection thread died).
    received: u64,
    /// Last outcome, ns after the start.
    end_ns: u64,
}

/// Plays the plan and collects every outcome.
fn drive(
    target: &Target,
    plan: &Plan<'_>,
    opts: &LoadgenOptions,
    timeout: Duration,
    sla_ms: f64,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<Collected, LoadgenError> {
    let requests = plan.requests();
    let n = requests.len();
    let threads = plan.threads(opts.connections);
    let path = target.path(opts.body.path());
    let shared = Shared {
        next: AtomicUsize::new(0),
        sent: AtomicU64::new(0),
        late: AtomicU64::new(0),
        reopened: AtomicU64::new(0),
    };
    // Every thread opens its connection, then waits at the gate for the start instant.
    let gate = Gate::default();
    let (tx, rx) = mpsc::channel::<Done>();

    let expected_ns = match plan {
        Plan::Open(schedule) => schedule.send_at_ns.last().copied().unwrap_or(0),
        Plan::Closed { duration_ns, .. } => duration_ns.unwrap_or(0),
    };
    let mut record = Recorder::new(
        1,
        ms_to_nanos(sla_ms),
        // The recorder's time series is not reported live; one window a second bounds it.
        1_000_000_000,
        expected_ns,
    );
    let mut lag_ns = crate::latency_histogram::latency_histogram();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut received = 0u64;
    let mut end_ns = 0u64;
    let mut failed_so_far = 0u64;

    std::thread::scope(|s| -> Result<(), LoadgenError> {
        for id in 0..threads {
            let tx = tx.clone();
            let (shared, gate, path) = (&shared, &gate, &path);
            let spawned = std::thread::Builder::new()
                .name(format!("loadgen-conn-{id}"))
                .spawn_scoped(s, move || {
                    let mut conn = ClientConn::new(target.addr, timeout);
                    // A failed connect is retried (and counted) at the first request.
                    let _ = conn.connect();
                    let Some(start) = gate.arrive_and_wait() else {
                        return;
                    };
                    let client;
                    let (requests, trace_ids, pace) = match plan {
                        Plan::Open(schedule) => (
                            &schedule.requests[..],
                            &schedule.trace_ids[..],
                            Pace::open(schedule),
                        ),
                        Plan::Closed {
                            requests,
                            trace_ids,
                            lp,
                            duration_ns,
                        } => {
                            client = Client {
                                id,
                                lp,
                                end: duration_ns.map(|d| start + Duration::from_nanos(d)),
                            };
                            let pace = Pace::closed(&client, opts.seed, start);
                            (&requests[..], &trace_ids[..], pace)
                        }
                    };
                    connection_loop(
                        &mut conn, shared, requests, trace_ids, pace, target, path, opts, start,
                        &tx,
                    )
                });
            if let Err(source) = spawned {
                gate.open(None);
                return Err(LoadgenError::Spawn { source });
            }
        }
        drop(tx);
        gate.wait_for(threads);
        let start = Instant::now() + START_LEAD;
        gate.open(Some(start));

        let mut next_tick = start + PROGRESS_EVERY;
        let mut ticker = Ticker {
            start,
            last: start,
            completed_at_last: 0,
            scheduled: n as u64,
        };
        while received < n as u64 {
            let now = Instant::now();
            if now >= next_tick {
                on_progress(&ticker.tick(now, &record, failed_so_far, &shared));
                next_tick += PROGRESS_EVERY;
                continue;
            }
            let done = match rx.recv_timeout(next_tick - now) {
                Ok(d) => d,
                Err(RecvTimeoutError::Timeout) => continue,
                // Every connection thread has exited: nothing more will arrive.
                Err(RecvTimeoutError::Disconnected) => break,
            };
            received += 1;
            end_ns = end_ns.max(done.end_ns);
            let _ = lag_ns.record(done.lag_ns.clamp(LATENCY_MIN_NS, LATENCY_MAX_NS));
            let r = &requests[done.index as usize];
            let mut at = *r;
            at.arrival_ns = done.origin_ns;
            match done.outcome {
                Outcome::Http {
                    status,
                    prompt_tokens,
                    completion_tokens,
                } if (200..300).contains(&status) => {
                    // Tokens as the server counted them, where it says.
                    at.prompt_tokens = prompt_tokens.unwrap_or(r.prompt_tokens);
                    at.output_tokens = completion_tokens.unwrap_or(r.output_tokens);
                    record.on_complete(done.end_ns, &at);
                }
                Outcome::Http { status, .. } => {
                    *errors.entry(status.to_string()).or_default() += 1;
                    failed_so_far += 1;
                    if status == 429 {
                        // Refused at admission: a rejection, as in the simulator.
                        record.series.on_fail(done.end_ns);
                        record.by_priority[r.priority.index()].failed += 1;
                    } else {
                        record.on_fail(done.end_ns, r);
                    }
                }
                Outcome::Transport(e) => {
                    *errors.entry(e.as_str().to_string()).or_default() += 1;
                    failed_so_far += 1;
                    record.on_fail(done.end_ns, r);
                }
            }
        }
        on_progress(&ticker.tick(Instant::now(), &record, failed_so_far, &shared));
        Ok(())
    })?;
    Ok(Collected {
        record,
        lag_ns,
        errors,
        sent: shared.sent.load(Ordering::Relaxed),
        late: shared.late.load(Ordering::Relaxed),
        reopened: shared.reopened.load(Ordering::Relaxed),
        received,
        end_ns,
    })
}

/// One closed-loop client.
struct Client<'a> {
    /// Which client (its first send and think-time stream depend on it).
    id: usize,
    lp: &'a ClosedLoop,
    /// No request is sent at or after this instant.
    end: Option<Instant>,
}

/// When a connection thread sends its next request.
enum Pace<'a> {
    /// Open loop: request `i` is due `send_at_ns[i]` after the start, whatever came back.
    Open { send_at_ns: &'a [u64] },
    /// Closed loop: one client, sending again a think time after its answer.
    Closed {
        client: &'a Client<'a>,
        /// Think times from (seed, client): the same run asks for the same pauses.
        rng: SmallRng,
        next_at: Instant,
    },
}

impl<'a> Pace<'a> {
    fn open(schedule: &'a Schedule) -> Pace<'a> {
        Pace::Open {
            send_at_ns: &schedule.send_at_ns,
        }
    }

    fn closed(client: &'a Client<'a>, seed: u64, start: Instant) -> Pace<'a> {
        Pace::Closed {
            client,
            rng: SmallRng::seed_from_u64(seed ^ (client.id as u64).wrapping_mul(0x9E37_79B9)),
            next_at: start + Duration::from_nanos(client.lp.first_arrival_ns(client.id)),
        }
    }
}

/// Sleeps until `at` (returns at once if it passed).
fn sleep_until(at: Instant) {
    let now = Instant::now();
    if at > now {
        std::thread::sleep(at - now);
    }
}

/// One connection thread, open or closed loop: take the next request, wait for its time
/// (`pace`), send, read, report; stop when the requests run out, a closed loop's end
/// passes, or the collector is gone.
#[allow(clippy::too_many_arguments)]
fn connection_loop(
    conn: &mut ClientConn,
    shared: &Shared,
    requests: &[SimRequest],
    trace_ids: &[u64],
    mut pace: Pace<'_>,
    target: &Target,
    path: &str,
    opts: &LoadgenOptions,
    start: Instant,
    tx: &mpsc::Sender<Done>,
) {
    let mut request = Vec::with_capacity(4096);
    let mut body = Vec::with_capacity(4096);
    let since_start = |t: Instant| t.saturating_duration_since(start).as_nanos() as u64;
    loop {
        if let Pace::Closed {
            client, next_at, ..
        } = &pace
        {
            sleep_until(*next_at);
            if client.end.is_some_and(|end| Instant::now() >= end) {
                break;
            }
        }
        // Relaxed: the index only hands out distinct requests; the requests are read-only.
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(r) = requests.get(i) else {
            break;
        };
        // Build the bytes before sleeping, so the send itself is one write at the due time.
        prompt::write_request(
            &mut request,
            &mut body,
            path,
            &target.host_header,
            &opts.body,
            r,
            prompt::request_ids(trace_ids, r),
            opts.seed,
            i as u64,
        );
        // Open loop: latency runs from the scheduled send (no coordinated omission), and a
        // send late past LATE_SEND_NS is counted; closed loop: from the actual send.
        let (origin_ns, lag_ns) = match &pace {
            Pace::Open { send_at_ns } => {
                let due_ns = send_at_ns[i];
                sleep_until(start + Duration::from_nanos(due_ns));
                (due_ns, since_start(Instant::now()).saturating_sub(due_ns))
            }
            Pace::Closed { .. } => (since_start(Instant::now()), 0),
        };
        shared.sent.fetch_add(1, Ordering::Relaxed);
        if lag_ns > LATE_SEND_NS {
            shared.late.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = send(conn, &request);
        let answered = Instant::now();
        let done = Done {
            index: i as u32,
            origin_ns,
            end_ns: since_start(answered),
            lag_ns,
            outcome,
        };
        if tx.send(done).is_err() {
            // The collector is gone (it only leaves when every outcome is in).
            break;
        }
        if let Pace::Closed {
            client,
            rng,
            next_at,
        } = &mut pace
        {
            *next_at = answered + Duration::from_nanos(client.lp.think_ns(rng));
        }
    }
    shared
        .reopened
        .fetch_add(conn.reopened(), Ordering::Relaxed);
    conn.close();
}

/// Sends `request` on `conn` and reads the answer into an outcome (status and usage, or the
/// transport error), for the open- and the closed-loop senders alike.
fn send(conn: &mut ClientConn, request: &[u8]) -> Outcome {
    match conn.request(request) {
        Ok(resp) => {
            let (prompt_tokens, completion_tokens) = prompt::usage(resp.body);
            Outcome::Http {
                status: resp.status,
                prompt_tokens,
                completion_tokens,
            }
        }
        Err(e) => Outcome::Transport(e),
    }
}
