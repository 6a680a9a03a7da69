#!/usr/bin/env bash
# Coverage-guided fuzzing of abe's parsers with cargo fuzz (libFuzzer): builds the targets
# of fuzz/ (a nightly-only crate outside the workspace) and runs each for SECONDS (default
# 60), then prints executions, exec/s, coverage (libFuzzer's cov: edges, ft: features) and
# crashes per target. Not part of tools/test.sh: it needs the nightly toolchain; the stable
# mutation fuzzer (tests/fuzz_*.rs) is the bounded run of the test command.
#
#   tools/fuzz_coverage.sh [SECONDS] [TARGET...]
#
# Seeds are read from fuzz/corpus/<dir> and never written to (the stable fuzzer reads every
# file there); each run grows a fresh corpus in target/fuzz-coverage/corpus/<target>
# (FUZZ_KEEP=1 keeps the previous one). A crash is written to
# target/fuzz-coverage/artifacts/<target>/ and replays with
# `fuzz/target/x86_64-unknown-linux-gnu/release/<target> FILE`.
# FUZZ_SANITIZER (default address) is passed to `cargo fuzz build -s`; debug assertions on.
# Exit status: 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
# target:seed dirs under fuzz/corpus (comma-separated):max input bytes
all=(
  "http_head:http:4096"
  "api_body:api:4096"
  "config_toml:config,router:4096"
  "sse_reader:upstream_sse:8192"
  "upstream_answer:upstream_json:8192"
)

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz_coverage: needs a nightly toolchain (rustup toolchain install nightly)" >&2
  exit 2
fi
if ! command -v cargo-fuzz >/dev/null; then
  echo "== installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked
fi

sanitizer=${FUZZ_SANITIZER:-address}
echo "== cargo +nightly fuzz build -a -s $sanitizer"
(cd fuzz && cargo +nightly fuzz build -a -s "$sanitizer")
bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release
out=target/fuzz-coverage
mkdir -p "$out"

summary=()
crashed=0
for spec in "${all[@]}"; do
  IFS=: read -r name dirs max_len <<<"$spec"
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then
    continue
  fi
  work=$out/corpus/$name
  artifacts=$out/artifacts/$name
  [ "${FUZZ_KEEP:-0}" = 1 ] || rm -rf "$work"
  rm -rf "$artifacts"
  mkdir -p "$work" "$artifacts"
  seeds=()
  for d in ${dirs//,/ }; do seeds+=("fuzz/corpus/$d"); done
  log=$out/$name.log
  echo "== $name: ${secs} s, seeds ${seeds[*]}"
  status=0
  # The first corpus dir is the one libFuzzer writes to; the seed dirs are only read.
  "$bin_dir/$name" "$work" "${seeds[@]}" \
    -max_total_time="$secs" -max_len="$max_len" -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  crashes=$(find "$artifacts" -type f | wc -l)
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    crashed=1
    echo "   CRASH (exit $status): $(ls "$artifacts" | head -3) ; log $log"
    grep -m3 -E 'panicked|ERROR' "$log" || true
  fi
  line="| \`$name\` | ${runs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | ${rss:-?} | $crashes |"
  echo "$line"
  summary+=("$line")
done

echo
echo "== summary: ${secs} s per target, $(nproc) vCPU, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| target | executions | exec/s | cov (edges) | ft (features) | corpus (inputs/bytes) | peak RSS MB | crashes |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${summary[@]}"
exit "$crashed"
