#!/usr/bin/env bash
# Instructions one `abe simulate` run takes (callgrind: deterministic, unlike its wall time on
# a shared machine): the inference-lab comparison's workload at 300 requests/s, 100,000 chat
# requests on Llama-3.1-8B / H100 (tools/peers/inference_lab.sh times the same run against
# inference-lab). BENCHMARKS.md, "Prefix caching", records the counts.
# Usage: tools/bench/sim_instructions.sh [ABE_BINARY]   (default: target/release/abe)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
abe="${1:-$root/target/release/abe}"
[ -x "$abe" ] || { echo "no $abe: cargo build --release --bin abe" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "needs valgrind (tools/setup.sh installs it)" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" "$abe" simulate \
  --scenario "$root/scenarios/chat_8b_h100.toml" --requests 100000 --seed 7 --jobs 1 \
  --latency flops_efficiency=1 --latency bandwidth_efficiency=1 --rate-scale 15 \
  >/dev/null 2>"$out/valgrind.txt"
n="$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/valgrind.txt")"
echo "abe simulate, inference-lab workload at 300 requests/s: $n instructions"
