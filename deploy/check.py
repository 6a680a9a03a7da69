#!/usr/bin/env python3
"""Checks deploy/ as far as a machine without Docker or Kubernetes allows.

  python3 deploy/check.py [--abe target/debug/abe] [--replay]

- Dockerfile: multi-stage; the build stage's Rust matches the local rustc (major.minor);
  every COPY source exists in the build context; the runtime stage is a slim image, runs
  as a numeric non-root user, exposes the port abe is told to serve on, and its entrypoint
  is the binary the build stage produced. With --replay, the build stage's steps run here
  (WORKDIR and COPY into a scratch directory, then its RUN with /src and /out mapped into
  it), and the binary it produced answers `--version`, then serves /health and /ready.
- Kubernetes manifests (deploy/k8s/*.yaml): parse; every Deployment's containers run as
  non-root without privilege escalation, probe /health (liveness) and /ready (readiness)
  on a port they declare, and every Service selects a Deployment's pods on a port they
  declare; the router's discovery names the headless Service of the vLLM Deployment, at
  its port, in its namespace; each ConfigMap's abe.toml equals deploy/config/*.toml and
  passes `abe config check`.

What cannot be checked here: that the images build with Docker (the base images are not
pulled), that the manifests apply to a cluster (no API server: only their shape is
checked), that cluster DNS answers the headless Service per pod (tests/live_backends.rs
checks discovery against /etc/hosts instead), and vLLM itself. Exits 1 on the first
problem, naming it.
"""

import argparse
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
ROOT = DEPLOY.parent
CONFIGS = {"abe-router": "router.toml", "abe-standin": "standin.toml"}


def fail(what):
    print(f"deploy check: FAILED: {what}")
    sys.exit(1)


def ok(what):
    print(f"deploy check: ok: {what}")


def dockerfile_stages(text):
    """The Dockerfile as stages: [{'from': str, 'name': str|None, 'steps': [(op, arg)]}]."""
    lines, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    stages = []
    for line in lines:
        op, _, arg = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            stages.append({"from": m.group(1), "name": m.group(2), "steps": []})
        elif not stages:
            fail(f"Dockerfile: {op} before the first FROM")
        else:
            stages[-1]["steps"].append((op, arg.strip()))
    return stages


