//! The reference text of `abe simulate --help`: every scenario, workload, engine and
//! latency-model key. Kept next to the types it documents; a test checks that every key the
//! parsers accept is mentioned here, so the help cannot silently fall behind.

/// Shown after the flags by `abe simulate --help`.
pub const AFTER_HELP: &str = r#"SCENARIOS
  Built in: steady_state, ramp_up, spike_test, mixed_priority, long_tail, multibin_paper,
  light_load, medium_load, heavy_load (Poisson at ~24/54/88 % worker utilisation), bursty
  (bursts of 16), closed_loop (8 clients, one worker, a + b n = 10 + 2n ms), kv_bound
  (Pang et al.'s KV-memory-bound backlog), chat_8b_h100 (continuous batching, Llama-3.1-8B
  on an H100 roofline, Poisson 20 requests/s of chat: the inference-lab comparison)
  (each also shipped as scenarios/<name>.toml). Any other value of --scenario is read as a
  TOML file with these keys (all but name and workload.arrivals optional):

    name = "my_run"              description = "..."
    requests = 100000            # --requests overrides
    sla_ms = 1000.0              # end-to-end latency target; --sla-ms overrides
    [workload.arrivals]          process = "..." and its keys, below
    [workload.prompt_tokens]     dist = "..." and its keys (default fixed 256)
    [workload.output_tokens]     dist = "..." and its keys (default fixed 128)
    [workload.priority]          low/normal/high/critical weights (default all normal)
    workload.prediction_error_sigma = 0.0   # log-normal noise on the predicted output length
    [engine]                     core settings, below
    [latency]                    model = "..." and its keys, below
    [routing]                    strategy = "..." (continuous: replicas behind a router)

WORKLOAD: ARRIVALS (workload.arrivals.process)
  constant    rate_rps                      evenly spaced, first at t = 0
  poisson     rate_rps                      exponential gaps
  ramp        start_rps, end_rps, ramp_s, poisson (bool, default false)
                                            linear rate change, then holds end_rps
  spike       base_rps, multiplier, spike_start_s, spike_duration_s, poisson (bool)
                                            base rate x multiplier during the window
  saturated   (no keys)                     every request at t = 0 (capacity test)
  bursty      bursts_per_s, burst_size, gap_ms (default 0)
                                            burst starts Poisson at bursts_per_s (from the
                                            seed), each burst_size requests gap_ms apart;
                                            mean rate bursts_per_s x burst_size
  replay      path, format ("csv"|"jsonl"; default from the extension), rate_scale
              (default 1: the trace plays k times faster, timestamps divided by k);
              a relative path is relative to the scenario file; formats under TRACES

