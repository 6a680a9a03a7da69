#!/usr/bin/env python3
"""Live-backends soak: `abe serve` under load while its backends come and go, then checks
that nothing was lost, nothing answered twice and the counters reconcile (as the chaos
soak, tools/chaos_soak.py, whose helpers it uses).

Usage: tools/live_soak.py [--seconds N] [--mode request|continuous] [--clients N] [--bin PATH]

Request mode: the front routes model abe-sim to a local sim backend `local`, a fixed
upstream `u1` (another abe on 127.0.0.1) and a discovery table `pool` following a name in
/etc/hosts with abe servers on 127.0.0.2 and 127.0.0.3 (one port). Three churners run at
once: the admin API removes `local` and adds it back (DELETE / POST /admin/backends); a
reload rewrites the config file with `u1` gone or back and another routing strategy, then
sends SIGHUP; discovery sees 127.0.0.3's line added and removed. 127.0.0.2 stays, so some
backend is always active: every request must get a 200 (or a 429 with Retry-After).
Continuous mode: three sim backends `s1`, `s2`, `s3`; the admin API churns `s2`, reloads
churn `s3` (continuous batching takes only sim backends, so there is no discovery).
In both modes a fourth churner adds a backend the config never named (`new-1`, `new-2`,
... one new name each time, serving abe-sim: an upstream at u1's address in request mode,
a sim backend in continuous mode) through POST /admin/backends into a spare slot
(routing.spare_backend_slots: the default 8 in request mode, 2 in continuous), checks it
took requests, and removes it; its slot takes the next new name once drained. A reload
drains such a backend too (the file is the wanted state): that is part of the churn.

Checks: every request got exactly one complete answer (a stream ending in [DONE]), none a
5xx; admitted = completed + failed with nothing live and failed = 0; every churn step
was accepted (a new backend never refused for want of a spare slot); each backend went
through draining and empty at least once (seen in GET /admin/backends), and so did a new
one, and new backends were routed to; no "panicked" in any log; exit status 0 after
SIGTERM.
Needs root for /etc/hosts (without it, request mode runs without the discovery churn and
says so).
"""
import argparse
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_soak as cs  # noqa: E402

TOKEN = "live-token"
HOSTS = "/etc/hosts"
AUTH = [("Authorization", f"Bearer {TOKEN}")]


def admin(port, method, path, body=None):
    out = cs.raw(port, cs.request(method, path, body, AUTH))
    if out is None:
        return 0, {}
    status, _, data = cs.parse_one(out)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, {}


class Hosts:
    """Lines naming `name` in /etc/hosts, replaced whole by a rename; removed at the end."""

    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()

    def set(self, ips):
        with self.lock:
            keep = [l for l in open(HOSTS).read().splitlines() if not l.endswith(" " + self.name)]
            keep += [f"{ip} {self.name}" for ip in ips]
            tmp = f"{HOSTS}.{self.name}"
            with open(tmp, "w") as f:
                f.write("\n".join(keep) + "\n")
            os.rename(tmp, HOSTS)


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def table(name, kind, extra=""):
    return (f'[[backends]]\nname = "{name}"\nkind = "{kind}"\n{extra}'
            f'[[backends.models]]\nname = "abe-sim"\ncontext_length = 8192\n')


def client(port, deadline, seed, tally):
    """Like the chaos soak's client, without abandoned requests: every one is checked."""
    rng = random.Random(seed)
    while time.time() < deadline:
        kind = rng.choice(list(cs.PATHS))
        out = cs.raw(port, cs.request("POST", cs.PATHS[kind], cs.body_for(kind, rng)))
        if out is None:
            tally.bad(f"{kind}: connection failed ({cs.failure()})")
            continue
        cs.check_answer(kind, out, tally)


def churn(deadline, every, steps, tally, what):
    """Runs `steps` in turn every `every` seconds until the deadline."""
    i = 0
    while time.time() < deadline:
        ok, label = steps[i % len(steps)]()
        tally.add(f"{what}: {label}" if ok else f"{what}: REFUSED {label}")
        if not ok:
            tally.bad(f"{what}: {label} refused")
        i += 1
        time.sleep(every)


