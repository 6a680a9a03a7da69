#!/usr/bin/env bash
# Where the CPU of a request goes, per thread: abe serve (latency model `none`, as in
# http_vs_nginx.sh) and nginx returning a fixed 200, under wrk with the same small POST at
# -c64 and -c8. For each server thread that worked, its CPU (user + system, from
# /proc/PID/task/TID/stat), its context switches (voluntary + involuntary, from .../status)
# and, when `perf` can read the syscall tracepoints, its system calls, all per request.
# The wrk client's own CPU is printed too: on a 2-core machine client and server share
# the cores, so every microsecond the server's other threads take is one the client has not.
# For abe also the mean batch (abe_batch_size_requests from /metrics): at -c8 every batch is
# a hand-off to a worker and back, so requests per batch set the switches per request; and
# how often `auto` held during the run, with the fixed cost a batch it has fitted.
# THREAD_CPU_ABE=path runs another abe binary (an experiment's build) instead of this tree's.
# Needs: wrk, nginx (Debian packages); perf optional (linux-perf).
# Usage: tools/bench/thread_cpu.sh [seconds per run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-5}"
rounds="${2:-2}"
abe_bin="${THREAD_CPU_ABE:-}"
if [ -z "$abe_bin" ]; then
  cargo build --release --bin abe >/dev/null
  abe_bin=./target/release/abe
fi
here="$(pwd)/tools/bench"
. tools/bench/wrk_lib.sh # cpu_ticks, hz, wrk_warm
calls="recvfrom,sendto,writev,epoll_wait,futex,sched_yield,write,read"
perf_ok=false
if command -v perf >/dev/null &&
  perf stat -e syscalls:sys_enter_futex -- true >/dev/null 2>&1; then
  perf_ok=true
fi

# snapshot PID...: one line per thread: "pid/tid name ticks switches".
snapshot() {
  local pid t
  for pid in "$@"; do
    for t in /proc/"$pid"/task/*; do
      printf '%s/%s %s %s %s\n' "$pid" "${t##*/}" "$(tr ' ' _ <"$t/comm")" \
        "$(cpu_ticks "$pid/task/${t##*/}")" \
        "$(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status")"
    done
  done
}

# wrk_run CONNS URL OUT: one wrk run of `secs` into OUT, in the background; sets wrk_pid.
wrk_run() {
  wrk -t1 -c"$1" -d"${secs}s" -s "$here/post.lua" "$2" >"$3" &
  wrk_pid=$!
}

# batches: from abe's /metrics, "requests batches holds dispatches fixed_cost_s": batched
# requests and batches so far, `auto`'s decisions so far (held, dispatched at once), and
# its fitted fixed cost a batch now.
batches() {
  curl -s http://127.0.0.1:18480/metrics | awk '
    /^abe_batch_size_requests_sum/ {s = $2} /^abe_batch_size_requests_count/ {c = $2}
    /^abe_auto_decisions_total.*decision="hold"/ {h += $2}
    /^abe_auto_decisions_total.*decision="dispatch"/ {d += $2}
    /^abe_auto_cost_fixed_seconds/ {a = $2}
    END {print s, c, h + 0, d + 0, a + 0}'
}

