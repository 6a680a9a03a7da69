#!/usr/bin/env bash
# A real harness against abe, unmodified: NVIDIA's AIPerf (PyPI `aiperf`) runs a streaming
# completions profile against a running `abe serve`, and its TTFT, inter-token latency and
# end-to-end latency are compared with abe's own (the vllm:* histograms on /metrics, read
# before and after the measured run, so only its requests count). It also prints where
# AIPerf's TTFT differs from abe's: the part before AIPerf's request is written, and the part
# from then to the first response bytes (AIPerf's http_req_* trace); see BENCHMARKS.md.
#
# Usage: tools/with_server.sh tools/harness/aiperf_check.sh          (or pass a base URL)
#   e.g. ABE_BATCHING_MODE=continuous ABE_WORKERS_LATENCY_MODEL=calibrated \
#        tools/with_server.sh tools/harness/aiperf_check.sh
# Knobs (environment): AIPERF_REQUESTS (200), AIPERF_CONCURRENCY (4), AIPERF_ISL (1000),
# AIPERF_OSL (32), AIPERF_VENV (target/aiperf-venv; created with `pip install aiperf` when
# missing), AIPERF_TOLERANCE (0.05).
# AIPerf counts output tokens with its own tokenizer: tools/harness/make_tokenizer.py writes
# one (one token per word of abe's synthetic vocabulary, nothing downloaded) so it counts
# what abe generated. Not part of tools/test.sh: AIPerf and its dependencies are ~1 GB.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
url="$1"
venv="${AIPERF_VENV:-$root/target/aiperf-venv}"
if [ ! -x "$venv/bin/aiperf" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "aiperf==0.13.0"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$root/tools/harness/make_tokenizer.py" "$work/tokenizer" 2>/dev/null
run() {
  "$venv/bin/aiperf" profile --model abe-sim --url "$url" --endpoint-type completions \
    --streaming --tokenizer "$work/tokenizer" --ui-type none \
    --synthetic-input-tokens-mean "${AIPERF_ISL:-1000}" --output-tokens-mean "${AIPERF_OSL:-32}" \
    --extra-inputs ignore_eos:true \
    --concurrency "${AIPERF_CONCURRENCY:-4}" --request-count "$1" \
    --artifact-dir "$work/$2" >"$work/$2.log" 2>&1 || { tail -30 "$work/$2.log"; exit 1; }
}
# Warm-up run (connections, caches), not compared.
run 20 warmup
curl -sf "$url/metrics" >"$work/before.prom"
run "${AIPERF_REQUESTS:-200}" measured
curl -sf "$url/metrics" >"$work/after.prom"
python3 - "$work" "${AIPERF_TOLERANCE:-0.05}" <<'PY'
import glob, json, re, sys
work, tol = sys.argv[1], float(sys.argv[2])
def prom(path):
    out = {}
    for line in open(path):
        m = re.match(r'^(vllm:[a-z0-9_]+_(?:sum|count))\{model_name="[^"]*"\} (\S+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out
before, after = prom(f"{work}/before.prom"), prom(f"{work}/after.prom")
def abe_mean_ms(name):
    n = after[name + "_count"] - before[name + "_count"]
    return (after[name + "_sum"] - before[name + "_sum"]) / n * 1000, int(n)
report = json.load(open(glob.glob(f"{work}/measured/**/profile_export_aiperf.json", recursive=True)[0]))
rows = [
    ("TTFT", "time_to_first_token", "vllm:time_to_first_token_seconds"),
    ("ITL", "inter_token_latency", "vllm:inter_token_latency_seconds"),
    ("e2e", "request_latency", "vllm:e2e_request_latency_seconds"),
]
ok = True
print(f"{'metric':6} {'aiperf mean ms':>15} {'abe mean ms':>12} {'diff':>7}  (abe: {abe_mean_ms(rows[0][2])[1]} requests)")
for label, key, name in rows:
    theirs = report[key]["avg"]
    ours, _ = abe_mean_ms(name)
    diff = (theirs - ours) / ours
    ok &= abs(diff) <= tol
    print(f"{label:6} {theirs:15.3f} {ours:12.3f} {diff:+7.1%}")
# Where AIPerf's TTFT differs from abe's: AIPerf starts its clock before aiohttp builds and
# sends the request (start_perf_ns) and stops it when its event loop has parsed the first SSE
# message. Its HTTP trace splits that: sending (request written), waiting (request written to
# first response bytes read, the part a server can be responsible for).
def avg(key):
    return report[key]["avg"] if key in report else float("nan")
ttft_abe, _ = abe_mean_ms("vllm:time_to_first_token_seconds")
sending, waiting = avg("http_req_sending"), avg("http_req_waiting")
print(f"TTFT split: aiperf TTFT {avg('time_to_first_token'):.3f} ms = before first response byte "
      f"{avg('time_to_first_token') - waiting:.3f} (of which sending {sending:.3f}, "
      f"connecting {avg('http_req_connecting'):.3f}, blocked {avg('http_req_blocked'):.3f}) "
      f"+ waiting {waiting:.3f}; waiting vs abe's TTFT {ttft_abe:.3f}: "
      f"{(waiting - ttft_abe):+.3f} ms ({(waiting - ttft_abe) / ttft_abe:+.1%})")
print(f"aiperf: {report['request_throughput']['avg']:.1f} requests/s, "
      f"{report['output_token_throughput']['avg']:.0f} output tokens/s")
print("agree within", f"{tol:.0%}:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
PY
