//! Behaviour of the continuous scheduler, driven step by step.

/// LoRA adapter slots in the continuous scheduler (`tests/lora.rs`).
mod lora;
/// Prefix caching in the continuous scheduler (`tests/prefix.rs`).
mod prefix;

use super::*;
use crate::core::request::{Kind, RequestMeta, Ticket};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn meta(prompt_tokens: u32, max_tokens: u32, p: Priority) -> RequestMeta {
    let mut m = RequestMeta::new(p, Kind::Completion, 0, max_tokens, 0);
    m.tokens_estimated = prompt_tokens + max_tokens;
    m
}

fn cfg() -> ContinuousConfig {
    ContinuousConfig {
        replicas: 1,
        max_slots: 4,
        prefill_chunk: 8,
        n_batch: 16,
        kv_capacity_tokens: 10_000,
        max_queue: 8,
        prefix_caching: false,
        block_tokens: 16,
        max_loras: 1,
    }
}

/// Runs one tick and returns the step's entries (empty if none) and preemptions.
fn tick(c: &mut Continuous) -> (Vec<StepEntry>, Vec<Ticket>) {
    let mut entries = vec![];
    let mut preempted = vec![];
    c.tick(&mut |a| match a {
        StepAction::Step { entries: e, .. } => entries = e.to_vec(),
        StepAction::Preempted { ticket, .. } => preempted.push(ticket),
    });
    (entries, preempted)
}

fn finish_all(c: &mut Continuous, entries: &[StepEntry]) -> Vec<Ticket> {
    let results = vec![EntryResult::Continue; entries.len()];
    let mut done = vec![];
    c.complete_step(0, &results, &mut |t, _| done.push(t));
    done
}

#[test]
fn decode_tokens_come_before_prefill_and_the_budget_is_never_exceeded() {
    let mut rng = SmallRng::seed_from_u64(11);
    for seed in 0..50u64 {
        let mut c = Continuous::new(ContinuousConfig {
            max_slots: 6,
            max_queue: 64,
            ..cfg()
        });
        let mut rng2 = SmallRng::seed_from_u64(seed);
        for _ in 0..20 {
            let _ = c.admit(meta(
                rng2.gen_range(1..60),
                rng2.gen_range(1..20),
                Priority::Normal,
            ));
        }
        let mut steps = 0;
        while !c.is_idle() {
            let (entries, _) = tick(&mut c);
            assert!(!entries.is_empty(), "work exists, so a step runs");
            let first_prefill = entries
                .iter()
                .position(|e| matches!(e.work, StepWork::Prefill { .. }))
                .unwrap_or(entries.len());
            assert!(
                entries[first_prefill..]
                    .iter()
                    .all(|e| matches!(e.work, StepWork::Prefill { .. })),
                "decode entries precede prefill entries"
            );
            let shape = StepShape::of(&entries);
            let (d, p) = (shape.decode_tokens, shape.prefill_tokens);
            assert!(d + p <= 16, "budget exceeded: {d} + {p}");
            let results: Vec<EntryResult> = entries
                .iter()
                .map(|_| {
                    if rng.gen_bool(0.05) {
                        EntryResult::Finished
                    } else {
                        EntryResult::Continue
                    }
                })
                .collect();
            c.complete_step(0, &results, &mut |_, _| {});
            steps += 1;
            assert!(steps < 10_000);
        }
        assert_eq!(c.stats().completed, 20);
    }
}

#[test]
fn a_long_prompt_arriving_does_not_stall_generating_slots() {
    let mut c = Continuous::new(cfg());
    let a = c.admit(meta(4, 50, Priority::Normal)).unwrap();
    let b = c.admit(meta(4, 50, Priority::Normal)).unwrap();
    // Prefill both (4 + 4 tokens fit one step), then they generate.
    let (e, _) = tick(&mut c);
    assert_eq!(e.len(), 2);
    finish_all(&mut c, &e);
    let long = c.admit(meta(1000, 5, Priority::Normal)).unwrap();
    // Every following step carries one decode token for a and b: inter-token gap one tick,
    // while the long prompt is prefilled in chunks of at most the remaining budget.
    let mut prefilled = 0;
    for _ in 0..20 {
        let (e, _) = tick(&mut c);
        let decodes: Vec<Ticket> = e
            .iter()
            .filter(|x| x.work == StepWork::Decode)
            .map(|x| x.ticket)
            .collect();
        assert!(decodes.contains(&a) && decodes.contains(&b), "{e:?}");
        for x in &e {
            if let StepWork::Prefill { tokens, .. } = x.work {
                assert_eq!(x.ticket, long);
                assert!(tokens <= 8, "chunked");
                prefilled += tokens;
            }
        }
        finish_all(&mut c, &e);
    }
    assert!(prefilled > 0);
}

