#!/usr/bin/env bash
# abe as the router tier of a multi-server deployment, all on 127.0.0.1 (issue 24, part 3).
#
#   - N "GPU servers": `abe serve` in continuous batching with prefix caching, one replica
#     each (workers.count = 1: one GPU), the roofline latency model of LLM on GPU;
#   - one front: `abe serve` in request-level batching with the N as `upstream` backends
#     (plain OpenAI-compatible HTTP, exactly what it would send to vLLM) and
#     routing.strategy = each of STRATEGIES in turn;
#   - `abe loadgen --trace TRACE` replays a Mooncake-format trace against the front (prompt
#     text derived from the trace's hash_ids: equal ids, equal text), time-compressed by
#     RATE_SCALE.
#
# Each run starts every process afresh (cold caches), so strategies are compared on the same
# requests from the same state; ROUNDS > 1 alternates them (a b c a b c ...). Per run: the
# cluster hit rate from the servers' own counters (vllm:prefix_cache_hits_total over
# vllm:prefix_cache_queries_total, summed), the requests each server answered, the client's
# end-to-end latency (loadgen, which does not stream, so it sees no first token) and the
# servers' mean TTFT (vllm:time_to_first_token_seconds, sum over count, all servers).
#
# Then (SIMULATE=1, the default) `abe simulate` replays the same trace slice at the same
# RATE_SCALE through N replicas with each strategy (`--sweep routing=...`), the servers'
# settings read from their effective config (tools/scenario_from_config.py), and prints
# its hit rate and mean TTFT beside the live ones (issue 24: prefix_aware's live hit rate
# within 5 points of the simulator's). The simulator routes on the replicas' exact caches;
# the live front on its approximate index of what it sent.
#
# Usage: tools/cluster.sh                 (defaults below; override any with VAR=value)
#        N=8 RATE_SCALE=3 ROUNDS=2 tools/cluster.sh
# Writes each run's loadgen report, metrics and logs into OUT_DIR, and the table to
# OUT_DIR/table.txt. Every process is killed on exit (trap), whatever happens.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-4}"
TRACE="${TRACE:-$root/tests/fixtures/mooncake_fast25_synthetic_200.jsonl}"
REQUESTS="${REQUESTS:-}"                 # default: the whole trace
# Play the trace this many times in a row (each pass after the last, the same prompts at the
# same offsets, every pass after the first in a shuffled order, seeded by its number, as
# conversations return in any order): the 200-line Mooncake slice alone reuses little (one
# infinite cache would hit 6 %: its conversations return later in the full trace); a second
# pass is every conversation returning once (an infinite cache: 53 %), which is where
# routing decides the hit rate.
TRACE_REPEAT="${TRACE_REPEAT:-1}"
RATE_SCALE="${RATE_SCALE:-2}"            # arrival times divided by this
STRATEGIES="${STRATEGIES:-round_robin least_loaded prefix_aware}"
ROUNDS="${ROUNDS:-1}"
MODEL="${MODEL:-llama-3.1-8b}"           # the servers' model name (and roofline preset)
GPU="${GPU:-h100-sxm}"
# Block names the front tracks per server ([routing.prefix] max_tracked_blocks): "auto" reads
# the first server's KV capacity (abe_continuous_kv_capacity_tokens) in 16-token blocks, the
# size docs/routing.md advises (an index smaller than the server's cache forgets prefixes
# the server still holds). For vLLM servers: num_gpu_blocks x block_size / 16.
TRACKED_BLOCKS="${TRACKED_BLOCKS:-auto}"
CONNECTIONS="${CONNECTIONS:-128}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-300}"    # bound on one loadgen run
OUT_DIR="${OUT_DIR:-$root/target/cluster}"
SIMULATE="${SIMULATE:-1}"
BIN="${BIN:-$root/target/release/abe}"

command -v jq >/dev/null || { echo "cluster.sh needs jq" >&2; exit 2; }
mkdir -p "$OUT_DIR"
if [[ "${BUILD:-1}" == 1 ]]; then
  echo "== build release" >&2
  (cd "$root" && cargo build --release --quiet --bin abe)
fi

if [[ "$TRACE_REPEAT" -gt 1 ]]; then
  # Timestamps (ms) of pass k shifted by k times the slice's span plus one second; passes
  # after the first take the requests in an order shuffled by awk's rand() seeded with k.
  repeated="$OUT_DIR/trace_x$TRACE_REPEAT.jsonl"
  span=$(jq -s 'map(.timestamp) | max + 1000' "$TRACE")
  for k in $(seq 0 $((TRACE_REPEAT - 1))); do
    awk -v seed="$k" 'BEGIN { srand(seed) } { print (seed ? rand() : NR) "\t" $0 }' "$TRACE" \
      | sort -g | cut -f2- >"$OUT_DIR/pass.jsonl"
    jq -n -c --argjson off $((k * span)) --slurpfile orig "$TRACE" \
      --slurpfile pass "$OUT_DIR/pass.jsonl" \
      '[($orig | map(.timestamp)), $pass] | transpose | .[] | .[1] + {timestamp: (.[0] + $off)}'
  done >"$repeated"
  TRACE="$repeated"
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap cleanup EXIT INT TERM

