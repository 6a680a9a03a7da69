#!/usr/bin/env bash
# Streaming load test: abe serve answering `stream: true` completions (latency model `none`,
# so only abe's own work is timed) against nginx sending the same SSE body, chunked, under
# wrk at -c64 (64 streams at once; each connection sends its next request when its stream
# ends). The figure is SSE events ("chunks") per second: requests per second times the
# events of one answer, which are the same for both servers: nginx's body is a copy of
# abe's answer to the same request (max_tokens MAX_TOKENS: one event per token, the final
# event, `data: [DONE]`), returned by `return 200` with SSI on, which drops the
# Content-Length so nginx sends it with `Transfer-Encoding: chunked` as abe does. nginx
# writes the body at once; abe writes events as the engine produces them, so this is a
# lower bound on what streaming costs abe, as http_vs_nginx.sh is for a plain answer.
#
# The servers run side by side and are measured in alternation (nginx, abe, nginx, ...)
# for ROUNDS rounds; each round's ratio compares neighbouring runs. Prints every run
# (req/s, events/s, p50/p99 of a whole stream, server CPU per stream from utime+stime in
# /proc) and the medians and median ratio.
# Needs: wrk, nginx, curl (Debian packages).
# Usage: tools/bench/stream_vs_nginx.sh [seconds per run] [rounds] [connections]
#        (BENCH_BIN=PATH uses that binary instead of building target/release/abe;
#         MAX_TOKENS=N sets the tokens per stream, default 16)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-10}"
rounds="${2:-3}"
conns="${3:-64}"
max_tokens="${MAX_TOKENS:-16}"
bin="${BENCH_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
work="$(mktemp -d)"
results="$work/results"
abe_port=18484
ngx_port=18485
body="{\"prompt\":\"hi\",\"max_tokens\":$max_tokens,\"stream\":true}"

. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm, median

cat >"$work/post_stream.lua" <<LUA
wrk.method = "POST"
wrk.body   = '$body'
wrk.headers["Content-Type"] = "application/json"
LUA

ABE_WORKERS_LATENCY_MODEL=none RUST_LOG=warn "$bin" serve --port $abe_port >/dev/null &
abe=$!
ngx=""
trap 'kill $abe $ngx 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$abe_port/health" >/dev/null && break; sleep 0.1; done

# nginx's body: abe's own answer to the same request.
curl -sf -X POST "http://127.0.0.1:$abe_port/v1/completions" \
  -H 'Content-Type: application/json' -d "$body" >"$work/body.sse"
events=$(grep -c '^data: ' "$work/body.sse")
if grep -q "['\\\\]" "$work/body.sse"; then
  echo "the SSE body holds a quote or a backslash; nginx's return string would change it" >&2
  exit 1
fi
cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ngx_port;
        location / {
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            # SSI drops the Content-Length of the fixed body: chunked, as abe's stream.
            ssi on;
            ssi_types text/event-stream;
            # (\$(cat) drops the body's last blank line; nginx reads \\n in a string.)
            return 200 '$(cat "$work/body.sse")\\n\\n';
        }
    }
}
NGINX
nginx -c "$work/nginx.conf" &
ngx=$!
sleep 1
ngx_worker=$(pgrep -P "$ngx" | head -1)
if ! curl -sfi -X POST "http://127.0.0.1:$ngx_port/v1/completions" -d "$body" |
  grep -qi '^transfer-encoding: chunked'; then
  echo "nginx did not answer chunked" >&2
  exit 1
fi
if ! cmp -s <(curl -sf -X POST "http://127.0.0.1:$ngx_port/v1/completions" -d "$body") "$work/body.sse"; then
  echo "nginx's body differs from abe's answer" >&2
  exit 1
fi

run() { # name pid url round
  local name=$1 pid=$2 url=$3 round=$4
  local m rps p50 p99 non2xx cpu_us eps
  m=$(wrk_measure "$conns" "$secs" "$work/post_stream.lua" "$url" "$pid")
  read -r rps p50 p99 non2xx _ _ cpu_us <<<"$m"
  eps=$(awk -v r="$rps" -v e="$events" 'BEGIN {printf "%.0f", r * e}')
  if [ "$non2xx" != 0 ]; then echo "$name: non-2xx answers" >&2; exit 1; fi
  printf "round %s  %-6s c=%-3s %9.0f streams/s %10.0f events/s  p50 %6.0f us  p99 %6.0f us  server CPU %6s us/stream\n" \
    "$round" "$name" "$conns" "$rps" "$eps" "$p50" "$p99" "$cpu_us"
  echo "$name $round $rps $eps $p50 $p99 $cpu_us" >>"$results"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%F %H:%M') UTC; abe $(git rev-parse --short HEAD); $events SSE events per stream (max_tokens $max_tokens)"
wrk_warm "$conns" "$work/post_stream.lua" "http://127.0.0.1:$ngx_port/v1/completions"
wrk_warm "$conns" "$work/post_stream.lua" "http://127.0.0.1:$abe_port/v1/completions"
for r in $(seq 1 "$rounds"); do
  run nginx "$ngx_worker" "http://127.0.0.1:$ngx_port/v1/completions" "$r"
  run abe "$abe" "http://127.0.0.1:$abe_port/v1/completions" "$r"
done
col() { awk -v n="$1" -v k="$2" '$1 == n {print $k}' "$results"; }
echo "medians over $rounds rounds:"
for name in nginx abe; do
  printf "  %-6s c=%-3s %9.0f streams/s %10.0f events/s  p50 %6.0f us  p99 %6.0f us  server CPU %6.2f us/stream\n" \
    "$name" "$conns" "$(col $name 3 | median)" "$(col $name 4 | median)" \
    "$(col $name 5 | median)" "$(col $name 6 | median)" "$(col $name 7 | median)"
done
ratios=$(paste <(col nginx 4) <(col abe 4) | awk '{printf "%.3f\n", $2 / $1}')
printf "  abe/nginx events/s at c=%s: median %.3f (per round: %s)\n" \
  "$conns" "$(median <<<"$ratios")" "$(paste -sd' ' <<<"$ratios")"
