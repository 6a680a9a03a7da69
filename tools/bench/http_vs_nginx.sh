#!/usr/bin/env bash
# Load test: abe serve (latency model `none`, so only abe's own overhead is measured) and
# nginx returning a fixed 200, under wrk with the same small POST, at -c64 and -c8.
# The two servers run side by side and are measured in alternation (nginx, abe, nginx, abe,
# ...) for ROUNDS rounds, so a slow phase of the machine hits both; each round's ratio
# compares neighbouring runs. Prints every run (req/s, latency p50/p99, server CPU per
# request from utime+stime in /proc) and, per concurrency, the medians and the median ratio.
# Needs: wrk, nginx (Debian packages).
# Usage: [CONNS="64 8"] tools/bench/http_vs_nginx.sh [seconds per run] [rounds]
#   CONNS: the connection counts, in order (e.g. CONNS=1 for one connection at a time).
#   abe's ABE_* settings pass through (e.g. ABE_ENGINE_IDLE=park).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-10}"
rounds="${2:-5}"
conns="${CONNS:-64 8}"
cargo build --release --bin abe >/dev/null
here="$(pwd)/tools/bench"
results="$(mktemp)"

. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm, median

run() { # name pid url conns round
  local name=$1 pid=$2 url=$3 conns=$4 round=$5
  local m rps p50 p99 non2xx cpu_us
  m=$(wrk_measure "$conns" "$secs" "$here/post.lua" "$url" "$pid")
  read -r rps p50 p99 non2xx _ _ cpu_us <<<"$m"
  # An error answered fast is not throughput.
  if [ "$non2xx" != 0 ]; then echo "$url: $non2xx non-2xx answers" >&2; exit 1; fi
  printf "round %s  %-6s c=%-3s %10.0f req/s  p50 %6.0f us  p99 %6.0f us  server CPU %5s us/req\n" \
    "$round" "$name" "$conns" "$rps" "$p50" "$p99" "$cpu_us"
  echo "$name $conns $round $rps $p50 $p99 $cpu_us" >>"$results"
}

nginx -c "$here/nginx.conf" &
ngx=$!
ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn ./target/release/abe serve --port 18480 >/dev/null &
abe=$!
trap 'kill $ngx $abe 2>/dev/null || true; rm -f "$results"' EXIT
sleep 1
ngx_worker=$(pgrep -P "$ngx" | head -1)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%F %H:%M') UTC; abe $(git rev-parse --short HEAD)"
for c in $conns; do # warm-up
  wrk_warm "$c" "$here/post.lua" http://127.0.0.1:18481/
  wrk_warm "$c" "$here/post.lua" http://127.0.0.1:18480/v1/completions
done
for r in $(seq 1 "$rounds"); do
  for c in $conns; do
    run nginx "$ngx_worker" http://127.0.0.1:18481/ "$c" "$r"
    run abe "$abe" http://127.0.0.1:18480/v1/completions "$c" "$r"
  done
done
col() { awk -v n="$1" -v c="$2" -v k="$3" '$1 == n && $2 == c {print $k}' "$results"; }
echo "medians over $rounds rounds:"
for c in $conns; do
  for name in nginx abe; do
    printf "  %-6s c=%-3s %10.0f req/s  p50 %6.0f us  p99 %6.0f us  server CPU %5.2f us/req\n" \
      "$name" "$c" "$(col $name $c 4 | median)" "$(col $name $c 5 | median)" \
      "$(col $name $c 6 | median)" "$(col $name $c 7 | median)"
  done
  ratios=$(paste <(col nginx $c 4) <(col abe $c 4) | awk '{printf "%.3f\n", $2 / $1}')
  printf "  abe/nginx req/s at c=%s: median %.3f (per round: %s)\n" \
    "$c" "$(median <<<"$ratios")" "$(paste -sd' ' <<<"$ratios")"
done
