# Shared by the proxy-path scripts (proxy_front_ab.sh, proxy_instructions.sh,
# proxy_syscalls.sh, proxy_vs_nginx.sh); source it.

# front_toml FILE BACK_PORT: an abe front's config with one `upstream` table to the
# answering abe on 127.0.0.1:BACK_PORT, its address and model only (every other key on the
# `upstream` defaults: each request forwarded alone, 64 at once, on the backend's event loop).
# FRONT_BACKENDS=N writes N such tables (upstream-abe-0 ..), all to the same address: the
# shape of a router tier over N replicas, for what each backend adds to a request.
front_toml() {
  local n="${FRONT_BACKENDS:-1}" i name
  : >"$1"
  for i in $(seq 0 $((n - 1))); do
    name="upstream-abe"
    [ "$n" -gt 1 ] && name="upstream-abe-$i"
    cat >>"$1" <<TOML
[[backends]]
name = "$name"
kind = "upstream"
base_url = "http://127.0.0.1:$2"
[[backends.models]]
name = "abe-sim"
context_length = 131072
TOML
  done
}

# nginx_proxy_conf FILE DIR LISTEN_PORT BACK_PORT [MASTER]: an nginx config, one worker in
# the foreground, `proxy_pass` on 127.0.0.1:LISTEN_PORT to the answering abe on
# 127.0.0.1:BACK_PORT over up to 64 kept-alive upstream connections; its pid and error log
# in DIR. MASTER=off runs the worker without a master process (for callgrind).
nginx_proxy_conf() {
  cat >"$1" <<NGINX
worker_processes 1;
master_process ${5:-on};
daemon off;
pid $2/nginx.pid;
error_log $2/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    upstream abe_back {
        server 127.0.0.1:$4;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$3;
        location / {
            proxy_pass http://abe_back;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering on;
        }
    }
}
NGINX
}
