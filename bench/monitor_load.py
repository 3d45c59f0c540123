"""What the Live monitor costs the server per viewer: N real Chromium sessions on the monitor page at once.

    python -m bench.monitor_load [--viewers 1,4,8] [--seconds 30] [--warmup 8] [--root DIR] [--label TEXT]

For each N, the app (started here from --root, default this checkout, on a free loopback port) serves N browser
sessions on the Live monitor. After a warm-up, for --seconds it counts every refresh each session really finished
(Streamlit's `script_finished` messages, read off the websockets) and the CPU time of the server process and of
Chromium. Then a further session opens the History page and the time until its heading shows is taken: what a user
navigating during the load waits. --root lets one sitting measure an older checkout beside this one.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from tests.e2e.helpers import CHROMIUM, CHROMIUM_ARGS, AppServer


SCRIPT_FINISHED_FIELD = 6  # ForwardMsg.script_finished in Streamlit's ForwardMsg.proto (an enum: a varint)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def is_script_finished(data: bytes) -> bool:
    """Whether a websocket frame is a ForwardMsg carrying script_finished, read off the protobuf wire format: the
    top-level fields are walked by tag, so the bench needs no Streamlit import (bench sits outside the layers)."""
    i = 0
    try:
        while i < len(data):
            tag, i = _varint(data, i)
            field, wire = tag >> 3, tag & 7
            if field == SCRIPT_FINISHED_FIELD and wire == 0:
                return True
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                n, i = _varint(data, i)
                i += n
            elif wire == 5:
                i += 4
            else:  # groups (3, 4) are not used by Streamlit's messages
                return False
    except IndexError:  # a truncated frame: not a ForwardMsg
        return False
    return False


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor()


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def chromium_procs(browser_pid_parent: psutil.Process) -> list[psutil.Process]:
    return [c for c in browser_pid_parent.children(recursive=True) if "chrom" in c.name().lower()]


def measure(browser, server: AppServer, n: int, seconds: float, warmup_s: float) -> dict:
    url = server.url
    finished = [0] * n

    def count(i):
        def on_frame(payload):
            if isinstance(payload, (bytes, bytearray)) and is_script_finished(bytes(payload)):
                finished[i] += 1
        return lambda ws: ws.on("framereceived", on_frame)

    contexts = []
    for i in range(n):
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        page.on("websocket", count(i))
        page.goto(f"{url}/monitor", wait_until="domcontentloaded", timeout=180_000)
        page.locator('[data-testid="stMetric"]').first.wait_for(timeout=180_000)
        contexts.append((ctx, page))
    me = psutil.Process()
    pages = [p for _, p in contexts]
    pages[0].wait_for_timeout(warmup_s * 1000)
    f0, s0, c0, t0 = list(finished), server.cpu_seconds(), cpu_s(chromium_procs(me)), time.monotonic()
    pages[0].wait_for_timeout(seconds * 1000)
    f1, s1, c1, t1 = list(finished), server.cpu_seconds(), cpu_s(chromium_procs(me)), time.monotonic()
    # A user navigating while the viewers stay live: a new session opens History.
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    probe = ctx.new_page()
    tn = time.monotonic()
    probe.goto(f"{url}/history", wait_until="domcontentloaded", timeout=300_000)
    probe.get_by_role("heading", name="History").wait_for(timeout=300_000)
    nav_s = time.monotonic() - tn
    ctx.close()
    for c, _ in contexts:
        c.close()
    wall = t1 - t0
    refreshes = sum(f1) - sum(f0)
    per_viewer = [(b - a) / wall for a, b in zip(f0, f1)]
    return {"viewers": n, "wall_s": wall, "refreshes": refreshes,
            "refresh_hz_per_viewer_min": min(per_viewer), "refresh_hz_per_viewer_mean": sum(per_viewer) / n,
            "server_cpu_pct": 100 * (s1 - s0) / wall, "server_ms_per_refresh": 1000 * (s1 - s0) / max(1, refreshes),
            "chromium_cpu_pct": 100 * (c1 - c0) / wall, "open_history_s": nav_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--viewers", default="1,4,8")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        # the file watcher off also in checkouts from before .streamlit/config.toml turned it off
        server = AppServer("app.py", Path(tmp) / "h.sqlite", Path(tmp) / "app.log", root=args.root.resolve(),
                           env={"STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"}).start()
        rows = []
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                measure(browser, server, 1, 3.0, 3.0)  # first load compiles the pages
                for n in (int(v) for v in args.viewers.split(",")):
                    rows.append(measure(browser, server, n, args.seconds, args.warmup))
                    time.sleep(3)
                browser.close()
        finally:
            server.stop()
    print(f"\nLive monitor load {args.label} ({cpu_model()}, {time.strftime('%Y-%m-%d')}, "
          f"{args.seconds:.0f} s per row, refresh as the page defaults)")
    print("| viewers | refreshes/s per viewer (min) | server CPU, % of a core | server CPU per refresh "
          "| server CPU per viewer | Chromium CPU, % of a core | open History meanwhile |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['viewers']} | {r['refresh_hz_per_viewer_mean']:.2f} ({r['refresh_hz_per_viewer_min']:.2f}) "
              f"| {r['server_cpu_pct']:.0f}% | {r['server_ms_per_refresh']:.0f} ms "
              f"| {r['server_cpu_pct'] / r['viewers']:.1f}% | {r['chromium_cpu_pct']:.0f}% "
              f"| {r['open_history_s']:.1f} s |")


if __name__ == "__main__":
    main()
