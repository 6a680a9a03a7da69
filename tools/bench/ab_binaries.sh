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
# Prints, per concurrency, the median B/A ratio of req/s, and each side's median p50 and
# server CPU a request with the number of rounds in which B's was lower.
#   tools/bench/ab_binaries.sh --summary LOG   prints that summary again from a saved run.
# Needs wrk (Debian package).
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)/tools/bench"
. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm, median

summarize() { # the "round ..." lines of a run on stdin -> the summary
  awk '
    $1 == "round" {
      c = substr($3, 3); n[c]++
      ratio[c] = ratio[c] " " $NF
      pa[c] = pa[c] " " $8;  ca[c] = ca[c] " " $11
      pb[c] = pb[c] " " $18; cb[c] = cb[c] " " $21
      if ($18 < $8) pl[c]++
      if ($21 < $11) cl[c]++
    }
    function med(list,   v, k, i, j, t) {
      k = split(list, v, " ")
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
      return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
    }
    END {
      for (i = 0; i < 2; i++) {
        c = i == 0 ? "64" : "8"
        if (!(c in n)) continue
        printf "B/A req/s at c=%s: median %.3f (per round:%s)\n", c, med(ratio[c]), ratio[c]
        printf "  p50 at c=%s: median A %.1f us, B %.1f us (B lower in %d of %d rounds)\n", c, med(pa[c]), med(pb[c]), pl[c], n[c]
        printf "  server CPU a request at c=%s: median A %.2f us, B %.2f us (B lower in %d of %d rounds)\n", c, med(ca[c]), med(cb[c]), cl[c], n[c]
      }
    }'
}

if [ "${1:-}" = --summary ]; then
  [ -f "${2:-}" ] || { echo "usage: $0 --summary LOG" >&2; exit 2; }
  summarize <"$2"
  exit 0
fi
[ $# -ge 2 ] || { sed -n '2,20p' "$0"; exit 2; }
bin_a=$1 bin_b=$2 secs=${3:-5} rounds=${4:-5}
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
      "$r" "$c" "$rps_a" "$p50_a" "$cpu_a" "$rps_b" "$p50_b" "$cpu_b" "$ratio" | tee -a "$results"
  done
done
summarize <"$results"
