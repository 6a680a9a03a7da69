#!/usr/bin/env python3
"""Loads abe's /dashboard in headless Chromium against a live server under load and checks,
from the page's DOM, that every chart received data, that live events arrive, and that the
strategy switch works (a real click on the page's button, then the server is asked).
Saves a screenshot. Drives Chromium over the DevTools protocol on a pipe
(--remote-debugging-pipe): Python's standard library only.

Usage: tools/dashboard_check.py [--screenshot PATH] [--mode request|continuous] BASE_URL
Needs: chromium (Debian package `chromium`), and the server under load (see
tools/dashboard_check.sh, which starts `abe loadgen` beside it).
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

REQUEST_CHARTS = ["throughput", "latency", "priority", "queue", "batch", "flush", "workers", "tokens",
                  "auto-cost", "auto-holds"]
CONTINUOUS_CHARTS = ["throughput", "latency", "tokens", "slots", "ttft", "prefix"]


class Cdp:
    """The DevTools protocol over Chromium's pipe (fd 3 in, fd 4 out; messages end in NUL)."""

    def __init__(self, chromium, width, height):
        self.profile = tempfile.mkdtemp(prefix="abe-chromium-")
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--remote-debugging-pipe", "--user-data-dir=" + self.profile,
             f"--window-size={width},{height}", "about:blank"],
            # 3 and 4 are set by dup2 below; kept open through the exec.
            pass_fds=(3, 4, to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def send(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": url})

    def eval(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def wait_for(cdp, what, expr, timeout_s=30):
    until = time.time() + timeout_s
    while time.time() < until:
        try:
            v = cdp.eval(expr)
            if v:
                return v
        except RuntimeError:
            pass  # the page is still loading
        time.sleep(0.25)
    raise SystemExit(f"FAIL: {what} (waited {timeout_s} s for {expr})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--screenshot", default="dashboard.png")
    ap.add_argument("--mode", default="request", choices=["request", "continuous"])
    ap.add_argument("url")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("FAIL: chromium not found (Debian package `chromium`; .ci/run installs it)")
    cdp = Cdp(chromium, 1440, 1300)
    try:
        cdp.open(args.url + "/dashboard")
        wait_for(cdp, "the page loaded its script", "typeof drawChart === 'function'")
        wait_for(cdp, "history reached the page", "Number(document.body.dataset.historySeconds || 0) >= 3")
        charts = REQUEST_CHARTS if args.mode == "request" else CONTINUOUS_CHARTS
        for c in charts:
            n = wait_for(cdp, f"chart {c} drew data",
                         f"Number(document.getElementById('chart-{c}').dataset.points || 0)")
            print(f"chart {c}: {n} points")
        rows = cdp.eval("document.querySelectorAll('#workers-table tbody tr').length")
        assert rows >= 1, f"no worker rows ({rows})"
        events = wait_for(cdp, "live events arrived", "Number(document.body.dataset.events || 0)")
        print(f"events shown: {events}")
        if args.mode == "request":
            before = json.load(urllib.request.urlopen(args.url + "/admin/strategy"))["strategy"]
            target = "fixed" if before != "fixed" else "queue_depth"
            wait_for(cdp, "the strategy list loaded",
                     f"[...document.getElementById('strategy-select').options].some(o => o.value === '{target}')")
            cdp.eval(f"document.getElementById('strategy-select').value = '{target}';"
                     "document.getElementById('strategy-select').dispatchEvent(new Event('change'));"
                     "document.getElementById('strategy-apply').click(); true")
            wait_for(cdp, "the page reported the switch",
                     f"document.getElementById('strategy-status').textContent === 'switched to {target}'")
            # The engine applies a switch at its next turn and GET /admin/strategy reads the
            # published snapshot (at most ~50 ms old): wait for it, bounded.
            deadline = time.monotonic() + 10
            while True:
                after = json.load(urllib.request.urlopen(args.url + "/admin/strategy"))["strategy"]
                if after == target or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert after == target, f"server runs {after}, page switched to {target}"
            wait_for(cdp, "the header shows the new strategy",
                     f"document.getElementById('kpi-strategy').textContent === '{target}'")
            print(f"strategy switch: {before} -> {after}")
        time.sleep(1.5)  # one more poll, so the screenshot shows the newest second
        png = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(args.screenshot, "wb") as f:
            f.write(base64.b64decode(png))
        print(f"screenshot: {args.screenshot}")
    finally:
        cdp.close()
    print("dashboard check: ok")


if __name__ == "__main__":
    main()
