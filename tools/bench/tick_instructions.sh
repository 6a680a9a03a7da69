#!/usr/bin/env bash
# Instructions per continuous tick, prefix caching on and off (issue 23: on within 1.10x of
# off): callgrind of the `continuous/tick_16_slots` bench loop (benches/continuous.rs: 16
# generating slots, 16-token prompts, 64 tokens out, one EOS in 64), run for 10,000 and
# 20,000 ticks; the difference over 10,000 is one tick without set-up. Deterministic for a
# given build (a rebuild can move counts by ~2 %: compare ratios, and builds of one session).
# Usage: tools/bench/tick_instructions.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/tools/bench/bench_bin.sh"
cd "$root"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
bin="$(bench_binary continuous "$out")"
count() { # caching ticks
  TICK_CACHING="$1" TICK_COUNT="$2" valgrind --tool=callgrind \
    --callgrind-out-file="$out/cg.$1.$2" "$bin" >/dev/null 2>"$out/vg.$1.$2"
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/vg.$1.$2"
}
declare -A per
for m in off on; do
  a=$(count "$m" 10000); b=$(count "$m" 20000)
  per[$m]=$(( (b - a) / 10000 ))
  echo "caching $m: ${per[$m]} instructions a tick"
done
echo "on / off: $(echo "scale=3; ${per[on]} / ${per[off]}" | bc)"
