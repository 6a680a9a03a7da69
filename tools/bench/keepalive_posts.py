#!/usr/bin/env python3
"""Sends N small completion POSTs over CONNS keep-alive connections (default 1) and reads
each response in full. In each round every connection sends one request, then every
response is read, so CONNS requests are in flight together (as wrk's -c at its closed
loop) and the server sees the same pattern from run to run. Used by the callgrind
benchmarks and the instruction budget (the same requests to abe and nginx).

Usage: keepalive_posts.py PORT N [CONNS]   (N is rounded down to a multiple of CONNS;
                                           exits 1 if the server is not reachable yet)
"""
import socket
import sys

port, n = int(sys.argv[1]), int(sys.argv[2])
conns = int(sys.argv[3]) if len(sys.argv) > 3 else 1
body = b'{"prompt":"hi","max_tokens":1}'
req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body)) + body
try:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(conns)]
except OSError:
    sys.exit(1)
for s in socks:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
files = [s.makefile("rb") for s in socks]


def read_response(f):
    line = f.readline()
    assert line.startswith(b"HTTP/1.1 200"), line
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        if h.lower().startswith(b"content-length:"):
            length = int(h.split(b":")[1])
    f.read(length)


for _ in range(n // conns):
    for s in socks:
        s.sendall(req)
    for f in files:
        read_response(f)
for s in socks:
    s.close()
