#!/usr/bin/env bash
# `auto` against fixed batching windows on the embed executor, mixed lengths: the table
# "Does `auto` ... leave throughput on the table here?" in BENCHMARKS.md ("A real embedding
# model"). Three `abe serve` (release, --features embed, all-MiniLM-L6-v2 from
# tools/fetch_minilm.sh, one embed backend, max_concurrent_batches 1, max batch 64) run side
# by side: `auto`, and `fixed` holding batches up to each of WINDOWS_MS ms with
# `dispatch_when_idle = false`. The same Python client (tools/peers/drive.py closed --mixed:
# every 8th request 142 tokens, the rest 16) measures each in turn, WARMUP_S unmeasured then
# DURATION_S, at each of CLIENTS, for ROUNDS rounds. One JSON line per point.
# Not part of the test command. Usage: tools/bench/embed_windows.sh  (VAR=value to override)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/tools/bench/embed_server.sh"
CLIENTS="${CLIENTS:-16 64}"
ROUNDS="${ROUNDS:-2}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
WINDOWS_MS="${WINDOWS_MS:-10 25}"
PORT0="${PORT0:-18471}"
model="$("$root/tools/fetch_minilm.sh")"
(cd "$root" && cargo build -q --release --features embed --bin abe)

pids=()
cfgs=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -f "${cfgs[@]}"
}
trap cleanup EXIT
servers=()
start() { # name port strategy window_ms idle_dispatch
  local cfg
  cfg="$(mktemp --suffix .toml)"
  cfgs+=("$cfg")
  embed_config "$cfg" "$model" "$3" 64 "$4" "$5"
  start_embed_server "$root/target/release/abe" "$cfg" "$2"
  servers+=("$1@abe-embed=http://127.0.0.1:$2")
}
port=$PORT0
start auto "$port" auto 100 true
for w in $WINDOWS_MS; do
  port=$((port + 1))
  start "fixed-${w}ms" "$port" fixed "$w" false
done

echo "# $(date -u +%FT%TZ) $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
drive="$root/tools/peers/drive.py"
for round in $(seq 1 "$ROUNDS"); do
  for n in $CLIENTS; do
    for entry in "${servers[@]}"; do
      label="${entry%%@*}"
      server="${entry#*@}"
      python3 "$drive" closed --server "$server" --clients "$n" --duration "$WARMUP_S" \
        --mixed >/dev/null
      line="$(python3 "$drive" closed --server "$server" --clients "$n" \
        --duration "$DURATION_S" --mixed)"
      echo "{\"setting\": \"$label\", \"round\": $round, \"clients\": $n, \"load1\": $(cut -d' ' -f1 /proc/loadavg), ${line#\{}"
    done
  done
done
