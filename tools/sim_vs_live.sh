#!/usr/bin/env bash
# Simulated vs live for one scenario: the issue-5 proof that `abe simulate` and
# `abe loadgen` against `abe serve` agree within 10 %, on what can disagree.
#
#   1. builds release;
#   2. starts `abe serve` on a free loopback port with WORKERS workers, LATENCY_MODEL (its
#      default parameters, the same defaults the simulator uses) and STRATEGY;
#   3. runs `abe loadgen` for SCENARIO/SEED/REQUESTS against it (open loop, real traffic to
#      127.0.0.1 only);
#   4. runs `abe simulate` of the same scenario, seed, request count, strategy, workers and
#      latency model; with TRACE and MODE=continuous, through a scenario file written from
#      the server's effective config (`abe config show`): its continuous settings (slots,
#      n_batch, prefill chunk, queue, prefix caching, block size), request timeout and
#      roofline model/GPU, so the simulator schedules exactly what the server does (the
#      trace's replay base otherwise has chat_8b_h100's 256 slots and 8192-token steps);
#   5. prints both runs (throughput: completed / makespan, first scheduled arrival to last
#      completion; latency p50 / p99; computed by the same code for both) and judges the
#      figure that can disagree: below saturation (the simulated workers busy less than
#      SATURATION of the time, nothing refused) both replay one schedule and keep up with
#      it, so their throughputs agree by construction and the p50 latency is compared;
#      past saturation the throughput is (what the workers sustain). Exits 1 if the judged
#      figure differs by more than TOLERANCE. MODE=continuous also compares p50 TTFT and TPOT: the
#      server's own per-request figures (/metrics/json token_latency, read before it stops)
#      against the simulator's (runs[0].continuous), and fails if either differs by more
#      than TOLERANCE (issue 13 asks for 5 %: TOLERANCE=0.05). With a trace, the prefix-cache
#      hit rates too: the server's vllm:prefix_cache_hits_total / queries_total against the
#      simulator's (issue 23 asks for 1 point; reported, not enforced).
#
# Usage: tools/sim_vs_live.sh            (defaults below; override any with VAR=value)
# Writes live.json, sim.json and serve.log into OUT_DIR.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
SCENARIO="${SCENARIO:-steady_state}"     # built-in name or scenario file
SEED="${SEED:-7}"
REQUESTS="${REQUESTS:-3000}"             # steady_state: 100 requests/s, so 30 s of load
WORKERS="${WORKERS:-4}"
LATENCY_MODEL="${LATENCY_MODEL:-linear}" # none | linear | calibrated (server's defaults)
STRATEGY="${STRATEGY:-queue_depth}"
# request | continuous (then the strategy does not apply: loadgen does not switch it, and
# the simulator's run is named `continuous`; LATENCY_MODEL=roofline is the realistic one).
MODE="${MODE:-request}"
# More than the requests in flight at the server's pace, so sends are rarely late; the
# simulator has no connection limit. (An overloaded run still queues the excess in the
# load generator, where latency keeps counting from the schedule.)
CONNECTIONS="${CONNECTIONS:-256}"
TOLERANCE="${TOLERANCE:-0.10}"
# Simulated worker utilisation from which a run counts as saturated (throughput judged).
SATURATION="${SATURATION:-0.9}"
# A trace (abe's CSV/JSONL, Azure CSV, Mooncake JSONL) replayed by both instead of the
# scenario's workload, RATE_SCALE times faster; with MODE=continuous the prefix-cache hit
# rates are compared too (the server's /metrics/json prefix_cache against the simulator's).
TRACE="${TRACE:-}"
RATE_SCALE="${RATE_SCALE:-1}"
OUT_DIR="${OUT_DIR:-$root/target/sim_vs_live}"

command -v jq >/dev/null || { echo "sim_vs_live.sh needs jq" >&2; exit 2; }
mkdir -p "$OUT_DIR"
bin="$root/target/release/abe"

echo "== 1. build release" >&2
(cd "$root" && cargo build --release --quiet)

echo "== 2. abe serve: $WORKERS workers, latency model $LATENCY_MODEL, $MODE mode, strategy $STRATEGY" >&2
config="$OUT_DIR/serve.toml"
cat >"$config" <<EOF
[server]
host = "127.0.0.1"
port = 0
# Room for every request a saturated run may hold.
max_connections = 4096

