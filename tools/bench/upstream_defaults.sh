#!/usr/bin/env bash
# abe in front of a server that batches for itself, on defaults: one `abe serve` in
# continuous batching (its default roofline model, Llama-3.1-8B on an H100: it stands in for
# vLLM) answers, and a second abe routes to it as an `upstream` backend configured with
# nothing but its address and model (every other key on its default). `abe loadgen` runs
# closed loops of CLIENTS clients (the steady_state scenario's requests) for SECS seconds
# against the server directly and through the front, alternated ROUNDS times; prints each
# run's req/s, p50 and p99 and the median ratio front / direct. With BASE_BIN=PATH a third
# column runs that build as the front (the same config file), for before/after.
# Usage: tools/bench/upstream_defaults.sh [SECS] [ROUNDS] [CLIENTS...]
#   (defaults 15 s, 3 rounds, 16 64 128 clients; BENCH_BIN=PATH uses that binary instead of
#    building target/release/abe; TABLE_EXTRA='key = value' adds a line to the front's
#    backend table, e.g. 'prompt_array = true'). Needs curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-15}"
rounds="${2:-3}"
shift 2 2>/dev/null || shift $#
clients=("${@:-16 64 128}")
[ ${#clients[@]} -eq 1 ] && read -r -a clients <<<"${clients[0]}"
bin="${BENCH_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
base="${BASE_BIN:-}"
back_port=18500
front_port=18501
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
cat >"$work/front.toml" <<TOML
[[backends]]
name = "batching-server"
kind = "upstream"
base_url = "http://127.0.0.1:$back_port"
${TABLE_EXTRA:-}
[[backends.models]]
name = "abe-sim"
context_length = 131072
TOML
wait_ok() { # port
  for _ in $(seq 1 150); do
    if curl -sf -o /dev/null "http://127.0.0.1:$1/v1/completions" -d '{"prompt":"x","max_tokens":1}'; then return 0; fi
    sleep 0.2
  done
  echo "nothing answers on port $1" >&2
  exit 1
}
ABE_BATCHING_MODE=continuous RUST_LOG=warn "$bin" serve --port "$back_port" >"$work/back.log" 2>&1 &
pids+=($!)
wait_ok "$back_port"
front_pid=""
start_front() { # binary
  [ -n "$front_pid" ] && { kill "$front_pid" 2>/dev/null || true; wait "$front_pid" 2>/dev/null || true; }
  RUST_LOG=warn "$1" serve --port "$front_port" --config "$work/front.toml" >"$work/front.log" 2>&1 &
  front_pid=$!
  pids+=("$front_pid")
  wait_ok "$front_port" # the health checker marks the backend up within a check interval
}
run() { # port clients -> "req/s p50 p99"
  "$bin" loadgen --url "http://127.0.0.1:$1" --clients "$2" --duration "$secs" -q 2>&1 \
    | awk '$1 == "live" && $2 !~ /^http/ { print $6, $8, $10 }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "# $(date -u +%FT%TZ), $(nproc) vCPU; front $bin${base:+, base front $base}; ${secs}s runs"
for c in "${clients[@]}"; do
  : >"$work/ratios"
  : >"$work/base_ratios"
  for r in $(seq 1 "$rounds"); do
    read -r d_rps d_p50 d_p99 < <(run "$back_port" "$c")
    start_front "$bin"
    read -r f_rps f_p50 f_p99 < <(run "$front_port" "$c")
    line="clients $c round $r: direct $d_rps req/s p50 $d_p50 p99 $d_p99 ms | front $f_rps req/s p50 $f_p50 p99 $f_p99 ms"
    awk -v f="$f_rps" -v d="$d_rps" 'BEGIN { print f / d }' >>"$work/ratios"
    if [ -n "$base" ]; then
      start_front "$base"
      read -r b_rps b_p50 b_p99 < <(run "$front_port" "$c")
      line="$line | base front $b_rps req/s p50 $b_p50 p99 $b_p99 ms"
      awk -v f="$b_rps" -v d="$d_rps" 'BEGIN { print f / d }' >>"$work/base_ratios"
    fi
    echo "$line"
  done
  echo "clients $c: front / direct req/s, median $(median <"$work/ratios")${base:+; base front / direct $(median <"$work/base_ratios")}"
done
