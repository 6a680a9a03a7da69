#!/usr/bin/env bash
# Starts `abe serve` on a free loopback port, runs the given command with the base URL
# as its last argument, then stops abe with SIGTERM and checks it exited 0.
# Usage: tools/with_server.sh COMMAND [ARGS...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ABE_BIN:-$root/target/debug/abe}"
out="$(mktemp)"
ABE_ENGINE_PIN=false RUST_LOG=warn env -u ABE_BIN "$bin" serve --port 0 >"$out" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "$out"' EXIT
url=""
for _ in $(seq 1 100); do
  url="$(sed -n 's/^abe listening on //p' "$out")"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "abe did not start" >&2; exit 1; }
status=0
"$@" "$url" || status=$?
kill -TERM $pid
wait $pid || { echo "abe exited non-zero after SIGTERM" >&2; exit 1; }
trap - EXIT
rm -f "$out"
exit $status
