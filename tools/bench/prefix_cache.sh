#!/usr/bin/env bash
# Prefix caching in the simulator on the Mooncake FAST'25 synthetic trace (../shared/data):
#   1. the trace's ideal reuse (one replica, unbounded cache, 16-token blocks, at most
#      (prompt - 1) / 16 blocks hit), counted here in Python from the raw hash_ids;
#   2. the simulator with an unbounded KV cache (tools/bench/prefix_unbounded.toml): its hit
#      rate must equal (1);
#   3. hit rate against the replica's KV capacity (the same run with 1, 4, 16 M tokens);
#   4. Llama-3.1-8B on one H100 (roofline, 427 k KV tokens) at ~80 % busy
#      (--rate-scale 0.2): prefix caching off against on, same requests;
#   5. the simulator's own speed: the whole trace (3,993 requests, 61 M prompt tokens) with
#      caching on, wall time.
# Usage: tools/bench/prefix_cache.sh [TRACE]   (needs a release build: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/../.."
TRACE=${1:-../shared/data/mooncake-fast25/synthetic_trace.jsonl}
ABE=target/release/abe
[ -x "$ABE" ] || cargo build --release --bin abe

echo "== 1. ideal reuse (unbounded cache, one replica)"
python3 - "$TRACE" <<'PY'
import json, sys
seen = set(); q = h = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    n, ids = r["input_length"], r["hash_ids"]
    q += n
    named = min(len(ids) * 512, n) // 16          # full 16-token blocks with a name
    can = min(named, max(n - 1, 0) // 16)         # at least one token is computed
    key = lambda i: (tuple(ids[: (16 * i + 15) // 512 + 1]), i)
    k = 0
    while k < can and key(k) in seen:
        k += 1
    h += 16 * k
    for i in range(named):
        seen.add(key(i))
print(f"query_tokens {q}  hit_tokens {h}  hit rate {100 * h / q:.2f} %")
PY

echo "== 2. simulator, unbounded KV cache"
sed "s|^path = .*|path = \"$(realpath "$TRACE")\"|" tools/bench/prefix_unbounded.toml > /tmp/abe-prefix-unbounded.toml
"$ABE" simulate --scenario /tmp/abe-prefix-unbounded.toml | tail -2

echo "== 3. hit rate against KV capacity per replica (arrivals slowed 1,000x)"
for kv in 1000000 4000000 16000000; do
  sed "s/^kv_capacity_tokens = .*/kv_capacity_tokens = $kv/" /tmp/abe-prefix-unbounded.toml > /tmp/abe-prefix-kv.toml
  printf 'kv %9d tokens: ' "$kv"
  "$ABE" simulate --scenario /tmp/abe-prefix-kv.toml | tail -1 | awk '{print "hit " $NF " %"}'
done

echo "== 4. Llama-3.1-8B / H100, one replica, ~80 % busy: caching off against on"
"$ABE" simulate --trace "$TRACE" --mode continuous --rate-scale 0.2 --sweep prefix_caching=0,1 \
  --json /tmp/abe-prefix-onoff.json | tail -7
python3 - <<'PY'
import json
d = json.load(open("/tmp/abe-prefix-onoff.json"))
for r in d["runs"]:
    c = r["continuous"]
    print(f'{r["label"]:32s} ttft mean {c["ttft_ms"]["mean"]:9.1f} ms  p99 {c["ttft_ms"]["p99"]:9.1f} ms  '
          f'prefill tokens {c["prefill_tokens"]:>10}  kv {100 * c["kv_utilisation_mean"]:5.1f} %  '
          f'hit {100 * (c.get("prefix_cache") or {}).get("hit_rate", 0):5.1f} %')
PY

echo "== 4b. the same load with a 16 M-token KV cache (the trace's working set fits: what a"
echo "       CPU/SSD KV tier would give), caching off against on"
sed "s/^kv_capacity_tokens = .*/kv_capacity_tokens = 16000000/; s/^rate_scale = .*/rate_scale = 0.2/" \
  /tmp/abe-prefix-unbounded.toml > /tmp/abe-prefix-16m.toml
"$ABE" simulate --scenario /tmp/abe-prefix-16m.toml --sweep prefix_caching=0,1 \
  --json /tmp/abe-prefix-16m.json | tail -3
python3 - <<'PY'
import json
d = json.load(open("/tmp/abe-prefix-16m.json"))
for r in d["runs"]:
    c = r["continuous"]
    print(f'{r["label"]:32s} ttft mean {c["ttft_ms"]["mean"]:9.1f} ms  p99 {c["ttft_ms"]["p99"]:9.1f} ms  '
          f'prefill tokens {c["prefill_tokens"]:>10}  hit {100 * (c.get("prefix_cache") or {}).get("hit_rate", 0):5.1f} %')
PY

echo "== 5. simulator speed: the whole trace, caching on"
/usr/bin/time -f "wall %e s, max RSS %M KB" "$ABE" simulate --trace "$TRACE" --mode continuous >/dev/null
