#!/usr/bin/env bash
# System calls a forwarded request costs an abe front, by thread: one answering abe (latency
# model `none`), a front with one `upstream` table on its defaults (every request forwarded
# alone, on the backend's event loop), wrk's small POST (tools/bench/post.lua) at -c CONNS.
# `perf stat --per-thread` counts the syscall tracepoints over the middle SECS seconds of a
# run; each count is divided by the requests wrk reports for those seconds (its rate times
# SECS). Tracepoints cost little, but the figures are counts, not times.
# Needs: perf (with tracepoints readable), wrk, curl, bc.
# Usage: tools/bench/proxy_syscalls.sh [CONNS] [SECS] [BINARY]
#   (default 64 connections, 4 s, `cargo build --release --bin abe`)
set -euo pipefail
cd "$(dirname "$0")/../.."
conns="${1:-64}"
secs="${2:-4}"
bin="${3:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
here="$(pwd)/tools/bench"
. tools/bench/proxy_lib.sh # front_toml
work="$(mktemp -d)"
back_port=18493
front_port=18494
back=""
front=""
trap 'kill $back $front 2>/dev/null || true; rm -rf "$work"' EXIT
front_toml "$work/front.toml" "$back_port"
ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_PIN=false RUST_LOG=warn \
  "$bin" serve --port $back_port >/dev/null 2>&1 &
back=$!
RUST_LOG=warn "$bin" serve --port $front_port --config "$work/front.toml" >/dev/null 2>&1 &
front=$!
up=0
for _ in $(seq 1 100); do
  if curl -sf -X POST "http://127.0.0.1:$front_port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hi","max_tokens":1}' | grep -q text_completion; then
    up=1
    break
  fi
  sleep 0.2
done
[ "$up" = 1 ] || { echo "the front did not answer a completion" >&2; exit 1; }
wrk -t1 -c"$conns" -d"$((secs + 3))s" -s "$here/post.lua" \
  "http://127.0.0.1:$front_port/v1/completions" >"$work/wrk.out" &
wrk_pid=$!
sleep 1.5
calls="recvfrom sendto epoll_wait futex write read sched_yield writev readv"
events=$(for c in $calls; do printf 'syscalls:sys_enter_%s,' "$c"; done)
perf stat --per-thread -e "${events%,}" -p "$front" -o "$work/perf.txt" -- sleep "$secs"
wait $wrk_pid
rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.out")
requests=$(echo "$rps * $secs" | bc)
echo "proxy front, c=$conns, $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $bin: $rps req/s"
echo "system calls a forwarded request, by thread (threads with none left out):"
awk -v n="$requests" '/syscalls:sys_enter_/ && $2 / n >= 0.0005 {
  t = $1; sub(/-[0-9]+$/, "", t); c = $3; sub(/syscalls:sys_enter_/, "", c)
  per[t] = per[t] sprintf(" %s %.3f", c, $2 / n); total[t] += $2 / n; all += $2 / n
} END {
  for (t in per) printf "  %-14s %.3f:%s\n", t, total[t], per[t]
  printf "  all            %.3f\n", all
}' "$work/perf.txt" | sort
