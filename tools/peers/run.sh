#!/usr/bin/env bash
# abe against BentoML's adaptive batcher and Triton's dynamic batcher on the issue-12 model:
# ONE executor whose batch of n takes a + b*n ms, max batch 32, one instance each.
#
#   abe      abe serve, strategy $ABE_STRATEGY (default auto), one `linear` worker with
#            base a, per-token b/2, variance 0 (the load's requests are 2 tokens each);
#   bento    BentoML (PyPI bentoml 1.4.39: 1.4.40 needs certifi >= 2026.10.19, which the
#            registry reachable here does not have yet), tools/peers/bento_service.py: a
#            batchable API that sleeps a + b*n ms, workers = 1;
#   triton   PyTriton (PyPI nvidia-pytriton 0.7.0, which bundles tritonserver; installed into a
#            venv of Debian's /usr/bin/python3, whose libpython its Python backend loads),
#            tools/peers/triton_server.py: the same sleep behind Triton's dynamic batcher,
#            max_queue_delay_microseconds $PEER_TRITON_DELAY_US (default 0).
#
# All three run at once on loopback ports for one (a, b) and are measured in turn, point by
# point (alternating, so machine load drifts over all of them alike), each by the same
# Python client (tools/peers/drive.py): closed loops at CLIENTS (% of the best possible
# m / (a + m b), m = min(N, 32)) and an open-loop Poisson sweep at LOADS x capacity
# (capacity = 32 / (a + 32 b)), p50 / p99. Each point: WARMUP_S unmeasured, then DURATION_S.
#
# Installs what it needs into venvs under $VENV_DIR (default target/peers); not part of the
# test command. Usage: tools/peers/run.sh   (override any VAR=value below)
set -euo pipefail
# Arithmetic with a leading zero (TOML wants 0.05, not .05).
calc() { awk "BEGIN { printf \"%.10g\", $1 }"; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tools/peers"
PAIRS="${PAIRS:-10:2 5:0.5}"
CLIENTS="${CLIENTS:-1 2 8 32 64 256}"
PEERS="${PEERS:-abe bento triton}"
LOADS="${LOADS:-0.1 0.5 0.8 0.95}"
DURATION_S="${DURATION_S:-3}"
WARMUP_S="${WARMUP_S:-1}"
ABE_STRATEGY="${ABE_STRATEGY:-auto}"
export PEER_TRITON_DELAY_US="${PEER_TRITON_DELAY_US:-0}"
VENV_DIR="${VENV_DIR:-$root/target/peers}"
OUT_DIR="${OUT_DIR:-$root/target/peers/out}"
mkdir -p "$VENV_DIR" "$OUT_DIR"
export BENTOML_DO_NOT_TRACK=true

# --- install -------------------------------------------------------------------------
want() { case " $PEERS " in *" $1 "*) return 0 ;; esac; return 1; }
if want bento && [ ! -x "$VENV_DIR/bento/bin/bentoml" ]; then
  echo "== installing bentoml into $VENV_DIR/bento" >&2
  python3 -m venv "$VENV_DIR/bento"
  "$VENV_DIR/bento/bin/pip" install -q "bentoml==1.4.39"
fi
if want triton && [ ! -d "$VENV_DIR/triton/lib/python3.11/site-packages/pytriton" ]; then
  echo "== installing nvidia-pytriton into $VENV_DIR/triton" >&2
  /usr/bin/python3 -m venv "$VENV_DIR/triton"
  "$VENV_DIR/triton/bin/pip" install -q "nvidia-pytriton==0.7.0"
fi
if want abe; then
  (cd "$root" && cargo build --release --quiet --bin abe)
fi
py=python3 # drive.py needs only the standard library

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

# wait_http URL PATH LOG: until GET answers 200 (60 s at most: tritonserver starts slowly).
wait_http() {
  for _ in $(seq 1 600); do
    if python3 - "$1" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
EOF
    sleep 0.1
  done
  echo "not ready: $1 (see $2)" >&2
  return 1
}