# measure NAME URL CONNS PID...: one wrk run; prints the per-thread CPU and switches per
# request, and the client's CPU per request (read between 0.2 s in and 0.2 s before the end).
measure() {
  local name=$1 url=$2 conns=$3
  shift 3
  local before after out reqs wrk_before wrk_after batches_before="" batches_after=""
  out=$(mktemp)
  [ "$name" = abe ] && batches_before=$(batches)
  before=$(snapshot "$@")
  wrk_run "$conns" "$url" "$out"
  sleep 0.2
  wrk_before=$(cpu_ticks "$wrk_pid")
  sleep "$(awk -v s="$secs" 'BEGIN {print s - 0.4}')"
  wrk_after=$(cpu_ticks "$wrk_pid")
  wait "$wrk_pid"
  after=$(snapshot "$@")
  [ "$name" = abe ] && batches_after=$(batches)
  reqs=$(awk '/requests in/ {print $1}' "$out")
  printf '%s c=%s: %s req/s; wrk client %.2f us/req%s\n' "$name" "$conns" \
    "$(awk '/Requests\/sec/ {print $2}' "$out")" \
    "$(awk -v t=$((wrk_after - wrk_before)) -v hz="$hz" -v n="$reqs" -v s="$secs" \
      'BEGIN {print t / hz * 1e6 / (n * (s - 0.4) / s)}')" \
    "$(awk -v a="$batches_before" -v b="$batches_after" 'BEGIN {
      if (a == "") exit; split(a, x, " "); split(b, y, " ")
      printf "; mean batch %.2f requests; auto held %d of %d decisions, fixed cost %.0f us",
        (y[1] - x[1]) / (y[2] - x[2]), y[3] - x[3], (y[3] - x[3]) + (y[4] - x[4]), y[5] * 1e6 }')"
  join <(sort <<<"$before") <(sort <<<"$after") | awk -v hz="$hz" -v n="$reqs" '
    { cpu = ($6 - $3) / hz * 1e6 / n; sw = ($7 - $4) / n
      if (cpu > 0.05 || sw > 0.01) { printf "  %-16s %6.2f us/req  %5.2f switches/req\n", $2, cpu, sw }
      tot += cpu }
    END { printf "  %-16s %6.2f us/req\n", "server, all", tot }'
  rm -f "$out"
}

# count_calls NAME URL CONNS PID...: a second wrk run with perf counting each thread's
# system calls, per request. Separate from `measure`: the tracepoints slow every call.
count_calls() {
  local name=$1 url=$2 conns=$3
  shift 3
  local out perf_out evs="" c reqs
  for c in ${calls//,/ }; do evs+="syscalls:sys_enter_$c,"; done
  out=$(mktemp)
  perf_out=$(mktemp)
  perf stat -x, --per-thread -e "${evs%,}" -p "$(paste -sd, <<<"${*// /$'\n'}")" \
    -o "$perf_out" -- sleep "$secs" 2>/dev/null &
  local perf_pid=$!
  wrk_run "$conns" "$url" "$out"
  wait "$wrk_pid" "$perf_pid"
  reqs=$(awk '/requests in/ {print $1}' "$out")
  # perf -x, --per-thread lines: "comm-tid,count,,event,..."
  awk -F, -v n="$reqs" 'NF > 3 && $2 ~ /^[0-9]+$/ && $2 / n >= 0.005 {
      t = $1; sub(/-[0-9]+$/, "", t); ev = $4; sub(/syscalls:sys_enter_/, "", ev)
      line[t] = line[t] sprintf(" %s %.2f", ev, $2 / n) }
    END { for (t in line) printf "  %-16s syscalls/req:%s\n", t, line[t] }' "$perf_out" | sort
  rm -f "$out" "$perf_out"
}

nginx -c "$here/nginx.conf" &
ngx=$!
ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn "$abe_bin" serve --port 18480 >/dev/null &
abe=$!
trap 'kill $ngx $abe 2>/dev/null || true' EXIT
sleep 1
ngx_workers=$(pgrep -P "$ngx" | paste -sd' ')
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%F %H:%M') UTC; abe $(git rev-parse --short HEAD); syscalls counted: $perf_ok"
for c in 64 8; do
  wrk_warm "$c" "$here/post.lua" http://127.0.0.1:18481/
  wrk_warm "$c" "$here/post.lua" http://127.0.0.1:18480/v1/completions
done
for r in $(seq 1 "$rounds"); do
  for c in 64 8; do
    echo "round $r"
    # shellcheck disable=SC2086 # one pid per word
    measure nginx http://127.0.0.1:18481/ "$c" $ngx_workers
    measure abe http://127.0.0.1:18480/v1/completions "$c" "$abe"
    if $perf_ok && [ "$r" = 1 ]; then
      count_calls nginx http://127.0.0.1:18481/ "$c" $ngx_workers
      count_calls abe http://127.0.0.1:18480/v1/completions "$c" "$abe"
    fi
  done
done
