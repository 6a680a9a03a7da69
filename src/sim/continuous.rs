//! The discrete-event driver for continuous batching: the real [`Continuous`] scheduler in
//! virtual time, the sibling of [`super::driver`] (which drives the request-level core).
//!
//! Two kinds of events: arrivals (the pre-generated, time-sorted slice, walked by index) and
//! step completions (a min-heap with at most one entry per replica, ordered by (time,
//! replica) so ties resolve the same way every run). At each instant the driver completes
//! every step due (its sampled tokens are timed, finished requests leave their slots),
//! admits every arrival due, fails waiting requests past the request timeout, and ticks the
//! scheduler once: every idle replica with work starts a step, which completes after the
//! latency model's [`LatencyModel::step_ms`] for the step's shape.
//!
//! Never here: a wall-clock read, a sleep, a thread, or an allocation inside the loop (the
//! heap, the result buffer and every per-request table are sized from the
//! scheduler's configuration before it starts). Closed-loop workloads are not driven here
//! (the caller refuses them).

use super::cluster::{ClusterOutput, ClusterRouting, ReplicaOutput, SimCluster};
use super::driver::RunOutput;
use super::prefix::PrefixArena;
use super::record::Recorder;
use super::tokens::TokenRecord;
use super::workload::SimRequest;
use super::SimError;
use crate::core::continuous::{Continuous, ContinuousConfig, StepAction};
use crate::core::prefix::{BlockHash, PromptBlocks};
use crate::core::{CoreStats, Nanos, Ticket};
use crate::exec::latency::LatencyModel;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What one continuous run needs.
#[derive(Clone, Debug)]
pub struct ContinuousInput<'a> {
    /// Sorted by `arrival_ns`.
    pub requests: &'a [SimRequest],
    /// The prompt-block names the requests' `prefix` spans point into.
    pub prefix: &'a PrefixArena,
    pub sched: ContinuousConfig,
    pub latency: &'a LatencyModel,
    /// A request still waiting for a slot this long after its arrival fails.
    pub request_timeout_ns: Nanos,
    pub sla_ns: u64,
    pub window_ns: u64,
    /// Goodput targets: a completed request counts when its TTFT and TPOT meet both.
    pub ttft_target_ns: u64,
    pub tpot_target_ns: u64,
    /// `Some`: every replica is its own group behind a router with this strategy
    /// ([`super::cluster`]); `None`: one group of all replicas (a central queue).
    pub routing: Option<ClusterRouting>,
    /// `prefix_aware`'s thresholds (`None`: [`super::cluster::prefix_config`]).
    pub routing_prefix: Option<crate::router::PrefixConfig>,
    /// Seeds the router's RNG (`power_of_two`).
    pub seed: u64,
    /// Each request's LoRA adapter, and what loading one into a slot costs.
    pub lora: super::settings::SimLora,
}

/// The [`PromptBlocks`] of a running simulation: the request behind each ticket (the
/// driver's table-slot map) and its sequence's arena.
struct SimPromptBlocks<'a> {
    requests: &'a [SimRequest],
    arena: &'a PrefixArena,
    /// Per request-table slot, the index of its request in `requests` (`u32::MAX`: none).
    slot_req: &'a [u32],
    block_tokens: u32,
    /// Each request's adapter: its blocks are named under it.
    lora: &'a super::settings::SimLora,
}

impl SimPromptBlocks<'_> {
    fn request(&self, ticket: Ticket) -> Option<&SimRequest> {
        let i = *self.slot_req.get(ticket.index as usize)?;
        self.requests.get(i as usize)
    }
}

impl PromptBlocks for SimPromptBlocks<'_> {
    fn block_count(&self, ticket: Ticket) -> u32 {
        match self.request(ticket) {
            Some(r) if r.prefix.len > 0 => {
                self.arena
                    .block_count(r.prefix, r.prompt_tokens, self.block_tokens)
            }
            _ => 0,
        }
    }

    fn block_hash(&self, ticket: Ticket, i: u32) -> BlockHash {
        let r = self.request(ticket).expect("block_hash of a live ticket");
        let adapter = self
            .lora
            .adapter_of(self.slot_req[ticket.index as usize] as usize);
        self.arena
            .block_hash_for(r.prefix, self.block_tokens, i, adapter)
    }
}

/// Service time in ms to whole ns (never negative).
fn ms_to_ns(ms: f64) -> Nanos {
    if ms > 0.0 {
        (ms * 1e6).round().min(u64::MAX as f64) as Nanos
    } else {
        0
    }
}