def check_dockerfile():
    text = (DEPLOY / "Dockerfile").read_text()
    stages = dockerfile_stages(text)
    if len(stages) < 2:
        fail("Dockerfile: not multi-stage")
    build, run = stages[0], stages[-1]
    m = re.match(r"rust:(\d+\.\d+)", build["from"])
    if not m:
        fail(f"Dockerfile: build stage is not an official rust image: {build['from']}")
    local = re.search(r"rustc (\d+\.\d+)", subprocess.run(
        ["rustc", "--version"], capture_output=True, text=True).stdout)
    if not local or local.group(1) != m.group(1):
        fail(f"Dockerfile: build stage Rust {m.group(1)}, local rustc {local and local.group(1)}")
    for op, arg in build["steps"]:
        if op == "COPY":
            for src in arg.split()[:-1]:
                if not (ROOT / src).exists():
                    fail(f"Dockerfile: COPY source {src} is not in the build context")
    if not any(x in run["from"] for x in ("distroless", "slim", "alpine", "scratch")):
        fail(f"Dockerfile: runtime stage is not slim: {run['from']}")
    steps = dict(run["steps"][::-1])  # first occurrence wins
    user = steps.get("USER", "")
    if not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user):
        fail(f"Dockerfile: runtime USER {user!r} is not a numeric non-root user")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for o, a in run["steps"] if o == "ENV")))
    if steps.get("EXPOSE") != env.get("ABE_SERVER_PORT"):
        fail("Dockerfile: EXPOSE and ABE_SERVER_PORT differ")
    copy_from = [a for o, a in run["steps"] if o == "COPY" and a.startswith(f"--from={build['name']}")]
    if not copy_from:
        fail("Dockerfile: the runtime stage copies nothing from the build stage")
    binary = copy_from[0].split()[-1]
    entry = steps.get("ENTRYPOINT", "")
    if f'"{binary}"' not in entry:
        fail(f"Dockerfile: ENTRYPOINT {entry} is not {binary}")
    ok(f"Dockerfile: {len(stages)} stages, rust {m.group(1)}, runtime {run['from']} as {user}, "
       f"port {steps.get('EXPOSE')}, entrypoint {binary}")
    return build, int(steps["EXPOSE"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay(build):
    """Runs the build stage's steps here; returns the binary it produced."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="abe-deploy-replay-"))
    paths = {"/src": scratch / "src", "/out": scratch / "out"}
    cwd = None
    env = dict(os.environ)
    for op, arg in build["steps"]:
        if op == "WORKDIR":
            cwd = paths.get(arg, scratch / arg.lstrip("/"))
            cwd.mkdir(parents=True, exist_ok=True)
        elif op == "COPY":
            *srcs, dst = arg.split()
            for src in srcs:
                target = cwd / dst if dst not in ("./", ".") else cwd
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target, dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / src, target / pathlib.Path(src).name)
        elif op == "RUN":
            cmd = arg
            for k, v in paths.items():
                cmd = cmd.replace(k, str(v))
            print(f"deploy check: replaying RUN {cmd}", flush=True)
            if subprocess.run(cmd, shell=True, cwd=cwd, env=env).returncode != 0:
                fail("Dockerfile: the build stage's RUN failed")
        elif op == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", arg))
    binary = paths["/out"] / "abe"
    if not binary.exists():
        fail("Dockerfile: the build stage produced no /out/abe")
    return binary


def probe_binary(binary, port):
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{binary} --version: {out.stderr}")
    env = dict(os.environ, ABE_SERVER_HOST="127.0.0.1", ABE_SERVER_PORT=str(port),
               ABE_WORKERS_LATENCY_MODEL="none")
    child = subprocess.Popen([str(binary), "serve"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for path in ("/health", "/ready"):
            deadline = time.time() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    fail(f"{binary} serve: {path} never answered 200")
                time.sleep(0.1)
    finally:
        child.terminate()
        child.wait(timeout=30)
    ok(f"{binary.name} from the replayed build: --version, /health and /ready answer")


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def container_ports(c):
    return {p["containerPort"] for p in c.get("ports", [])} | {
        p["name"] for p in c.get("ports", []) if "name" in p}


def check_manifests(abe, port):
    all_docs = {p.name: docs(p) for p in sorted((DEPLOY / "k8s").glob("*.yaml"))}
    if set(all_docs) != {"router.yaml", "standin.yaml"}:
        fail(f"deploy/k8s holds {sorted(all_docs)}, expected router.yaml and standin.yaml")
    for name, ds in all_docs.items():
        by_kind = {}
        for d in ds:
            for key in ("apiVersion", "kind", "metadata"):
                if key not in d:
                    fail(f"{name}: a document without {key}")
            by_kind.setdefault(d["kind"], []).append(d)
        deployments = by_kind.get("Deployment", [])
        for dep in deployments:
            check_deployment(name, dep, port)
        for svc in by_kind.get("Service", []):
            check_service(name, svc, deployments)
        for cm in by_kind.get("ConfigMap", []):
            check_configmap(name, cm, abe)
        ok(f"{name}: {', '.join(f'{len(v)} {k}' for k, v in sorted(by_kind.items()))}")
    check_discovery(all_docs["router.yaml"])


def check_deployment(name, dep, port):
    spec = dep["spec"]
    labels = spec["template"]["metadata"]["labels"]
    if spec["selector"]["matchLabels"] != labels:
        fail(f"{name}: Deployment {dep['metadata']['name']}: selector does not match its pods")
    pod = spec["template"]["spec"]
    for c in pod["containers"]:
        ports = container_ports(c)
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.get(kind, {}).get("httpGet")
            if not probe:
                fail(f"{name}: container {c['name']}: no {kind} over HTTP")
            if probe["port"] not in ports:
                fail(f"{name}: container {c['name']}: {kind} on undeclared port {probe['port']}")
        if not c["image"].startswith("abe:"):
            continue
        # abe's own containers: the promises of the README.
        if c["readinessProbe"]["httpGet"]["path"] != "/ready":
            fail(f"{name}: abe's readiness probe is not /ready")
        if c["livenessProbe"]["httpGet"]["path"] != "/health":
            fail(f"{name}: abe's liveness probe is not /health")
        if port not in ports:
            fail(f"{name}: abe's container does not declare the image's port {port}")
        sc = pod.get("securityContext", {})
        if not sc.get("runAsNonRoot") or not sc.get("runAsUser"):
            fail(f"{name}: abe's pod may run as root")
        if c.get("securityContext", {}).get("allowPrivilegeEscalation", True):
            fail(f"{name}: abe's container allows privilege escalation")
        envs = {e["name"] for e in c.get("env", [])}
        if "ABE_SERVER_ADMIN_TOKEN" not in envs:
            fail(f"{name}: abe binds 0.0.0.0 with admin endpoints and no ABE_SERVER_ADMIN_TOKEN")


def check_service(name, svc, deployments):
    sel = svc["spec"]["selector"]
    targets = [d for d in deployments
               if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                      for k, v in sel.items())]
    if not targets:
        fail(f"{name}: Service {svc['metadata']['name']} selects no Deployment's pods")
    for p in svc["spec"]["ports"]:
        for d in targets:
            declared = set().union(*(container_ports(c)
                                     for c in d["spec"]["template"]["spec"]["containers"]))
            if p["targetPort"] not in declared:
                fail(f"{name}: Service {svc['metadata']['name']} targets undeclared "
                     f"port {p['targetPort']}")


def check_configmap(name, cm, abe):
    cm_name = cm["metadata"]["name"]
    text = cm["data"]["abe.toml"]
    source = (DEPLOY / "config" / CONFIGS[cm_name]).read_text()
    if text != source:
        fail(f"{name}: ConfigMap {cm_name}'s abe.toml differs from deploy/config/{CONFIGS[cm_name]}")
    env = dict(os.environ, ABE_SERVER_ADMIN_TOKEN="deploy-check")
    out = subprocess.run([abe, "config", "check", str(DEPLOY / "config" / CONFIGS[cm_name])],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        fail(f"{name}: ConfigMap {cm_name}: abe config check: {out.stdout}{out.stderr}")


def check_discovery(ds):
    router = next(d for d in ds if d["kind"] == "ConfigMap")
    m = re.search(r'dns = "([^"]+)", port = (\d+)', router["data"]["abe.toml"])
    if not m:
        fail("router.yaml: abe's config has no discovery table")
    dns, port = m.group(1), int(m.group(2))
    headless = [d for d in ds if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    names = {f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local": s
             for s in headless}
    svc = names.get(dns)
    if not svc:
        fail(f"router.yaml: discovery names {dns}, no headless Service of that name")
    if port not in {p["port"] for p in svc["spec"]["ports"]}:
        fail(f"router.yaml: discovery port {port} is not a port of Service {dns}")
    vllm = next(d for d in ds if d["kind"] == "Deployment"
                and d["metadata"]["name"] == svc["metadata"]["name"])
    if "nvidia.com/gpu" not in str(vllm["spec"]["template"]["spec"]["containers"][0]["resources"]):
        fail("router.yaml: the vLLM Deployment asks for no GPU")
    ok(f"router.yaml: discovery follows headless Service {dns}:{port}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--abe", default=str(ROOT / "target" / "debug" / "abe"),
                    help="abe binary for `config check` (default: target/debug/abe)")
    ap.add_argument("--replay", action="store_true",
                    help="run the Dockerfile's build stage here (a `dist` profile build: minutes)")
    args = ap.parse_args()
    if not pathlib.Path(args.abe).exists():
        fail(f"no abe binary at {args.abe} (cargo build first, or pass --abe)")
    build, port = check_dockerfile()
    check_manifests(args.abe, port)
    if args.replay:
        probe_binary(replay(build), free_port())
    print("deploy check: all passed")


if __name__ == "__main__":
    main()
