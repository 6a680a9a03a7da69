#!/usr/bin/env bash
# Streams a chat completion from a running abe with `curl -N` (no buffering, as a person
# would watch it) and checks the Server-Sent Events: data lines, a finish reason, [DONE].
# Usage: tools/curl_stream_check.sh http://127.0.0.1:PORT
set -euo pipefail
url="$1"
out="$(curl -sN "$url/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":5,"stream":true}')"
events=$(grep -c '^data: ' <<<"$out")
[ "$(tail -n 1 <<<"$out")" = "data: [DONE]" ] || { echo "no [DONE] at the end" >&2; echo "$out" >&2; exit 1; }
grep -q '"finish_reason":"length"' <<<"$out" || { echo "no finish_reason" >&2; exit 1; }
# role delta, 5 content deltas, the finish chunk, [DONE]
[ "$events" -eq 8 ] || { echo "expected 8 events, got $events" >&2; echo "$out" >&2; exit 1; }
echo "curl -N stream check: ok ($events events)"