#[test]
fn admission_is_fifo_within_priority_and_higher_priorities_go_first() {
    let mut c = Continuous::new(ContinuousConfig {
        max_slots: 2,
        ..cfg()
    });
    let n1 = c.admit(meta(2, 100, Priority::Normal)).unwrap();
    let n2 = c.admit(meta(2, 100, Priority::Normal)).unwrap();
    let n3 = c.admit(meta(2, 100, Priority::Normal)).unwrap();
    let h = c.admit(meta(2, 100, Priority::High)).unwrap();
    let (e, _) = tick(&mut c);
    let admitted: Vec<Ticket> = e.iter().map(|x| x.ticket).collect();
    assert_eq!(admitted, vec![h, n1], "high first, then the oldest normal");
    assert!(e.iter().all(|x| x.admitted));
    c.complete_step(
        0,
        &[EntryResult::Finished, EntryResult::Continue],
        &mut |_, _| {},
    );
    let (e, _) = tick(&mut c);
    let tickets: Vec<Ticket> = e.iter().map(|x| x.ticket).collect();
    assert!(tickets.contains(&n2) && !tickets.contains(&n3));
}

#[test]
fn max_queue_refuses_and_oversized_requests_are_refused_with_their_size() {
    let mut c = Continuous::new(ContinuousConfig {
        max_queue: 2,
        kv_capacity_tokens: 100,
        ..cfg()
    });
    c.admit(meta(1, 1, Priority::Normal)).unwrap();
    c.admit(meta(1, 1, Priority::Normal)).unwrap();
    assert_eq!(
        c.admit(meta(1, 1, Priority::Normal)),
        Err(ContinuousReject::QueueFull { max_queue: 2 })
    );
    assert_eq!(
        c.admit(meta(90, 20, Priority::Normal)),
        Err(ContinuousReject::TooLarge {
            needed: 110,
            capacity: 100
        })
    );
}

#[test]
fn kv_exhaustion_preempts_the_youngest_which_is_requeued_and_still_completes() {
    // Capacity 30 KV tokens. Admission counts what active slots use now, so the second
    // request (4 + 16 = 20 needed, 5 used) gets in while the first is small; together they
    // grow to 40 > 30, and the youngest must give way.
    let mut c = Continuous::new(ContinuousConfig {
        kv_capacity_tokens: 30,
        max_slots: 2,
        ..cfg()
    });
    let old = c.admit(meta(4, 16, Priority::Normal)).unwrap();
    let (e, _) = tick(&mut c); // old alone: 20 <= 40
    finish_all(&mut c, &e);
    let young = c.admit(meta(4, 16, Priority::Normal)).unwrap(); // 5 used + 20 <= 40: admitted
    let mut preempted = vec![];
    let mut done = vec![];
    for _ in 0..200 {
        if c.is_idle() {
            break;
        }
        let (e, p) = tick(&mut c);
        preempted.extend(p);
        if e.is_empty() {
            continue;
        }
        done.extend(finish_all(&mut c, &e));
        assert!(c.kv_used(0) <= 30, "never past capacity");
    }
    assert!(c.is_idle());
    assert_eq!(done.len(), 2, "both complete");
    assert!(done.contains(&old) && done.contains(&young));
    assert!(
        !preempted.is_empty(),
        "the cache ran out, so someone was preempted"
    );
    assert!(
        preempted.iter().all(|t| *t == young),
        "the youngest is the victim"
    );
    assert_eq!(c.stats().preemptions as usize, preempted.len());
}

