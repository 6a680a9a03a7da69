#!/usr/bin/env bash
# abe's `embed` executor against Infinity (PyPI infinity-emb 0.0.78, a dynamic-batching
# embedding server on torch) on the same model, all-MiniLM-L6-v2, on this machine.
#
# Both servers run at once on loopback; closed loops of one sentence (16 tokens) per
# request at each of CLIENTS are measured alternately (abe, infinity, abe, infinity... for
# ROUNDS rounds), each point WARMUP_S unmeasured then DURATION_S, by the same Python client
# (tools/peers/drive.py). Prints one JSON line per point; compare medians per server.
#
#   abe       target/release/abe built with --features embed, one embed backend,
#             max_concurrent_batches 1 (a forward pass already uses both cores),
#             strategy $ABE_STRATEGY (default auto), max_batch_size $ABE_MAX_BATCH (64);
#   infinity  `infinity_emb v2` with --engine torch --device cpu, batch size 64, from a
#             venv at $VENV (created here if missing; torch without its CUDA packages).
#
# Not part of the test command. Usage: tools/peers/infinity.sh  (override VAR=value below;
# MIXED=1 for mixed lengths)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/tools/bench/embed_server.sh"
CLIENTS="${CLIENTS:-1 8 64}"
ROUNDS="${ROUNDS:-3}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
ABE_STRATEGY="${ABE_STRATEGY:-auto}"
ABE_MAX_BATCH="${ABE_MAX_BATCH:-64}"
VENV="${VENV:-$root/target/peers/infinity-venv}"
# MIXED=1: 1 request in 8 is the sentence ten times over (142 tokens), so batches mix lengths.
MIXED_FLAG=""
[ "${MIXED:-0}" = 1 ] && MIXED_FLAG="--mixed"
ABE_PORT="${ABE_PORT:-18461}"
INF_PORT="${INF_PORT:-18462}"
model="$("$root/tools/fetch_minilm.sh")"

if [ ! -x "$VENV/bin/infinity_emb" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-deps torch
  "$VENV/bin/pip" install -q sympy networkx jinja2 filelock fsspec typing-extensions
  # Its own venv: infinity-emb 0.0.78 pins sentence-transformers < 4 and numpy < 2.
  "$VENV/bin/pip" install -q "infinity-emb[server,torch]==0.0.78"
fi
(cd "$root" && cargo build -q --release --features embed --bin abe)

cfg="$(mktemp --suffix .toml)"
embed_config "$cfg" "$model" "$ABE_STRATEGY" "$ABE_MAX_BATCH"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -f "$cfg"
}
trap cleanup EXIT
ABE_ENGINE_PIN=false RUST_LOG=warn "$root/target/release/abe" serve --config "$cfg" \
  --port "$ABE_PORT" >/dev/null 2>&1 &
pids+=($!)
INFINITY_ANONYMOUS_USAGE_STATS=0 HF_HUB_OFFLINE=1 "$VENV/bin/infinity_emb" v2 \
  --model-id "$model" --served-model-name all-MiniLM-L6-v2 --engine torch --device cpu \
  --batch-size 64 --port "$INF_PORT" --no-model-warmup >/dev/null 2>&1 &
pids+=($!)
wait_up() {
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null -X POST "$1" -H 'content-type: application/json' -d "$2" && return 0
    sleep 0.2
  done
  echo "server at $1 did not come up" >&2
  exit 1
}
wait_up "http://127.0.0.1:$ABE_PORT/v1/embeddings" '{"input":"warm up"}'
wait_up "http://127.0.0.1:$INF_PORT/embeddings" \
  '{"model":"all-MiniLM-L6-v2","input":["warm up"]}'

echo "# $(date -u +%FT%TZ) $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
drive="$root/tools/peers/drive.py"
for round in $(seq 1 "$ROUNDS"); do
  for n in $CLIENTS; do
    for server in "abe-embed=http://127.0.0.1:$ABE_PORT" "infinity=http://127.0.0.1:$INF_PORT"; do
      python3 "$drive" closed --server "$server" --clients "$n" --duration "$WARMUP_S" \
        $MIXED_FLAG >/dev/null
      line="$(python3 "$drive" closed --server "$server" --clients "$n" --duration "$DURATION_S" \
        $MIXED_FLAG)"
      echo "{\"round\": $round, \"clients\": $n, \"load1\": $(cut -d' ' -f1 /proc/loadavg), ${line#\{}"
    done
  done
done
# What auto learned of this executor's batch cost (a fixed, b per request), and the
# padding and forward time the embed backend saw, for BENCHMARKS.md.
curl -s "http://127.0.0.1:$ABE_PORT/metrics" |
  grep -E '^abe_(auto_cost|auto_cost_samples|embed_)|^abe_batch_size_(sum|count)' >&2 || true