# Waits for `abe listening on http://ADDR` in log $1 (bounded) and prints ADDR.
listening_addr() {
  local log="$1" addr=""
  for _ in $(seq 1 200); do
    addr="$(sed -n 's/^abe listening on http:\/\///p' "$log" | head -1)"
    [[ -n "$addr" ]] && { echo "$addr"; return 0; }
    sleep 0.05
  done
  echo "no address in $log:" >&2; cat "$log" >&2; return 1
}

# Sum of a counter (all label sets) in a Prometheus text page on stdin.
metric_sum() {
  awk -v name="$1" '$1 == name || index($1, name "{") == 1 { s += $2 } END { printf "%.6f\n", s + 0 }'
}

# Prompts are up to ~40k tokens (160 KB); the servers may queue a while under round robin.
common_env=(ABE_ENGINE_PIN=false ABE_SERVER_MAX_BODY_BYTES=4194304
            ABE_BATCHING_REQUEST_TIMEOUT=5m RUST_LOG=warn)

# Every GPU server's settings (the simulator reads them back through `abe config show`).
server_env=("${common_env[@]}" ABE_BATCHING_MODE=continuous ABE_WORKERS_COUNT=1
            ABE_CONTINUOUS_PREFIX_CACHING=true ABE_SERVER_MODEL_NAME="$MODEL"
            ABE_WORKERS_LLM="$MODEL" ABE_WORKERS_GPU="$GPU")

# One run: fresh servers and front, the trace replayed, the servers' counters read.
run_one() {
  local strategy="$1" round="$2" dir="$OUT_DIR/$1-$2"
  mkdir -p "$dir"
  local urls=()
  for i in $(seq 0 $((N - 1))); do
    env "${server_env[@]}" "$BIN" serve --host 127.0.0.1 --port 0 >"$dir/server$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 0 $((N - 1))); do
    urls+=("http://$(listening_addr "$dir/server$i.log")")
  done
  local tracked="$TRACKED_BLOCKS"
  if [[ "$tracked" == auto ]]; then
    # Wait for the gauge (bounded; builds before 2026-11-27 published the engine's metrics
    # a few ms after listening, and a BIN may be one); never guess a size (an index smaller
    # than the servers' caches forgets what they hold: 32,768 blocks here cost 11-13
    # points of hit rate against the servers' 52,853).
    local kv=0
    for _ in $(seq 1 100); do
      kv=$(curl -s "${urls[0]}/metrics" | metric_sum abe_continuous_kv_capacity_tokens | cut -d. -f1)
      [[ "$kv" -gt 0 ]] && break
      sleep 0.05
    done
    if [[ "$kv" -le 0 ]]; then
      echo "no abe_continuous_kv_capacity_tokens from ${urls[0]} in 5 s: set TRACKED_BLOCKS" >&2
      return 1
    fi
    tracked=$(( (kv + 15) / 16 ))
  fi
  {
    cat <<EOF
[server]
host = "127.0.0.1"
port = 0
max_connections = 4096
max_body_bytes = 4194304

[batching]
mode = "request"
# A router forwards each request at once: batches of one, no wait.
strategy = "fixed"
max_batch_size = 1
request_timeout = "5m"

[engine]
pin = false

[upstream]
request_timeout = "5m"

[routing]
strategy = "$strategy"

[routing.prefix]
max_tracked_blocks = $tracked
EOF
    for i in "${!urls[@]}"; do
      cat <<EOF

[[backends]]
name = "gpu-$i"
kind = "upstream"
base_url = "${urls[$i]}"
# Requests forwarded at once (one connection each): more than a server runs.
max_concurrent_batches = 64
[[backends.models]]
name = "$MODEL"
context_length = 131072
EOF
    done
  } >"$dir/front.toml"
  env RUST_LOG=warn "$BIN" serve --config "$dir/front.toml" >"$dir/front.log" 2>&1 &
  pids+=($!)
  local front
  front="http://$(listening_addr "$dir/front.log")"

  local extra=()
  [[ -n "$REQUESTS" ]] && extra+=(--requests "$REQUESTS")
  timeout "$RUN_TIMEOUT_S" "$BIN" loadgen --url "$front" --trace "$TRACE" \
    --rate-scale "$RATE_SCALE" --connections "$CONNECTIONS" --model "$MODEL" \
    --no-extensions --timeout-ms $((RUN_TIMEOUT_S * 1000)) --quiet \
    --json "$dir/loadgen.json" "${extra[@]}" >"$dir/loadgen.txt" 2>&1 \
    || echo "loadgen for $strategy ended with $? (see $dir/loadgen.txt)" >&2

  # The servers publish metrics snapshots every few ms: let the last settle.
  sleep 0.5
  local hits=0 queries=0 ttft_sum=0 ttft_count=0 spread=""
  for i in "${!urls[@]}"; do
    curl -s "${urls[$i]}/metrics" >"$dir/server$i.metrics"
    local m="$dir/server$i.metrics"
    hits=$(echo "$hits + $(metric_sum vllm:prefix_cache_hits_total <"$m")" | bc)
    queries=$(echo "$queries + $(metric_sum vllm:prefix_cache_queries_total <"$m")" | bc)
    ttft_sum=$(echo "$ttft_sum + $(metric_sum vllm:time_to_first_token_seconds_sum <"$m")" | bc)
    ttft_count=$(echo "$ttft_count + $(metric_sum vllm:time_to_first_token_seconds_count <"$m")" | bc)
    spread+="$(metric_sum vllm:request_success_total <"$m" | cut -d. -f1)/"
  done
  cleanup
  local r="$dir/loadgen.json"
  printf '%-13s %5s %9s %8s %-20s %11s %10s %12s\n' \
    "$strategy" "$round" \
    "$(jq -r '.runs[0].completed' "$r")/$(jq -r '.live.sent' "$r")" \
    "$(echo "scale=1; 100 * $hits / ($queries + 0.000001)" | bc)%" \
    "${spread%/}" \
    "$(jq -r '.runs[0].latency_ms.mean | floor' "$r")" \
    "$(jq -r '.runs[0].latency_ms.p99 | floor' "$r")" \
    "$(echo "scale=0; 1000 * $ttft_sum / ($ttft_count + 0.000001)" | bc)"
}

