# Shared by the proxy-path scripts (proxy_front_ab.sh, proxy_instructions.sh,
# proxy_syscalls.sh); source it.

# front_toml FILE BACK_PORT: an abe front's config with one `upstream` table to the
# answering abe on 127.0.0.1:BACK_PORT, its address and model only (every other key on the
# `upstream` defaults: each request forwarded alone, 64 at once, on the backend's event loop).
front_toml() {
  cat >"$1" <<TOML
[[backends]]
name = "upstream-abe"
kind = "upstream"
base_url = "http://127.0.0.1:$2"
[[backends.models]]
name = "abe-sim"
context_length = 131072
TOML
}
