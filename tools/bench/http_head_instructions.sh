#!/usr/bin/env bash
# Instructions a call of each request-head reader in benches/runtime.rs (the head scanner,
# httparse), counted with valgrind's callgrind on the bench binary: steadier than
# criterion's clock on a shared machine. Prints one line per head.
# Usage: tools/bench/http_head_instructions.sh     (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(cargo bench --bench runtime --no-run 2>&1 | sed -nE 's/.*Executable .*\((.*runtime-[0-9a-f]+)\).*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "no bench binary" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for head in small_post openai_sdk browser_get; do
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$head" "$bin" --bench \
        --profile-time 1 "http_head/$head/(scan|httparse)\$" > /dev/null 2>&1
    callgrind_annotate --inclusive=yes --tree=calling "$out/cg.$head" 2>/dev/null \
        | python3 -c '
import re, sys
head = sys.argv[1]
calls = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \(.*\)\s+>\s+\S*runtime::(head_scan_once|httparse_once) \(([\d,]+)x\)", line)
    if m:
        ir, fn, n = int(m[1].replace(",", "")), m[2], int(m[3].replace(",", ""))
        if n > calls.get(fn, (0, 0))[1]:
            calls[fn] = (ir, n)
s, h = (calls[k][0] / calls[k][1] for k in ("head_scan_once", "httparse_once"))
print(f"{head}: scan {s:.0f}, httparse {h:.0f} instructions a call ({s / h:.2f}x)")
' "$head"
done