TRACES (replay, --trace FILE; told apart by the CSV header or the JSONL fields)
  abe         CSV with a header or JSONL: arrival_ms, prompt_tokens, output_tokens,
              priority (optional); JSONL rows may carry hash_ids (as Mooncake's)
  Azure       CSV TIMESTAMP,ContextTokens,GeneratedTokens (the Azure LLM inference traces):
              wall-clock timestamps (2023-11-16 18:15:46.6805900), arrival = timestamp
              minus the earliest
  Mooncake    JSONL timestamp (ms), input_length, output_length, hash_ids (ids of the
              prompt's 512-token blocks, equal ids = equal prefix): the conversation,
              tool/agent and synthetic traces; hash_ids name the KV blocks prefix caching
              shares (a 512-token block is 32 of 16 tokens)
  Rows are sorted by arrival; --requests N takes the first N; lines over 1 MiB, missing or
  mistyped fields, bad timestamps and empty files are errors naming the file and line.
  abe simulate --trace FILE replays FILE without a scenario file (base: one Llama-3.1-8B
  on an H100 roofline, request-level unless --mode continuous; with --scenario, that
  scenario's engine and latency model); --rate-scale K compresses its time.

WORKLOAD: LENGTHS (workload.prompt_tokens / workload.output_tokens, key dist)
  fixed        value
  uniform      min, max                     continuous, rounded to whole tokens
  normal       mean, std_dev, min, max      clamped to [min, max] (min defaults to 0)
  lognormal    median, sigma, max           sigma in log space
  exponential  mean, max
  bimodal      weight, first, second        first = { dist = ... } with probability weight
  empirical    values, weights              weights optional (equal when absent)
  Draws are rounded and clamped to 0..=10000000 tokens.

WORKLOAD: PRIORITY (workload.priority)
  low, normal, high, critical               relative weights, absent keys are 0

ENGINE ([engine]; absent keys keep the core defaults; --workers/--max-batch-size override)
  workers, max_batch_size, min_batch_size, max_batch_tokens, token_bucketing,
  priority_enabled, dispatch_when_idle, max_wait_ms, min_wait_ms, queue_depth_low,
  queue_depth_high, target_p99_ms, queue_capacity, request_timeout_ms, batch_timeout_ms,
  max_inflight, balancer (round_robin|least_loaded|power_of_two),
  priority_max_wait_ms = [low, normal, high, critical]
  bins                K bins of the multi_bin strategy (1..=64; other strategies ignore it)
  max_tokens_limit    output length the bins span before statistics (default 32768)
  [engine.dynamic]    dynamic/multi_bin settings, the keys of [batching.dynamic] in
                      config.toml: bins, bin_policy, predictor, recompute_every, m_max_gb,
                      m_model_gb, kv_gb_per_token, memory_margin_gb, safety_fraction,
                      b_min, b_max, sla_tbt_ms, sla_epsilon_ms, sla_alpha, sla_delta
  oracle_bins         K > 1: emulate K-bin batching for any strategy on a saturated backlog
                      (K equal-mass bins by output length, fed to the core in single-bin
                      groups of max_batch_size); an error for other arrival processes
  mode                request (default: a strategy forms batches) | continuous
                      (iteration-level batching, the scheduler `abe serve` runs with
                      batching.mode = "continuous"; one run named `continuous` replaces the
                      strategies; open-loop workloads only); --mode overrides
  continuous keys     workers (replicas), max_slots (16), n_batch (2048, tokens per step),
                      prefill_chunk (512), kv_capacity_tokens (per replica; default from the
                      roofline model's GPU memory, else the [batching.dynamic] memory
                      model), queue_capacity (requests waiting for a slot, 1024),
                      request_timeout_ms (a request waiting for a slot longer fails),
                      prefix_caching (true: finished prompts' KV blocks stay cached and a
                      prompt starts after its longest cached prefix; a trace's hash_ids
                      name the blocks), kv_block_tokens (16)
  LoRA keys           lora_adapters (0: requests spread evenly over this many adapters),
                      max_loras (1: distinct adapters a step or batch applies, per replica;
                      a request whose adapter has no slot waits), lora_load_ms (0: what
                      loading an adapter into a slot adds to the step or batch); both modes
  routing             (or [routing] strategy) round_robin | least_loaded | power_of_two |
                      prefix_aware | session: each of the `workers` replicas is its own
                      backend behind abe's router (the live code), each request routed
                      with its prompt's block names and the replicas' exact caches;
                      session's key is the request's first trace block (a Mooncake
                      conversation's opening context). Absent: one queue for all replicas.
                      Adds runs[].cluster (hit_rate, reference_hit_rate: one LRU cache of
                      the whole cluster's KV, timing-free, the bound no router beats;
                      imbalance = max / mean busy; replicas[]) and a cluster table
  ttft_target_ms = 500, tpot_target_ms = 50 (top-level keys; --ttft-target-ms,
                      --tpot-target-ms): goodput counts the requests meeting both

LATENCY MODELS (--latency-model NAME, --latency key=value; or [latency] model = NAME)
  none          (no keys)                   zero service time
  linear        base_ms=10, per_token_ms=0.5, variance=0.1
                base + per_token x all tokens of the batch, Gaussian noise sd base x variance
  calibrated    prefill_ms_per_token=0.02, beta_ms=5.74, gamma=0.316      (default)
                prefill per prompt token, then per decode step beta (1 + gamma (b-1)/b)
  max_of_batch  base_ms=0, prefill_ms_per_token=0.02, decode_ms_per_token=5.74
                each request alone: base + prefill x prompt + decode x output; the batch
                takes its slowest request's time (multi-bin paper)
  affine_step   prefill_ms_per_token=0.02, a_ms=0.2, c_ms=5.5
                prefill, then per decode step a x b + c, b = requests still generating
  roofline      llm=llama-3.1-8b, gpu=h100-sxm, tp=1, flops_efficiency=0.6,
                bandwidth_efficiency=0.8
                a model on a GPU from their published numbers: each step takes
                max(FLOPs / peak FLOP/s, bytes / bandwidth) + tensor-parallel all-reduces;
                FLOPs 2 x active params per token + attention, bytes the weights + KV read;
                in continuous mode the KV capacity is GPU memory x 0.9 less the weights.
                llm: llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, mistral-7b, mixtral-8x7b,
                qwen3-30b-a3b; gpu: a100-80gb, h100-sxm, h200, l4, l40s

SWEEPS (--sweep key=v1,v2,...; repeat for a grid)
  bins, oracle_bins, max_batch_size, min_batch_size, workers, max_wait_ms, min_wait_ms,
  queue_capacity, dispatch_when_idle (0 or 1)
  rate_scale   multiplies every arrival rate (constant, poisson, ramp, spike; bursty's
               bursts_per_s; a replay's timestamps are divided by it): latency against
               load in one command (--rate-scale K: one value)
  clients      a closed loop's client count
  mode         request,continuous (or 0,1): both modes on the identical requests
  prefix_caching  0,1: continuous batching without and with prefix caching, same requests
  routing      round_robin,least_loaded,power_of_two,prefix_aware,session: the same
               requests through each router in front of `workers` replicas
  max_loras    1,4,...: LoRA adapter slots (with lora_adapters > 0), same requests

OUTPUTS
  table on stdout; --json FILE (deterministic: same seed and inputs, same bytes);
  --csv FILE (per-window time series); --svg DIR (latency_over_time.svg,
  queue_depth_over_time.svg, batch_size_distribution.svg; for sweeps throughput_vs_<key>.svg
  and latency_vs_<key>.svg (p50 and p99 per strategy against the first sweep key));
  with more than one priority class, p50/p99 per priority in the table, the JSON
  (runs[].latency_ms_by_priority, always present) and FILE.by_priority.csv beside --csv;
  continuous runs add a token table (TTFT, TPOT, ITL p50/p99, goodput, tokens per step, KV
  and slot use, preemptions), runs[].continuous in the JSON, FILE.continuous.csv beside
  --csv, token_latency.svg, and for sweeps ttft_vs_<key>.svg and tpot_vs_<key>.svg

EXAMPLE
  abe simulate --scenario steady_state --strategies fixed,queue_depth --seed 7 \
      --requests 100000 --json out.json --csv out.csv --svg out/
  abe simulate --scenario multibin_paper --strategies fixed --sweep oracle_bins=1,2,4,8 --svg out/
  abe simulate --scenario multibin_paper --strategies multi_bin --sweep bins=2,4,8,16
  abe simulate --scenario long_tail --strategies fixed,multi_bin --sweep bins=1,2,4,8
  abe simulate --scenario medium_load --strategies fixed,auto \
      --sweep rate_scale=0.25,0.5,1,1.5,2,3 --svg out/
  abe simulate --scenario closed_loop --strategies fixed,auto --sweep clients=1,2,8,32
  abe simulate --scenario scenarios/chat_8b_h100.toml --strategies auto --sweep mode=request,continuous
  abe simulate --scenario medium_load --mode continuous --latency-model roofline \
      --latency llm=llama-3.1-70b --latency gpu=h200 --latency tp=2
  abe simulate --trace synthetic_trace.jsonl --mode continuous --requests 500 --rate-scale 2
  abe simulate --trace synthetic_trace.jsonl --mode continuous --workers 8 \
      --sweep routing=round_robin,least_loaded,power_of_two,prefix_aware,session
"#;

#[cfg(test)]
mod tests {
    use super::AFTER_HELP;
    use crate::exec::latency::LatencyKind;
    use crate::sim::scenario::BUILTIN_NAMES;
    use crate::sim::sweep::SweepKey;

    #[test]
    fn help_mentions_every_key_the_parsers_accept() {
        let mut keys: Vec<&str> = vec![
            // arrivals
            "constant",
            "poisson",
            "ramp",
            "spike",
            "saturated",
            "replay",
            "bursty",
            "bursts_per_s",
            "burst_size",
            "gap_ms",
            "rate_rps",
            "start_rps",
            "end_rps",
            "ramp_s",
            "base_rps",
            "multiplier",
            "spike_start_s",
            "spike_duration_s",
            "path",
            "format",
            "rate_scale",
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "hash_ids",
            "input_length",
            "--trace",
            // lengths
            "fixed",
            "uniform",
            "normal",
            "lognormal",
            "exponential",
            "bimodal",
            "empirical",
            "value",
            "min",
            "max",
            "mean",
            "std_dev",
            "median",
            "sigma",
            "weight",
            "first",
            "second",
            "values",
            "weights",
            // scenario and workload
            "name",
            "description",
            "requests",
            "sla_ms",
            "prediction_error_sigma",
            "low",
            "high",
            "critical",
            // engine
            "workers",
            "max_batch_size",
            "min_batch_size",
            "max_batch_tokens",
            "token_bucketing",
            "priority_enabled",
            "dispatch_when_idle",
            "max_wait_ms",
            "min_wait_ms",
            "queue_depth_low",
            "queue_depth_high",
            "target_p99_ms",
            "queue_capacity",
            "request_timeout_ms",
            "batch_timeout_ms",
            "max_inflight",
            "balancer",
            "priority_max_wait_ms",
            "bins",
            "mode",
            "max_slots",
            "n_batch",
            "prefill_chunk",
            "kv_capacity_tokens",
            "prefix_caching",
            "kv_block_tokens",
            "routing",
            "max_loras",
            "lora_adapters",
            "lora_load_ms",
            "ttft_target_ms",
            "tpot_target_ms",
        ];
        for kind in LatencyKind::ALL {
            keys.push(kind.as_str());
            keys.extend(kind.keys());
            keys.extend(kind.name_keys());
        }
        keys.extend(crate::exec::roofline::presets::LLMS.map(|l| l.name));
        keys.extend(crate::exec::roofline::presets::GPUS.map(|g| g.name));
        keys.extend(BUILTIN_NAMES);
        keys.extend(SweepKey::ALL.map(|k| k.as_str()));
        for k in keys {
            assert!(AFTER_HELP.contains(k), "--help does not mention '{k}'");
        }
    }
}
