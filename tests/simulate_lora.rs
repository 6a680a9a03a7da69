//! LoRA adapters in the simulator: the same seeded workload spread over 8 adapters runs
//! slower with one adapter slot than with four (fewer requests share a step or batch, and
//! adapters are loaded again and again), in both batching modes; without adapters the slot
//! count changes nothing. Virtual time only.

use abe::core::BatchingMode;
use abe::sim::report::RunReport;
use abe::sim::scenario::builtin;
use abe::sim::{simulate_scenario, SimulateOptions};

fn run(mode: BatchingMode, adapters: u16, max_loras: usize) -> RunReport {
    let s = builtin("heavy_load").unwrap();
    let mut o = SimulateOptions {
        requests: Some(1_500),
        strategies: vec!["fixed".into()],
        ..SimulateOptions::default()
    };
    o.engine.mode = Some(mode);
    o.engine.lora_adapters = Some(adapters);
    o.engine.max_loras = Some(max_loras);
    o.engine.lora_load_ms = Some(5.0);
    let r = simulate_scenario(&s, &o).unwrap();
    r.runs.into_iter().next().unwrap()
}

#[test]
fn one_lora_slot_is_slower_than_four_on_the_same_adapter_mix() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let one = run(mode, 8, 1);
        let four = run(mode, 8, 4);
        assert_eq!(one.completed + one.failed, four.completed + four.failed);
        assert!(
            one.latency_ms.mean > four.latency_ms.mean * 1.1,
            "{mode:?}: max_loras=1 {:.1} ms vs max_loras=4 {:.1} ms",
            one.latency_ms.mean,
            four.latency_ms.mean
        );
    }
}

#[test]
fn without_adapters_the_slot_count_changes_nothing() {
    for mode in [BatchingMode::Request, BatchingMode::Continuous] {
        let one = run(mode, 0, 1);
        let four = run(mode, 0, 4);
        assert_eq!(one.latency_ms.mean, four.latency_ms.mean, "{mode:?}");
        assert_eq!(one.completed, four.completed);
    }
}
