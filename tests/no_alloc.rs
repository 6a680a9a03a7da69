//! Zero allocations on the engine thread (and in the core) in steady state.
//!
//! A counting global allocator counts allocations made by threads marked through the
//! runtime's `on_thread_start` hook (the engine), and by the test thread while it drives a
//! bare core. Warm-up first (first-touch growth is allowed), then 100,000 requests each.

use abe::core::strategy::StrategyKind;
use abe::core::{Action, BatchOutcome, Core, CoreConfig, Kind, Priority, RequestMeta};
use abe::exec::latency::LatencyModel;
use abe::exec::Work;
use abe::router::{BackendConfig, Need, Router, RoutingConfig, SlotState};
use abe::runtime::engine::Routing;
use abe::runtime::{self, Request, RouteRequest, RuntimeConfig, ThreadRole};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Counting;

static COUNTED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static TRACKED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: defers to the system allocator; the bookkeeping touches only a const-initialised
// thread-local and an atomic, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if TRACKED.try_with(|t| t.get()).unwrap_or(false) {
            COUNTED.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if TRACKED.try_with(|t| t.get()).unwrap_or(false) {
            COUNTED.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn mark_engine(role: ThreadRole) {
    if role == ThreadRole::Engine {
        TRACKED.with(|t| t.set(true));
    }
}

/// A wake as an io thread's submitter has one (a no-op here: the test polls), so workers
/// answer its non-streaming requests directly (`runtime::direct_reply`) and the direct path
/// is under the count too.
fn io_thread_wake() -> Arc<dyn Fn() + Send + Sync> {
    Arc::new(|| {})
}

/// `workers` sim workers, zero latency, unpinned, the engine thread counted.
fn engine_config(workers: usize) -> RuntimeConfig {
    let mut cfg = RuntimeConfig::default();
    cfg.core.workers = workers;
    cfg.sim.latency = LatencyModel::None;
    cfg.pin = false;
    cfg.on_thread_start = Some(mark_engine);
    cfg
}

/// The engine's snapshot once `seen` holds of it, waiting up to 5 s. The engine publishes
/// every ~50 ms (an idle one later), and a test's run can be shorter than that: a snapshot
/// read right after it may predate every request it sent (all counts zero).
fn snapshot_when(
    handle: &runtime::Handle,
    seen: impl Fn(&runtime::Snapshot) -> bool,
) -> runtime::Snapshot {
    let mut snap = handle.snapshot();
    for _ in 0..500 {
        if seen(&snap) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        snap = handle.snapshot();
    }
    snap
}

/// Requests routed to any backend, in a snapshot.
fn routed_sum(snap: &runtime::Snapshot) -> u64 {
    snap.backends.iter().map(|b| b.routed).sum()
}

/// Runs `n` requests through a submitter with at most `window` in flight.
fn drive(sub: &mut runtime::Submitter, n: u64, window: usize, prompt: &str) {
    drive_routed(sub, n, window, prompt, &[None]);
}

/// As `drive`, request `i` asking for `routes[i % routes.len()]`.
fn drive_routed(
    sub: &mut runtime::Submitter,
    n: u64,
    window: usize,
    prompt: &str,
    routes: &[Option<RouteRequest>],
) {
    let mut sent = 0u64;
    let mut done = 0u64;
    // Prompts with full blocks carry their names (made here, on the submitting thread, as
    // the io thread does), so a continuous engine with prefix caching looks them up.
    let mut names = Vec::new();
    abe::core::prefix::text_block_hashes(prompt, 16, &mut names);
    let names: Option<std::sync::Arc<[u64]>> = (!names.is_empty()).then(|| names.into());
    while done < n {
        while sent < n && sub.in_flight() < window {
            let req = Request {
                priority: if sent % 10 == 0 {
                    Priority::High
                } else {
                    Priority::Normal
                },
                route: routes[(sent % routes.len() as u64) as usize],
                work: Work {
                    kind: Kind::Completion,
                    prompt: prompt.into(),
                    max_tokens: 4,
                    // Half streaming: in continuous mode the engine also sends token
                    // events; in request-level batching the other half are answered by
                    // their workers directly (`runtime::direct_reply`), the engine keeping
                    // the books.
                    stream: sent % 2 == 0,
                    prompt_blocks: names.clone(),
                    ..Default::default()
                },
            };
            match sub.submit(req, sent) {
                Ok(()) => sent += 1,
                Err(_) => break,
            }
        }
        let got = sub.drain_completions(|c| {
            if let Some(outcome) = c.outcome() {
                assert!(outcome.is_ok(), "request {} failed: {:?}", c.tag, c.event);
            }
        });
        done += got as u64;
        if got == 0 {
            std::thread::yield_now();
        }
    }
}

#[test]
fn engine_thread_allocates_nothing_over_100k_requests_in_steady_state() {
    let handle = runtime::start(engine_config(2)).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    drive(&mut sub, 20_000, 256, "warm up the engine");
    let before = COUNTED.load(Ordering::Relaxed);
    drive(&mut sub, 100_000, 256, "steady state");
    let after = COUNTED.load(Ordering::Relaxed);
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(
        after - before,
        0,
        "engine thread allocated {} times over 100,000 requests",
        after - before
    );
}

#[test]
fn engine_thread_allocates_nothing_routing_across_backends() {
    // Three sim backends: `a` and `b` serve model m (round-robin between them), `c` serves
    // n; requests alternate between the two models.
    let backend = sim_backend;
    let routing_cfg = round_robin();
    let backends = [backend("a", "m"), backend("b", "m"), backend("c", "n")];
    let (router, _) = Router::build(&backends, &routing_cfg, 7).unwrap();
    let need = Need::default();
    let routes = [
        Some(RouteRequest {
            name: router.lookup("m").unwrap(),
            need,
            session: None,
        }),
        Some(RouteRequest {
            name: router.lookup("n").unwrap(),
            need,
            session: None,
        }),
    ];
    let routing = Routing::new(router, routes[0].unwrap().name, None);
    let cfg = engine_config(1);
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = (0..3)
        .map(|l| runtime::sim_lane(&cfg, &cfg.sim.latency, 1, l << 32, &stop))
        .collect();
    let handle = runtime::start_routed(cfg, routing, lanes, stop).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    drive_routed(&mut sub, 20_000, 256, "warm up the engine", &routes);
    let before = COUNTED.load(Ordering::Relaxed);
    drive_routed(&mut sub, 100_000, 256, "steady state", &routes);
    let after = COUNTED.load(Ordering::Relaxed);
    let snap = snapshot_when(&handle, |s| routed_sum(s) >= 120_000);
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(
        after - before,
        0,
        "engine thread allocated {} times over 100,000 routed requests",
        after - before
    );
    // Every backend took its share: m alternates between a and b, n goes to c.
    let routed: Vec<u64> = snap.backends.iter().map(|b| b.routed).collect();
    assert!(routed.iter().all(|&r| r > 10_000), "{routed:?}");
}

#[test]
fn engine_thread_allocates_nothing_while_backends_drain_and_come_back() {
    // Two sim backends of model m; between chunks of requests the test removes `b` (it
    // drains, then the engine empties its slot) and adds it back, ten times over.
    let backend = |name: &str| {
        let mut b = BackendConfig::default_sim("m", 100_000);
        b.name = name.into();
        b.max_concurrent_batches = 1;
        b
    };
    let routing_cfg = RoutingConfig {
        strategy: "round_robin".into(),
        ..Default::default()
    };
    let (router, _) = Router::build(&[backend("a"), backend("b")], &routing_cfg, 7).unwrap();
    let name = router.lookup("m").unwrap();
    let route = Some(RouteRequest {
        name,
        need: Need::default(),
        session: None,
    });
    let routing = Routing::new(router, name, None);
    let cfg = engine_config(1);
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = (0..2)
        .map(|l| runtime::sim_lane(&cfg, &cfg.sim.latency, 1, l << 32, &stop))
        .collect();
    let handle = runtime::start_routed(cfg, routing, lanes, stop).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    let b = abe::router::BackendId::from_index(1);
    // Warm-up passes through every state once (first-touch growth is allowed there).
    let mut seq = 0;
    for slot in [SlotState::Draining, SlotState::Active] {
        seq += 1;
        handle.set_slot(b, slot, seq).unwrap();
        drive_routed(&mut sub, 10_000, 256, "warm up the engine", &[route]);
    }
    let before = COUNTED.load(Ordering::Relaxed);
    for round in 0..10 {
        let slot = if round % 2 == 0 {
            SlotState::Draining
        } else {
            SlotState::Active
        };
        seq += 1;
        handle.set_slot(b, slot, seq).unwrap();
        drive_routed(&mut sub, 10_000, 256, "steady state", &[route]);
    }
    let after = COUNTED.load(Ordering::Relaxed);
    // A round can take less than the engine's publishing interval: wait for a snapshot
    // that has seen the last slot change (its sequence number).
    let snap = snapshot_when(&handle, |s| s.backends[1].slot_seq == seq);
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(
        after - before,
        0,
        "engine thread allocated {} times while a backend came and went",
        after - before
    );
    assert_eq!(report.completed, 120_000, "{report:?}");
    // b took work in the rounds it was active, and was left active.
    assert!(snap.backends[1].routed > 10_000, "{:?}", snap.backends);
    assert_eq!(snap.backends[1].slot, SlotState::Active);
}

#[test]
fn engine_thread_allocates_nothing_while_tables_swap_in_new_backends_and_aliases() {
    // `a` serves m; a spare slot (as `serve` reserves it, empty) takes backend `c` serving
    // m2, with an alias x -> m2; then the alias moves between m and m2 every round. The
    // tables are built on this thread; the engine only swaps them.
    use abe::router::slots::spare_placeholder;
    use abe::router::BackendKindName;
    use abe::runtime::tables::{EngineTables, TablesAnswer};
    use std::collections::BTreeMap;
    let backend = sim_backend;
    let routing_cfg = round_robin();
    let mut slots = vec![
        backend("a", "m"),
        spare_placeholder("spare-0".into(), BackendKindName::Sim),
    ];
    let (mut router, _) = Router::build(&slots, &routing_cfg, 7).unwrap();
    let spare = abe::router::BackendId::from_index(1);
    router.registry_mut().set_slot(spare, SlotState::Empty);
    let mut base = router.lookup_copy();
    let m = router.lookup("m").unwrap();
    let routing = Routing::new(router, m, None);
    let cfg = engine_config(1);
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = (0..2)
        .map(|l| runtime::sim_lane(&cfg, &cfg.sim.latency, 1, l << 32, &stop))
        .collect();
    let handle = runtime::start_routed(cfg, routing, lanes, stop).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    // Swaps in tables for `slots` with alias x -> `target`; the name ids of m and x.
    let mut swap = |slots: &[BackendConfig], target: &str| {
        let aliases = BTreeMap::from([("x".to_string(), target.to_string())]);
        let tables = base.next_tables(slots, &aliases, &BTreeMap::new()).unwrap();
        let ids = (
            tables.resolver().lookup("m").unwrap(),
            tables.resolver().lookup("x").unwrap(),
        );
        let copy = base.lookup_copy_with(tables.clone());
        let answer = handle
            .swap_tables(
                EngineTables::new(tables),
                std::time::Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(answer, TablesAnswer::Taken);
        base = copy;
        ids
    };
    slots[1] = backend("c", "m2");
    let (m, x) = swap(&slots, "m2");
    handle.set_slot(spare, SlotState::Active, 1).unwrap();
    let route = |name| {
        Some(RouteRequest {
            name,
            need: Need::default(),
            session: None,
        })
    };
    let routes = [route(m), route(x)];
    drive_routed(&mut sub, 20_000, 256, "warm up the engine", &routes);
    let before = COUNTED.load(Ordering::Relaxed);
    for round in 0..10 {
        let ids = swap(&slots, if round % 2 == 0 { "m" } else { "m2" });
        assert_eq!(ids, (m, x), "ids carry over");
        drive_routed(&mut sub, 10_000, 256, "steady state", &routes);
    }
    let after = COUNTED.load(Ordering::Relaxed);
    let snap = snapshot_when(&handle, |s| routed_sum(s) >= 120_000);
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(
        after - before,
        0,
        "engine thread allocated {} times while tables were swapped",
        after - before
    );
    // c took the alias's requests while it pointed at m2, and a took every other one.
    assert!(snap.backends[1].routed > 10_000, "{:?}", snap.backends);
    assert!(snap.backends[0].routed > 60_000, "{:?}", snap.backends);
}

/// Request-level routing by affinity over two backends of model m: `prefix_aware` with a
/// prompt of full blocks (the router's approximate index matches and records its names on
/// every decision), `session` with two session keys. Returns requests routed per backend.
fn affinity_routing_allocations(
    strategy: &str,
    prompt: &str,
    sessions: [Option<u64>; 2],
) -> (u64, Vec<u64>) {
    let backend = |name: &str| {
        let mut b = BackendConfig::default_sim("m", 100_000);
        b.name = name.into();
        b.max_concurrent_batches = 1;
        b
    };
    let routing_cfg = RoutingConfig {
        strategy: strategy.into(),
        ..Default::default()
    };
    let (router, _) = Router::build(&[backend("a"), backend("b")], &routing_cfg, 7).unwrap();
    let name = router.lookup("m").unwrap();
    let routes = sessions.map(|session| {
        Some(RouteRequest {
            name,
            need: Need::default(),
            session,
        })
    });
    let routing = Routing::new(router, name, None);
    let cfg = engine_config(1);
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = (0..2)
        .map(|l| runtime::sim_lane(&cfg, &cfg.sim.latency, 1, l << 32, &stop))
        .collect();
    let handle = runtime::start_routed(cfg, routing, lanes, stop).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    drive_routed(&mut sub, 20_000, 256, prompt, &routes);
    let before = COUNTED.load(Ordering::Relaxed);
    drive_routed(&mut sub, 50_000, 256, prompt, &routes);
    let after = COUNTED.load(Ordering::Relaxed);
    let snap = snapshot_when(&handle, |s| routed_sum(s) >= 70_000);
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    (
        after - before,
        snap.backends.iter().map(|b| b.routed).collect(),
    )
}

#[test]
fn engine_thread_allocates_nothing_routing_by_prefix_and_session() {
    // 540 bytes, 135 tokens at 4 bytes a token: eight full blocks, so every decision
    // searches both indexes and records eight names.
    let prompt = "a shared document ".repeat(30);
    let (allocs, routed) = affinity_routing_allocations("prefix_aware", &prompt, [None, None]);
    assert_eq!(
        allocs, 0,
        "engine thread allocated {allocs} times routing by prefix"
    );
    // (The snapshot may trail the last few hundred.)
    assert!(routed.iter().sum::<u64>() > 60_000, "{routed:?}");
    let (allocs, routed) =
        affinity_routing_allocations("session", "hi", [Some(1), Some(0xdead_beef)]);
    assert_eq!(
        allocs, 0,
        "engine thread allocated {allocs} times routing by session"
    );
    // (The snapshot may trail the last few hundred.)
    assert!(routed.iter().sum::<u64>() > 60_000, "{routed:?}");
}

#[test]
fn engine_thread_allocates_nothing_in_continuous_mode() {
    let mut cfg = engine_config(2);
    cfg.continuous = Some(abe::core::continuous::ContinuousConfig {
        max_slots: 16,
        max_queue: 4096,
        ..Default::default()
    });
    let handle = runtime::start(cfg).expect("runtime starts");
    let mut sub = handle.submitter(Some(io_thread_wake())).expect("submitter");
    // A prompt of four full blocks and a bit: prefix caching looks up, holds and names
    // blocks on every admission.
    let prompt = "steady state ".repeat(21);
    drive(&mut sub, 5_000, 128, &prompt);
    let before = COUNTED.load(Ordering::Relaxed);
    drive(&mut sub, 30_000, 128, &prompt);
    let after = COUNTED.load(Ordering::Relaxed);
    let snap = snapshot_when(&handle, |s| {
        s.continuous
            .and_then(|c| c.prefix)
            .is_some_and(|p| p.hit_tokens > 0)
    });
    let report = handle.shutdown(std::time::Duration::from_secs(10));
    assert!(report.clean);
    assert_eq!(
        after - before,
        0,
        "engine thread allocated {} times over 30,000 continuous requests",
        after - before
    );
    let prefix = snap
        .continuous
        .and_then(|c| c.prefix)
        .expect("prefix caching is on");
    assert!(prefix.hit_tokens > 0, "the shared prompt hit: {prefix:?}");
}

/// Drives a bare core running `strategy` through 1,000 warm-up requests, then 100,000
/// counted ones, with output lengths spread over 16..1,000 tokens (so `multi_bin`
/// recomputes its bin boundaries and `dynamic` sizes its batches) and every seventh
/// request critical.
fn core_allocates_nothing(strategy: StrategyKind) {
    let mut core = Core::new(CoreConfig {
        workers: 2,
        strategy,
        ..CoreConfig::default()
    });
    let mut out = Vec::with_capacity(64);
    let mut run = |core: &mut Core, n: u64, start: u64| {
        let mut now = start;
        for i in 0..n {
            now += 1000;
            let p = if i % 7 == 0 {
                Priority::Critical
            } else {
                Priority::Normal
            };
            let max_tokens = 16 + (i * 37 % 985) as u32;
            core.admit(
                now,
                RequestMeta::new(p, Kind::Completion, 40, max_tokens, now),
            )
            .expect("room in the queue");
            core.poll(now, &mut |a| {
                if let Action::Dispatch { batch, .. } = a {
                    out.push(batch);
                }
            });
            for b in out.drain(..) {
                core.complete(now, b, BatchOutcome::Ok);
            }
        }
        now
    };
    let now = run(&mut core, 1000, 0);
    TRACKED.with(|t| t.set(true));
    let before = COUNTED.load(Ordering::Relaxed);
    let end = run(&mut core, 100_000, now);
    let after = COUNTED.load(Ordering::Relaxed);
    TRACKED.with(|t| t.set(false));
    assert_eq!(
        after - before,
        0,
        "core running {strategy} allocated {} times",
        after - before
    );
    // Whatever is still queued is answered by a drain; nothing was lost.
    core.begin_drain();
    core.poll(end, &mut |a| {
        if let Action::Dispatch { batch, .. } = a {
            out.push(batch);
        }
    });
    for b in out.drain(..) {
        core.complete(end, b, BatchOutcome::Ok);
    }
    assert_eq!(core.stats().completed, 101_000, "{strategy}");
    if strategy == StrategyKind::MultiBin {
        assert!(
            core.research_snapshot().boundary_recomputes >= 50,
            "multi_bin recomputed its boundaries in the counted run"
        );
    }
}

#[test]
fn core_allocates_nothing_over_100k_requests_under_every_strategy() {
    for strategy in StrategyKind::ALL {
        core_allocates_nothing(strategy);
    }
}

#[test]
fn continuous_ticks_allocate_nothing_in_steady_state() {
    use abe::core::continuous::{Continuous, ContinuousConfig, EntryResult, StepAction};
    use abe::core::prefix::{chain, BlockHash, PromptBlocks, ROOT};
    /// Prompts of 6 blocks: the first 3 shared by all, the next 3 by few
    /// (one of 1,024 by ticket), so admissions hit, miss and name blocks, and the small KV
    /// cache below evicts.
    struct Names;
    impl PromptBlocks for Names {
        fn block_count(&self, _: abe::core::Ticket) -> u32 {
            6
        }
        fn block_hash(&self, t: abe::core::Ticket, i: u32) -> BlockHash {
            let mut h = ROOT;
            for j in 0..=i {
                h = chain(
                    h,
                    if j < 3 {
                        u64::from(j)
                    } else {
                        ((u64::from(t.index) * 31 + u64::from(t.generation)) % 1024) << 8
                            | u64::from(j)
                    },
                );
            }
            h
        }
    }
    let names = Names;
    let mut sched = Continuous::new(ContinuousConfig {
        max_slots: 16,
        prefill_chunk: 64,
        n_batch: 256,
        max_queue: 1024,
        kv_capacity_tokens: 4_000,
        ..ContinuousConfig::default()
    });
    let mut results = [EntryResult::Continue; 16];
    let mut steps = 0u64;
    let mut run = |sched: &mut Continuous, ticks: u64| {
        for _ in 0..ticks {
            while sched.waiting() < 32 {
                let mut m = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 40, 0);
                m.tokens_estimated = 100 + 40; // 100-token prompts: chunked prefill
                sched.admit(m).expect("room in the queue");
            }
            let mut entries = 0;
            sched.tick_replicas(&names, &mut |_| true, &mut |a| {
                if let StepAction::Step { entries: e, .. } = a {
                    entries = e.len();
                }
            });
            for (i, r) in results.iter_mut().enumerate().take(entries) {
                steps += 1;
                *r = if (steps + i as u64) % 37 == 0 {
                    EntryResult::Finished
                } else {
                    EntryResult::Continue
                };
            }
            sched.complete_step_with(0, &names, &results[..entries], &mut |_, _| {});
        }
    };
    run(&mut sched, 1000);
    TRACKED.with(|t| t.set(true));
    let before = COUNTED.load(Ordering::Relaxed);
    run(&mut sched, 100_000);
    let after = COUNTED.load(Ordering::Relaxed);
    TRACKED.with(|t| t.set(false));
    assert_eq!(
        after - before,
        0,
        "continuous scheduler allocated {} times",
        after - before
    );
    assert!(sched.stats().completed > 10_000, "requests flowed through");
    let p = sched.prefix_stats();
    assert!(
        p.hit_tokens > 0 && p.evicted_blocks > 0,
        "caching paths ran: {p:?}"
    );
    assert!(sched.stats().prefill_tokens > 0 && sched.stats().decode_tokens > 0);
}

/// A sim backend `name` serving `model`, one batch at a time (the routing cases).
fn sim_backend(name: &str, model: &str) -> BackendConfig {
    let mut b = BackendConfig::default_sim(model, 100_000);
    b.name = name.into();
    b.max_concurrent_batches = 1;
    b
}

/// Round-robin routing (the routing cases).
fn round_robin() -> RoutingConfig {
    RoutingConfig {
        strategy: "round_robin".into(),
        ..Default::default()
    }
}
