"""A capacity-bound server, for real: six clients send short prompts with long answers to the package's server, which
runs two sequences at once (--max-num-seqs 2), so four requests wait for a slot while the engine decodes and the KV
cache has room. The checklist's vllm.saturation fails and says so with the load's own waiting count; vllm.prefill
does not call it prefill-bound; the server's own histograms over the same load put queueing at half of TTFT or more.

Then the load changes to one client, which never waits, and `run --quick` answers first from the server's counters
since it started (this test's queued load is most of its life), and the full window revises that answer in words."""
from __future__ import annotations

import json
import time

import pytest

from core.engines.remote import RemoteEngine
from tests.serving.server import MAX_NUM_SEQS, FreshPrompts, closed_loop, diagnostics_cli, phase_sums

pytestmark = pytest.mark.vllm
CLIENTS = 6
PROMPT_TOKENS = 64  # one engine step prefills it: prefill is a small part of a request's time
NEW_TOKENS = 32  # the slots are held by decoding, the other requests wait for them


def test_capacity_bound_named_with_the_loads_waiting_count_and_the_quick_answer_revised(queued_server):
    url = queued_server.base_url
    eng = RemoteEngine(url, timeout_s=300)
    with closed_loop(eng, FreshPrompts(PROMPT_TOKENS, 5), CLIENTS, NEW_TOKENS) as finished:
        time.sleep(3)  # the queue forms before the window opens
        before, t0 = phase_sums(url), time.time()
        out = diagnostics_cli("run", "--vllm-url", url, "--duration", "15", "--json", timeout=300)
        after, t1 = phase_sums(url), time.time()
    assert out.returncode == 0, out.stderr[-2000:]
    findings = {f["id"]: f for f in json.loads(out.stdout)["findings"]}
    sat, pre = findings["vllm.saturation"], findings["vllm.prefill"]
    print(f"\n{len(finished)} of the load's requests finished: {sat['verdict']}")
    assert sat["status"] == "FAIL" and "requests wait for a scheduling slot" in sat["verdict"], sat
    assert "--max-num-seqs" in sat["remedy"] and "sweep" in sat["remedy"]
    ev = sat["evidence"]
    # the server's own sums over a span that holds the checklist's window: queueing is most of TTFT there too
    d = {k: after[k][0] - before[k][0] for k in ("request_queue_time", "time_to_first_token")}
    assert d["request_queue_time"] / d["time_to_first_token"] >= 0.5, d
    assert ev["queue_share_of_ttft_pct"] >= 50, ev
    # six clients on two slots: at most four of the load's requests wait at once, and the console's canary is no
    # request of the load's
    assert 1 <= ev["max_waiting_for_capacity"] <= CLIENTS - MAX_NUM_SEQS, ev
    assert ev["console_canaries_surely"] <= ev["console_canaries"] <= ev["console_canaries_sent"], ev
    assert ev["load_requests_finished"] <= sum(t0 <= t <= t1 for t in finished), ev
    assert ev["kv_cache_usage_peak_pct"] is None or ev["kv_cache_usage_peak_pct"] < 90, ev
    # prompts of one engine step: nothing here waits behind prefills
    assert pre["status"] == "PASS" and pre["verdict"].startswith("Not prefill-bound"), pre

    # The past this server's counters hold is the queued load above; now one client, which never waits for a slot.
    with closed_loop(eng, FreshPrompts(PROMPT_TOKENS, 5), 1, NEW_TOKENS) as light:
        quick = diagnostics_cli("run", "--vllm-url", url, "--quick", "--duration", "10", timeout=300)
    assert quick.returncode == 0, quick.stderr[-2000:]
    text = quick.stdout
    print(text[:1500])
    first = text.split("Refining over the full window")[0]
    assert "First answer in " in first and "FAIL  vllm.saturation since the server started (" in first, first
    (revised,) = [line for line in text.splitlines() if line.startswith("revised: ")]
    assert revised.startswith("revised: vllm.saturation: since the server started (") and " it read FAIL " in \
        revised, revised
    print(revised)
    assert "Over the 10 s window it reads PASS " in revised and len(light) >= 3, (revised, len(light))
