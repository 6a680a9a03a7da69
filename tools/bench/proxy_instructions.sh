#!/usr/bin/env bash
# User-space instructions a forwarded request costs an abe front (an `upstream` backend on
# its defaults: every request forwarded alone, on the backend's event loop), by thread:
# the io threads, the engine, the event loop. Counted with callgrind (deterministic) on the
# front only; the answering abe runs natively (latency model `none`). The figure is the
# difference of two runs, (Ir(HIGH) - Ir(LOW)) / (HIGH - LOW), so start-up, the health
# checker's first probes and shutdown cancel; the spare event loops (one per spare slot)
# idle and are not counted. The requests are keepalive_posts.py's small POST over CONNS
# keep-alive connections.
#
# Usage: tools/bench/proxy_instructions.sh [--nginx] [CONNS] [BINARY]
#   (default 8 connections and `cargo build --release --bin abe`; BUDGET_LOW / BUDGET_HIGH
#    set the two runs' requests, default 800 / 4000; CG_OUT=DIR keeps the second run's
#    per-thread profiles there, for `callgrind_annotate`. With --nginx the front is nginx
#    `proxy_pass` to the same answering abe over keep-alive upstream connections, one
#    worker without a master process, all of its instructions counted)
# Needs valgrind, python3 and curl (and nginx for --nginx).
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)/tools/bench"
. tools/bench/callgrind_lib.sh # callgrind_thread_kind
. tools/bench/proxy_lib.sh # front_toml, nginx_proxy_conf
nginx=0
if [ "${1:-}" = --nginx ]; then
  nginx=1
  shift
fi
conns="${1:-8}"
bin="${2:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null 2>&1 || { cargo build --release --bin abe; exit 2; }
  bin=target/release/abe
fi
low="${BUDGET_LOW:-800}"
high="${BUDGET_HIGH:-4000}"
out="$(mktemp -d)"
back=""
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; [ -n "$back" ] && kill "$back" 2>/dev/null; rm -rf "$out"' EXIT

ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_PIN=false RUST_LOG=warn \
  "$bin" serve --port 0 >"$out/back.log" 2>&1 &
back=$!
back_port=""
for _ in $(seq 1 100); do
  back_port=$(sed -n 's/^abe listening on http:\/\/.*:\([0-9]*\)$/\1/p' "$out/back.log")
  [ -n "$back_port" ] && break
  sleep 0.1
done
[ -n "$back_port" ] || { echo "the answering abe did not start: $(tail -3 "$out/back.log")" >&2; exit 1; }
front_toml "$out/front.toml" "$back_port"
ngx_port=18496
nginx_proxy_conf "$out/nginx.conf" "$out" "$ngx_port" "$back_port" off

measure() { # requests -> "io engine loop" Ir (nginx: "all 0 0")
  local reqs=$1 port="" f ir io=0 engine=0 loop=0 nloop=0
  rm -f "$out"/cg.* "$out/front.log"
  if [ "$nginx" = 1 ]; then
    port=$ngx_port
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
      nginx -c "$out/nginx.conf" >"$out/front.log" 2>"$out/vg.log" &
  else
    ABE_ENGINE_PIN=false RUST_LOG=warn \
      valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
      "$bin" serve --port 0 --config "$out/front.toml" >"$out/front.log" 2>"$out/vg.log" &
  fi
  pid=$!
  local up=0
  for _ in $(seq 1 300); do
    kill -0 $pid 2>/dev/null || break
    [ -n "$port" ] || port=$(sed -n 's/^abe listening on http:\/\/.*:\([0-9]*\)$/\1/p' "$out/front.log")
    # Up once a completion is answered: the health checker has seen the backend.
    if [ -n "$port" ] && curl -sf -X POST "http://127.0.0.1:$port/v1/completions" \
      -H 'Content-Type: application/json' -d '{"prompt":"hi","max_tokens":1}' |
      grep -q text_completion; then
      up=1
      break
    fi
    sleep 0.2
  done
  [ "$up" = 1 ] || { echo "the front under valgrind did not answer: $(grep -v '^==' "$out/vg.log" | tail -3)" >&2; exit 1; }
  python3 "$here/keepalive_posts.py" "$port" "$reqs" "$conns"
  if [ "$nginx" = 1 ]; then kill -QUIT $pid; else kill -TERM $pid; fi
  wait $pid || true
  pid=""
  if [ "$nginx" = 1 ]; then
    for f in "$out"/cg.*; do io=$((io + $(awk '/^summary:/ {print $2}' "$f"))); done
    echo "$io 0 0"
    return
  fi
  for f in "$out"/cg.*-*; do
    ir=$(awk '/^summary:/ {print $2}' "$f")
    [ -n "$ir" ] || continue
    case "$(callgrind_thread_kind "$f")" in
      io) io=$((io + ir)) ;;
      engine) engine=$((engine + ir)) ;;
      loop)
        # The busy loop is the backend's; spare slots' loops only idle.
        if [ "$ir" -gt "$loop" ]; then loop=$ir; fi
        nloop=$((nloop + 1))
        ;;
    esac
  done
  if [ "$io" = 0 ] || [ "$engine" = 0 ] || [ "$nloop" = 0 ]; then
    echo "request-path threads not all found (io $io, engine $engine, $nloop loops)" >&2
    exit 1
  fi
  echo "$io $engine $loop"
}

m=$(measure "$low")
read -r io_l engine_l loop_l <<<"$m"
m=$(measure "$high")
read -r io_h engine_h loop_h <<<"$m"
if [ -n "${CG_OUT:-}" ]; then
  rm -rf "$CG_OUT"
  mkdir -p "$CG_OUT"
  cp "$out"/cg.* "$CG_OUT/"
fi
n=$((high - low))
io=$(((io_h - io_l) / n))
engine=$(((engine_h - engine_l) / n))
loop=$(((loop_h - loop_l) / n))
if [ "$nginx" = 1 ]; then
  echo "nginx proxy_pass front, $conns connections, $(nginx -v 2>&1 | sed 's/.*: //'):"
  echo "  instructions a forwarded request: $io"
  exit 0
fi
echo "proxy front, $conns connections, $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $bin:"
echo "  instructions a forwarded request: $((io + engine + loop)) (io $io, engine $engine, event loop $loop)"
