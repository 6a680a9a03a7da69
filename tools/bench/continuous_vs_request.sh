#!/usr/bin/env bash
# Same offered load, same latency model (calibrated), same workload: abe serve in
# request-level mode vs continuous mode, driven by abe loadgen (open loop). Prints
# throughput, p99 latency, p99 latency per output token (client side), and the server's
# p99 time per output token and time to first token (continuous mode only).
# Request-level mode runs STRATEGY (default queue_depth, what BENCHMARKS.md's "Continuous
# batching (issue 4)" table was measured with; STRATEGY=auto for today's default).
# Usage: [STRATEGY=name] tools/bench/continuous_vs_request.sh [requests] [rate_scale]
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-3000}"
scale="${2:-3}"
cargo build --release --bin abe >/dev/null 2>&1
bin=target/release/abe
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
run() { # mode port
  local mode=$1 port=$2
  ABE_BATCHING_MODE=$mode ABE_BATCHING_STRATEGY="${STRATEGY:-queue_depth}" \
    ABE_WORKERS_LATENCY_MODEL=calibrated ABE_ENGINE_PIN=false \
    ABE_CONTINUOUS_NATURAL_LENGTH_MEAN_TOKENS=0 RUST_LOG=warn \
    "$bin" serve --port "$port" >/dev/null &
  local pid=$!
  sleep 0.5
  "$bin" loadgen --url "http://127.0.0.1:$port" --scenario steady_state --seed 7 \
    --requests "$n" --rate-scale "$scale" --connections 512 -q --json "$out/$mode.json" >/dev/null
  curl -s "http://127.0.0.1:$port/metrics" >"$out/$mode.metrics"
  kill -TERM $pid
  wait $pid || true
}
run request 18700
run continuous 18701
python3 - "$out" <<'PY'
import json, sys, re
out = sys.argv[1]
def quantile(metrics, name, q):
    buckets = [(float(m.group(1)), float(m.group(2))) for m in
               re.finditer(name + r'_bucket\{le="([0-9.e+-]+)"\} ([0-9.]+)', metrics)]
    total = re.search(name + r'_count ([0-9.]+)', metrics)
    if not buckets or not total or float(total.group(1)) == 0:
        return None
    want = q * float(total.group(1))
    for le, c in buckets:
        if c >= want:
            return le
    return float("inf")
print(f"{'mode':<11} {'req/s':>8} {'out tok/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'p99 ms/token':>13} {'TTFT p99 s':>11} {'TPOT p99 s':>11}")
for mode in ("request", "continuous"):
    r = json.load(open(f"{out}/{mode}.json"))["runs"][0]
    m = open(f"{out}/{mode}.metrics").read()
    toks = r["output_tokens_per_s"] / max(r["throughput_rps"], 1e-9)
    ttft = quantile(m, "abe_time_to_first_token_seconds", 0.99)
    tpot = quantile(m, "abe_time_per_output_token_seconds", 0.99)
    print(f"{mode:<11} {r['throughput_rps']:>8.2f} {r['output_tokens_per_s']:>10.1f} "
          f"{r['latency_ms']['p50']:>8.1f} {r['latency_ms']['p99']:>8.1f} "
          f"{r['latency_ms']['p99'] / toks:>13.2f} "
          f"{'-' if ttft is None else f'<= {ttft:g}':>11} {'-' if tpot is None else f'<= {tpot:g}':>11}")
PY