[batching]
strategy = "$STRATEGY"
mode = "$MODE"

[workers]
count = $WORKERS
latency_model = "$LATENCY_MODEL"

[engine]
# The load generator shares this machine; unpinned threads share the cores fairly.
pin = false
EOF
log="$OUT_DIR/serve.log"
RUST_LOG=warn "$bin" serve --config "$config" >"$log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 100); do
  url="$(sed -n 's/^abe listening on //p' "$log")"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "abe serve did not start; see $log" >&2; exit 1; }

workload=(--scenario "$SCENARIO")
[ -z "$TRACE" ] || workload=(--trace "$TRACE" --rate-scale "$RATE_SCALE")
sim_latency=(--latency-model "$LATENCY_MODEL")
if [ -n "$TRACE" ] && [ "$MODE" = continuous ]; then
  # The simulator's settings from the server's effective config (what it really runs with).
  "$bin" config show --config "$config" >"$OUT_DIR/serve_effective.toml"
  "$root/tools/scenario_from_config.py" "$OUT_DIR/serve_effective.toml" "$TRACE" \
    >"$OUT_DIR/scenario.toml"
  workload=(--scenario "$OUT_DIR/scenario.toml" --trace "$TRACE" --rate-scale "$RATE_SCALE")
  # The scenario names the server's latency model (roofline: with its GPU and
  # efficiencies); --latency-model would replace it with the defaults.
  sim_latency=()
fi

echo "== 3. abe loadgen against $url" >&2
loadgen=("$bin" loadgen --url "$url" "${workload[@]}" --seed "$SEED"
  --requests "$REQUESTS" --connections "$CONNECTIONS" --json "$OUT_DIR/live.json")
[ "$MODE" = continuous ] || loadgen+=(--strategy "$STRATEGY")
echo "\$ ${loadgen[*]}"
"${loadgen[@]}"
# The server's own TTFT / TPOT histograms (continuous mode records them per request, as the
# simulator does: first token minus arrival; (last - first) / (tokens - 1)).
if [ "$MODE" = continuous ]; then
  curl -sf "$url/metrics/json" | jq .token_latency >"$OUT_DIR/live_tokens.json"
  curl -sf "$url/metrics/json" | jq .prefix_cache >"$OUT_DIR/live_prefix.json"
  curl -sf "$url/metrics" >"$OUT_DIR/live_metrics.txt"
fi

kill -TERM $pid
wait $pid || { echo "abe serve exited non-zero after SIGTERM; see $log" >&2; exit 1; }
trap - EXIT

echo "== 4. abe simulate" >&2
simulate=("$bin" simulate "${workload[@]}" --seed "$SEED" --requests "$REQUESTS"
  --strategies "$STRATEGY" --workers "$WORKERS" "${sim_latency[@]}"
  --mode "$MODE" --json "$OUT_DIR/sim.json")
echo "\$ ${simulate[*]}"
"${simulate[@]}"

echo "== 5. compare"
live_digest="$(jq -r .request_digest "$OUT_DIR/live.json")"
sim_digest="$(jq -r .request_digest "$OUT_DIR/sim.json")"
[ "$live_digest" = "$sim_digest" ] || {
  echo "request sequences differ: live $live_digest, sim $sim_digest" >&2
  exit 1
}
row() {
  jq -r --arg who "$1" '.runs[0] | [$who, .completed, .failed + .rejected_queue_full,
    (.makespan_s * 100 | round / 100), (.throughput_rps * 100 | round / 100),
    (.latency_ms.p50 * 10 | round / 10), (.latency_ms.p99 * 10 | round / 10)] | @tsv' "$2"
}
{
  printf 'run\tcompleted\tnot_ok\tmakespan_s\treq/s\tp50_ms\tp99_ms\n'
  row simulated "$OUT_DIR/sim.json"
  row live "$OUT_DIR/live.json"
} | column -t
sim_rps="$(jq .runs[0].throughput_rps "$OUT_DIR/sim.json")"
live_rps="$(jq .runs[0].throughput_rps "$OUT_DIR/live.json")"
sim_p50="$(jq .runs[0].latency_ms.p50 "$OUT_DIR/sim.json")"
live_p50="$(jq .runs[0].latency_ms.p50 "$OUT_DIR/live.json")"
saturated="$(jq -r --argjson sat "$SATURATION" \
  '.runs[0] | (.worker_utilisation >= $sat) or (.rejected_queue_full > 0)' "$OUT_DIR/sim.json")"
