//! The discrete-event driver: the real [`Core`] in virtual time.
//!
//! Three kinds of events: arrivals (a pre-generated, time-sorted slice, walked by index; or,
//! in a closed loop, a min-heap with one entry per client whose next request is due, fed by
//! the answers), batch completions (a min-heap with at most one entry per batch slot), and
//! the core's own deadline (the `Option<Nanos>` its last `poll` returned). Each step takes the earliest
//! instant, delivers every completion due then, admits every arrival due then, and polls the
//! core once; a dispatched batch completes after the latency model's service time.
//!
//! Never here: a wall-clock read, a sleep, a thread, or a per-request allocation (the heap,
//! the slot map and the scratch buffers are sized before the loop). A loop that stops
//! making progress is reported as [`SimError::Stalled`] with the seed, never spun forever.

use super::arrivals::ClosedLoop;
use super::record::Recorder;
use super::workload::SimRequest;
use super::SimError;
use crate::core::{Action, BatchId, BatchOutcome, Completion, Core, CoreConfig, CoreStats, Nanos};
use crate::exec::latency::LatencyModel;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Consecutive polls at one instant without any effect before the run is declared stalled.
const STALL_LIMIT: u32 = 1_000;

/// What one run needs.
#[derive(Clone, Debug)]
pub struct RunInput<'a> {
    /// Sorted by `arrival_ns`.
    pub requests: &'a [SimRequest],
    pub core: CoreConfig,
    pub latency: &'a LatencyModel,
    /// Seeds the latency model's noise (the core has its own seed in `core.seed`).
    pub seed: u64,
    pub sla_ns: u64,
    pub window_ns: u64,
    /// A closed loop: `requests` are issued one per client, the next a think time after the
    /// answer (their `arrival_ns` is ignored).
    pub closed: Option<ClosedLoop>,
    /// Each request's LoRA adapter, and what loading one costs.
    pub lora: super::settings::SimLora,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunOutput {
    pub record: Recorder,
    pub stats: CoreStats,
    /// Busy time per worker at `end_ns`.
    pub busy_ns: Vec<Nanos>,
    /// Virtual time of the last event.
    pub end_ns: Nanos,
    /// Requests still queued or in flight when the events ran out (0 unless the core idles
    /// with work it will never release).
    pub unfinished: u64,
    /// Batches the `dynamic`/`multi_bin` memory check cut short (0 for other strategies).
    pub memory_limit_hits: u64,
    /// Routed continuous runs only: per replica, and the one-big-cache reference.
    pub cluster: Option<Box<super::cluster::ClusterOutput>>,
}

/// Service time in ms to whole ns (never negative).
fn ms_to_ns(ms: f64) -> Nanos {
    if ms > 0.0 {
        (ms * 1e6).round().min(u64::MAX as f64) as Nanos
    } else {
        0
    }
}

/// Everything a `poll` callback touches, borrowed apart from the core.
struct Exec<'a> {
    requests: &'a [SimRequest],
    latency: &'a LatencyModel,
    /// `slot_req[ticket.index]` = index into `requests` of the request in that table slot.
    slot_req: &'a [u32],
    completions: &'a mut BinaryHeap<Reverse<(Nanos, u64, u32)>>,
    seq: &'a mut u64,
    shapes: &'a mut Vec<(u32, u32)>,
    sort_scratch: &'a mut Vec<(u32, u32)>,
    rng: &'a mut SmallRng,
    rec: &'a mut Recorder,
    /// Requests failed in this poll (in a closed loop their clients send the next).
    failed: &'a mut usize,
    acted: bool,
    /// What loading a LoRA adapter for a batch costs, ms.
    lora_load_ms: f64,
}

impl Exec<'_> {
    fn on_action(&mut self, now: Nanos, action: Action<'_>) {
        self.acted = true;
        match action {
            Action::Dispatch {
                batch,
                tickets,
                lora_loads,
                ..
            } => {
                self.shapes.clear();
                for t in tickets {
                    let r = &self.requests[self.slot_req[t.index as usize] as usize];
                    self.shapes.push((r.prompt_tokens, r.output_tokens));
                    self.rec.on_dispatched(now, r);
                }
                self.rec.on_batch(now, tickets.len());
                let ms = self
                    .latency
                    .batch_ms(self.shapes, self.sort_scratch, self.rng)
                    + f64::from(lora_loads) * self.lora_load_ms;
                let done = now.saturating_add(ms_to_ns(ms));
                self.completions.push(Reverse((done, *self.seq, batch.0)));
                *self.seq += 1;
            }
            Action::Fail { ticket, .. } => {
                let r = &self.requests[self.slot_req[ticket.index as usize] as usize];
                self.rec.on_fail(now, r);
                *self.failed += 1;
            }
        }
    }
}

