#!/usr/bin/env bash
# Re-measures every row of BENCHMARKS.md's "Current figures" table at one commit, on this
# machine, in one run: each row's own command (the table's last column), in turn, never two
# at once. Each command's whole output goes to OUT/NN-name.log; OUT/summary.txt collects the
# lines that hold each row's figures (the medians, ratios and totals the commands print), with
# the commit, the machine, the date and the load before and after each step.
#
# Groups (all by default; name some to run only those):
#   core   criterion: core/request_cycle, the continuous tick with caching on and off (and its
#          instructions by callgrind), the prefix lookup per block            (~6 min)
#   http   the instruction budget (abe and nginx), abe against nginx under wrk: plain
#          requests, streams, and the proxy path (batched and one request at a time) (~12 min)
#   sim    the continuous simulator against inference-lab at 20 and 300 requests/s, prefix
#          caching on the Mooncake trace, cache-aware routing over 8 replicas (~8 min)
#   live   auto against work-conserving in closed loops, simulated against live (roofline,
#          and a Mooncake slice), the live router tier of 4 servers                 (~25 min)
#   peers  Triton and BentoML (tools/peers/run.sh), Infinity (tools/peers/infinity.sh); they
#          install their peers into target/peers on first use (a long download)   (~30 min)
# The figures are only worth recording from a machine with nothing else running: the script
# prints the load average before each step so a reader can tell.
#
# Usage: tools/bench/current_figures.sh [core] [http] [sim] [live] [peers]
#        OUT=DIR to write elsewhere (default target/current_figures/<commit>).
# Not part of the test command.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -1)
OUT="${OUT:-$root/target/current_figures/$commit}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(core http sim live peers)
for g in "${groups[@]}"; do
  case "$g" in core | http | sim | live | peers) ;; *)
    echo "unknown group '$g' (core, http, sim, live, peers)" >&2
    exit 2
    ;;
  esac
done
wants() { local g; for g in "${groups[@]}"; do [ "$g" = "$1" ] && return 0; done; return 1; }

{
  echo "abe $commit${dirty:+ (work tree modified)}; $(date -u '+%F %H:%M') UTC"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "groups: ${groups[*]}"
} | tee "$summary"

n=0
# measure NAME PATTERN CMD...: runs CMD with its output in OUT/NN-NAME.log, then copies the
# lines matching PATTERN (an extended regex) into the summary.
measure() {
  local name=$1 pattern=$2
  shift 2
  n=$((n + 1))
  local log
  log="$OUT/$(printf '%02d' "$n")-$name.log"
  local start=$SECONDS load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "== $name (load before: $load): $*" | tee -a "$summary"
  if "$@" >"$log" 2>&1; then
    grep -E "$pattern" "$log" | sed 's/^/   /' | tee -a "$summary" || true
    echo "   ($((SECONDS - start)) s; $log)" | tee -a "$summary"
  else
    echo "   FAILED (exit $?; $((SECONDS - start)) s): see $log" | tee -a "$summary"
    tail -5 "$log" | sed 's/^/   | /' | tee -a "$summary"
  fi
}

cargo build --release --bin abe >/dev/null 2>&1 || cargo build --release --bin abe

if wants core; then
  measure request_cycle '^core/|time:' cargo bench --bench core -- 'core/request_cycle$'
  measure continuous_tick '^continuous/|time:' cargo bench --bench continuous -- tick_16_slots
  measure continuous_tick_instructions 'instructions|on / off' tools/bench/tick_instructions.sh
  measure prefix_lookup '^continuous/|time:' cargo bench --bench continuous -- prefix
fi

if wants http; then
  measure instruction_budget 'connection|per request|budget' tools/bench/instruction_budget.sh
  measure instruction_budget_nginx 'connection|per request' tools/bench/instruction_budget.sh --nginx
  measure http_vs_nginx 'medians|c=|abe/nginx' tools/bench/http_vs_nginx.sh 5 3
  measure stream_vs_nginx 'medians|  (abe|nginx) |abe/nginx' tools/bench/stream_vs_nginx.sh 10 3 64
  measure proxy_vs_nginx 'medians|  (abe|nginx)|abe/nginx' tools/bench/proxy_vs_nginx.sh 10 3 64
  measure proxy_vs_nginx_alone 'medians|  (abe|nginx)|abe/nginx' \
    env FRONT_MAX_BATCH=1 UPSTREAM_WORKERS=16 tools/bench/proxy_vs_nginx.sh 10 3 64
fi

if wants sim; then
  measure inference_lab_20 'throughput|TTFT|TPOT|wall|ratio' tools/peers/inference_lab.sh
  measure inference_lab_300 'throughput|TTFT|TPOT|wall|ratio' env RATE=300 REQUESTS=100000 tools/peers/inference_lab.sh
  measure prefix_cache 'hit|TTFT|ideal|wall|busy' tools/bench/prefix_cache.sh
  measure cluster_sim 'prefix_aware|round_robin|least|reference|unbounded' tools/bench/cluster_sim.sh
fi

if wants live; then
  measure closed_loop '%|best' env SERVERS="auto wc" tools/bench/closed_loop.sh closed
  measure sim_vs_live_roofline 'throughput|p50|TTFT|TPOT|PASS|FAIL|agree' \
    env MODE=continuous LATENCY_MODEL=roofline WORKERS=2 TOLERANCE=0.05 tools/sim_vs_live.sh
  measure sim_vs_live_mooncake 'hit|throughput|p50|TTFT|TPOT|PASS|FAIL|agree' \
    env TRACE=tests/fixtures/mooncake_fast25_synthetic_200.jsonl MODE=continuous \
    LATENCY_MODEL=roofline WORKERS=1 REQUESTS=200 RATE_SCALE=0.25 tools/sim_vs_live.sh
  measure cluster_live 'hit|prefix_aware|round_robin|least_loaded' \
    env GPU=h200 TRACE_REPEAT=2 ROUNDS=1 tools/cluster.sh
fi

if wants peers; then
  measure peers_triton_bento '%|p50|p99' tools/peers/run.sh
  measure peers_infinity '"server"|median|/s' tools/peers/infinity.sh
fi

echo "== done; load after: $(cut -d' ' -f1-3 /proc/loadavg); summary in $summary" | tee -a "$summary"
