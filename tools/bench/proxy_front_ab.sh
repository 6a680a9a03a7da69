#!/usr/bin/env bash
# Two abe fronts alternated against one answering abe, for before/after comparisons of the
# proxy path: the answering abe runs latency model `none` (unpinned), each front has one
# `upstream` table with only its address and model (every other key on its defaults), and
# wrk sends tools/bench/post.lua's small POST at -c CONNS. A front is a binary plus
# optional ABE_* settings (A_BIN/A_ENV against B_BIN/B_ENV), so the same script compares
# two builds or two settings of one build. Each run prints req/s, p50, the front's CPU a
# request and that CPU by thread (io threads, engine, event loop or workers: user + system,
# from /proc/PID/task/TID/stat over the measured seconds); then the medians.
# A_BACKENDS / B_BACKENDS give a side N `upstream` tables to the same answering abe
# (`front_toml`'s FRONT_BACKENDS: a router tier's shape), default FRONT_BACKENDS or 1.
# Needs: wrk, curl (Debian packages). Linux only (/proc).
# Usage: A_BIN=path [A_ENV='ABE_ENGINE_IDLE=adaptive'] B_BIN=path [B_ENV=...] \
#        [A_BACKENDS=N] [B_BACKENDS=N] \
#        tools/bench/proxy_front_ab.sh [rounds] [seconds per run] [connections]
#        (the answering abe is A_BIN)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-3}"
secs="${2:-6}"
conns="${3:-64}"
a_bin="${A_BIN:?A_BIN=path of the first front binary}"
b_bin="${B_BIN:-$a_bin}"
here="$(pwd)/tools/bench"
work="$(mktemp -d)"
back_port=18491
front_port=18492
. tools/bench/wrk_lib.sh # median
. tools/bench/proxy_lib.sh # front_toml

FRONT_BACKENDS="${A_BACKENDS:-${FRONT_BACKENDS:-1}}" front_toml "$work/front-A.toml" "$back_port"
FRONT_BACKENDS="${B_BACKENDS:-${FRONT_BACKENDS:-1}}" front_toml "$work/front-B.toml" "$back_port"
ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_PIN=false RUST_LOG=warn "$a_bin" serve --port $back_port >/dev/null &
back=$!
front=""
trap 'kill $back $front 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$back_port/health" >/dev/null && break; sleep 0.1; done

# CPU ticks of each thread kind of PID: "kind user system" lines.
ticks() {
  for t in /proc/"$1"/task/*; do
    echo "$(cat "$t/comm" 2>/dev/null) $(awk '{print $14, $15}' "$t/stat" 2>/dev/null)"
  done | awk 'NF == 3 {k = $1; sub(/-[0-9]+$/, "", k); u[k] += $2; s[k] += $3}
              END {for (k in u) print k, u[k], s[k]}' | sort
}

echo "machine: $(nproc) cores; $(date -u '+%F %H:%M') UTC; abe $(git rev-parse --short HEAD); A: $a_bin ${A_ENV:-} ($(grep -c '^\[\[backends\]\]' "$work/front-A.toml") backends); B: $b_bin ${B_ENV:-} ($(grep -c '^\[\[backends\]\]' "$work/front-B.toml") backends); c=$conns, ${secs} s a run"
for r in $(seq 1 "$rounds"); do
  for side in A B; do
    if [ $side = A ]; then bin=$a_bin settings="${A_ENV:-}"; else bin=$b_bin settings="${B_ENV:-}"; fi
    # shellcheck disable=SC2086 # settings are words on purpose (KEY=VALUE ...)
    env $settings RUST_LOG=warn "$bin" serve --port $front_port --config "$work/front-$side.toml" >/dev/null &
    front=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$front_port/health" >/dev/null && break; sleep 0.1; done
    wrk_warm "$conns" "$here/post.lua" "http://127.0.0.1:$front_port/v1/completions"
    ticks $front >"$work/before"
    out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$here/post.lua" "http://127.0.0.1:$front_port/v1/completions")
    ticks $front >"$work/after"
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    hz=$(getconf CLK_TCK)
    split=$(join "$work/before" "$work/after" | awk -v r="$rps" -v s="$secs" -v hz="$hz" '
      $1 ~ /^abe-(io|engine|loop|worker)$/ {
        u = ($4 - $2) * 1e6 / hz / (r * s); y = ($5 - $3) * 1e6 / hz / (r * s); t += u + y
        printf "%s %.2f+%.2f  ", substr($1, 5), u, y
      } END {printf "| total %.2f", t}')
    total=${split##*total }
    echo "round $r $side: $rps req/s  p50 $p50  front CPU $total us/req  ($split)"
    echo "$side $rps $total" >>"$work/results"
    kill $front
    wait $front 2>/dev/null || true
    front=""
  done
done
for side in A B; do
  printf "median %s: %9.0f req/s  %6.2f us of front CPU a request\n" "$side" \
    "$(awk -v s=$side '$1 == s {print $2}' "$work/results" | median)" \
    "$(awk -v s=$side '$1 == s {print $3}' "$work/results" | median)"
done
