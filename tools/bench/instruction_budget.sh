#!/usr/bin/env bash
# User-space instructions per request of `abe serve` on the request path, counted with
# valgrind's callgrind (deterministic: it counts instructions, not time), and checked
# against tools/bench/instruction_budget.toml.
#
# What is counted: the small completion POST of keepalive_posts.py (latency model `none`,
# idle policy `park`, no pinning) over 1 keep-alive connection and over 8 (8 requests in
# flight per round). Each case runs twice, with LOW and HIGH requests, and the figure is
# (Ir(HIGH) - Ir(LOW)) / (HIGH - LOW), so start-up and shutdown cancel. Only the threads
# that do per-request work are summed: io threads, the engine, the workers. The history
# sampler (once a second) and the events thread (at most 400 sampled events a second) cost
# per second, not per request; under valgrind a request takes ~5 ms, so counting them
# would charge their per-second cost to every request (the breakdown in BENCHMARKS.md
# states them apart).
#
# Usage: tools/bench/instruction_budget.sh [--check] [BINARY]
# Without BINARY it builds and counts `cargo build --release --bin abe` (target/release/abe):
# `cargo bench` leaves its own thin-LTO binary at that path, ~4 % fewer instructions.
#        tools/bench/instruction_budget.sh --nginx                 (the same count for nginx)
# With --check it exits 1 if a case is over its budget, printing the number and the budget
# (BUDGET_FILE=PATH reads the budgets from another file). With --threads it also prints the
# figure split by thread kind (io threads, the engine, the workers; the same difference of
# two runs over the requests between them).
# Needs valgrind and python3 (nginx for --nginx).
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)/tools/bench"
. tools/bench/callgrind_lib.sh # callgrind_thread_kind
check=0
nginx=0
threads=0
bin=""
for a in "$@"; do
  case "$a" in
    --check) check=1 ;;
    --nginx) nginx=1 ;;
    --threads) threads=1 ;;
    *) bin="$a" ;;
  esac
done
if [ -z "$bin" ] && [ "$nginx" = 0 ]; then
  cargo build --release --bin abe >/dev/null 2>&1 || { cargo build --release --bin abe; exit 2; }
  bin=target/release/abe
fi
budget_file="${BUDGET_FILE:-$here/instruction_budget.toml}"
low="${BUDGET_LOW:-400}"
high="${BUDGET_HIGH:-2000}"
out="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

# Request-path threads of one abe run: a thread's file names the loop it ran
# (`callgrind_thread_kind`, tools/bench/callgrind_lib.sh). Each kind of thread must be
# found, or the count fails.
# Prints the total and the io threads', the engine's and the workers' shares of it.
abe_request_path_ir() {
  local total=0 f ir io=0 engine=0 worker=0 io_ir=0 engine_ir=0 worker_ir=0
  for f in "$out"/cg.*; do
    ir=$(awk '/^summary:/ {print $2}' "$f")
    case "$(callgrind_thread_kind "$f")" in
      io)
        io=$((io + 1))
        io_ir=$((io_ir + ir))
        ;;
      engine)
        engine=$((engine + 1))
        engine_ir=$((engine_ir + ir))
        ;;
      worker)
        worker=$((worker + 1))
        worker_ir=$((worker_ir + ir))
        ;;
      *) continue ;;
    esac
    total=$((total + ir))
  done
  if [ "$io" -lt 1 ] || [ "$engine" -ne 1 ] || [ "$worker" -lt 1 ]; then
    echo "request-path threads not all found ($io io, $engine engine, $worker worker): the count would be wrong" >&2
    exit 1
  fi
  echo "$total $io_ir $engine_ir $worker_ir"
}

all_ir() {
  local total=0 f
  for f in "$out"/cg.*; do total=$((total + $(awk '/^summary:/ {print $2}' "$f"))); done
  echo "$total"
}

# Whether nothing listens on 127.0.0.1:PORT: nginx's port is fixed by its config, and a
# server already there would answer the probes and be counted instead. abe takes a free
# port (`--port 0`) and prints it, so two runs of this script never meet.
port_free() {
  python3 -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

measure() { # requests conns -> Ir
  local reqs=$1 conns=$2 port="" ir
  rm -f "$out"/cg.* "$out/serve.log"
  if [ "$nginx" = 1 ]; then
    port=18481
    port_free $port || {
      echo "port $port is in use (another nginx run of this script?): its count would be another server's" >&2
      exit 1
    }
    sed -e 's/^worker_processes 1;/worker_processes 1;\nmaster_process off;/' \
      "$here/nginx.conf" >"$out/nginx.conf"
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
      nginx -c "$out/nginx.conf" 2>"$out/vg.log" &
  else
    ABE_WORKERS_LATENCY_MODEL=none ABE_ENGINE_IDLE=park ABE_ENGINE_PIN=false RUST_LOG=warn \
      valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
      "$bin" serve --port 0 >"$out/serve.log" 2>"$out/vg.log" &
  fi
  pid=$!
  local up=0
  for _ in $(seq 1 300); do
    kill -0 $pid 2>/dev/null || break
    [ -n "$port" ] || port=$(sed -n 's/^abe listening on http:\/\/.*:\([0-9]*\)$/\1/p' "$out/serve.log")
    if [ -n "$port" ] && python3 "$here/keepalive_posts.py" $port 0 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  [ "$up" = 1 ] || { echo "server under valgrind did not start: $(tail -3 "$out/vg.log")" >&2; exit 1; }
  python3 "$here/keepalive_posts.py" $port "$reqs" "$conns"
  if [ "$nginx" = 1 ]; then kill -QUIT $pid; else kill -TERM $pid; fi
  wait $pid || true
  pid=""
  if [ "$nginx" = 1 ]; then ir=$(all_ir); else ir=$(abe_request_path_ir); fi
  [ "${ir%% *}" -gt 0 ] || { echo "no callgrind output" >&2; exit 1; }
  echo "$ir"
}

budget_of() { # key -> budget from the toml
  awk -F= -v k="$1" '$1 ~ "^"k" *$" {gsub(/[ _]/, "", $2); print $2}' "$budget_file"
}

over=0
for conns in 1 8; do
  # Assigned first: a failing measure stops the script here (set -e), where a
  # `read <<<"$(measure ...)"` would read nothing and count 0.
  m_low=$(measure "$low" "$conns")
  m_high=$(measure "$high" "$conns")
  read -r a a_io a_engine a_worker <<<"$m_low"
  read -r b b_io b_engine b_worker <<<"$m_high"
  per=$(( (b - a) / (high - low) ))
  name=$([ "$nginx" = 1 ] && echo nginx || echo abe)
  if [ "$check" = 1 ]; then
    budget=$(budget_of "conns_$conns")
    if [ "$per" -gt "$budget" ]; then
      echo "instruction budget: $name, $conns connection(s): $per instructions per request, OVER the budget of $budget ($budget_file)"
      over=1
    else
      echo "instruction budget: $name, $conns connection(s): $per instructions per request (budget $budget)"
    fi
  else
    echo "$name, $conns connection(s): $per instructions per request (Ir $a with $low requests, $b with $high)"
  fi
  if [ "$threads" = 1 ] && [ "$nginx" = 0 ]; then
    echo "  by thread: io $(( (b_io - a_io) / (high - low) )), engine $(( (b_engine - a_engine) / (high - low) )), workers $(( (b_worker - a_worker) / (high - low) ))"
  fi
done
exit $over