def watcher(port, deadline, seen, new_routed):
    """Records every (backend, state) GET /admin/backends shows, and the most requests
    /metrics/json shows routed to each new backend (`new-*`)."""
    while time.time() < deadline + 3:
        status, body = admin(port, "GET", "/admin/backends")
        for b in body.get("backends", []):
            seen.add((b["name"], b["state"]))
        _, m = admin(port, "GET", "/metrics/json")
        for b in m.get("backends", []):
            if b.get("name", "").startswith("new-"):
                new_routed[b["name"]] = max(new_routed.get(b["name"], 0), b.get("routed", 0))
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--mode", choices=["request", "continuous"], default="request")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--bin", default=os.path.join(cs.ROOT, "target/debug/abe"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="abe-live-soak-")
    logs = []
    procs = []

    def start(cfg_text, name, port=0, host=None):
        path = os.path.join(work, f"{name}.toml")
        with open(path, "w") as f:
            f.write(cfg_text)
        logs.append(os.path.join(work, f"{name}.log"))
        env = {"ABE_SERVER_HOST": host} if host else {}
        p, port = cs.start_abe(a.bin, path, port, logs[-1], env)
        procs.append(p)
        return p, port, path

    upstream = "[workers]\ncount = 2\n"
    hosts = None
    head = (f'[server]\nadmin_token = "{TOKEN}"\nshutdown_timeout = "5s"\n'
            f'[batching]\nmode = "{a.mode}"\n[workers]\ncount = 2\n'
            f'[health]\ncheck_interval = "200ms"\n')
    if a.mode == "request":
        _, u1_port, _ = start(upstream, "u1")
        pool_port = free_port("127.0.0.2")
        start(upstream, "pool-a", pool_port, "127.0.0.2")
        start(upstream, "pool-b", pool_port, "127.0.0.3")
        name = f"abe-live-soak-{os.getpid()}.test"
        if os.access(HOSTS, os.W_OK) and os.access(os.path.dirname(HOSTS), os.W_OK):
            hosts = Hosts(name)
            hosts.set(["127.0.0.2", "127.0.0.3"])
        else:
            print("live soak: /etc/hosts is not writable: no discovery churn")
        u1 = table("u1", "upstream", f'base_url = "http://127.0.0.1:{u1_port}"\n')
        pool = (table("pool", "upstream",
                      f'discovery = {{ dns = "{name}", port = {pool_port}, every = "200ms" }}\n')
                if hosts else "")
        fixed = table("local", "sim", "max_concurrent_batches = 2\n") + pool
        churned, admin_name = u1, "local"
    else:
        fixed = table("s1", "sim") + table("s2", "sim")
        churned, admin_name = table("s3", "sim"), "s2"
        u1_port = None
    admin_body = json.dumps({"name": admin_name, "kind": "sim",
                             "max_concurrent_batches": 2 if a.mode == "request" else 4,
                             "models": [{"name": "abe-sim", "context_length": 8192}]})

    spare = "" if a.mode == "request" else "spare_backend_slots = 2\n"

    def front_config(with_churned, strategy):
        return (f'{head}{fixed}{churned if with_churned else ""}[routing]\n'
                f'strategy = "{strategy}"\n{spare}')

    front, port, front_cfg = start(front_config(True, "smart"), "front")
    tally = cs.Tally()
    seen = set()

    def admin_remove():
        s, _ = admin(port, "DELETE", f"/admin/backends/{admin_name}")
        return s == 200, f"DELETE {admin_name}"

    def admin_add():
        s, _ = admin(port, "POST", "/admin/backends", admin_body)
        return s == 200, f"POST {admin_name}"

    new_at = [0]
    new_routed = {}

    def new_body(name):
        if a.mode == "request":
            extra = {"kind": "upstream", "base_url": f"http://127.0.0.1:{u1_port}"}
        else:
            extra = {"kind": "sim"}
        return json.dumps({"name": name, **extra,
                           "models": [{"name": "abe-sim", "context_length": 8192}]})

    def new_add():
        new_at[0] += 1
        name = f"new-{new_at[0]}"
        s, body = admin(port, "POST", "/admin/backends", new_body(name))
        return s == 200, f"POST {name} (a new name){'' if s == 200 else ': ' + str(body)}"

    def new_remove():
        name = f"new-{new_at[0]}"
        s, _ = admin(port, "DELETE", f"/admin/backends/{name}")
        return s == 200, f"DELETE {name}"

    reloads = [(False, "round_robin"), (True, "least_loaded"), (False, "smart"), (True, "smart")]
    reload_at = [0]

    def reload_step():
        with_churned, strategy = reloads[reload_at[0] % len(reloads)]
        reload_at[0] += 1
        with open(front_cfg, "w") as f:
            f.write(front_config(with_churned, strategy))
        front.send_signal(signal.SIGHUP)
        return True, f"SIGHUP ({'with' if with_churned else 'without'} the churned backend, {strategy})"

    def hosts_step(ips):
        def step():
            hosts.set(ips)
            return True, f"/etc/hosts: {' '.join(ips)}"
        return step

    started = time.time()
    deadline = started + a.seconds
    threads = [threading.Thread(target=client, args=(port, deadline, i, tally))
               for i in range(a.clients)]
    threads.append(threading.Thread(target=churn, args=(
        deadline, 0.7, [admin_remove, admin_add], tally, "admin")))
    threads.append(threading.Thread(target=churn, args=(
        deadline, 1.1, [reload_step], tally, "reload")))
    threads.append(threading.Thread(target=churn, args=(
        deadline, 0.8, [new_add, new_remove], tally, "new")))
    if hosts:
        threads.append(threading.Thread(target=churn, args=(
            deadline, 0.9, [hosts_step(["127.0.0.2"]), hosts_step(["127.0.0.2", "127.0.0.3"])],
            tally, "discovery")))
    threads.append(threading.Thread(target=watcher, args=(port, deadline, seen, new_routed)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = cs.wait_idle(port, "after the load")
    r = m["requests"]
    final = admin(port, "GET", "/admin/backends")[1].get("backends", [])
    front.send_signal(signal.SIGTERM)
    code = front.wait(timeout=30)
    for p in procs[:-1]:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    if hosts:
        hosts.set([])

    checked = sum(n for k, n in tally.by.items() if k.split(":")[0] not in
                  ("admin", "reload", "discovery", "new"))
    statuses = {k: n for k, n in tally.by.items() if k.split(":")[0] not in
                ("admin", "reload", "discovery")}
    print(f"live soak ({a.mode} mode): {a.seconds:.0f} s, {a.clients} clients")
    print(f"  requests checked answered exactly once: {checked}")
    for k in sorted(tally.by):
        print(f"    {k}: {tally.by[k]}")
    print(f"  server: admitted {r['admitted']} (readmitted {r['readmitted']}) = completed "
          f"{r['completed']} + failed {r['failed']}; rejected {r['rejected']}")
    print(f"  backend states seen: {sorted(seen)}")
    print(f"  at the end: {[(b['name'], b['state']) for b in final]}; exit {code}")
    print(f"  new backends added: {new_at[0]}; routed to each before its removal: {new_routed}")
    problems = list(tally.violations)
    for k, n in statuses.items():
        if k.split()[-1].startswith("5"):
            problems.append(f"{n} answers {k}")
    if r["admitted"] != r["completed"] + r["failed"]:
        problems.append("counters do not reconcile")
    if r["failed"] != 0:
        problems.append(f"{r['failed']} requests failed")
    churned_names = [admin_name, "u1" if a.mode == "request" else "s3"]
    if hosts:
        churned_names.append("pool-1")
    for n in churned_names:
        for state in ("draining", "empty", "active"):
            if (n, state) not in seen and not (state == "draining" and (n, "empty") in seen):
                problems.append(f"{n} was never seen {state}")
    news = {n for n, _ in seen if n.startswith("new-")}
    if not news:
        problems.append("no new backend was ever seen")
    elif not any((n, "active") in seen for n in news):
        problems.append("no new backend was ever seen active")
    elif not any((n, "empty") in seen for n in news):
        problems.append("no new backend was ever seen empty after its removal")
    if not any(r > 0 for r in new_routed.values()):
        problems.append(f"no new backend was routed to: {new_routed}")
    if code != 0:
        problems.append(f"exit status {code} after SIGTERM")
    for log in logs:
        if os.path.exists(log) and b"panicked" in open(log, "rb").read():
            problems.append(f"a panic in {log}")
    if checked == 0:
        problems.append("nothing was checked")
    for p in problems[:20]:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
