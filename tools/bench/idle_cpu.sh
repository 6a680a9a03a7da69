#!/usr/bin/env bash
# What an idle `abe serve` costs: starts it (with CONFIG, or on embedded defaults when CONFIG
# is `-`), waits WARM seconds, then prints its threads, resident memory and the CPU it used
# over SECS seconds with no request sent (utime + stime from /proc, % of one core), and the
# size of one /metrics scrape (bytes, samples, per-worker samples). For the idle cost of many
# worker threads (an `upstream` backend's, its spare slots'). Needs curl.
# Usage: tools/bench/idle_cpu.sh [CONFIG|-] [SECS] [BINARY]   (defaults -, 10 s,
#        target/release/abe, built when not given). Linux only (/proc).
set -euo pipefail
cd "$(dirname "$0")/../.."
config="${1:--}"
secs="${2:-10}"
bin="${3:-}"
warm="${WARM:-4}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
args=(serve --port "${PORT:-18520}")
[ "$config" != - ] && args+=(--config "$config")
RUST_LOG=warn "$bin" "${args[@]}" >/dev/null 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
sleep "$warm"
kill -0 "$pid" 2>/dev/null || { echo "abe exited at start (config $config)" >&2; exit 1; }
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
a=$(ticks)
sleep "$secs"
b=$(ticks)
threads=$(ls "/proc/$pid/task" | wc -l)
scrape=$(curl -s "http://127.0.0.1:${PORT:-18520}/metrics")
scrape_bytes=$(printf '%s' "$scrape" | wc -c)
samples=$(printf '%s\n' "$scrape" | grep -c '^[a-z]' || true)
worker_samples=$(printf '%s\n' "$scrape" | grep -c '^abe_worker_' || true)
rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
awk -v t="$threads" -v r="$rss" -v d=$((b - a)) -v hz="$hz" -v s="$secs" -v c="$config" -v bin="$bin" \
  -v mb="$scrape_bytes" -v ms="$samples" -v mw="$worker_samples" \
  'BEGIN { printf "%s, config %s: %d threads, %.1f MiB resident, idle CPU %.2f %% of a core over %d s; /metrics %d bytes, %d samples (%d per worker)\n", bin, c, t, r / 1024, 100 * d / hz / s, s, mb, ms, mw }'
