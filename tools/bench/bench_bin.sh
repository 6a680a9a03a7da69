# Sourced by the callgrind bench scripts (core_instructions.sh, tick_instructions.sh):
# `bench_binary NAME DIR` builds `cargo bench --bench NAME --no-run` and prints the bench
# executable's path, or prints what the build said (kept in DIR/build.txt) and exits 2.
# Also checks for valgrind, which every caller needs.
command -v valgrind >/dev/null || { echo "needs valgrind (tools/setup.sh installs it)" >&2; exit 2; }

bench_binary() {
  local name="$1" dir="$2" bin
  bin="$(cargo bench --bench "$name" --no-run --message-format=json 2>"$dir/build.txt" \
    | jq -r --arg n "$name" 'select(.reason == "compiler-artifact" and .target.name == $n
             and .executable != null) | .executable' | tail -1)"
  [ -x "$bin" ] || { echo "no $name bench binary; the build said:" >&2; cat "$dir/build.txt" >&2; exit 2; }
  printf '%s\n' "$bin"
}
