#!/usr/bin/env bash
# Sends a little traffic to a running abe, then checks its /metrics with
# `promtool check metrics` (Prometheus' own linter).
# abe's own abe_* families must be clean. vLLM's vllm:* families (exported so tools built
# for vLLM read abe) contain ':', which promtool reports as reserved for recording rules:
# that one complaint, for vllm: names only, is accepted; anything else fails.
# Usage: [ABE_BATCHING_MODE=continuous] tools/promtool_check.sh http://127.0.0.1:PORT
set -euo pipefail
url="$1"
for i in 1 2 3; do
  curl -sf "$url/v1/completions" -d "{\"prompt\":\"metrics $i\",\"max_tokens\":2}" >/dev/null
  curl -sf "$url/v1/embeddings" -d "{\"input\":\"metrics $i\"}" >/dev/null
done
curl -s "$url/v1/nope" >/dev/null || true
sleep 0.2
metrics="$(curl -sf "$url/metrics")"
# abe's families alone: no complaint at all.
grep -v '^vllm:' <<<"$metrics" | grep -v '^# [A-Z]* vllm:' | promtool check metrics
# The whole page: parses, and the only complaints are the colons of vllm: names.
set +e
complaints="$(promtool check metrics <<<"$metrics" 2>&1)"
set -e
others="$(grep -v "^vllm:[a-z0-9_:]* metric names should not contain ':'$" <<<"$complaints" | grep -v '^$' || true)"
if [ -n "$others" ]; then
  echo "promtool check metrics (whole page): $others" >&2
  exit 1
fi
mode="${ABE_BATCHING_MODE:-request}"
# `auto`'s fitted state is request-level batching's.
required="abe_queue_depth abe_requests_total abe_strategy"
[ "$mode" = continuous ] || required="$required abe_batches_total abe_auto_cost_samples"
for name in $required \
  vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc \
  vllm:e2e_request_latency_seconds_bucket vllm:time_to_first_token_seconds_bucket \
  vllm:prompt_tokens_total vllm:generation_tokens_total vllm:request_success_total \
  vllm:prefix_cache_queries_total vllm:prefix_cache_hits_total; do
  grep -q "^$name" <<<"$metrics" || { echo "missing metric $name" >&2; exit 1; }
done
# Continuous batching with prefix caching (the default there): abe's own prefix-cache
# families are on the page (and were linted above).
if [ "$mode" = continuous ] && [ "${ABE_CONTINUOUS_PREFIX_CACHING:-true}" != false ]; then
  for name in abe_prefix_cache_query_tokens_total abe_prefix_cache_hit_tokens_total \
    abe_prefix_cache_evicted_blocks_total; do
    grep -q "^$name" <<<"$metrics" || { echo "missing metric $name" >&2; exit 1; }
  done
fi
echo "promtool check metrics: ok ($(grep -vc '^#' <<<"$metrics") samples; vllm: names accepted with their colons)"
