//! The simulator's prefix cache is keyed by LoRA adapter, as vLLM's block hash and abe's
//! live path are: a trace whose requests all share one prompt prefix, replayed one request
//! at a time, hits the cache on every request but the first without adapters, and on none
//! of an adapter's first request with them (the same prompt under another adapter shares no
//! KV block). Continuous mode (the mode with a KV cache), central queue and a router over
//! replicas. Virtual time only.

use abe::core::BatchingMode;
use abe::sim::cluster::ClusterRouting;
use abe::sim::report::PrefixCacheMetrics;
use abe::sim::{simulate, SimulateOptions};
use std::path::PathBuf;

const REQUESTS: u64 = 40;
const ADAPTERS: u16 = 8;

/// 40 requests of the same 2,048-token prompt (four 512-token trace blocks), a second apart:
/// each finishes before the next arrives, so only the cache links them.
fn trace() -> PathBuf {
    let path = std::env::temp_dir().join(format!("abe-lora-prefix-{}.jsonl", std::process::id()));
    let rows: String = (0..REQUESTS)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": 2048, \"output_length\": 4, \
                 \"hash_ids\": [1, 2, 3, 4]}}\n",
                i * 1000
            )
        })
        .collect();
    std::fs::write(&path, rows).unwrap();
    path
}

fn run(adapters: u16, routing: Option<ClusterRouting>) -> PrefixCacheMetrics {
    let mut o = SimulateOptions {
        trace: Some(trace()),
        strategies: vec!["fixed".into()],
        ..SimulateOptions::default()
    };
    o.engine.mode = Some(BatchingMode::Continuous);
    o.engine.workers = Some(2);
    o.engine.routing = routing;
    o.engine.lora_adapters = Some(adapters);
    o.engine.max_loras = Some(usize::from(ADAPTERS));
    let r = simulate(&o).unwrap();
    assert_eq!(r.requests, REQUESTS);
    let run = r.runs.into_iter().next().unwrap();
    assert_eq!(run.completed, REQUESTS, "every request completes");
    run.continuous
        .and_then(|c| c.prefix_cache)
        .expect("prefix caching is on by default")
}

#[test]
fn the_same_prompt_under_another_adapter_shares_no_kv_block() {
    for routing in [None, Some(ClusterRouting::PrefixAware)] {
        let base = run(0, routing);
        let lora = run(ADAPTERS, routing);
        assert_eq!(base.query_tokens, lora.query_tokens, "{routing:?}");
        // Without adapters every request after the first finds the whole prefix cached
        // (on either replica under a router: the first of each replica misses).
        let per_hit = base.hit_tokens / (REQUESTS - 2);
        assert!(per_hit > 1_000, "{routing:?}: {base:?}");
        // With 8 adapters over 40 requests each adapter's first request (at least 8 of them:
        // all 8 occur, by the adapter mix's hash) misses, and the rest still hit.
        assert!(
            lora.hit_tokens > 0,
            "{routing:?}: one adapter's requests share: {lora:?}"
        );
        assert!(
            lora.hit_tokens <= per_hit * (REQUESTS - u64::from(ADAPTERS)),
            "{routing:?}: adapters shared KV blocks: base {base:?}, with adapters {lora:?}"
        );
    }
}
