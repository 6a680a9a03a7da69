#!/usr/bin/env bash
# Two builds of abe's `embed` executor side by side on loopback, alternated: the "old and
# new release binaries" tables in BENCHMARKS.md ("A real embedding model").
#
#   tools/bench/ab_embed_live.sh OLD_REV NEW_REV      (git revisions; NEW_REV may be HEAD)
#
# Each revision is checked out in a detached worktree under target/ab/ and built with
# `cargo build --release --features embed --bin abe` (one shared target directory,
# target/ab/target). Both servers run the config of tools/peers/infinity.sh's abe (strategy
# $ABE_STRATEGY, default auto; max batch 64; one embed backend, max_concurrent_batches 1) on
# all-MiniLM-L6-v2 (tools/fetch_minilm.sh). tools/peers/drive.py measures each in turn at
# each of CLIENTS (closed loop, WARMUP_S unmeasured then DURATION_S; MIXED=1 for mixed
# lengths), ROUNDS rounds. One JSON line per point with "build": "old" or "new".
# Not part of the test command.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
. "$root/tools/bench/embed_server.sh"
old_rev=${1:?old revision}
new_rev=${2:?new revision}
CLIENTS="${CLIENTS:-4 8 16}"
ROUNDS="${ROUNDS:-2}"
DURATION_S="${DURATION_S:-8}"
WARMUP_S="${WARMUP_S:-2}"
ABE_STRATEGY="${ABE_STRATEGY:-auto}"
MIXED_FLAG=""
[ "${MIXED:-0}" = 1 ] && MIXED_FLAG="--mixed"
model="$("$root/tools/fetch_minilm.sh")"

build() { # rev -> prints the binary's path
  local rev dir
  rev="$(git -C "$root" rev-parse --short "$1")"
  dir="$root/target/ab/$rev"
  [ -d "$dir" ] || git -C "$root" worktree add -q --detach "$dir" "$rev"
  (cd "$dir" && CARGO_TARGET_DIR="$root/target/ab/target" \
    cargo build -q --release --features embed --bin abe)
  cp "$root/target/ab/target/release/abe" "$root/target/ab/abe-$rev"
  echo "$root/target/ab/abe-$rev"
}
old_bin="$(build "$old_rev")"
new_bin="$(build "$new_rev")"

cfg="$(mktemp --suffix .toml)"
embed_config "$cfg" "$model" "$ABE_STRATEGY" 64
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -f "$cfg"
}
trap cleanup EXIT
servers=()
start() { # label bin port
  start_embed_server "$2" "$cfg" "$3"
  servers+=("$1@abe-embed=http://127.0.0.1:$3")
}
start old "$old_bin" "${OLD_PORT:-18481}"
start new "$new_bin" "${NEW_PORT:-18482}"

echo "# $(date -u +%FT%TZ) old $old_rev new $new_rev, $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
drive="$root/tools/peers/drive.py"
for round in $(seq 1 "$ROUNDS"); do
  for n in $CLIENTS; do
    for entry in "${servers[@]}"; do
      label="${entry%%@*}"
      server="${entry#*@}"
      python3 "$drive" closed --server "$server" --clients "$n" --duration "$WARMUP_S" \
        $MIXED_FLAG >/dev/null
      line="$(python3 "$drive" closed --server "$server" --clients "$n" \
        --duration "$DURATION_S" $MIXED_FLAG)"
      echo "{\"build\": \"$label\", \"round\": $round, \"clients\": $n, \"load1\": $(cut -d' ' -f1 /proc/loadavg), ${line#\{}"
    done
  done
done
