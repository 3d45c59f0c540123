"""Precision compare on the real embedded Gemma 3 270M: the noise floor, FP8 against FP32, batched scoring, the CLI
and what it saves to history (a temporary TRIAGE_DB).

Each precision is loaded once per module. Prompts are short and outputs 16 tokens: FP8 W8A8 goes through
torch._scaled_mm, which is slow on a CPU. No golden strings: assertions are on agreement metrics.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.compare import run as cp
from core.compare.prompts import Prompt, default_prompts
from core.compare.result import CompareResult, Side, history_payload, history_summary, history_title, save_stopped
from core.engines.base import Cancelled, length_groups
from core.precision import Precision
from core.store import Store

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [Prompt("france", "The capital of France is"), Prompt("arithmetic", "What is 123 * 456?")]
N = 16
FP32, FP8 = Side(Precision.FP32), Side(Precision.FP8)


@pytest.fixture(scope="module")
def fp32():
    return cp.load_engine(FP32)


@pytest.fixture(scope="module")
def fp8():
    return cp.load_engine(FP8)


def test_noise_floor_fp32_against_itself_is_exact(fp32):
    res = cp.compare(fp32, fp32, PROMPTS, max_new_tokens=N, reference=FP32, candidate=FP32)
    s = res.summary
    assert res.noise_floor and s.identical and s.status == "identical"
    assert s.top3_match == 1.0 and s.same_top == 1.0 and s.top1_agreement_free == 1.0
    assert s.mean_kld == 0.0 and s.p99_kld == 0.0 and s.max_kld == 0.0
    assert s.kl_source == "full" and s.positions == sum(len(p.ref_ids) for p in res.prompts) > 0
    assert s.vllm_passed == s.vllm_total == len(PROMPTS)
    for p in res.prompts:
        assert p.ref_ids == p.cand_ids and len(p.ref_ids) > 0
        assert all(x == 0.0 for x in p.tf.kl) and all(o == 1.0 for o in p.tf.topk_overlap)


def test_fp8_against_fp32_differs_but_agrees_on_the_top_token(fp32, fp8):
    res = cp.compare(fp32, fp8, PROMPTS, max_new_tokens=N, reference=FP32, candidate=FP8)
    s = res.summary
    assert not s.identical
    assert s.kl_source == "full"
    assert s.mean_kld > 0.0 and s.max_kld >= s.p99_kld >= 0.0
    assert s.mean_kld < 0.5  # nats; a broken quantization is far above this
    assert s.same_top >= 0.8  # chance on a 262k vocabulary is ~0
    assert s.mean_topk_overlap >= 0.6
    assert s.top3_match is not None and s.status in ("fine", "watch", "inconclusive", "low agreement")
    assert s.reference_health.nonfinite == s.candidate_health.nonfinite == 0
    assert s.verdict and "FP8" in s.verdict
    # every id shown has a text, and exports are complete
    assert all(t in res.token_text for p in res.prompts for t in p.ref_ids + p.cand_ids)
    assert len(res.rows()) == sum(max(len(p.ref_ids), len(p.cand_ids)) for p in res.prompts)
    # What history stores (strict JSON) rebuilds the same result, and its summary carries the headline numbers.
    payload = json.loads(json.dumps(history_payload(res), allow_nan=False))
    rebuilt = CompareResult.from_dict(payload)
    assert rebuilt.summary.to_dict() == s.to_dict() and rebuilt.rows() == res.rows()
    hs = history_summary(res)
    assert hs["mean_kld_nats"] == s.mean_kld and hs["p99_kld_nats"] == s.p99_kld
    assert hs["same_top_pct"] == 100 * s.same_top and hs["verdict_band"] == s.status
    assert hs["candidate_precision"] == "fp8" and "FP8" in hs["candidate"] and "FP8" in history_title(res)


def test_an_fp16_reference_on_gemma_3_is_named_as_the_broken_side(fp32):
    # Gemma 3 overflows FP16 (NaN from decoder layer 7 on): the reference is blamed, the candidate not judged.
    fp16_side = Side(Precision.FP16)
    fp16 = cp.load_engine(fp16_side)
    try:
        res = cp.compare(fp16, fp32, PROMPTS[:1], max_new_tokens=4, reference=fp16_side, candidate=FP32)
    finally:
        fp16.unload()
    s = res.summary
    assert s.status == "reference broken" and s.reference_health.nonfinite_share == 1.0, s.verdict
    assert s.verdict.startswith("Reference broken: the FP16 reference overflowed: its logits are not finite at 100% "
                                "of positions") and "candidate was not judged" in s.verdict
    assert s.candidate_health.nonfinite == 0 and "calibration" not in s.verdict.lower()


SEVEN = [Prompt(p.name, p.text) for p in default_prompts()[:7]]  # one batch of six, then a batch of one


def test_prompts_run_in_batches_until_every_prompt_is_scored(fp32, fp8):
    # 4 tokens a prompt: 24 positions after the first batch cannot decide (the interval is wider than the watch
    # band), so the second batch runs; then the prompts are spent and the verdict says how many more would decide.
    counted, batches = [], []
    res = cp.compare(fp32, fp8, SEVEN, max_new_tokens=4, reference=FP32, candidate=FP8, budget_s=None,
                     on_prompts=lambda done, needed, msg: counted.append((done, needed)),
                     on_batch=lambda r: batches.append(len(r.prompts)))
    assert batches == [cp.BATCH_PROMPTS, 7] and len(res.prompts) == 7 and res.prompts_given == 7
    assert res.stop == "prompts" and res.summary.status == "inconclusive", res.summary.verdict
    assert res.summary.verdict.startswith("Inconclusive: all 7 prompts given were scored; about ")
    assert "more prompts would decide it" in res.summary.verdict
    assert res.scored_text == "7 of 7 prompts scored, every prompt given was scored"
    # the bar counts prompts scored of those needed so far: never back, never past what is needed
    done = [d for d, _ in counted]
    assert done == sorted(done) and done[-1] == 7 and all(d <= n for d, n in counted)
    assert counted[0][1] == cp.BATCH_PROMPTS and counted[-1][1] == 7
    # what History stores says why it stopped, and rebuilds the same verdict
    rebuilt = CompareResult.from_dict(json.loads(json.dumps(history_payload(res))))
    assert rebuilt.stop == "prompts" and rebuilt.summary.verdict == res.summary.verdict


def test_a_spent_budget_stops_after_the_first_batch_and_says_so(fp32, fp8):
    # spent_s: the budget's seconds already gone (as a load's are), so the next batch cannot fit whatever the pace
    res = cp.compare(fp32, fp8, SEVEN, max_new_tokens=4, reference=FP32, candidate=FP8, budget_s=10, spent_s=10)
    assert res.stop == "budget" and len(res.prompts) == cp.BATCH_PROMPTS
    assert res.summary.verdict.startswith(f"Inconclusive: the 10 s budget ran out after {cp.BATCH_PROMPTS} of 7 "
                                          "prompts; about "), res.summary.verdict


def test_the_noise_floor_decides_after_one_batch(fp32):
    res = cp.compare(fp32, fp32, SEVEN, max_new_tokens=2, reference=FP32, candidate=FP32, budget_s=None)
    assert res.stop == "decided" and res.summary.status == "identical" and len(res.prompts) == cp.BATCH_PROMPTS


def test_a_stop_keeps_the_batches_scored_before_it_in_history(fp32, fp8, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "history.sqlite"))
    partial = []
    with pytest.raises(Cancelled):  # the stop comes as the second batch starts, as a Stop button's does
        cp.compare(fp32, fp8, SEVEN, max_new_tokens=2, reference=FP32, candidate=FP8,
                   budget_s=None, should_stop=lambda: bool(partial), on_batch=partial.append)
    run_id = save_stopped(FP32, FP8, 7, 0.0, 1.0, partial[-1])
    store = Store(tmp_path / "history.sqlite")
    run = store.get_run(run_id)
    assert run.status == "cancelled" and run.summary["prompts"] == cp.BATCH_PROMPTS
    assert run.summary["prompts_given"] == 7 and "Stopped after 6 of 7 prompts were scored" in run.error
    assert len(CompareResult.from_dict(run.payload).prompts) == cp.BATCH_PROMPTS
    store.close()


def test_batched_scoring_matches_the_engine_score(fp32):
    prompt = fp32.encode("The capital of France is")
    items = [(prompt, [506, 5279, 529, 506]), (fp32.encode("What is 123 * 456? The answer is"), [236743, 236810])]
    batched = cp.score_many(fp32, items, top_k=8)
    for (p, c), got in zip(items, batched):
        want = fp32.score(p, c, top_k=8, full=True)
        np.testing.assert_allclose(got.target_logprobs, want.target_logprobs, atol=2e-3)
        np.testing.assert_allclose(got.full_logprobs, want.full_logprobs, atol=2e-3)
        assert [max(d, key=d.get) for d in got.top_logprobs] == [max(d, key=d.get) for d in want.top_logprobs]


def test_full_kl_on_real_distributions_equals_the_plain_expression(fp32, fp8):
    """kl_full works in place and in small chunks for speed; on the real FP32 and FP8 distributions of a scored
    continuation (262,144 tokens a position) it gives what the plain one-pass expression gives, bit for bit."""
    from core.compare import agreement as ag
    from core.engines.base import GenerationParams
    from tests.unit.test_agreement import kl_plain

    prompt = fp32.encode("The capital of France is")
    items = [(prompt, fp32.generate([prompt], GenerationParams(max_new_tokens=12, top_logprobs=0))[0].token_ids)]
    ref = cp.score_many(fp32, items, top_k=8)[0].full_logprobs
    cand = cp.score_many(fp8, items, top_k=8)[0].full_logprobs
    assert ref.dtype == np.float32 and ref.shape[1] == 262144
    kl = ag.kl_full(ref, cand)
    assert np.array_equal(kl, kl_plain(ref, cand)) and np.all(kl > 0)


def test_length_groups_keep_the_long_prompt_apart():
    groups = length_groups([6, 1100, 12, 9, 40])
    assert [1] in groups and sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]


def test_cli_compare_json_fp8_kv_cache(tmp_path):
    db = tmp_path / "history.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRIAGE_DB": str(db)}
    out = subprocess.run(
        [sys.executable, "-m", "diagnostics", "compare", "--model", "embedded", "--reference", "fp32",
         "--candidate", "fp32", "--kv-dtype", "fp8", "--prompt", "The capital of France is", "--max-new-tokens", "8",
         "--top-k", "5", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["reference"]["precision"] == "fp32" and d["candidate"]["kv_dtype"] == "fp8"
    # What ran, not only what was asked: the eager torch engine on this CPU (the CUDA-graph path says so instead).
    assert d["reference"]["ran"].startswith("torch eager on CPU, ") and "oneDNN-packed linears" in d["reference"]["ran"]
    assert "torch eager on CPU" in d["candidate"]["label"]
    # ...and in a few words for headlines, beside the full one
    assert d["candidate"]["ran_short"] == "torch eager · CPU"
    assert d["candidate"]["short_label"] == "FP32 + FP8 KV · torch eager · CPU"
    assert d["top_k"] == 5 and len(d["prompts"]) == 1
    s = d["summary"]
    assert s["kl_source"] == "full" and s["mean_kld"] >= 0.0 and s["same_top"] >= 0.8
    assert s["bands"]["top3_match"]["band"] in ("fine", "watch", "low agreement")
    assert len(d["prompts"][0]["teacher_forced"]["kl"]) == len(d["prompts"][0]["ref_ids"]) > 0
    # The run is in history, with the same numbers as printed.
    store = Store(db)
    runs = store.list_runs()
    assert [r.kind for r in runs] == ["compare"]
    hs = runs[0].summary
    assert "torch eager on CPU" in hs["candidate"] and hs["candidate_short"] == "FP32 + FP8 KV · torch eager · CPU"
    assert runs[0].title == "Compare FP32 vs FP32 + FP8 KV · torch eager · CPU · 1 prompt"  # reads whole in History
    assert runs[0].duration_s is not None and runs[0].duration_s > 0  # saved with its start
    assert hs["candidate_kv_dtype"] == "fp8" and hs["mean_kld_nats"] == s["mean_kld"] and hs["top_k"] == 5
    assert store.get_run(runs[0].id).payload["prompts"][0]["ref_ids"] == d["prompts"][0]["ref_ids"]
    store.close()


def test_cli_refuses_bad_input_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRIAGE_DB": str(tmp_path / "history.sqlite")}
    out = subprocess.run([sys.executable, "-m", "diagnostics", "compare", "--prompts-file", "/nonexistent/x.txt"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "No prompts file" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "diagnostics", "compare", "--budget-s", "5"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Time budget (s) must be between 10 and 3,600 seconds" in out.stderr