/// Runs `input.requests` through a fresh core until no event is left.
pub fn run(input: RunInput<'_>) -> Result<RunOutput, SimError> {
    let RunInput {
        requests,
        core: cfg,
        latency,
        seed,
        sla_ns,
        window_ns,
        closed,
        lora,
    } = input;
    debug_assert!(requests
        .windows(2)
        .all(|w| w[0].arrival_ns <= w[1].arrival_ns));
    let batch_slots = cfg.workers * cfg.max_inflight_per_worker.max(1) as usize;
    let table_slots = cfg.queue_capacity.max(1);
    let mut core = Core::new(cfg);
    let max_batch = core.max_batch_len();
    // The span the time series reserves windows for: the last arrival, or for a closed loop
    // (whose arrivals come from the run) a think time per round of requests, so the series
    // is not grown inside the loop when the think time dominates.
    let expected_ns = match closed {
        Some(c) => c
            .think_ns
            .saturating_mul((requests.len() / c.clients.max(1)) as u64),
        None => requests.last().map_or(0, |r| r.arrival_ns),
    };
    let mut rec = Recorder::new(max_batch, sla_ns, window_ns, expected_ns);
    // Pool sizes, fixed before the loop:
    let mut slot_req = vec![u32::MAX; table_slots]; // one per request-table slot
    let mut completions = BinaryHeap::with_capacity(batch_slots + 1); // one per batch slot
    let mut shapes = Vec::with_capacity(max_batch); // one batch's shapes
    let mut sort_scratch = Vec::with_capacity(max_batch); // one batch's shapes, sorted
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x1a7e_9c1e_5eed_0001);
    let mut failed = 0usize; // requests failed in one poll
                             // Closed loop: the requests with the arrival times the run gives them, one pending
                             // arrival per client, and the think-time RNG (its own stream, so the latency noise is
                             // the same sequence as in an open run).
    let mut issued: Vec<SimRequest> = if closed.is_some() {
        requests.to_vec()
    } else {
        Vec::new()
    };
    let clients = closed.map_or(0, |c| c.clients.min(requests.len()));
    let mut pending: BinaryHeap<Reverse<(Nanos, u32)>> = BinaryHeap::with_capacity(clients);
    for i in 0..clients {
        let c = closed.expect("clients > 0 only in a closed loop");
        pending.push(Reverse((c.first_arrival_ns(i), i as u32)));
    }
    let mut next_unissued = clients;
    let mut think_rng = SmallRng::seed_from_u64(seed ^ 0x7c1e_47c1_05ed_0002);
    // A client got its answer (or its failure, or a refusal): it sends its next request.
    let mut answered = |now: Nanos, pending: &mut BinaryHeap<Reverse<(Nanos, u32)>>| {
        if let Some(c) = closed {
            if next_unissued < requests.len() {
                let at = now.saturating_add(c.think_ns(&mut think_rng));
                pending.push(Reverse((at, next_unissued as u32)));
                next_unissued += 1;
            }
        }
    };
    let mut seq = 0u64;
    let mut next_arrival = 0usize;
    let mut deadline: Option<Nanos> = None;
    let mut stalls = 0u32;
    let mut now: Nanos = 0;

    loop {
        let t_arrival = if closed.is_some() {
            pending.peek().map(|Reverse((t, _))| *t)
        } else {
            requests.get(next_arrival).map(|r| r.arrival_ns)
        };
        let t_done = completions.peek().map(|Reverse((t, _, _))| *t);
        let Some(t) = [t_arrival, t_done, deadline].into_iter().flatten().min() else {
            break;
        };
        debug_assert!(t >= now, "virtual time never goes back");
        now = t;
        rec.series.advance(now, core.queued());
        let mut progressed = false;

        while let Some(&Reverse((t, _, b))) = completions.peek() {
            if t != now {
                break;
            }
            completions.pop();
            progressed = true;
            let batch = BatchId(b);
            if core.complete(now, batch, BatchOutcome::Ok) == Completion::Deliver {
                let reqs = if closed.is_some() {
                    &issued[..]
                } else {
                    requests
                };
                for ticket in core.batch_tickets(batch) {
                    let r = &reqs[slot_req[ticket.index as usize] as usize];
                    rec.on_complete(now, r);
                    answered(now, &mut pending);
                }
            }
        }

        loop {
            let index = if closed.is_some() {
                match pending.peek() {
                    Some(&Reverse((t, i))) if t == now => {
                        pending.pop();
                        issued[i as usize].arrival_ns = now;
                        i as usize
                    }
                    _ => break,
                }
            } else {
                match requests.get(next_arrival) {
                    Some(r) if r.arrival_ns == now => {
                        next_arrival += 1;
                        next_arrival - 1
                    }
                    _ => break,
                }
            };
            progressed = true;
            let r = if closed.is_some() {
                &issued[index]
            } else {
                &requests[index]
            };
            let mut meta = r.meta();
            meta.adapter = lora.adapter_of(index);
            let admitted = match core.admit(now, meta) {
                Ok(ticket) => {
                    slot_req[ticket.index as usize] = index as u32;
                    true
                }
                Err(_) => false,
            };
            rec.on_offer(r, admitted);
            if !admitted {
                answered(now, &mut pending);
            }
        }

        let mut exec = Exec {
            requests: if closed.is_some() {
                &issued[..]
            } else {
                requests
            },
            latency,
            slot_req: &slot_req,
            completions: &mut completions,
            seq: &mut seq,
            shapes: &mut shapes,
            sort_scratch: &mut sort_scratch,
            rng: &mut rng,
            rec: &mut rec,
            failed: &mut failed,
            acted: false,
            lora_load_ms: lora.load_ms,
        };
        deadline = core.poll(now, &mut |a| exec.on_action(now, a));
        progressed |= exec.acted;
        for _ in 0..std::mem::take(&mut failed) {
            answered(now, &mut pending);
        }

        // The core may ask to run again at `now` when a rule is due but cannot act yet; that
        // must resolve through another event, so look one ns later, and give up if nothing
        // ever changes.
        if let Some(d) = deadline {
            if d <= now {
                stalls = if progressed { 0 } else { stalls + 1 };
                if stalls > STALL_LIMIT {
                    return Err(SimError::Stalled {
                        now_ns: now,
                        seed,
                        polls: stalls,
                    });
                }
                deadline = Some(now + 1);
            } else {
                stalls = 0;
            }
        }
    }

    let busy_ns = core.workers().iter().map(|w| w.busy_ns(now)).collect();
    Ok(RunOutput {
        stats: *core.stats(),
        busy_ns,
        end_ns: now,
        unfinished: core.live_requests() as u64,
        memory_limit_hits: core.research_snapshot().memory_limit_hits,
        cluster: None,
        record: rec,
    })
}
