#!/usr/bin/env bash
# A per-thread callgrind profile of `abe serve` on the request path, kept for reading: the
# same server and requests as tools/bench/instruction_budget.sh (latency model `none`, idle
# policy `park`, no pinning; keepalive_posts.py's small completion POST), one profile file
# per thread in OUT, and each file's thread kind and instruction count printed. Read one
# with `callgrind_annotate --inclusive=yes OUT/cg.PID-NN` (or `--tree=caller` to see who
# calls a function); divide by N for a figure a request (start-up and shutdown included:
# small at N = 2,000, but instruction_budget.sh's difference of two runs is the exact one).
#
# Usage: tools/bench/callgrind_profile.sh [N] [CONNS] [OUT] [BINARY]
#   (defaults 2000 requests, 1 connection, target/callgrind_profile, target/release/abe,
#   built with `cargo build --release --bin abe` when BINARY is not given)
# Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/callgrind_lib.sh # callgrind_thread_kind
n="${1:-2000}"
conns="${2:-1}"
out="${3:-target/callgrind_profile}"
bin="${4:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null 2>&1 || { cargo build --release --bin abe; exit 2; }
  bin=target/release/abe
fi
port="${PORT:-18640}"
rm -rf "$out"
mkdir -p "$out"
ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_IDLE=park ABE_ENGINE_PIN=false RUST_LOG=warn \
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
  "$bin" serve --port "$port" >/dev/null 2>"$out/valgrind.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
up=0
for _ in $(seq 1 300); do
  if python3 tools/bench/keepalive_posts.py "$port" 0 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
[ "$up" = 1 ] || { echo "server under valgrind did not start: $(tail -3 "$out/valgrind.log")" >&2; exit 1; }
python3 tools/bench/keepalive_posts.py "$port" "$n" "$conns"
kill -TERM "$pid"
wait "$pid" || true
trap - EXIT
for f in "$out"/cg.*-*; do
  kind=$(callgrind_thread_kind "$f")
  ir=$(awk '/^summary:/ {print $2}' "$f")
  [ -n "$ir" ] || continue
  printf '%-7s %12s Ir  %8d a request  %s\n' "$kind" "$ir" $((ir / n)) "$f"
done
