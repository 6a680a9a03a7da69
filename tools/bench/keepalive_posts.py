#!/usr/bin/env python3
"""Sends N small completion POSTs, one at a time, over one keep-alive connection, and reads
each response in full. Used by the callgrind benchmarks (the same requests to abe and nginx).

Usage: keepalive_posts.py PORT N        (exits 1 if the server is not reachable yet)
"""
import socket
import sys

port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"prompt":"hi","max_tokens":1}'
req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % len(body)) + body
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
except OSError:
    sys.exit(1)
f = s.makefile("rb")
for _ in range(n):
    s.sendall(req)
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
s.close()
