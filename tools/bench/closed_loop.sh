#!/usr/bin/env bash
# Live closed- and open-loop benchmark of the batching strategies on the issue-12 model: ONE
# worker whose batch of n requests takes a + b*n ms, max batch 32.
#
#   abe serve: workers.count = 1, latency_model = "linear", base_latency_ms = a,
#   latency_variance = 0, per_token_latency_ms = b / 2. The linear model charges
#   per_token x (prompt tokens + max_tokens) over the batch; every request here has a 1-token
#   prompt (4 bytes: abe estimates bytes / 4) and max_tokens 1, so it contributes 2 tokens,
#   i.e. b ms. engine.pin = false (the load generator shares the 2 cores).
#
# Closed loop (abe loadgen --clients N, no think time) at every (a, b) in PAIRS and every N in
# CLIENTS, for three servers:
#   auto       strategy auto (no parameter)
#   wc         fixed, dispatch_when_idle = true (work-conserving: an idle worker takes what
#              is queued at once)
#   w1         fixed, max_wait_ms = 1, dispatch_when_idle = false (a 1 ms window)
# and prints throughput as % of the best possible, m / (a + m b) with m = min(N, 32) (every
# client in every batch; more than 32 clients: full batches back to back). A client's round
# trip (loopback HTTP, the load generator's own scheduling) is not in that bound, so at one
# client and small a it cannot be reached live: the best a real client sees there is
# 1 / (a + b + rtt).
#
# Open loop (Poisson at LOADS x capacity, capacity = 32 / (a + 32 b)) at OPEN_PAIR for auto,
# wc and fixed windows WINDOWS (dispatch_when_idle = false), printing p50 / p99 and each
# strategy's ratio to the best of wc and the windows at that load.
#
# Each point: a WARMUP_S warm-up run (not reported) then a DURATION_S measured run, both
# against the same server (auto learns the cost model during the warm-up, as it would in
# service). Real traffic to 127.0.0.1 only; every run bounded by its duration and a
# per-request timeout.
#
# Usage: tools/bench/closed_loop.sh [closed|open|all]   (default all; override VAR=value)
# Writes every loadgen JSON, the summaries (closed.tsv, open.tsv) and server logs to OUT_DIR.
set -euo pipefail
# Arithmetic with a leading zero (TOML wants 0.05, not .05).
calc() { awk "BEGIN { printf \"%.10g\", $1 }"; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
WHAT="${1:-all}"
PAIRS="${PAIRS:-1:0.1 5:0.5 10:2 50:5}"   # a:b in ms
CLIENTS="${CLIENTS:-1 2 8 32 64 256}"
SERVERS="${SERVERS:-auto wc w1}"
DURATION_S="${DURATION_S:-3}"
WARMUP_S="${WARMUP_S:-1}"
OPEN_PAIR="${OPEN_PAIR:-10:2}"
LOADS="${LOADS:-0.1 0.5 0.8 0.95}"
WINDOWS="${WINDOWS:-1 2 5 10}"            # fixed max_wait_ms for the open loop
OUT_DIR="${OUT_DIR:-$root/target/bench_closed_loop}"
# BUILD=0: use the release binary as it is (this tree's build script reruns on git changes).

command -v jq >/dev/null || { echo "closed_loop.sh needs jq" >&2; exit 2; }
mkdir -p "$OUT_DIR"
bin="$root/target/release/abe"
if [ "${BUILD:-1}" = 1 ]; then
  echo "== build release" >&2
  (cd "$root" && cargo build --release --quiet --bin abe)
fi
echo "# $(date -u +%FT%TZ) $(nproc) cpus, load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

pid=""
stop_server() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
}
trap stop_server EXIT

# start_server NAME A B: abe serve with one linear worker and the strategy NAME stands for
# (auto | wc | wN = fixed window N ms, not work-conserving); sets $url.
start_server() {
  local name="$1" a="$2" b="$3" strategy dwi=true wait=100.0
  case "$name" in
    auto) strategy=auto ;;
    wc) strategy=fixed ;;
    w*) strategy=fixed; dwi=false; wait="${name#w}" ;;
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  local config="$OUT_DIR/serve-$name-a$a-b$b.toml" log="$OUT_DIR/serve-$name-a$a-b$b.log"
  # A fresh log: the address is read from it.
  rm -f "$log"
  cat >"$config" <<EOF
[server]
host = "127.0.0.1"
port = 0
max_connections = 4096

[batching]
strategy = "$strategy"
max_batch_size = 32
max_wait_ms = $wait
# (queue_depth only; it must not exceed max_wait_ms)
min_wait_ms = $wait
dispatch_when_idle = $dwi

[workers]
count = 1
latency_model = "linear"
base_latency_ms = $a
per_token_latency_ms = $(calc "$b / 2")
latency_variance = 0.0

[engine]
pin = false
EOF
  RUST_LOG=warn "$bin" serve --config "$config" >"$log" 2>&1 &
  pid=$!
  url=""
  for _ in $(seq 1 100); do
    url="$(sed -n 's/^abe listening on //p' "$log" 2>/dev/null || true)"
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  echo "abe serve did not start; see $log" >&2
  exit 1
}

# A scenario with 1-token prompts and max_tokens 1 (2 tokens a request) and the given
# arrivals (TOML lines).
scenario() {
  local file="$1" arrivals="$2"
  cat >"$file" <<EOF
name = "linear_ab"
description = "1-token prompts, max_tokens 1: each request costs b ms on the linear model."
requests = 200000
sla_ms = 1000.0

[workload.arrivals]
$arrivals

[workload.prompt_tokens]
dist = "fixed"
value = 1.0

[workload.output_tokens]
dist = "fixed"
value = 1.0
EOF
}

