#!/usr/bin/env bash
# User-space instructions per request of `abe serve` (latency model `none`), counted with
# valgrind's callgrind: (Ir with N requests - Ir with 0 requests) / N, all threads.
# Idle policy `park` so no yield loop adds scheduling-dependent instructions.
# All threads are counted, the history sampler and the events thread too, whose work is per
# second: under valgrind a request takes milliseconds, so their share per request is much
# larger than at load. tools/bench/instruction_budget.sh counts the request path only.
# Usage: tools/bench/callgrind_per_request.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)/tools/bench"
n="${1:-2000}"
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release --bin abe >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

measure() { # requests
  local reqs=$1 port=18500
  ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_IDLE=park ABE_ENGINE_PIN=false RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
    "${CARGO_TARGET_DIR:-target}/release/abe" serve --port $port >/dev/null 2>"$out/vg.log" &
  local pid=$!
  for _ in $(seq 1 200); do
    python3 "$here/keepalive_posts.py" "$port" 0 2>/dev/null && break
    sleep 0.1
  done
  python3 "$here/keepalive_posts.py" "$port" "$reqs"
  kill -TERM $pid
  wait $pid || true
  local total=0
  for f in "$out"/cg.*; do
    ir=$(awk '/^summary:/ {print $2}' "$f")
    total=$((total + ir))
  done
  rm -f "$out"/cg.*
  echo "$total"
}

base=$(measure 0)
loaded=$(measure "$n")
echo "instructions: idle run $base, with $n requests $loaded"
awk -v a="$loaded" -v b="$base" -v n="$n" 'BEGIN {printf "instructions per request: %.0f\n", (a - b) / n}'
