#!/usr/bin/env bash
# The dashboard in a real browser: puts a running abe under load (`abe loadgen`, open loop,
# 20 s at most) and runs tools/dashboard_check.py (headless Chromium: charts got data, live
# events arrive, the strategy switch works; a screenshot is saved).
# (Not ABE_*: abe reads every ABE_* variable as a config key.)
# Usage: [DASHBOARD_MODE=continuous] [DASHBOARD_SCREENSHOT=path.png] \
#        tools/dashboard_check.sh http://127.0.0.1:PORT
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${ABE_BIN:-$root/target/debug/abe}"
url="$1"
shot="${DASHBOARD_SCREENSHOT:-$(mktemp -d)/dashboard.png}"
"$bin" loadgen --url "$url" --duration 20 --connections 8 >/dev/null 2>&1 &
load=$!
trap 'kill $load 2>/dev/null || true' EXIT
cd "$(dirname "$shot")"
python3 "$root/tools/dashboard_check.py" --mode "${DASHBOARD_MODE:-request}" --screenshot "$shot" "$url"
kill $load 2>/dev/null || true
wait $load 2>/dev/null || true
trap - EXIT
