#!/usr/bin/env bash
# One build of abe's `embed` executor on defaults against the same build hand-tuned, side by
# side on loopback, alternated: BENCHMARKS.md, "Issue 25: defaults per executor kind".
#
#   tools/bench/ab_embed_defaults.sh [BIN]      (default target/release/abe, built with
#                                                `cargo build --release --features embed`)
#
# "defaults": a config holding only the embed backend and its model (no batch size, no
# max_concurrent_batches, no pinning key, no ABE_* variable), so abe picks the embed kind's
# defaults (config::KindDefaults). "tuned": tools/bench/embed_server.sh's hand-tuned config
# (max batch 64, max_concurrent_batches 1) with ABE_ENGINE_PIN=false, as
# tools/bench/ab_embed_live.sh and tools/peers/infinity.sh run it. OLD=1 adds "old", the
# defaults before issue 25 written out (max batch 32, 4 concurrent batches, pinned).
# tools/peers/drive.py measures each in turn at each of CLIENTS (closed loop, WARMUP_S
# unmeasured then DURATION_S), ROUNDS rounds, each starting at the next config. One JSON
# line per point with "config". Each server's effective config (`abe config show`) goes to
# stderr first.
# Not part of the test command.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/target/release/abe}"
CLIENTS="${CLIENTS:-8 64}"
ROUNDS="${ROUNDS:-3}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
model="$("$root/tools/fetch_minilm.sh")"

dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
backend() {
  cat <<TOML
[[backends]]
name = "minilm"
kind = "embed"
model_dir = "$model"
$1
[[backends.models]]
name = "all-MiniLM-L6-v2"
context_length = 512
TOML
}
backend "" >"$dir/defaults.toml"
{
  echo "[batching]"
  echo "max_batch_size = 64"
  backend "max_concurrent_batches = 1"
} >"$dir/tuned.toml"
{
  printf '[batching]\nmax_batch_size = 32\n[engine]\npin = true\n'
  backend "max_concurrent_batches = 4"
} >"$dir/old.toml"

start() { # label port [VAR=value ...]
  local label=$1 port=$2
  shift 2
  echo "# $label: $(env "$@" "$bin" config show --config "$dir/$label.toml" |
    grep -E '^(max_batch_size|pin|max_concurrent_batches) =' | tr '\n' ' ')" >&2
  env "$@" RUST_LOG=warn "$bin" serve --config "$dir/$label.toml" --port "$port" \
    >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/v1/embeddings" -d '{"input":"warm up"}' &&
      return 0
    sleep 0.2
  done
  echo "abe ($label) on port $port did not come up" >&2
  exit 1
}
servers=("defaults@18491" "tuned@18492")
start defaults 18491
start tuned 18492 ABE_ENGINE_PIN=false
if [ "${OLD:-0}" = 1 ]; then
  start old 18493
  servers+=("old@18493")
fi

echo "# $(date -u +%FT%TZ) $bin, $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
drive="$root/tools/peers/drive.py"
k=${#servers[@]}
for round in $(seq 1 "$ROUNDS"); do
  for n in $CLIENTS; do
    # Each round starts at the next server, so none is always measured first.
    for i in $(seq 0 $((k - 1))); do
      entry="${servers[$(((i + round - 1) % k))]}"
      label="${entry%%@*}"
      server="abe-embed=http://127.0.0.1:${entry#*@}"
      python3 "$drive" closed --server "$server" --clients "$n" --duration "$WARMUP_S" >/dev/null
      line="$(python3 "$drive" closed --server "$server" --clients "$n" --duration "$DURATION_S")"
      echo "{\"config\": \"$label\", \"round\": $round, \"clients\": $n, \"load1\": $(cut -d' ' -f1 /proc/loadavg), ${line#\{}"
    done
  done
done
