#!/usr/bin/env bash
# A/B of the criterion benches between two builds, alternating, on one machine in one go.
#
#   tools/bench/ab_benches.sh BASE_DIR NEW_DIR [ROUNDS]
#
# BASE_DIR and NEW_DIR each hold the bench executables `core`, `runtime`, `router`,
# `continuous` (from `cargo bench --no-run`: target/release/deps/<name>-<hash>, copied and
# renamed). Each round runs every bench of BASE then of NEW (3 s measurement, 1 s warm-up);
# the output is each bench's per-round criterion medians for both builds and the median of
# the per-round ratios NEW / BASE (below 1: NEW is faster). This VM's speed drifts within
# minutes, which is why the builds alternate and ratios are taken per round.
set -euo pipefail
base=${1:?base bench dir}
new=${2:?new bench dir}
rounds=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# Prints "<bench id> <median ns>" for each benchmark of one executable.
run() {
  "$1" --bench --noplot --measurement-time 3 --warm-up-time 1 2>/dev/null |
    awk '
      /^[a-z_]+\/[a-z_0-9]+/ { id = $1 }
      /time:/ {
        sub(/.*\[/, ""); v = $3; u = $4
        f = (u == "ps") ? 0.001 : (u == "ns") ? 1 : (u == "µs" || u == "us") ? 1000 : (u == "ms") ? 1e6 : 1e9
        printf "%s %.2f\n", id, v * f
      }'
}

for r in $(seq 1 "$rounds"); do
  for side in base new; do
    dir=$base; [ "$side" = new ] && dir=$new
    for b in core runtime router continuous; do
      run "$dir/$b" | sed "s/^/$r $side /" >>results
    done
  done
done

python3 - "$work/results" <<'EOF'
import statistics, sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, side, bench, ns = line.split()
    rows[bench].setdefault(side, {})[int(r)] = float(ns)
print(f"{'bench':<32} {'base ns (rounds)':<28} {'new ns (rounds)':<28} median new/base")
for bench, sides in sorted(rows.items()):
    base, new = sides.get("base", {}), sides.get("new", {})
    ratios = [new[r] / base[r] for r in base if r in new]
    fmt = lambda d: " / ".join(f"{d[r]:.1f}" for r in sorted(d))
    ratio = f"{statistics.median(ratios):.3f}" if ratios else "-"  # a bench one build lacks
    print(f"{bench:<32} {fmt(base):<28} {fmt(new):<28} {ratio}")
EOF
