# Helpers shared by the wrk load scripts (http_vs_nginx.sh, stream_vs_nginx.sh,
# proxy_vs_nginx.sh, router_proxy.sh); sourced, not run. The one place a wrk run is measured
# (wrk_measure) and warmed up for (wrk_warm). Nothing here starts or stops a server.

# cpu_ticks PID: user + system CPU of PID so far, in clock ticks (/proc/PID/stat).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# us_per TICKS N: TICKS clock ticks of CPU spread over N requests, in microseconds each.
us_per() { awk -v t="$1" -v hz="$hz" -v n="$2" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}'; }

# to_us LATENCY: a latency as wrk prints it (us, ms, s) in microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1e6}}' <<<"$1"; }

# median: the median of the numbers on stdin, one a line.
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# wrk_warm CONNS LUA URL: one second of wrk (one thread, CONNS connections, the script LUA)
# against URL, its output dropped: the warm-up before measured runs.
wrk_warm() { wrk -t1 -c"$1" -d1s -s "$2" "$3" >/dev/null; }

# wrk_measure CONNS SECS LUA URL PID...: one measured wrk run (one thread, CONNS
# connections, SECS seconds, the script LUA, latency percentiles on) against URL, and the
# CPU each PID spends meanwhile. Prints one line of fields, in this order:
#   rps         requests per second, as wrk prints it
#   p50_us      latency median, in microseconds
#   p99_us      latency 99th percentile, in microseconds
#   non2xx      answers wrk counted as non-2xx or 3xx (0 when it reports none)
#   p50 p99     the two percentiles as wrk prints them (e.g. 1.23ms)
#   cpu...      for each PID in order: its CPU (user + system) per request, in microseconds
# Fails (status 1, nothing printed) when wrk fails or a PID is gone: call it as
# `m=$(wrk_measure ...)`, so that `set -e` sees the failure, then `read -r ... <<<"$m"`.
wrk_measure() {
  local conns=$1 secs=$2 lua=$3 url=$4
  shift 4
  local pid ticks before=() cpu=() out reqs rps p50 p99 non2xx i=0
  for pid in "$@"; do
    ticks=$(cpu_ticks "$pid") || return 1
    before+=("$ticks")
  done
  out=$(wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$lua" "$url") || return 1
  for pid in "$@"; do
    ticks=$(cpu_ticks "$pid") || return 1
    cpu+=("$((ticks - before[i]))")
    i=$((i + 1))
  done
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses/ {print $NF}' <<<"$out")
  printf '%s %s %s %s %s %s' "$rps" "$(to_us "$p50")" "$(to_us "$p99")" "${non2xx:-0}" "$p50" "$p99"
  for ticks in "${cpu[@]}"; do printf ' %s' "$(us_per "$ticks" "$reqs")"; done
  printf '\n'
}
