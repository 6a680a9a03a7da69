#!/usr/bin/env bash
# The cost of one sched_yield hand-off between two threads pinned to one core, with no work
# between: the floor under each context switch of abe's io thread -> engine -> worker cycle
# when, on 2 cores, the three share the last core (BENCHMARKS.md, "One more look").
# Needs a C compiler (gcc).
# Usage: tools/bench/yield_handoff.sh [HAND-OFFS] [CORE]   (defaults 1000000, the last core)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
gcc -O2 -pthread -o "$out/yield_handoff" tools/bench/yield_handoff.c
"$out/yield_handoff" "${1:-1000000}" "${2:-$(($(nproc) - 1))}"
