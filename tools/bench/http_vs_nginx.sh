#!/usr/bin/env bash
# Load test: abe serve (latency model `none`, so only abe's own overhead is measured) and
# nginx returning a fixed 200, under wrk with the same small POST, at -c64 and -c8.
# Prints req/s, latency p50/p99 and server CPU per request (utime+stime from /proc).
# Needs: wrk, nginx (Debian packages). Usage: tools/bench/http_vs_nginx.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-10}"
cargo build --release --bin abe >/dev/null
here="$(pwd)/tools/bench"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

run() { # name pid url conns
  local name=$1 pid=$2 url=$3 conns=$4
  wrk -t1 -c"$conns" -d1s -s "$here/post.lua" "$url" >/dev/null # warm-up
  local before after out reqs
  before=$(cpu_ticks "$pid")
  out=$(wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$here/post.lua" "$url")
  after=$(cpu_ticks "$pid")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  local rps p50 p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local cpu_us
  cpu_us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$reqs" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
  printf "%-6s c=%-3s %10s req/s  p50 %8s  p99 %8s  server CPU %6s us/req\n" \
    "$name" "$conns" "$rps" "$p50" "$p99" "$cpu_us"
}

nginx -c "$here/nginx.conf" &
ngx=$!
ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn ./target/release/abe serve --port 18480 >/dev/null &
abe=$!
trap 'kill $ngx $abe 2>/dev/null || true' EXIT
sleep 1
ngx_worker=$(pgrep -P "$ngx" | head -1)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
for c in 64 8; do
  run nginx "$ngx_worker" http://127.0.0.1:18481/ "$c"
  run abe "$abe" http://127.0.0.1:18480/v1/completions "$c"
done
