#!/usr/bin/env bash
# A/B of two abe binaries on the request path: both serve side by side (latency model
# `none`, so only abe's own work is timed) and wrk sends them the same small POST in
# alternation (A then B, at 64 then 8 connections, ROUNDS rounds), so a slow phase of the
# machine hits both. Prints every run (req/s, p50, server CPU per request) with the ratio
# B / A of its round, then per concurrency the median of those ratios. Use it for a build
# option or a patch whose effect is smaller than the run-to-run spread of one server
# against nginx (tools/bench/http_vs_nginx.sh).
#
#   tools/bench/ab_binaries.sh BIN_A BIN_B [SECONDS] [ROUNDS]
#
# e.g. the `dist` profile against release:
#   cargo build --release --bin abe && cp target/release/abe /tmp/abe-release
#   cargo build --profile dist --bin abe
#   tools/bench/ab_binaries.sh /tmp/abe-release target/dist/abe 5 10
# ENV_A / ENV_B: extra environment for one side (e.g. ENV_B="ABE_WORKERS_COUNT=1").
# Needs wrk (Debian package).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '2,17p' "$0"; exit 2; }
bin_a=$1 bin_b=$2 secs=${3:-5} rounds=${4:-5}
here="$(pwd)/tools/bench"
. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm, median
results="$(mktemp)"
logs="$(mktemp -d)"
# Free ports (`--port 0`), read from each server's "abe listening on" line.
# shellcheck disable=SC2086 # ENV_A / ENV_B are lists of NAME=VALUE words
env ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn ${ENV_A:-} "$bin_a" serve --port 0 >"$logs/a" &
pid_a=$!
# shellcheck disable=SC2086
env ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn ${ENV_B:-} "$bin_b" serve --port 0 >"$logs/b" &
pid_b=$!
trap 'kill $pid_a $pid_b 2>/dev/null || true; rm -rf "$results" "$logs"' EXIT
base_a="" base_b=""
for _ in $(seq 1 100); do
  base_a=$(sed -n 's/^abe listening on //p' "$logs/a")
  base_b=$(sed -n 's/^abe listening on //p' "$logs/b")
  [ -n "$base_a" ] && [ -n "$base_b" ] && break
  sleep 0.1
done
[ -n "$base_a" ] && [ -n "$base_b" ] || { echo "a server did not start" >&2; exit 1; }
url_a=$base_a/v1/completions
url_b=$base_b/v1/completions
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%F %H:%M') UTC"
echo "A: $bin_a ${ENV_A:-}"
echo "B: $bin_b ${ENV_B:-}"
for c in 64 8; do
  wrk_warm "$c" "$here/post.lua" "$url_a"
  wrk_warm "$c" "$here/post.lua" "$url_b"
done
for r in $(seq 1 "$rounds"); do
  for c in 64 8; do
    ma=$(wrk_measure "$c" "$secs" "$here/post.lua" "$url_a" "$pid_a")
    mb=$(wrk_measure "$c" "$secs" "$here/post.lua" "$url_b" "$pid_b")
    read -r rps_a p50_a _ non_a _ _ cpu_a <<<"$ma"
    read -r rps_b p50_b _ non_b _ _ cpu_b <<<"$mb"
    # An error answered fast is not throughput.
    if [ "$non_a" != 0 ] || [ "$non_b" != 0 ]; then
      echo "non-2xx answers: A $non_a, B $non_b" >&2
      exit 1
    fi
    ratio=$(awk -v b="$rps_b" -v a="$rps_a" 'BEGIN {printf "%.3f", b / a}')
    printf "round %s c=%-3s A %8.0f req/s p50 %5.0f us CPU %5s us/req | B %8.0f req/s p50 %5.0f us CPU %5s us/req | B/A %s\n" \
      "$r" "$c" "$rps_a" "$p50_a" "$cpu_a" "$rps_b" "$p50_b" "$cpu_b" "$ratio"
    echo "$c $ratio" >>"$results"
  done
done
for c in 64 8; do
  ratios=$(awk -v c="$c" '$1 == c {print $2}' "$results")
  printf "B/A req/s at c=%s: median %.3f (per round: %s)\n" "$c" "$(median <<<"$ratios")" "$(paste -sd' ' <<<"$ratios")"
done