#[test]
fn a_cancelled_request_frees_its_slot_at_the_next_step() {
    let mut c = Continuous::new(ContinuousConfig {
        max_slots: 1,
        ..cfg()
    });
    let a = c.admit(meta(2, 100, Priority::Normal)).unwrap();
    let b = c.admit(meta(2, 100, Priority::Normal)).unwrap();
    let (e, _) = tick(&mut c);
    assert_eq!(e[0].ticket, a);
    let mut ended = vec![];
    c.complete_step(0, &[EntryResult::Cancelled], &mut |t, r| ended.push((t, r)));
    assert_eq!(ended, vec![(a, EntryResult::Cancelled)]);
    let (e, _) = tick(&mut c);
    assert_eq!(e[0].ticket, b, "the freed slot goes to the next request");
    assert!(!c.cancel_waiting(b), "b is active, not waiting");
}

#[test]
fn max_tokens_ends_a_request_with_exactly_that_many_tokens() {
    let mut c = Continuous::new(cfg());
    let t = c.admit(meta(3, 5, Priority::Normal)).unwrap();
    let mut sampled = 0;
    let mut done = false;
    while !done {
        let (e, _) = tick(&mut c);
        sampled += e.iter().filter(|x| x.samples()).count();
        done = finish_all(&mut c, &e).contains(&t);
    }
    assert_eq!(sampled, 5);
}

#[test]
fn waiting_requests_past_their_deadline_are_dropped_oldest_first() {
    let mut c = Continuous::new(ContinuousConfig {
        max_slots: 1,
        ..cfg()
    });
    let at = |t: u64| {
        let mut m = meta(2, 100, Priority::Normal);
        m.arrival_ns = t;
        m
    };
    let active = c.admit(at(0)).unwrap();
    let old = c.admit(at(10)).unwrap();
    let young = c.admit(at(500)).unwrap();
    let (e, _) = tick(&mut c);
    assert_eq!(e[0].ticket, active);
    let mut expired = vec![];
    c.expire_waiting(1_000, 900, &mut |t| expired.push(t));
    assert_eq!(
        expired,
        vec![old],
        "the active request stays; only the old waiter expires"
    );
    assert_eq!(c.waiting(), 1);
    let _ = young;
}

#[test]
fn a_preempted_request_has_started_so_the_waiting_timeout_never_drops_it() {
    // As in the KV test above: the young request is preempted and re-queued at the front,
    // with an arrival as old as a plain waiter's. Past the timeout, the plain waiter behind
    // it is dropped; the preempted one (its client may hold streamed tokens) stays.
    let mut c = Continuous::new(ContinuousConfig {
        kv_capacity_tokens: 30,
        max_slots: 2,
        ..cfg()
    });
    let old = c.admit(meta(4, 16, Priority::Normal)).unwrap();
    let (e, _) = tick(&mut c);
    finish_all(&mut c, &e);
    let young = c.admit(meta(4, 16, Priority::Normal)).unwrap();
    let mut preempted = vec![];
    for _ in 0..200 {
        let (e, p) = tick(&mut c);
        preempted.extend(p);
        if !e.is_empty() {
            finish_all(&mut c, &e);
        }
        if !preempted.is_empty() {
            break;
        }
    }
    assert_eq!(
        preempted,
        vec![young],
        "the cache ran out and young gave way"
    );
    assert_eq!(
        c.next_expiry(1),
        None,
        "a preempted request alone sets no deadline (the engine would wake for nothing)"
    );
    let mut waiter_meta = meta(4, 16, Priority::Normal);
    waiter_meta.arrival_ns = 7;
    let waiter = c.admit(waiter_meta).unwrap();
    assert_eq!(c.waiting(), 2, "young at the front, the waiter behind");
    assert_eq!(
        c.next_expiry(1),
        Some(8),
        "the waiter's deadline, not young's"
    );
    let mut expired = vec![];
    c.expire_waiting(1_000_000, 1, &mut |t| expired.push(t));
    assert_eq!(
        expired,
        vec![waiter],
        "only the request that never started expires"
    );
    assert_eq!(c.waiting(), 1);
    let mut done = vec![];
    for _ in 0..400 {
        if c.is_idle() {
            break;
        }
        let (e, _) = tick(&mut c);
        if !e.is_empty() {
            done.extend(finish_all(&mut c, &e));
        }
    }
    assert!(c.is_idle());
    assert!(done.contains(&old) && done.contains(&young), "both finish");
}

