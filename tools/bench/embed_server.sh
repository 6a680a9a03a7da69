# Sourced by the embed load scripts (tools/peers/infinity.sh, tools/bench/embed_windows.sh,
# tools/bench/ab_embed_live.sh): one `abe serve` config for all-MiniLM-L6-v2 on the `embed`
# executor, and starting such a server on loopback until it answers. Not run on its own.

# embed_config FILE MODEL_DIR STRATEGY MAX_BATCH [MAX_WAIT_MS DISPATCH_WHEN_IDLE]: writes the
# config: one embed backend, max_concurrent_batches 1 (a forward pass already uses both
# cores); the window keys only when given.
embed_config() {
  local file=$1 model=$2 strategy=$3 max_batch=$4
  {
    echo "[batching]"
    echo "strategy = \"$strategy\""
    echo "max_batch_size = $max_batch"
    if [ $# -ge 6 ]; then
      echo "max_wait_ms = $5"
      echo "dispatch_when_idle = $6"
    fi
    cat <<TOML
[[backends]]
name = "minilm"
kind = "embed"
model_dir = "$model"
max_concurrent_batches = 1
[[backends.models]]
name = "all-MiniLM-L6-v2"
context_length = 512
TOML
  } >"$file"
}

# start_embed_server BIN CONFIG PORT: starts `abe serve` in the background (its pid appended
# to the caller's `pids` array) and waits until it answers an embedding, or exits 1.
start_embed_server() {
  ABE_ENGINE_PIN=false RUST_LOG=warn "$1" serve --config "$2" --port "$3" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$3/v1/embeddings" -d '{"input":"warm up"}' && return 0
    sleep 0.2
  done
  echo "abe on port $3 did not come up" >&2
  exit 1
}
