//! Request-level LoRA rule: a batch holds at most `max_loras` distinct adapters; a request
//! whose adapter does not fit waits for the next batch without holding up those behind it;
//! a worker keeps adapters resident between batches and counts a load only when one is not.

use super::*;

fn adapter_req(adapter: u16, at: Nanos) -> RequestMeta {
    let mut m = normal(at);
    m.adapter = adapter;
    m
}

/// Polls once (one worker, dispatch when idle) and returns the one batch: its adapters per
/// request, and the loads it paid.
fn next_batch(core: &mut Core, now: Nanos, adapter_of: &[(Ticket, u16)]) -> (Vec<u16>, u32) {
    let mut got = None;
    core.poll(now, &mut |a| {
        if let Action::Dispatch {
            batch,
            tickets,
            lora_loads,
            ..
        } = a
        {
            let adapters = tickets
                .iter()
                .map(|t| adapter_of.iter().find(|(x, _)| x == t).unwrap().1)
                .collect();
            got = Some((batch, adapters, lora_loads));
        }
    });
    let (batch, adapters, loads) = got.expect("a batch was dispatched");
    core.complete(now, batch, BatchOutcome::Ok);
    (adapters, loads)
}

#[test]
fn one_lora_slot_batches_one_adapter_with_the_base_requests() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        strategy: StrategyKind::Fixed,
        max_loras: 1,
        ..cfg()
    });
    let adapters = [1u16, 2, 0, 1, 2, 0];
    let adapter_of: Vec<(Ticket, u16)> = adapters
        .iter()
        .enumerate()
        .map(|(i, &a)| (core.admit(0, adapter_req(a, i as Nanos)).unwrap(), a))
        .collect();
    let (first, loads) = next_batch(&mut core, 10 * MS, &adapter_of);
    assert_eq!(
        first,
        [1, 0, 1, 0],
        "adapter 2's requests wait; those behind them (base, adapter 1) are not held up"
    );
    assert_eq!(loads, 1);
    let (second, loads) = next_batch(&mut core, 20 * MS, &adapter_of);
    assert_eq!(
        second,
        [2, 2],
        "the waiting adapter goes first in the next batch"
    );
    assert_eq!(loads, 1, "adapter 2 replaced adapter 1 in the one slot");
    assert_eq!(core.queued(), 0);
    assert_eq!(core.stats().lora_loads, 2);
}

#[test]
fn a_resident_adapter_is_not_loaded_again_and_max_loras_bounds_a_batch() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        strategy: StrategyKind::Fixed,
        max_loras: 2,
        ..cfg()
    });
    let mut adapter_of = Vec::new();
    for (i, a) in [1u16, 2, 3].into_iter().enumerate() {
        adapter_of.push((core.admit(0, adapter_req(a, i as Nanos)).unwrap(), a));
    }
    let (first, loads) = next_batch(&mut core, MS, &adapter_of);
    assert_eq!((first, loads), (vec![1, 2], 2));
    for (i, a) in [1u16, 2].into_iter().enumerate() {
        adapter_of.push((
            core.admit(2 * MS, adapter_req(a, 2 * MS + i as Nanos))
                .unwrap(),
            a,
        ));
    }
    let (second, loads) = next_batch(&mut core, 3 * MS, &adapter_of);
    assert_eq!(
        second,
        [3, 1],
        "oldest first: 3, then 1 (resident); 2 waits"
    );
    assert_eq!(loads, 1, "only adapter 3 had to be loaded");
}

#[test]
fn a_forgotten_adapter_is_loaded_again_by_its_next_batch() {
    let mut core = Core::new(CoreConfig {
        dispatch_when_idle: true,
        strategy: StrategyKind::Fixed,
        max_loras: 1,
        ..cfg()
    });
    let mut adapter_of = Vec::new();
    let mut batch = |core: &mut Core, at: Nanos| {
        adapter_of.push((core.admit(at, adapter_req(4, at)).unwrap(), 4u16));
        next_batch(core, at + MS, &adapter_of).1
    };
    assert_eq!(batch(&mut core, 0), 1, "first use: loaded");
    assert_eq!(batch(&mut core, 10 * MS), 0, "resident");
    assert!(core.adapter_resident(4));
    core.forget_adapter(4);
    assert!(!core.adapter_resident(4), "forgotten on every worker");
    assert_eq!(batch(&mut core, 20 * MS), 1, "the reused id pays a load");
    assert_eq!(core.stats().lora_loads, 2);
}