#[test]
fn a_failed_replica_frees_its_requests_and_ignores_the_late_step() {
    let mut c = Continuous::new(ContinuousConfig {
        replicas: 2,
        ..cfg()
    });
    let a = c.admit(meta(4, 3, Priority::Normal)).unwrap();
    // Only replica 0 may run: the request goes there.
    let mut entries = vec![];
    c.tick_replicas(
        &crate::core::prefix::NoPromptBlocks,
        &mut |r| r == 0,
        &mut |a| {
            if let StepAction::Step { entries: e, .. } = a {
                entries = e.to_vec();
            }
        },
    );
    assert_eq!(entries.len(), 1);
    assert!(c.is_busy(0) && !c.is_busy(1));
    let mut failed = vec![];
    c.fail_replica(0, &mut |t| failed.push(t));
    assert_eq!(failed, vec![a]);
    assert_eq!(c.active_slots(0), 0);
    assert!(c.is_busy(0), "the step is still out");
    // The hung step returns at last: nothing finishes twice.
    let mut done = vec![];
    c.complete_step(0, &[EntryResult::Continue], &mut |t, _| done.push(t));
    assert!(done.is_empty());
    assert!(c.is_idle());
}

/// More generating sequences than the step's token budget, on more slots than one word of
/// the slot bitmaps: a step decodes the first `n_batch` of them in slot order, its shape
/// prices exactly its entries, and every request still ends with exactly its max_tokens.
#[test]
fn a_budget_below_the_generating_slots_decodes_the_first_ones_and_prices_only_them() {
    for caching in [false, true] {
        let mut c = Continuous::new(ContinuousConfig {
            max_slots: 130,
            n_batch: 100,
            max_queue: 200,
            prefix_caching: caching,
            ..cfg()
        });
        let mut want = std::collections::HashMap::new();
        // Prompts of 1-5 tokens, then empty ones in the later slots: an empty prompt
        // finishes prefilling at no budget, so once the first ones generate, the empty ones
        // join them past the budget (a prompt of a token or more costs budget to prefill,
        // which alone would keep the generating slots within it).
        for i in 0..160u32 {
            let prompt = if i < 100 { 1 + i % 5 } else { 0 };
            let t = c.admit(meta(prompt, 20 + i % 7, Priority::Normal)).unwrap();
            want.insert(t, 20 + i % 7);
        }
        let mut got = std::collections::HashMap::new();
        let (mut limited, mut skipping, mut finished) = (0, 0, 0);
        // Generating requests (sampled a token, not finished).
        let mut generating = std::collections::HashSet::new();
        while !c.is_idle() {
            let (mut entries, mut shape, mut skips) = (vec![], StepShape::default(), false);
            let mut skipped = vec![];
            c.tick(&mut |a| {
                if let StepAction::Step {
                    entries: e,
                    shape: s,
                    ..
                } = a
                {
                    (entries, shape, skips) = (e.to_vec(), s, e.skips());
                    e.for_each_skipped(|t, generated| skipped.push((t, generated)));
                }
            });
            // The generating requests the step leaves out are exactly those not in it, each
            // with the tokens it has.
            assert_eq!(skips, !skipped.is_empty());
            skipping += usize::from(skips);
            let decoding: std::collections::HashSet<_> = entries
                .iter()
                .filter(|e| e.work == StepWork::Decode)
                .map(|e| e.ticket)
                .collect();
            for &(t, generated) in &skipped {
                assert!(generating.contains(&t) && !decoding.contains(&t));
                assert_eq!(got[&t], generated);
            }
            assert_eq!(decoding.len() + skipped.len(), generating.len());
            let decode: Vec<_> = entries
                .iter()
                .filter(|e| e.work == StepWork::Decode)
                .collect();
            assert!(
                decode.windows(2).all(|w| w[0].slot < w[1].slot),
                "slot order"
            );
            let (mut tokens, mut kv_read, mut pairs) = (0u32, 0u64, 0u64);
            for e in &entries {
                let (c, n) = match e.work {
                    StepWork::Decode => (u64::from(e.context), 1),
                    StepWork::Prefill { tokens, .. } => (u64::from(e.context), u64::from(tokens)),
                };
                tokens += n as u32;
                kv_read += c + n / 2;
                pairs += n * c + n * (n + 1) / 2;
            }
            assert!(tokens <= 100, "the budget holds");
            assert_eq!(shape.decode_tokens as usize, decode.len());
            assert_eq!(
                (shape.kv_read_tokens, shape.attention_pairs),
                (kv_read, pairs)
            );
            limited += usize::from(decode.len() == 100);
            for e in entries.iter().filter(|e| e.samples()) {
                assert_eq!(
                    got.insert(e.ticket, e.generated + 1).unwrap_or(0),
                    e.generated
                );
                generating.insert(e.ticket);
            }
            for t in finish_all(&mut c, &entries) {
                assert_eq!(got[&t], want[&t], "exactly max_tokens tokens");
                generating.remove(&t);
                finished += 1;
            }
        }
        assert!(
            limited > 0 && skipping > 0,
            "some steps had more generating slots than budget ({limited} full, {skipping} skipping)"
        );
        assert_eq!(finished, 160);
    }
}

