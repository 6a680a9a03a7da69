#!/usr/bin/env bash
# Cache-aware routing in the simulator (issue 24): the Mooncake FAST'25 synthetic trace on N
# Llama-3.1-8B / H100 replicas (roofline) behind each routing strategy, the same requests
# through all of them, with the reference hit rate (one LRU cache of the cluster's whole KV,
# in arrival order) and the unbounded one (the trace's ideal reuse).
#   1. 8 replicas at --rate-scale 1.2 (round_robin ~76 % busy), five strategies;
#   2. the replica count swept (2..32, load scaled with it: --rate-scale 0.15 x N).
# Usage: tools/bench/cluster_sim.sh [TRACE]   (release build; JSON in target/cluster_sim/)
set -euo pipefail
cd "$(dirname "$0")/../.."
TRACE=${1:-../shared/data/mooncake-fast25/synthetic_trace.jsonl}
ABE=target/release/abe
OUT=target/cluster_sim
mkdir -p "$OUT"
[ -x "$ABE" ] || cargo build --release --bin abe
table() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f'{"routing":14s} {"busy %":>7s} {"hit %":>6s} {"% of ref":>8s} {"ref %":>6s} {"TTFT mean":>10s} {"TTFT p99":>10s} {"req/s":>6s} {"imbalance":>9s}')
for r in d["runs"]:
    c, k = r["continuous"], r["cluster"]
    print(f'{k["routing"]:14s} {100 * r["worker_utilisation"]:7.1f} {100 * k["hit_rate"]:6.1f} '
          f'{100 * k["hit_rate_of_reference"]:8.1f} {100 * k["reference_hit_rate"]:6.1f} '
          f'{c["ttft_ms"]["mean"]:10.1f} {c["ttft_ms"]["p99"]:10.1f} {r["throughput_rps"]:6.2f} {k["imbalance"]:9.3f}')
PY
}
echo "== 1. 8 replicas, --rate-scale 1.2"
/usr/bin/time -f "wall %e s, max RSS %M KB" "$ABE" simulate --trace "$TRACE" --mode continuous \
  --workers 8 --rate-scale 1.2 \
  --sweep routing=round_robin,least_loaded,power_of_two,prefix_aware,session \
  --json "$OUT/m8.json" >/dev/null
table "$OUT/m8.json"
echo "== 2. replica count (load 0.15 x N)"
for n in 2 4 8 16 32; do
  rs=$(python3 -c "print(0.15 * $n)")
  echo "-- $n replicas, --rate-scale $rs"
  "$ABE" simulate --trace "$TRACE" --mode continuous --workers "$n" --rate-scale "$rs" \
    --sweep routing=round_robin,least_loaded,prefix_aware --json "$OUT/n$n.json" >/dev/null
  table "$OUT/n$n.json"
done
