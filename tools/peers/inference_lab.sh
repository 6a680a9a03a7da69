#!/usr/bin/env bash
# abe's continuous-batching simulator against inference-lab (crates.io: a Rust discrete-event
# simulator with a vLLM-style scheduler over a datasheet roofline), on the same model, GPU,
# scheduler limits and workload:
#   Llama-3.1-8B (BF16) on one H100 SXM, at most 256 sequences and 8192 tokens per step,
#   chunked prefill within that budget; Poisson 20 requests/s, prompts lognormal with median
#   128 tokens (sigma 0.6), outputs lognormal with median 24 (sigma 0.5); REQUESTS requests.
# RATE=N runs both at N requests/s instead (abe: the scenario's 20/s times --rate-scale N/20).
# abe runs scenarios/chat_8b_h100.toml with both roofline efficiencies at 1 (inference-lab
# prices steps at the datasheet peaks). The two draw their requests from different RNGs, so
# the comparison is of aggregates over many requests.
#
#   1. installs inference-lab VERSION with `cargo install --locked` into target/peers/ (once);
#   2. builds abe (release);
#   3. runs each, timed (wall clock, this machine), and prints throughput, mean TTFT and mean
#      TPOT side by side, with abe / inference-lab ratios.
#
# Usage: tools/peers/inference_lab.sh            (override with VAR=value)
# Writes il.toml, il_workload.toml, il.json, il.txt, abe.json, abe.txt into OUT_DIR.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
VERSION="${VERSION:-1.0.0}"
REQUESTS="${REQUESTS:-100000}"
RATE="${RATE:-20}"   # requests/s, both simulators (the issue's speed goal is at RATE=300)
SEED="${SEED:-7}"
OUT_DIR="${OUT_DIR:-$root/target/peers/inference_lab_run}"
il_root="$root/target/peers/inference-lab"
il="$il_root/bin/inference-lab"
command -v jq >/dev/null || { echo "inference_lab.sh needs jq" >&2; exit 2; }
mkdir -p "$OUT_DIR"

if ! [ -x "$il" ] || ! "$il" --version 2>/dev/null | grep -q "$VERSION"; then
  echo "== 1. cargo install inference-lab $VERSION" >&2
  cargo install --locked inference-lab --version "$VERSION" --root "$il_root"
fi

echo "== 2. build abe (release)" >&2
(cd "$root" && cargo build --release --quiet --bin abe)
abe="$root/target/release/abe"

cat >"$OUT_DIR/il.toml" <<TOML
model = "llama-3.1-8b-instruct"

[scheduler]
max_num_batched_tokens = 8192
max_num_seqs = 256
policy = "fcfs"
enable_chunked_prefill = true
block_size = 16

[hardware.h100]
tp = 1
TOML
# lognormal mean/std_dev are those of the log: ln 128 = 4.852, ln 24 = 3.178.
cat >"$OUT_DIR/il_workload.toml" <<TOML
arrival_pattern = "poisson"
arrival_rate = $RATE
num_requests = $REQUESTS
seed = $SEED

[input_len_dist]
type = "lognormal"
mean = 4.852
std_dev = 0.6

[output_len_dist]
type = "lognormal"
mean = 3.178
std_dev = 0.5
TOML

echo "== 3a. inference-lab" >&2
start=$(date +%s.%N)
"$il" -q -o "$OUT_DIR/il.json" --config "$OUT_DIR/il.toml" --hardware h100 \
  --workload "$OUT_DIR/il_workload.toml" >"$OUT_DIR/il.txt" 2>&1
il_s=$(echo "$(date +%s.%N) - $start" | bc)

echo "== 3b. abe simulate --mode continuous" >&2
start=$(date +%s.%N)
"$abe" simulate --scenario "$root/scenarios/chat_8b_h100.toml" --requests "$REQUESTS" \
  --seed "$SEED" --jobs 1 --latency flops_efficiency=1 --latency bandwidth_efficiency=1 \
  --rate-scale "$(awk -v r="$RATE" 'BEGIN { print r / 20 }')" \
  --json "$OUT_DIR/abe.json" >"$OUT_DIR/abe.txt"
abe_s=$(echo "$(date +%s.%N) - $start" | bc)

# inference-lab's per-token latency is the per-request mean TPOT ((e2e - TTFT) / (out - 1)).
# Its TTFT is one step longer by construction: its driver hands the generator's arrivals to
# the engine only between engine events, once the clock has passed them, so a request that
# arrives while a step runs is queued when that step ends, after the next step was already
# planned (inference-lab 1.0.0, src/simulation/simulator.rs drain_arrivals and
# src/simulation/engine.rs submit/handle_worker_ready). abe admits it into the next step.
# The row "abe + 1 step" adds abe's mean TPOT (one decode step) to abe's mean TTFT.
jq -rn --slurpfile il "$OUT_DIR/il.json" --slurpfile abe "$OUT_DIR/abe.json" \
  --arg il_s "$il_s" --arg abe_s "$abe_s" '
  ($il[0]) as $i | ($abe[0].runs[0]) as $a
  | def r(x): (x * 100 | round) / 100;
    def row(name; il; abe): "\(name)\t\(r(il))\t\(r(abe))\t\(r(abe / il))";
  "metric\tinference-lab\tabe\tabe/il",
  row("requests/s"; $i.throughput_metrics.requests_per_sec; $a.throughput_rps),
  row("output tok/s"; $i.throughput_metrics.output_tokens_per_sec; $a.output_tokens_per_s),
  row("TTFT mean ms"; $i.latency_metrics.ttft_ms.mean; $a.continuous.ttft_ms.mean),
  row("TTFT p50 ms"; $i.latency_metrics.ttft_ms.p50; $a.continuous.ttft_ms.p50),
  row("TTFT mean ms, abe + 1 step"; $i.latency_metrics.ttft_ms.mean;
    $a.continuous.ttft_ms.mean + $a.continuous.tpot_ms.mean),
  row("TPOT mean ms"; $i.latency_metrics.per_token_ms.mean; $a.continuous.tpot_ms.mean),
  row("e2e mean ms"; $i.latency_metrics.e2e_ms.mean; $a.latency_ms.mean),
  row("e2e p99 ms"; $i.latency_metrics.e2e_ms.p99; $a.latency_ms.p99),
  row("wall clock s"; ($il_s | tonumber); ($abe_s | tonumber))' | column -t -s "$(printf '\t')"
