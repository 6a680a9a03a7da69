#!/usr/bin/env bash
# Baseline for callgrind_per_request.sh: user-space instructions per request of nginx
# (master_process off, one worker) returning a fixed 200 to the same keep-alive POSTs.
# Usage: tools/bench/callgrind_nginx.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-2000}"
here="$(pwd)/tools/bench"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
conf="$out/nginx.conf"
sed -e 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' "$here/nginx.conf" >"$conf"

measure() {
  local reqs=$1
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" nginx -c "$conf" 2>"$out/vg.log" &
  local pid=$!
  sleep 2
  python3 "$here/keepalive_posts.py" 18481 "$reqs"
  kill -QUIT $pid
  wait $pid || true
  local total=0
  for f in "$out"/cg.*; do
    total=$((total + $(awk '/^summary:/ {print $2}' "$f")))
  done
  rm -f "$out"/cg.*
  echo "$total"
}

base=$(measure 0)
loaded=$(measure "$n")
echo "nginx instructions: idle run $base, with $n requests $loaded"
awk -v a="$loaded" -v b="$base" -v n="$n" 'BEGIN {printf "nginx instructions per request: %.0f\n", (a - b) / n}'
