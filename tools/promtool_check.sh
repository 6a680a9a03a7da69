#!/usr/bin/env bash
# Sends a little traffic to a running abe, then checks its /metrics with
# `promtool check metrics` (Prometheus' own linter).
# Usage: tools/promtool_check.sh http://127.0.0.1:PORT
set -euo pipefail
url="$1"
for i in 1 2 3; do
  curl -sf "$url/v1/completions" -d "{\"prompt\":\"metrics $i\",\"max_tokens\":2}" >/dev/null
  curl -sf "$url/v1/embeddings" -d "{\"input\":\"metrics $i\"}" >/dev/null
done
curl -s "$url/v1/nope" >/dev/null || true
sleep 0.2
metrics="$(curl -sf "$url/metrics")"
echo "$metrics" | promtool check metrics
for name in abe_queue_depth abe_batches_total abe_requests_total abe_strategy abe_auto_cost_samples; do
  grep -q "^$name" <<<"$metrics" || { echo "missing metric $name" >&2; exit 1; }
done
echo "promtool check metrics: ok ($(grep -vc '^#' <<<"$metrics") samples)"