closed_loop() {
  local sc="$OUT_DIR/closed.toml" tsv="$OUT_DIR/closed.tsv"
  scenario "$sc" $'process = "closed"\nclients = 1\nthink_ms = 0.0'
  printf 'a_ms\tb_ms\tclients\tserver\tbest_rps\trps\tpct_of_best\tp50_ms\tp99_ms\terrors\n' >"$tsv"
  for pair in $PAIRS; do
    local a="${pair%%:*}" b="${pair##*:}"
    for server in $SERVERS; do
      start_server "$server" "$a" "$b"
      for n in $CLIENTS; do
        local m=$((n < 32 ? n : 32))
        local best json="$OUT_DIR/closed-a$a-b$b-$server-n$n.json"
        best="$(calc "$m * 1000 / ($a + $m * $b)")"
        local common=(--url "$url" --scenario "$sc" --clients "$n" --timeout-ms 30000 --quiet)
        "$bin" loadgen "${common[@]}" --duration "$WARMUP_S" >/dev/null
        "$bin" loadgen "${common[@]}" --duration "$DURATION_S" --json "$json" >/dev/null
        jq -r --arg a "$a" --arg b "$b" --arg n "$n" --arg s "$server" --argjson best "$best" \
          '[$a, $b, $n, $s, ($best * 10 | round / 10),
            (.runs[0].throughput_rps * 10 | round / 10),
            (.runs[0].throughput_rps / $best * 1000 | round / 10),
            (.runs[0].latency_ms.p50 * 100 | round / 100),
            (.runs[0].latency_ms.p99 * 100 | round / 100),
            (.live.errors_by_status | add // 0)] | @tsv' "$json" | tee -a "$tsv"
      done
      stop_server
    done
  done
  echo "== closed loop: % of best (rows: a:b x clients; columns: servers)"
  awk -F'\t' 'NR > 1 { k = $1 ":" $2 " n=" $3; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
      v[k, $4] = $7; if (!($4 in sv)) { sv[$4] = 1; servers[++ns] = $4 } }
    END { printf "%-16s", "a:b clients"; for (j = 1; j <= ns; j++) printf "%8s", servers[j]; print "";
      for (i = 1; i <= nk; i++) { printf "%-16s", keys[i];
        for (j = 1; j <= ns; j++) printf "%8s", v[keys[i], servers[j]]; print "" } }' "$tsv"
}

open_loop() {
  local a="${OPEN_PAIR%%:*}" b="${OPEN_PAIR##*:}" tsv="$OUT_DIR/open.tsv"
  local capacity
  capacity="$(calc "32 * 1000 / ($a + 32 * $b)")"
  printf 'a_ms\tb_ms\tload\trate_rps\tserver\tp50_ms\tp99_ms\trps\terrors\n' >"$tsv"
  local servers="auto wc"
  for w in $WINDOWS; do servers="$servers w$w"; done
  for server in $servers; do
    start_server "$server" "$a" "$b"
    for load in $LOADS; do
      local rate sc="$OUT_DIR/open-$load.toml" json="$OUT_DIR/open-a$a-b$b-$server-$load.json"
      rate="$(calc "$capacity * $load")"
      scenario "$sc" "process = \"poisson\""$'\n'"rate_rps = $rate"
      local common=(--url "$url" --scenario "$sc" --connections 512 --timeout-ms 30000 --quiet)
      "$bin" loadgen "${common[@]}" --seed 1 --duration "$WARMUP_S" >/dev/null
      "$bin" loadgen "${common[@]}" --seed 7 --duration "$DURATION_S" --json "$json" >/dev/null
      jq -r --arg a "$a" --arg b "$b" --arg l "$load" --arg s "$server" --argjson r "$rate" \
        '[$a, $b, $l, ($r * 10 | round / 10), $s,
          (.runs[0].latency_ms.p50 * 100 | round / 100),
          (.runs[0].latency_ms.p99 * 100 | round / 100),
          (.runs[0].throughput_rps * 10 | round / 10),
          (.live.errors_by_status | add // 0)] | @tsv' "$json" | tee -a "$tsv"
    done
    stop_server
  done
  echo "== open loop a=$a b=$b: p50 / p99 ms, and auto's ratio to the best non-auto"
  awk -F'\t' 'NR > 1 { l = $3; if (!(l in seen)) { seen[l] = 1; loads[++nl] = l }
      p50[l, $5] = $6; p99[l, $5] = $7; if (!($5 in sv)) { sv[$5] = 1; servers[++ns] = $5 }
      if ($5 != "auto") { if (!((l) in b50) || $6 < b50[l]) b50[l] = $6
                          if (!((l) in b99) || $7 < b99[l]) b99[l] = $7 } }
    END { printf "%-6s", "load"; for (j = 1; j <= ns; j++) printf "%16s", servers[j];
      printf "%16s\n", "auto/best";
      for (i = 1; i <= nl; i++) { l = loads[i]; printf "%-6s", l;
        for (j = 1; j <= ns; j++) printf "%16s", p50[l, servers[j]] "/" p99[l, servers[j]];
        printf "%16s\n", sprintf("%.2f/%.2f", p50[l, "auto"] / b50[l], p99[l, "auto"] / b99[l]) } }' "$tsv"
}

case "$WHAT" in
  closed) closed_loop ;;
  open) open_loop ;;
  all) closed_loop; open_loop ;;
  *) echo "usage: $0 [closed|open|all]" >&2; exit 2 ;;
esac
echo "# done $(date -u +%FT%TZ), load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