#[test]
fn step_entries_carry_their_context_for_the_latency_model() {
    let mut c = Continuous::new(cfg());
    let _t = c.admit(meta(10, 3, Priority::Normal)).unwrap();
    let (e, _) = tick(&mut c); // prefill 8 of 10 (chunk 8)
    assert_eq!(e[0].context, 0);
    let s = StepShape::of(&e);
    assert_eq!(
        (s.prefill_tokens, s.kv_read_tokens, s.attention_pairs),
        (8, 4, 36)
    );
    finish_all(&mut c, &e);
    let (e, _) = tick(&mut c); // the last 2 prompt tokens, then the first output token
    assert_eq!(e[0].context, 8);
    finish_all(&mut c, &e);
    let (e, _) = tick(&mut c); // decode: prompt 10 + 1 generated
    assert_eq!((e[0].work, e[0].context), (StepWork::Decode, 11));
    let s = StepShape::of(&e);
    assert_eq!(
        (s.decode_tokens, s.kv_read_tokens, s.attention_pairs),
        (1, 11, 12)
    );
}

#[test]
fn a_request_runs_only_on_the_replicas_of_its_group() {
    let mut c = Continuous::with_groups(
        ContinuousConfig {
            replicas: 3,
            ..cfg()
        },
        &[1, 2],
    );
    assert_eq!(c.groups(), 2);
    assert_eq!((c.group_of(0), c.group_of(1), c.group_of(2)), (0, 1, 1));
    // Six requests for group 1 (two replicas of 4 slots), none for group 0.
    let tickets: Vec<Ticket> = (0..6)
        .map(|_| c.admit_to(1, meta(4, 2, Priority::Normal)).unwrap())
        .collect();
    let mut replicas = vec![];
    let mut in_step = vec![];
    c.tick(&mut |a| {
        if let StepAction::Step {
            replica, entries, ..
        } = a
        {
            replicas.push(replica);
            in_step.extend(entries.iter().map(|e| e.ticket));
        }
    });
    assert_eq!(replicas, [1, 2], "group 0's replica has nothing to run");
    assert_eq!(in_step.len(), 6);
    assert!(tickets.iter().all(|t| in_step.contains(t)));
    // A waiting request of group 0 is cancelled from its own queue; group 1's stay.
    let t = c.admit_to(0, meta(4, 2, Priority::Normal)).unwrap();
    let late = c.admit_to(1, meta(4, 2, Priority::Normal)).unwrap();
    assert_eq!(c.waiting(), 2);
    assert!(c.cancel_waiting(t));
    assert_eq!(c.waiting(), 1);
    let mut expired = vec![];
    c.expire_waiting(u64::MAX, 1, &mut |t| expired.push(t));
    assert_eq!(expired, [late]);
    assert_eq!(c.waiting(), 0);
}
