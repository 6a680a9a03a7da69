#!/usr/bin/env bash
# Instructions a request of `core/request_cycle` (fixed) and `core/request_cycle_auto`
# (benches/core.rs), by callgrind, and their ratio: issue 25's decision cost ("within 2x"),
# which the clock on a shared 2-vCPU machine cannot tell. Each bench runs for 2 s under
# callgrind (`--profile-time`); tools/bench/core_instructions.py divides the timed loop's
# instructions by the requests admitted and lists the core's parts.
# Usage: tools/bench/core_instructions.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/tools/bench/bench_bin.sh"
cd "$root"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
bin="$(bench_binary core "$out")"
declare -A per
for b in request_cycle request_cycle_auto; do
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$b" "$bin" --bench --profile-time 2 \
    "core/$b\$" >/dev/null 2>"$out/vg.$b"
  echo "== core/$b ($(git rev-parse --short HEAD))"
  report="$(tools/bench/core_instructions.py "$out/cg.$b")"
  printf '%s\n' "$report"
  per[$b]="$(sed -n 's/.*(the timed loop) \([0-9]*\)$/\1/p' <<<"$report")"
done
awk -v a="${per[request_cycle_auto]}" -v f="${per[request_cycle]}" \
  'BEGIN { printf "request_cycle_auto / request_cycle: %.3f (goal: within 2x)\n", a / f }'