/// Runs `input.requests` through a fresh continuous scheduler until no event is left.
pub fn run(input: ContinuousInput<'_>) -> Result<RunOutput, SimError> {
    let ContinuousInput {
        requests,
        prefix,
        sched: cfg,
        latency,
        request_timeout_ns,
        sla_ns,
        window_ns,
        ttft_target_ns,
        tpot_target_ns,
        routing,
        routing_prefix,
        seed,
        lora,
    } = input;
    debug_assert!(requests
        .windows(2)
        .all(|w| w[0].arrival_ns <= w[1].arrival_ns));
    let replicas = cfg.replicas;
    let slots = cfg.max_slots;
    let kv_capacity = cfg.kv_capacity_tokens;
    let (caching, block_tokens) = (cfg.prefix_caching, cfg.block_tokens);
    let mut cluster = match routing {
        Some(r) => Some(SimCluster::new(
            r,
            routing_prefix.unwrap_or_else(|| super::cluster::prefix_config(slots)),
            replicas,
            requests,
            prefix,
            block_tokens,
            seed,
        )?),
        None => None,
    };
    let mut sched = match cluster {
        Some(_) => Continuous::with_groups(cfg, &vec![1; replicas]),
        None => Continuous::new(cfg),
    };
    let table_slots = sched.table_capacity();
    let expected_ns = requests.last().map_or(0, |r| r.arrival_ns);
    let mut rec = Recorder::new(slots, sla_ns, window_ns, expected_ns);
    // Pool sizes, fixed before the loop:
    let mut tokens = TokenRecord::new(
        table_slots, // one token state per request-table slot
        ttft_target_ns,
        tpot_target_ns,
        kv_capacity,
        slots,
        replicas,
    );
    let mut slot_req = vec![u32::MAX; table_slots]; // one per request-table slot
    let mut done: BinaryHeap<Reverse<(Nanos, u32)>> = BinaryHeap::with_capacity(replicas + 1); // one per replica
    let mut started: Vec<(usize, Nanos)> = Vec::with_capacity(replicas); // steps of one tick
    let mut busy_ns = vec![0 as Nanos; replicas];
    let mut entries_total = 0u64; // sequences over all steps
    let mut per_replica = vec![ReplicaOutput::default(); replicas]; // routed runs only
    let mut slot_replica = vec![u32::MAX; table_slots]; // routed runs: each ticket's replica
    let mut slot_work = vec![0u64; table_slots]; // routed runs: each ticket's routed work

    // No waiting request fails before this: the earliest deadline the last
    // `next_expiry` saw, lowered by each admission since (a request that leaves the queue
    // only moves the next deadline later), so most instants skip `expire_waiting`.
    let mut expiry_at = Nanos::MAX;
    let mut next_arrival = 0usize;
    let mut now: Nanos = 0;
    loop {
        let t_arrival = requests.get(next_arrival).map(|r| r.arrival_ns);
        let t_done = done.peek().map(|Reverse((t, _))| *t);
        let Some(t) = [t_arrival, t_done].into_iter().flatten().min() else {
            break;
        };
        debug_assert!(t >= now, "virtual time never goes back");
        now = t;
        rec.series.advance(now, sched.waiting());

        while let Some(&Reverse((t, r))) = done.peek() {
            if t != now {
                break;
            }
            done.pop();
            let r = r as usize;
            // The step's decode tokens: counted together while every generating request of
            // the replica is `Clocked` (the usual case), else timed one by one.
            let entries = sched.step_entries(r);
            if tokens.tracks(r) {
                entries
                    .for_each_decode(|t, generated| tokens.on_decode(r, t.index, generated, now));
            } else {
                #[cfg(debug_assertions)]
                entries.for_each_decode(|t, _| {
                    debug_assert_eq!(
                        tokens.state[t.index as usize].mode,
                        super::tokens::TokenMode::Clocked
                    );
                });
                tokens.on_decodes(r, entries.decodes() as u64, now);
            }
            for e in entries.prefills().iter().filter(|e| e.samples()) {
                tokens.on_first_token(r, e.ticket.index, now);
            }
            let names = SimPromptBlocks {
                requests,
                arena: prefix,
                slot_req: &slot_req,
                block_tokens,
                lora: &lora,
            };
            let (rec, tokens, slot_req, slot_work) = (&mut rec, &mut tokens, &slot_req, &slot_work);
            let cl = &mut cluster;
            sched.complete_step_continuing(r, &names, &mut |ticket, _| {
                tokens.on_finish(r, ticket.index, now);
                rec.on_complete(now, &requests[slot_req[ticket.index as usize] as usize]);
                if let Some(c) = cl {
                    c.finished(r, slot_work[ticket.index as usize]);
                }
            });
            tokens.on_step_end(r, now);
        }

        while let Some(r) = requests.get(next_arrival).filter(|r| r.arrival_ns == now) {
            let mut meta = r.meta();
            meta.adapter = lora.adapter_of(next_arrival);
            let (admission, replica, work) = match &mut cluster {
                Some(c) => {
                    let (replica, work) = c.route(&sched, r, prefix, meta.adapter);
                    (sched.admit_to(replica, meta), replica, work)
                }
                None => (sched.admit(meta), usize::MAX, 0),
            };
            let admitted = match admission {
                Ok(ticket) => {
                    slot_req[ticket.index as usize] = next_arrival as u32;
                    tokens.on_admit(ticket.index, r.arrival_ns);
                    expiry_at = expiry_at.min(r.arrival_ns.saturating_add(request_timeout_ns));
                    if let Some(c) = &mut cluster {
                        c.started(replica, work);
                        slot_replica[ticket.index as usize] = replica as u32;
                        slot_work[ticket.index as usize] = work;
                        per_replica[replica].requests += 1;
                    }
                    true
                }
                Err(_) => false,
            };
            rec.on_offer(r, admitted);
            next_arrival += 1;
        }

        if sched.waiting() > 0 && now >= expiry_at {
            let (rec, slot_req, cl) = (&mut rec, &slot_req, &mut cluster);
            let (slot_replica, slot_work) = (&slot_replica, &slot_work);
            sched.expire_waiting(now, request_timeout_ns, &mut |ticket| {
                rec.on_fail(now, &requests[slot_req[ticket.index as usize] as usize]);
                if let Some(c) = cl {
                    let t = ticket.index as usize;
                    c.finished(slot_replica[t] as usize, slot_work[t]);
                }
            });
            expiry_at = sched.next_expiry(request_timeout_ns).unwrap_or(Nanos::MAX);
        }

        started.clear();
        {
            let names = SimPromptBlocks {
                requests,
                arena: prefix,
                slot_req: &slot_req,
                block_tokens,
                lora: &lora,
            };
            let (rec, tokens, started) = (&mut rec, &mut tokens, &mut started);
            let entries_total = &mut entries_total;
            sched.tick_replicas(&names, &mut |_| true, &mut |action| match action {
                StepAction::Step {
                    replica,
                    entries,
                    shape,
                } => {
                    let lora_ms = f64::from(shape.lora_loads) * lora.load_ms;
                    let ns = ms_to_ns(latency.step_ms(&shape) + lora_ms);
                    if entries.skips() {
                        entries.for_each_skipped(|t, _| tokens.on_skipped(replica, t.index));
                    }
                    // Decode entries never take a slot: only the prefills can.
                    for e in entries.prefills().iter().filter(|e| e.admitted) {
                        if tokens.on_slot(e.ticket.index) {
                            let r = &requests[slot_req[e.ticket.index as usize] as usize];
                            rec.on_dispatched(now, r);
                        }
                    }
                    rec.on_batch(now, entries.len());
                    tokens.on_step(shape.decode_tokens, shape.prefill_tokens);
                    *entries_total += entries.len() as u64;
                    done.push(Reverse((now.saturating_add(ns), replica as u32)));
                    started.push((replica, ns));
                }
                StepAction::Preempted {
                    replica, ticket, ..
                } => tokens.on_preempted(replica, ticket.index),
            });
        }
        // KV and slots as the steps start (the tick borrowed the scheduler).
        for &(r, ns) in &started {
            tokens.on_occupancy(sched.kv_used(r), sched.active_slots(r), ns);
            busy_ns[r] += ns;
            per_replica[r].kv_token_ns += u128::from(sched.kv_used(r)) * u128::from(ns);
        }
    }

    let c = *sched.stats();
    let stats = CoreStats {
        admitted: c.admitted,
        rejected_full: c.rejected_full,
        completed: c.completed,
        failed: rec.failed,
        expired: rec.failed,
        batches_formed: c.steps,
        batched_requests: entries_total,
        ..CoreStats::default()
    };
    let unfinished = sched.waiting() + (0..replicas).map(|r| sched.active_slots(r)).sum::<usize>();
    if caching {
        tokens.prefix = Some(sched.prefix_stats());
    }
    tokens.flush();
    rec.tokens = Some(Box::new(tokens));
    let cluster = routing.map(|routing| {
        for (r, out) in per_replica.iter_mut().enumerate() {
            out.prefix = sched.prefix_stats_of(r);
        }
        Box::new(ClusterOutput {
            routing: Some(routing),
            replicas: per_replica,
            kv_capacity_tokens: kv_capacity,
            reference: Default::default(),
            unbounded: Default::default(),
        })
    });
    Ok(RunOutput {
        record: rec,
        stats,
        busy_ns,
        end_ns: now,
        unfinished: unfinished as u64,
        memory_limit_hits: 0,
        cluster,
    })
}
