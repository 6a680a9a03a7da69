#!/usr/bin/env bash
# What routing through abe costs: wrk with the same small POST against an `abe serve`
# directly (latency model `none`), and against a second abe that routes to it as an
# `upstream` backend (one backend, 4 workers forwarding over keep-alive HTTP/1.1).
# Prints req/s, latency p50/p99, and CPU per request of each abe process.
# Needs: wrk and curl (Debian packages). Usage: tools/bench/router_proxy.sh [seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-10}"
conns="${2:-64}"
cargo build --release --bin abe >/dev/null
here="$(pwd)/tools/bench"
. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm
cfg="$(mktemp --suffix=.toml)"
cat >"$cfg" <<TOML
[[backends]]
name = "upstream-abe"
kind = "upstream"
base_url = "http://127.0.0.1:18490"
prompt_array = true
max_concurrent_batches = 4
[[backends.models]]
name = "abe-sim"
context_length = 131072
TOML
ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_PIN=false RUST_LOG=warn \
  ./target/release/abe serve --port 18490 >/dev/null &
up=$!
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:18490/health >/dev/null && break; sleep 0.1; done
ABE_ENGINE_PIN=false RUST_LOG=warn ./target/release/abe serve --port 18491 --config "$cfg" >/dev/null &
front=$!
trap 'kill $up $front 2>/dev/null || true; rm -f "$cfg"' EXIT
sleep 1
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
run() { # name url
  local name=$1 url=$2
  wrk_warm "$conns" "$here/post.lua" "$url"
  local m rps p50 p99 non2xx cpu_up cpu_front
  m=$(wrk_measure "$conns" "$secs" "$here/post.lua" "$url" "$up" "$front")
  read -r rps _ _ non2xx p50 p99 cpu_up cpu_front <<<"$m"
  # An error answered fast is not throughput.
  if [ "$non2xx" != 0 ]; then echo "$url: $non2xx non-2xx answers" >&2; exit 1; fi
  printf "%-8s c=%-3s %10s req/s  p50 %8s  p99 %8s  CPU/req: upstream abe %6s us, front abe %6s us\n" \
    "$name" "$conns" "$rps" "$p50" "$p99" "$cpu_up" "$cpu_front"
}
run direct http://127.0.0.1:18490/v1/completions
run routed http://127.0.0.1:18491/v1/completions
