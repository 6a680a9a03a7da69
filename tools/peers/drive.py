"""One load driver for every server, so each sees the same client: closed loops (N threads,
each with one keep-alive connection, sending its next request as soon as the answer to its
last arrives) and open loops (Poisson send times, latency from the scheduled send, a pool of
connections that take the next due request).

Servers (KIND=URL): abe (POST /v1/completions, 1-token prompt, max_tokens 1: b ms on the
bench's linear model), bento (POST /infer {"x": [1]}), triton (KServe v2 infer on model
"sleeper"), abe-embed (POST /v1/embeddings) and infinity (POST /embeddings): one sentence
of 16 tokens, model all-MiniLM-L6-v2. Loopback only. Prints one JSON line per point.

Usage:
  drive.py closed --server KIND=URL --clients N --duration S [--mixed]
  drive.py open --server KIND=URL --rate RPS --duration S [--connections C] [--seed K]
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

BODIES = {
    "abe": ("/v1/completions", json.dumps({"prompt": "abc ", "max_tokens": 1})),
    "bento": ("/infer", json.dumps({"x": [1]})),
    "triton": (
        "/v2/models/sleeper/infer",
        json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}),
    ),
}
# The sentence of benches/embed_forward.rs and tools/bench/embed_st.py: 16 tokens.
EMBED_SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank"
BODIES["abe-embed"] = (
    "/v1/embeddings",
    json.dumps({"model": "all-MiniLM-L6-v2", "input": EMBED_SENTENCE}),
)
BODIES["infinity"] = (
    "/embeddings",
    json.dumps({"model": "all-MiniLM-L6-v2", "input": [EMBED_SENTENCE]}),
)
# --mixed (embedding servers only): 1 request in 8 sends this instead, the sentence ten times
# over (142 tokens), so batches mix lengths and padding matters.
LONG_SENTENCE = " ".join([EMBED_SENTENCE] * 10)
LONG_BODIES = {
    "abe-embed": json.dumps({"model": "all-MiniLM-L6-v2", "input": LONG_SENTENCE}),
    "infinity": json.dumps({"model": "all-MiniLM-L6-v2", "input": [LONG_SENTENCE]}),
}
TIMEOUT_S = 30.0


class Conn:
    def __init__(self, kind, url, mixed=False, offset=0):
        u = urllib.parse.urlparse(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"{url}: loopback only")
        self.host, self.port = u.hostname, u.port
        self.path, self.body = BODIES[kind]
        self.body = self.body.encode()
        self.long = None
        if mixed:
            if kind not in LONG_BODIES:
                raise SystemExit(f"--mixed is for {', '.join(LONG_BODIES)} only")
            self.long = LONG_BODIES[kind].encode()
        # Which of this connection's requests is long: every 8th, offset per connection so
        # the long ones are spread over time.
        self.sent = offset
        self.c = None

    def connect(self):
        """Opens the connection now, so a run does not time a burst of connects (a listen
        backlog overflowing costs a 1 s SYN retransmit)."""
        try:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
            self.c.connect()
        except OSError:
            self.c = None  # retried at the first request

    def request(self):
        """True on a 2xx answer read to its end."""
        for attempt in range(2):
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
            body = self.body
            if self.long is not None and self.sent % 8 == 0:
                body = self.long
            try:
                self.c.request("POST", self.path, body, {"Content-Type": "application/json"})
                r = self.c.getresponse()
                r.read()
                ok = 200 <= r.status < 300
                if ok:
                    self.sent += 1
                return ok
            except (http.client.HTTPException, OSError):
                self.c.close()
                self.c = None
                if attempt == 1:
                    return False
        return False


def pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def closed(kind, url, clients, duration, mixed=False):
    lat, errors, ends = [], [0], [0.0]
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    t0 = [0.0]

    def client(k):
        c = Conn(kind, url, mixed, k)
        c.connect()
        mine, last, bad = [], 0.0, 0
        ready.wait()
        end = t0[0] + duration
        while time.perf_counter() < end:
            s = time.perf_counter()
            ok = c.request()
            e = time.perf_counter()
            if ok:
                mine.append(e - s)
            else:
                bad += 1
            last = e
        with lock:
            lat.extend(mine)
            errors[0] += bad
            ends[0] = max(ends[0], last)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    ready.wait()
    for t in threads:
        t.join(duration + TIMEOUT_S + 5)
    span = max(ends[0] - t0[0], 1e-9)
    return {"completed": len(lat), "errors": errors[0], "rps": len(lat) / span,
            "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3}


def open_loop(kind, url, rate, duration, connections, seed):
    rng = random.Random(seed)
    due, t = [], 0.0
    while t < duration:
        due.append(t)
        t += rng.expovariate(rate)
    nxt = [0]
    lock = threading.Lock()
    lat, errors, ends = [], [0], [0.0]
    ready = threading.Barrier(connections + 1)
    t0 = [0.0]

    def conn():
        c = Conn(kind, url)
        c.connect()
        mine, last, bad = [], 0.0, 0
        ready.wait()
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(due):
                break
            at = t0[0] + due[i]
            now = time.perf_counter()
            if at > now:
                time.sleep(at - now)
            ok = c.request()
            e = time.perf_counter()
            if ok:
                mine.append(e - at)
            else:
                bad += 1
            last = e
        with lock:
            lat.extend(mine)
            errors[0] += bad
            ends[0] = max(ends[0], last)

    threads = [threading.Thread(target=conn, daemon=True) for _ in range(connections)]
    for th in threads:
        th.start()
    t0[0] = time.perf_counter() + 0.05
    ready.wait()
    for th in threads:
        th.join(duration + TIMEOUT_S + 5)
    span = max(ends[0] - t0[0], 1e-9)
    return {"requests": len(due), "completed": len(lat), "errors": errors[0],
            "rps": len(lat) / span, "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["closed", "open"])
    p.add_argument("--server", required=True, help="KIND=URL, KIND in " + "|".join(BODIES))
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--mixed", action="store_true",
                   help="closed loops of abe-embed or infinity: 1 request in 8 is 142 tokens")
    a = p.parse_args()
    kind, url = a.server.split("=", 1)
    if a.mixed and a.mode != "closed":
        raise SystemExit("--mixed is for closed loops only")
    if a.mode == "closed":
        out = closed(kind, url, a.clients, a.duration, a.mixed)
    else:
        out = open_loop(kind, url, a.rate, a.duration, a.connections, a.seed)
    out.update({"server": kind, "mode": a.mode + ("-mixed" if a.mixed else "")})
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
