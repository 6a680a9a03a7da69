#!/usr/bin/env bash
# What an idle `abe serve` has allocated, by allocation site: valgrind's massif over SECS
# seconds of a server started with CONFIG (or on embedded defaults when CONFIG is `-`),
# no request sent, then each site of the largest detailed snapshot with its bytes and the
# first abe function under it (the struct or table that asked). Bytes allocated, not
# resident: pages never written cost no memory (tools/bench/idle_cpu.sh prints resident).
# Usage: tools/bench/idle_heap.sh [CONFIG|-] [SECS] [BINARY]   (defaults -, 12 s,
#        target/release/abe, built when not given). ABE_SERVER_HOST=127.0.0.1 is set, so a
#        config that listens on every address (deploy/config/router.toml) stays on loopback.
# Needs valgrind (ms_print) and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
config="${1:--}"
secs="${2:-12}"
bin="${3:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin abe >/dev/null
  bin=target/release/abe
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
args=(serve --port "${PORT:-18521}")
[ "$config" != - ] && args+=(--config "$config")
ABE_SERVER_HOST=127.0.0.1 RUST_LOG=warn timeout -s INT "$secs" \
  valgrind --tool=massif --massif-out-file="$out/massif.out" "$bin" "${args[@]}" \
  >/dev/null 2>"$out/valgrind.log" || true
[ -s "$out/massif.out" ] || { echo "no massif output: $(tail -3 "$out/valgrind.log")" >&2; exit 1; }
ms_print "$out/massif.out" >"$out/ms.txt"
python3 - "$out/ms.txt" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
# The detailed snapshot holding the most (the server at rest, before SIGINT's drain frees).
def held(l):
    m = re.search(r'\(([\d,]+)B\) \(heap allocation functions\)', l)
    return int(m.group(1).replace(',', '')) if m else -1
start = max((i for i, l in enumerate(lines) if 'heap allocation functions' in l), key=lambda i: held(lines[i]))
total = 0
for i in range(start + 1, len(lines)):
    l = lines[i]
    if l.startswith('---'):
        break
    m = re.match(r'^->\S+% \(([\d,]+)B\)', l)
    if not m:
        continue
    size = int(m.group(1).replace(',', ''))
    total += size
    site = 'below massif\'s threshold' if 'below massif' in l else ''
    for j in range(i + 1, len(lines)):
        if lines[j].startswith('->') or lines[j].startswith('---'):
            break
        f = re.search(r'0x[0-9A-F]+: (.*)$', lines[j])
        if f and 'abe::' in f.group(1) and 'alloc::' not in f.group(1).split('abe::')[0][-12:]:
            site = f.group(1)[:150]
            break
    print(f'{size / 1e6:9.1f} MB  {site}')
print(f'{total / 1e6:9.1f} MB  in all')
PY
