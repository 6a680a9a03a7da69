#!/usr/bin/env python3
"""Slow and idle clients against a live abe: a normal client's latency with thousands of
connections held open by idle and dribbling clients, against the same server unloaded.

Usage: tools/with_server.sh python3 tools/slow_clients.py [--idle N] [--slow N] [--requests K] URL

1. K requests, each on a fresh connection (the hard case: a newcomer needs a slot), unloaded.
2. Opens --idle connections that send nothing and --slow ones that send a request head and one
   byte of a 100-byte body, and keeps that many open (a closed one is reopened: an attacker
   does not give up) from a background thread.
3. K requests again, the same way, while they are held.
Prints p50/p99 of both runs, their ratio, and the server's eviction counters. Exits non-zero
if any normal request failed. A measurement, not a test: numbers go to RELIABILITY.md.
"""
import argparse
import http.client
import json
import resource
import selectors
import socket
import threading
import time
import urllib.parse

SLOW = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def normal_requests(host, port, k):
    body = json.dumps({"model": "abe-sim", "prompt": "hello", "max_tokens": 4})
    lat, failures = [], 0
    for _ in range(k):
        t0 = time.perf_counter()
        try:
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            c.close()
            if r.status != 200:
                failures += 1
                continue
        except OSError:
            failures += 1
            continue
        lat.append((time.perf_counter() - t0) * 1000.0)
    return lat, failures


class Holder(threading.Thread):
    """Keeps `idle` + `slow` connections open, reopening any the server closes."""

    def __init__(self, host, port, idle, slow):
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.want = {"idle": idle, "slow": slow}
        self.sel = selectors.DefaultSelector()
        self.open = {"idle": 0, "slow": 0}
        self.reopened = 0
        self.stop = False

    def connect(self, kind):
        s = socket.socket()
        s.setblocking(True)
        s.settimeout(5)
        try:
            s.connect(self.addr)
            if kind == "slow":
                s.sendall(SLOW)
        except OSError:
            s.close()
            return False
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, kind)
        self.open[kind] += 1
        return True

    def fill(self):
        for kind in ("idle", "slow"):
            while self.open[kind] < self.want[kind]:
                if not self.connect(kind):
                    break

    def run(self):
        self.fill()
        while not self.stop:
            for key, _ in self.sel.select(timeout=0.2):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                # Any answer (a 408, a 503) or EOF means the server gave up on it.
                self.sel.unregister(s)
                s.close()
                self.open[key.data] -= 1
                self.reopened += 1
            self.fill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("url")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.idle + a.slow + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port

    normal_requests(host, port, 20)  # warm up
    base, base_fail = normal_requests(host, port, a.requests)
    holder = Holder(host, port, a.idle, a.slow)
    holder.start()
    while holder.open["idle"] + holder.open["slow"] < (a.idle + a.slow) * 0.95:
        time.sleep(0.1)
    held_at_start = dict(holder.open)
    loaded, loaded_fail = normal_requests(host, port, a.requests)
    held_at_end = dict(holder.open)
    holder.stop = True
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics/json")
    m = json.loads(c.getresponse().read())["http"]
    b50, b99 = percentile(base, 50), percentile(base, 99)
    l50, l99 = percentile(loaded, 50), percentile(loaded, 99)
    print(f"unloaded: {len(base)} ok, {base_fail} failed, p50 {b50:.2f} ms, p99 {b99:.2f} ms")
    print(f"held open at start {held_at_start}, at end {held_at_end}, reopened {holder.reopened}")
    print(f"loaded:   {len(loaded)} ok, {loaded_fail} failed, p50 {l50:.2f} ms, p99 {l99:.2f} ms")
    print(f"p99 ratio loaded/unloaded: {l99 / b99:.2f}")
    print(f"server: open {m['connections_open']}, refused {m['connections_refused']}, "
          f"evicted {json.dumps(m['connections_evicted'])}")
    return 1 if base_fail or loaded_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