header=$(printf '%-13s %5s %9s %8s %-20s %11s %10s %12s' \
  strategy round done/sent hit_rate "requests/server" e2e_mean_ms e2e_p99_ms ttft_mean_ms)
echo "== $N servers ($MODEL on $GPU, continuous, prefix caching), front with each strategy;" \
  "trace $(basename "$TRACE") at ${RATE_SCALE}x" >&2
echo "$header" | tee "$OUT_DIR/table.txt"
for round in $(seq 1 "$ROUNDS"); do
  for s in $STRATEGIES; do
    # Not in a $(...) subshell: the servers' pids must stay in this shell for the trap.
    run_one "$s" "$round" >>"$OUT_DIR/table.txt"
    tail -1 "$OUT_DIR/table.txt"
  done
done

if [[ "$SIMULATE" == 1 ]]; then
  echo "== the simulator on the same slice: $N replicas, the servers' settings" >&2
  env "${server_env[@]}" "$BIN" config show >"$OUT_DIR/server_effective.toml"
  "$root/tools/scenario_from_config.py" "$OUT_DIR/server_effective.toml" "$TRACE" "$N" \
    >"$OUT_DIR/scenario.toml"
  sim_extra=()
  [[ -n "$REQUESTS" ]] && sim_extra+=(--requests "$REQUESTS")
  routing=$(echo "$STRATEGIES" | tr ' ' ',')
  "$BIN" simulate --scenario "$OUT_DIR/scenario.toml" --trace "$TRACE" \
    --rate-scale "$RATE_SCALE" --mode continuous --workers "$N" --sweep "routing=$routing" \
    --json "$OUT_DIR/sim.json" "${sim_extra[@]}" >"$OUT_DIR/sim.txt"
  {
    printf '%-13s %9s %8s %-20s %11s %10s %12s\n' strategy run hit_rate "requests/server" \
      e2e_mean_ms e2e_p99_ms ttft_mean_ms
    jq -r '.runs[] | [.cluster.routing, "simulated",
        "\(.cluster.hit_rate * 1000 | round / 10)%",
        (.cluster.replicas | map(.requests | tostring) | join("/")),
        (.latency_ms.mean | floor), (.latency_ms.p99 | floor),
        (.continuous.ttft_ms.mean | floor)] | @tsv' "$OUT_DIR/sim.json" |
      while IFS=$'\t' read -r st run hit spread mean p99 ttft; do
        printf '%-13s %9s %8s %-20s %11s %10s %12s\n' "$st" "$run" "$hit" "$spread" "$mean" \
          "$p99" "$ttft"
      done
  } | tee "$OUT_DIR/sim_table.txt"
fi