if [ "$saturated" = true ]; then
  what="throughput (saturated: simulated utilisation >= $SATURATION or requests refused)"
  sim_v="$sim_rps"; live_v="$live_rps"
else
  what="p50 latency ms (below saturation the throughputs agree by construction)"
  sim_v="$sim_p50"; live_v="$live_p50"
fi
jq -rn --argjson sr "$sim_rps" --argjson lr "$live_rps" --argjson s "$sim_v" --argjson l "$live_v" \
  --argjson tol "$TOLERANCE" --arg digest "$sim_digest" --arg what "$what" '
  ($l / $s) as $ratio
  | "request digest \($digest) (identical)",
    "throughput: simulated \($sr * 100 | round / 100) req/s, live \($lr * 100 | round / 100) req/s, live/simulated = \($lr / $sr * 1000 | round / 1000)",
    "judged: \($what): simulated \($s * 100 | round / 100), live \($l * 100 | round / 100), live/simulated = \($ratio * 1000 | round / 1000)",
    (if (($ratio - 1) | fabs) <= $tol then "agree within \($tol * 100) %"
     else "DISAGREE by more than \($tol * 100) %" end)'
ratio_ok="$(jq -n --argjson s "$sim_v" --argjson l "$live_v" --argjson tol "$TOLERANCE" \
  '((($l / $s) - 1) | fabs) <= $tol')"
tokens_ok=true
if [ "$MODE" = continuous ]; then
  # p50 TTFT and TPOT: the simulator's per-request figures against the server's.
  tokens="$(jq -rn --slurpfile sim "$OUT_DIR/sim.json" --slurpfile live "$OUT_DIR/live_tokens.json" \
    --argjson tol "$TOLERANCE" '
    ($sim[0].runs[0].continuous) as $s | ($live[0]) as $l
    | [["TTFT p50 ms", $s.ttft_ms.p50, $l.ttft.p50_ms], ["TPOT p50 ms", $s.tpot_ms.p50, $l.tpot.p50_ms],
       ["TTFT mean ms", $s.ttft_ms.mean, $l.ttft.mean_ms], ["TPOT mean ms", $s.tpot_ms.mean, $l.tpot.mean_ms]]
    | (map(select(.[0] | test("p50")) | ((.[2] / .[1]) - 1 | fabs) <= $tol) | all) as $ok
    | (map("\(.[0]): simulated \(.[1] * 100 | round / 100), live \(.[2] * 100 | round / 100), live/simulated = \(.[2] / .[1] * 1000 | round / 1000)") | .[]) ,
      (if $ok then "p50 TTFT and TPOT agree within \($tol * 100) %" else "p50 TTFT or TPOT DISAGREE by more than \($tol * 100) %" end),
      "ok=\($ok)"')"
  printf '%s\n' "$tokens" | grep -v '^ok='
  tokens_ok="$(printf '%s\n' "$tokens" | sed -n 's/^ok=//p')"
  # Prefix caching: the hit rates, in percentage points (the issue asks for 1 point).
  if [ "$(jq -r 'type' "$OUT_DIR/live_prefix.json")" = object ]; then
    # A counter summed over its label sets (vllm:* carry model_name).
    vllm() {
      awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { print s + 0 }' \
        "$OUT_DIR/live_metrics.txt"
    }
    jq -rn --slurpfile sim "$OUT_DIR/sim.json" --slurpfile live "$OUT_DIR/live_prefix.json" \
      --argjson hits "$(vllm vllm:prefix_cache_hits_total)" \
      --argjson queries "$(vllm vllm:prefix_cache_queries_total)" '
      ($sim[0].runs[0].continuous.prefix_cache) as $s | ($live[0]) as $l
      | (if $queries > 0 then $hits / $queries else 0 end) as $v
      | "prefix-cache hit rate: simulated \($s.hit_rate * 10000 | round / 100) % (\($s.hit_tokens) of \($s.query_tokens) tokens), live \($v * 10000 | round / 100) % (vllm:prefix_cache_hits_total \($hits) / queries_total \($queries); /metrics/json \($l.hit_tokens) of \($l.query_tokens)), difference \((($v - $s.hit_rate) * 10000 | round / 100)) points"'
  fi
fi
[ "$ratio_ok" = true ] && [ "$tokens_ok" = true ]
