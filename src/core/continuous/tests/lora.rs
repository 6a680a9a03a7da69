//! The LoRA slot rule: at most `max_loras` distinct adapters run on a replica at once; a
//! request whose adapter cannot get a slot waits without holding up others, and waits a
//! bounded time.

use super::*;

fn lora_meta(adapter: u16, max_tokens: u32) -> RequestMeta {
    let mut m = meta(4, max_tokens, Priority::Normal);
    m.adapter = adapter;
    m
}

/// Runs a step and completes it: `Finished` for entries whose request has generated
/// `max_tokens` (so each request runs `max_tokens` decode steps after its prefill).
fn run_step(
    c: &mut Continuous,
    budget: &mut std::collections::HashMap<Ticket, u32>,
) -> Vec<StepEntry> {
    let (entries, _) = tick(c);
    let results: Vec<_> = entries
        .iter()
        .map(|e| {
            let left = budget.get_mut(&e.ticket).expect("known ticket");
            if e.samples() {
                *left -= 1;
            }
            if *left == 0 {
                EntryResult::Finished
            } else {
                EntryResult::Continue
            }
        })
        .collect();
    c.complete_step(0, &results, &mut |_, _| {});
    entries
}

#[test]
fn one_lora_slot_runs_one_adapter_while_base_requests_go_on() {
    let mut c = Continuous::new(cfg());
    let mut budget = std::collections::HashMap::new();
    let mut adapter_of = std::collections::HashMap::new();
    for (a, n) in [(1u16, 3u32), (2, 1), (0, 2), (1, 1)] {
        let t = c.admit(lora_meta(a, n)).unwrap();
        budget.insert(t, n);
        adapter_of.insert(t, a);
    }
    let first = run_step(&mut c, &mut budget);
    let running: std::collections::BTreeSet<u16> =
        first.iter().map(|e| adapter_of[&e.ticket]).collect();
    assert_eq!(
        running,
        [0, 1].into(),
        "adapter 2 waits for the one slot; the base request and adapter 1's second request \
         (behind it in the queue) are not held up"
    );
    assert_eq!(
        first.iter().filter(|e| e.lora_load).count(),
        1,
        "adapter 1 is loaded once, for its first request only"
    );
    assert_eq!(StepShape::of(&first).lora_loads, 1);
    let mut loads_of_2 = 0;
    let mut seen_2 = false;
    while !c.is_idle() {
        let entries = run_step(&mut c, &mut budget);
        let adapters: std::collections::BTreeSet<u16> = entries
            .iter()
            .map(|e| adapter_of[&e.ticket])
            .filter(|&a| a != 0)
            .collect();
        assert!(
            adapters.len() <= 1,
            "one adapter per step with max_loras = 1"
        );
        if adapters.contains(&2) {
            seen_2 = true;
            loads_of_2 += entries.iter().filter(|e| e.lora_load).count();
        }
    }
    assert!(seen_2, "the waiting adapter ran once the slot was free");
    assert_eq!(loads_of_2, 1);
    assert_eq!(c.stats().lora_loads, 2);
}

#[test]
fn a_waiting_adapter_is_not_starved_by_a_stream_of_resident_ones() {
    // Adapter 1 keeps arriving; adapter 2 waits behind the slot. After max_slots (4)
    // admissions past it, the queue is fenced and adapter 2 gets the slot.
    let mut c = Continuous::new(ContinuousConfig {
        max_queue: 64,
        ..cfg()
    });
    let mut budget = std::collections::HashMap::new();
    let mut adapter_of = std::collections::HashMap::new();
    let admit = |c: &mut Continuous,
                 a: u16,
                 budget: &mut std::collections::HashMap<_, _>,
                 adapter_of: &mut std::collections::HashMap<_, _>| {
        let t = c.admit(lora_meta(a, 2)).unwrap();
        budget.insert(t, 2);
        adapter_of.insert(t, a);
    };
    admit(&mut c, 1, &mut budget, &mut adapter_of);
    admit(&mut c, 2, &mut budget, &mut adapter_of);
    let mut steps_until_2 = None;
    for step in 0..200 {
        admit(&mut c, 1, &mut budget, &mut adapter_of);
        let entries = run_step(&mut c, &mut budget);
        if entries.iter().any(|e| adapter_of[&e.ticket] == 2) {
            steps_until_2 = Some(step);
            break;
        }
    }
    let steps = steps_until_2.expect("adapter 2 ran despite adapter 1 arriving every step");
    assert!(steps < 20, "bounded by the fence, took {steps} steps");
}

#[test]
fn max_loras_two_runs_two_adapters_in_one_step() {
    let mut c = Continuous::new(ContinuousConfig {
        max_loras: 2,
        ..cfg()
    });
    let mut budget = std::collections::HashMap::new();
    let mut adapter_of = std::collections::HashMap::new();
    for a in [1u16, 2, 3] {
        let t = c.admit(lora_meta(a, 2)).unwrap();
        budget.insert(t, 2);
        adapter_of.insert(t, a);
    }
    let first = run_step(&mut c, &mut budget);
    let adapters: std::collections::BTreeSet<u16> =
        first.iter().map(|e| adapter_of[&e.ticket]).collect();
    assert_eq!(adapters, [1, 2].into());
    assert_eq!(c.running_adapters(0).count(), 2);
    assert_eq!(c.waiting_adapters(0).collect::<Vec<_>>(), [3]);
}

#[test]
fn a_forgotten_adapter_leaves_its_slot_when_its_requests_finish() {
    let mut c = Continuous::new(cfg());
    let mut budget = std::collections::HashMap::new();
    let t = c.admit(lora_meta(1, 3)).unwrap();
    budget.insert(t, 3);
    let first = run_step(&mut c, &mut budget);
    assert!(first[0].lora_load);
    // Forgotten (unloaded, or its id handed to a new adapter) while its request runs.
    c.forget_adapter(1);
    assert!(!c.adapter_resident(0, 1), "not resident for new requests");
    let t = c.admit(lora_meta(1, 1)).unwrap();
    budget.insert(t, 1);
    let mut load_of_new = None;
    while !c.is_idle() {
        for e in run_step(&mut c, &mut budget) {
            if e.ticket == t && load_of_new.is_none() {
                load_of_new = Some(e.lora_load);
            }
        }
    }
    assert_eq!(
        load_of_new,
        Some(true),
        "the id's next request waited for the slot to empty and paid a load"
    );
    assert_eq!(c.stats().lora_loads, 2);
    c.forget_adapter(1);
    assert!(
        !c.adapter_resident(0, 1),
        "an idle forgotten adapter leaves at once"
    );
}
