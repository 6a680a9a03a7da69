#!/usr/bin/env bash
# The proxy path against a plain reverse proxy: one `abe serve` answers (latency model
# `none`), and in front of it either a second abe routing to it as an `upstream` backend
# (the upstream executor: keep-alive HTTP/1.1, UPSTREAM_WORKERS batches in flight) or nginx
# with `proxy_pass` to a keep-alive upstream block. wrk sends the same small POST as
# http_vs_nginx.sh (tools/bench/post.lua) at -c CONNS to each front in alternation (nginx,
# abe, nginx, ...) for ROUNDS rounds; each round's ratio compares neighbouring runs. Prints
# every run (req/s, p50/p99, CPU per request of the front and of the answering abe) and the
# medians and median ratio. All three processes and wrk share the machine's cores.
# Needs: wrk, nginx, curl (Debian packages).
# Usage: tools/bench/proxy_vs_nginx.sh [seconds per run] [rounds] [connections]
#        (BENCH_BIN=PATH uses that binary instead of building target/release/abe;
#         UPSTREAM_WORKERS=N sets the front abe's max_concurrent_batches, default 4;
#         FRONT_MAX_BATCH=N sets its batching.max_batch_size: by default the front batches
#         requests and forwards a batch as one upstream request with a prompt array, which
#         nginx cannot do; FRONT_MAX_BATCH=1 forwards every request alone, as nginx does;
#         FRONT_DEFAULTS=1 writes only the backend's name, kind, address and model, so every
#         other key is abe's default: 64 in flight, each request alone, no prompt arrays,
#         the engine's pinning and idle policy;
#         STREAM=N sends `stream: true` completions of N tokens instead of the small POST:
#         each request is an SSE stream of N + 2 events relayed through the front)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-10}"
rounds="${2:-3}"
conns="${3:-64}"
workers="${UPSTREAM_WORKERS:-4}"
front_max_batch="${FRONT_MAX_BATCH:-}"
bin="${BENCH_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
here="$(pwd)/tools/bench"
work="$(mktemp -d)"
results="$work/results"
back_port=18486
front_port=18487
ngx_port=18488

. tools/bench/wrk_lib.sh # wrk_measure, wrk_warm, median
. tools/bench/proxy_lib.sh # nginx_proxy_conf

# The request: post.lua's small POST, or with STREAM=N a stream of N tokens.
script="$here/post.lua"
if [ -n "${STREAM:-}" ]; then
  script="$work/post_stream.lua"
  cat >"$script" <<LUA
wrk.method = "POST"
wrk.body   = '{"prompt":"hi","max_tokens":$STREAM,"stream":true}'
wrk.headers["Content-Type"] = "application/json"
LUA
fi

{
  if [ -n "$front_max_batch" ]; then printf '[batching]\nmax_batch_size = %s\n' "$front_max_batch"; fi
  cat <<TOML
[[backends]]
name = "upstream-abe"
kind = "upstream"
base_url = "http://127.0.0.1:$back_port"
$(if [ -z "${FRONT_DEFAULTS:-}" ]; then printf 'prompt_array = true\nmax_concurrent_batches = %s' "$workers"; fi)
[[backends.models]]
name = "abe-sim"
context_length = 131072
TOML
} >"$work/front.toml"
nginx_proxy_conf "$work/nginx.conf" "$work" "$ngx_port" "$back_port"

ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_PIN=false RUST_LOG=warn \
  "$bin" serve --port $back_port >/dev/null &
back=$!
front=""
ngx=""
trap 'kill $back $front $ngx 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$back_port/health" >/dev/null && break; sleep 0.1; done
# On FRONT_DEFAULTS the front keeps every engine default too (pinning among them).
front_pin=false
if [ -n "${FRONT_DEFAULTS:-}" ]; then front_pin=""; fi
env ${front_pin:+ABE_ENGINE_PIN=$front_pin} RUST_LOG=warn "$bin" serve --port $front_port --config "$work/front.toml" >/dev/null &
front=$!
nginx -c "$work/nginx.conf" &
ngx=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$front_port/health" >/dev/null && break; sleep 0.1; done
sleep 0.5
ngx_worker=$(pgrep -P "$ngx" | head -1)
for port in $front_port $ngx_port; do
  curl -sf -X POST "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hi","max_tokens":1}' | grep -q '"text_completion"' ||
    { echo "the front on port $port did not answer a completion" >&2; exit 1; }
done

run() { # name front_pid url round
  local name=$1 pid=$2 url=$3 round=$4
  local m rps p50 p99 non2xx cpu_front cpu_back
  m=$(wrk_measure "$conns" "$secs" "$script" "$url" "$pid" "$back")
  read -r rps p50 p99 non2xx _ _ cpu_front cpu_back <<<"$m"
  if [ "$non2xx" != 0 ]; then echo "$name: $non2xx non-2xx answers" >&2; exit 1; fi
  printf "round %s  %-9s c=%-3s %9.0f req/s  p50 %6.0f us  p99 %6.0f us  CPU front %6s us/req, answering abe %6s us/req\n" \
    "$round" "$name" "$conns" "$rps" "$p50" "$p99" "$cpu_front" "$cpu_back"
  echo "$name $round $rps $p50 $p99 $cpu_front $cpu_back" >>"$results"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%F %H:%M') UTC; abe $(git rev-parse --short HEAD); front abe: $workers upstream batches in flight, max_batch_size ${front_max_batch:-default}${STREAM:+, streams of $STREAM tokens}"
wrk_warm "$conns" "$script" "http://127.0.0.1:$ngx_port/v1/completions"
wrk_warm "$conns" "$script" "http://127.0.0.1:$front_port/v1/completions"
for r in $(seq 1 "$rounds"); do
  run nginx "$ngx_worker" "http://127.0.0.1:$ngx_port/v1/completions" "$r"
  run abe-front "$front" "http://127.0.0.1:$front_port/v1/completions" "$r"
done
col() { awk -v n="$1" -v k="$2" '$1 == n {print $k}' "$results"; }
echo "medians over $rounds rounds:"
for name in nginx abe-front; do
  printf "  %-9s c=%-3s %9.0f req/s  p50 %6.0f us  p99 %6.0f us  CPU front %6.2f us/req, answering abe %6.2f us/req\n" \
    "$name" "$conns" "$(col $name 3 | median)" "$(col $name 4 | median)" \
    "$(col $name 5 | median)" "$(col $name 6 | median)" "$(col $name 7 | median)"
done
ratios=$(paste <(col nginx 3) <(col abe-front 3) | awk '{printf "%.3f\n", $2 / $1}')
printf "  abe/nginx proxy req/s at c=%s: median %.3f (per round: %s)\n" \
  "$conns" "$(median <<<"$ratios")" "$(paste -sd' ' <<<"$ratios")"
