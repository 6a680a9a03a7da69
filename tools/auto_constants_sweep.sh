#!/usr/bin/env bash
# Sweeps one of `auto`'s constants over the property harnesses (BENCHMARKS.md, issue 25's
# thirteenth round): for each VALUE, a worktree of HEAD gets `const NAME: T = VALUE;` in
# FILE, and prints one line: drawn open loops meeting the property (of 200, 4,000 requests
# a case; seeds 0-99 / 100-199) and closed loops at 95 % of the best possible (of 100,
# with their mean and lowest ratio). The tree you work in is not touched.
# Usage: tools/auto_constants_sweep.sh FILE NAME VALUE...
#   e.g. tools/auto_constants_sweep.sh src/core/strategy/auto/bursts.rs BURST_GAP_FRACTION \
#        "1.0 / 16.0" "1.0 / 8.0" "1.0 / 4.0"
# About 2 minutes a value on 2 cores (the first builds the worktree's test target). The
# worktree (target/constants-sweep, or SWEEP_WORKTREE) stays for the next run, with its
# build; `git worktree remove --force target/constants-sweep` drops it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 2; }
file=$1 name=$2
shift 2
wt="${SWEEP_WORKTREE:-target/constants-sweep}"
if [ ! -d "$wt" ]; then
    git worktree add -q --detach "$wt" HEAD
else
    git -C "$wt" checkout -q --detach "$(git rev-parse HEAD)"
fi
for value in "$@"; do
    git -C "$wt" checkout -q -- "$file"
    sed -i -E "s|^(pub )?const $name: ([A-Za-z0-9_]+) = .*;|\\1const $name: \\2 = $value;|" "$wt/$file"
    grep -qE "const $name: [A-Za-z0-9_]+ = $value;" "$wt/$file" \
        || { echo "$name not found in $file" >&2; exit 1; }
    open=$(cd "$wt" && tools/auto_props.sh 200 open)
    closed=$(cd "$wt" && AUTO_PROPS_SEEDS=100 cargo test --features testing --lib \
        core::tests::auto_props -- --nocapture 2>&1 | grep -E '^seed ' || true)
    [ -n "$open" ] && [ -n "$closed" ] \
        || { echo "$name = $value: the harnesses did not run (a compile error?)" >&2; exit 1; }
    python3 - "$name = $value" <(echo "$open") <(echo "$closed") <<'P'
import re, sys
label, open_f, closed_f = sys.argv[1:]
open_text = open(open_f).read()
missed = {int(s) for s in re.findall(r'replay: AUTO_PROPS_OPEN_SEED=(\d+)', open_text)}
cases = {int(s) for s in re.findall(r'^open seed (\d+):', open_text, re.M)}
met = lambda lo, hi: sum(1 for k in cases if lo <= k < hi and k not in missed)
ratios = [float(r) for r in re.findall(r'^seed \d+: ([\d.]+) of the best', open(closed_f).read(), re.M)]
print(f"{label}: open {met(0, 200)} of {len(cases)} ({met(0, 100)} / {met(100, 200)}); "
      f"closed {sum(r >= 0.95 for r in ratios)} of {len(ratios)} "
      f"(mean {sum(ratios) / len(ratios):.4f}, lowest {min(ratios):.3f})")
P
done
git -C "$wt" checkout -q -- "$file"