declare -A url
start_all() {
  local a="$1" b="$2"
  export PEER_A_MS="$a" PEER_B_MS="$b"
  if want abe; then
    local port; port="$(free_port)"
    cat >"$OUT_DIR/abe.toml" <<EOF
[server]
host = "127.0.0.1"
port = $port
max_connections = 4096
[batching]
strategy = "$ABE_STRATEGY"
max_batch_size = 32
[workers]
count = 1
latency_model = "linear"
base_latency_ms = $a
per_token_latency_ms = $(calc "$b / 2")
latency_variance = 0.0
[engine]
pin = false
EOF
    RUST_LOG=warn "$root/target/release/abe" serve --config "$OUT_DIR/abe.toml" >"$OUT_DIR/abe.log" 2>&1 &
    pids+=($!)
    url[abe]="http://127.0.0.1:$port"
    wait_http "${url[abe]}/health" "$OUT_DIR/abe.log"
  fi
  if want bento; then
    local port; port="$(free_port)"
    (cd "$here" && exec "$VENV_DIR/bento/bin/bentoml" serve bento_service:Sleeper \
      --host 127.0.0.1 --port "$port") >"$OUT_DIR/bento.log" 2>&1 &
    pids+=($!)
    url[bento]="http://127.0.0.1:$port"
    wait_http "${url[bento]}/readyz" "$OUT_DIR/bento.log"
  fi
  if want triton; then
    local port; port="$(free_port)"
    "$VENV_DIR/triton/bin/python" "$here/triton_server.py" "$port" >"$OUT_DIR/triton.log" 2>&1 &
    pids+=($!)
    url[triton]="http://127.0.0.1:$port"
    wait_http "${url[triton]}/v2/models/sleeper/ready" "$OUT_DIR/triton.log"
  fi
}

echo "# $(date -u +%FT%TZ) $(nproc) cpus, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
tsv="$OUT_DIR/peers.tsv"
printf 'a_ms\tb_ms\tmode\tpoint\tserver\tbest_rps\trps\tpct_of_best\tp50_ms\tp99_ms\terrors\n' >"$tsv"
for pair in $PAIRS; do
  a="${pair%%:*}" b="${pair##*:}"
  start_all "$a" "$b"
  for n in $CLIENTS; do
    m=$((n < 32 ? n : 32))
    best="$(calc "$m * 1000 / ($a + $m * $b)")"
    for s in $PEERS; do
      $py "$here/drive.py" closed --server "$s=${url[$s]}" --clients "$n" --duration "$WARMUP_S" >/dev/null
      $py "$here/drive.py" closed --server "$s=${url[$s]}" --clients "$n" --duration "$DURATION_S" |
        jq -r --arg a "$a" --arg b "$b" --arg n "$n" --argjson best "$best" \
          '[$a, $b, "closed", $n, .server, ($best * 10 | round / 10), (.rps * 10 | round / 10),
            (.rps / $best * 1000 | round / 10), (.p50_ms * 100 | round / 100),
            (.p99_ms * 100 | round / 100), .errors] | @tsv' | tee -a "$tsv"
    done
  done
  capacity="$(calc "32 * 1000 / ($a + 32 * $b)")"
  for load in $LOADS; do
    rate="$(calc "$capacity * $load")"
    for s in $PEERS; do
      $py "$here/drive.py" open --server "$s=${url[$s]}" --rate "$rate" --duration "$WARMUP_S" --seed 1 >/dev/null
      $py "$here/drive.py" open --server "$s=${url[$s]}" --rate "$rate" --duration "$DURATION_S" |
        jq -r --arg a "$a" --arg b "$b" --arg l "$load" --argjson r "$rate" \
          '[$a, $b, "open", $l, .server, ($r * 10 | round / 10), (.rps * 10 | round / 10),
            "", (.p50_ms * 100 | round / 100), (.p99_ms * 100 | round / 100), .errors] | @tsv' |
        tee -a "$tsv"
    done
  done
  stop_all
done
echo "# done $(date -u +%FT%TZ), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== closed loop, % of best (a:b clients x server)"
awk -F'\t' '$3 == "closed" { k = $1 ":" $2 " n=" $4; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    v[k, $5] = $8; if (!($5 in sv)) { sv[$5] = 1; servers[++ns] = $5 } }
  END { printf "%-16s", "a:b clients"; for (j = 1; j <= ns; j++) printf "%8s", servers[j]; print "";
    for (i = 1; i <= nk; i++) { printf "%-16s", keys[i];
      for (j = 1; j <= ns; j++) printf "%8s", v[keys[i], servers[j]]; print "" } }' "$tsv"
echo "== open loop, p50/p99 ms (a:b load x server)"
awk -F'\t' '$3 == "open" { k = $1 ":" $2 " " $4; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    v[k, $5] = $9 "/" $10; if (!($5 in sv)) { sv[$5] = 1; servers[++ns] = $5 } }
  END { printf "%-14s", "a:b load"; for (j = 1; j <= ns; j++) printf " %18s", servers[j]; print "";
    for (i = 1; i <= nk; i++) { printf "%-14s", keys[i];
      for (j = 1; j <= ns; j++) printf " %18s", v[keys[i], servers[j]]; print "" } }' "$tsv"
