# Helpers shared by the wrk load scripts against nginx (http_vs_nginx.sh, stream_vs_nginx.sh,
# proxy_vs_nginx.sh); sourced, not run. Nothing here starts or stops a server.

# cpu_ticks PID: user + system CPU of PID so far, in clock ticks (/proc/PID/stat).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# us_per TICKS N: TICKS clock ticks of CPU spread over N requests, in microseconds each.
us_per() { awk -v t="$1" -v hz="$hz" -v n="$2" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}'; }

# to_us LATENCY: a latency as wrk prints it (us, ms, s) in microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1e6}}' <<<"$1"; }

# median: the median of the numbers on stdin, one a line.
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
