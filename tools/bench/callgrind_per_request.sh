#!/usr/bin/env bash
# User-space instructions per request of `abe serve` (latency model `none`), counted with
# valgrind's callgrind: (Ir with N requests - Ir with 0 requests) / N, all threads.
# Idle policy `park` so no yield loop adds scheduling-dependent instructions.
# Usage: tools/bench/callgrind_per_request.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-2000}"
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release --bin abe >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

measure() { # requests
  local reqs=$1 port=18500
  ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_IDLE=park ABE_ENGINE_PIN=false RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
    "${CARGO_TARGET_DIR:-target}/release/abe" serve --port $port >/dev/null 2>"$out/vg.log" &
  local pid=$!
  for _ in $(seq 1 200); do
    python3 - "$port" <<'PY' 2>/dev/null && break
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
PY
    sleep 0.1
  done
  python3 - "$port" "$reqs" <<'PY'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"prompt":"hi","max_tokens":1}'
req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body)) + body
s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")
for _ in range(n):
    s.sendall(req)
    line = f.readline()
    assert line.startswith(b"HTTP/1.1 200"), line
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        if h.lower().startswith(b"content-length:"):
            length = int(h.split(b":")[1])
    f.read(length)
s.close()
PY
  kill -TERM $pid
  wait $pid || true
  local total=0
  for f in "$out"/cg.*; do
    ir=$(awk '/^summary:/ {print $2}' "$f")
    total=$((total + ir))
  done
  rm -f "$out"/cg.*
  echo "$total"
}

base=$(measure 0)
loaded=$(measure "$n")
echo "instructions: idle run $base, with $n requests $loaded"
awk -v a="$loaded" -v b="$base" -v n="$n" 'BEGIN {printf "instructions per request: %.0f\n", (a - b) / n}'
