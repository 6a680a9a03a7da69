#!/usr/bin/env bash
# The long runs of `auto`'s property harness (src/core/tests/auto_props.rs).
# Closed loops (default): seeds 0..N (default 1000), each held to 95 % of the exact best
# possible. Prints one line per seed, the worst ratio and every miss with the seed that
# replays it (AUTO_PROPS_SEED=S). The test run itself covers the first 40 seeds.
# Open loops (`open`): seeds 0..N of Poisson and bursty arrivals, each held to the best
# fixed window in hindsight (p50 and p99 within 3 %) and to work-conserving dispatch
# (within 1 %); replay one with AUTO_PROPS_OPEN_SEED=S. The summary counts the cases met by
# kind (Poisson or bursts, one worker or several) beside what one fixed window would meet. REQUESTS (default 4000) draws that
# many requests a case: a longer case leaves less to `auto`'s learning and rests its p99
# on more requests (16000: ~2.5 min for 200 seeds). Not in the test run (auto misses
# it today; see BENCHMARKS.md, issue 25): the test run holds auto's measured envelope over
# seeds 0..24 instead (`auto_stays_within_its_measured_open_loop_envelope`).
# `open-oracle`: the same cases drawn four times each; on each draw, the fixed schedule that
# does best on the other three (a clairvoyant of the arrival process, not of the draw) and
# `auto`, judged by the same bounds, and `auto` against that schedule: how far the
# open-loop bound can be met at all (~35 s for 200 seeds of 4,000; ~3.5 min of 16,000).
# Usage: tools/auto_props.sh [N] [open|open-oracle [REQUESTS]]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000}"
if [ "${2:-}" = open-oracle ]; then
    AUTO_PROPS_OPEN_SEEDS="$n" AUTO_PROPS_OPEN_REQUESTS="${3:-4000}" cargo test --features testing --lib \
        core::tests::auto_props::open_loop::a_window_chosen -- --ignored --nocapture 2>&1 \
        | grep -E '^oracle seed | open cases |^  (Poisson|bursts), ' || true
    exit 0
fi
if [ "${2:-}" = open ]; then
    AUTO_PROPS_OPEN_SEEDS="$n" AUTO_PROPS_OPEN_REQUESTS="${3:-4000}" cargo test --features testing --lib \
        core::tests::auto_props::open_loop::auto_matches_the_best_window_in_hindsight_over_drawn_open_loops -- --ignored --nocapture 2>&1 \
        | grep -E '^open seed | open cases |AUTO_PROPS_OPEN_SEED=|^  work-conserving|^  (Poisson|bursts), ' || true
    exit 0
fi
AUTO_PROPS_SEEDS="$n" cargo test --features testing --lib \
    core::tests::auto_props -- --nocapture 2>&1 \
    | grep -E '^seed | cases: |AUTO_PROPS_SEED=' || true
