#!/usr/bin/env python3
"""Overload at 10x capacity, open loop: is abe still responsive?

Usage: tools/overload.py [--bin target/release/abe] [--factor 10] [--seconds 20]

1. Starts `abe serve` (4 sim workers, linear latency model, queue_capacity 512 so a queue
   full of admitted work drains well inside the 30 s request timeout).
2. Capacity: a closed loop of 256 clients for 10 s (`abe loadgen --clients 256`); capacity is
   the completions per second the server counted.
3. Overload: the steady_state schedule played open loop at `factor` x capacity
   (`abe loadgen --rate-scale`), 2,048 connections, while this script probes GET /health and
   GET /metrics every 50 ms on their own connection, sends one completion of its own (to time
   a 429 and see its Retry-After), and samples the server's RSS.
Prints capacity, offered rate, responses by status, the probes' latencies (a 429's too), the admitted requests' latency against their deadline, expirations, and RSS.
A measurement for RELIABILITY.md, not a test.
"""
import argparse
import json
import os
import socket
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n".encode())
    out = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
    s.close()
    return out


def post_completion(port):
    """One completion on its own connection: (status, has Retry-After, ms)."""
    body = json.dumps({"prompt": "probe", "max_tokens": 1}).encode()
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: o\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    out = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
    s.close()
    ms = (time.perf_counter() - t) * 1000
    return int(out[9:12]), b"\r\nretry-after:" in out.lower(), ms


def metrics(port):
    out = get(port, "/metrics/json")
    return json.loads(out.partition(b"\r\n\r\n")[2])


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/abe"))
    ap.add_argument("--factor", type=float, default=10)
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABE_")}
    env.update({"ABE_ENGINE_PIN": "false", "RUST_LOG": "warn",
                "ABE_BATCHING_QUEUE_CAPACITY": "512"})
    srv = subprocess.Popen([a.bin, "serve", "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env)
    line = srv.stdout.readline().decode()
    port = int(line.rsplit(":", 1)[1].strip().strip("/"))
    url = f"http://127.0.0.1:{port}"
    lg_env = {k: v for k, v in os.environ.items() if not k.startswith("ABE_")}

    def loadgen(*args):
        r = subprocess.run([a.bin, "loadgen", "--url", url, *args], capture_output=True,
                           text=True, env=lg_env)
        return r.stdout

    m0 = metrics(port)
    t0 = time.time()
    loadgen("--clients", "256", "--duration", "10")
    m1 = metrics(port)
    capacity = (m1["requests"]["completed"] - m0["requests"]["completed"]) / (time.time() - t0)
    # steady_state offers 100 requests/s.
    scale = a.factor * capacity / 100.0

    probes = {"/health": [], "/metrics": []}
    refusals = []  # (has Retry-After, ms) of probe completions answered 429
    peak = [rss(srv.pid)]
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            for path in probes:
                t = time.perf_counter()
                out = get(port, path)
                probes[path].append((time.perf_counter() - t) * 1000)
                assert out.startswith(b"HTTP/1.1 200"), out[:100]
            # A completion probe of its own, off this thread: an admitted one waits its turn.
            def one():
                status, retry, ms = post_completion(port)
                if status == 429:
                    refusals.append((retry, ms))
            threading.Thread(target=one, daemon=True).start()
            peak.append(rss(srv.pid))
            time.sleep(0.05)

    th = threading.Thread(target=probe)
    base_rss = rss(srv.pid)
    th.start()
    before = metrics(port)
    t1 = time.time()
    report = loadgen("--rate-scale", f"{scale:.3f}", "--duration", str(a.seconds),
                     "--connections", "2048")
    elapsed = time.time() - t1
    stop.set()
    th.join()
    after = metrics(port)
    codes = {}
    for k, v in after["http"]["responses"]["completions"].items():
        codes[k] = v - before["http"]["responses"]["completions"].get(k, 0)
    srv.terminate()
    srv.wait(timeout=60)
    offered = scale * 100
    req = {k: after["requests"][k] - before["requests"][k]
           for k in ("admitted", "completed", "expired", "failed", "rejected_full")}
    print(f"capacity (closed loop, 256 clients, 10 s): {capacity:.0f} completions/s")
    print(f"offered (open loop, steady_state x {scale:.2f}): {offered:.0f} requests/s "
          f"= {a.factor:g}x, for {a.seconds:g} s ({elapsed:.1f} s with the tail)")
    print(f"completions responses by status: {codes}")
    print(f"server: {req}")
    for path, xs in probes.items():
        print(f"GET {path} during overload: {len(xs)} probes, p50 {pct(xs, 50):.2f} ms, "
              f"p99 {pct(xs, 99):.2f} ms, max {max(xs):.2f} ms")
    if refusals:
        xs = [ms for _, ms in refusals]
        with_header = sum(1 for r, _ in refusals if r)
        print(f"probe completions refused with 429: {len(xs)} ({with_header} with Retry-After), "
              f"p50 {pct(xs, 50):.2f} ms, p99 {pct(xs, 99):.2f} ms, max {max(xs):.2f} ms")
    print(f"RSS: {base_rss >> 20} MiB before, peak {max(peak) >> 20} MiB during")
    print("loadgen report:")
    print(report)


if __name__ == "__main__":
    main()
