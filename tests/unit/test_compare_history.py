"""What a comparison saves to history (core.compare.history_*, save_to_history) and that the saved JSON rebuilds the
same result, on the hand-made result of test_compare_render (hostile token text) and a temporary SQLite file."""
from __future__ import annotations

import dataclasses
import json
import math

from core.compare import run as cp
import time

import pytest

from core.compare.result import (CompareResult, Side, history_payload, history_summary, history_title,
                                 save_to_history, summarize_prompts, title_from_summary)
from core.precision import Precision
from core.store import Store
from tests.unit.test_compare_render import _result


def _strict_json(obj):
    return json.loads(json.dumps(obj, allow_nan=False))


def test_payload_rebuilds_the_same_result():
    res = _result()
    rebuilt = CompareResult.from_dict(_strict_json(history_payload(res)))
    assert rebuilt.to_dict() == res.to_dict()
    assert rebuilt.summary == res.summary and rebuilt.rows() == res.rows()
    assert rebuilt.reference == res.reference and rebuilt.candidate == res.candidate
    assert rebuilt.text_of(10) == "<script>alert(1)</script>"


def test_non_finite_kl_survives_the_round_trip_as_non_finite():
    res = _result()
    tf = res.prompts[0].tf
    res.prompts[0].tf = dataclasses.replace(tf, kl=[tf.kl[0], math.nan, math.inf, tf.kl[3]])
    res.summary = summarize_prompts(res.prompts, res.reference, res.candidate, res.token_text)
    payload = _strict_json(history_payload(res))  # JSON has no NaN: null
    assert payload["prompts"][0]["teacher_forced"]["kl"][1:3] == [None, None]
    rebuilt = CompareResult.from_dict(payload)
    assert rebuilt.summary.nonfinite_kl == res.summary.nonfinite_kl == 2
    assert rebuilt.summary.status == "broken" and rebuilt.summary.mean_kld == res.summary.mean_kld


def test_summary_is_flat_and_carries_the_headline_numbers():
    res = _result()
    s = history_summary(res)
    assert all(not isinstance(v, (dict, list)) for v in s.values())
    assert s["reference"] == res.reference.label and s["candidate"] == res.candidate.label
    assert s["candidate_precision"] == "fp8" and s["candidate_kv_dtype"] == "fp8"
    assert s["mean_kld_nats"] == res.summary.mean_kld and s["p99_kld_nats"] == res.summary.p99_kld
    assert s["same_top_pct"] == 100 * res.summary.same_top and s["top3_match"] == res.summary.top3_match
    assert s["verdict_band"] == res.summary.status and s["verdict"] == res.summary.verdict
    assert s["vllm_rule_passed"] == res.summary.vllm_passed and s["vllm_rule_total"] == 1
    assert "noise_floor_identical" not in s
    _strict_json(s)


def test_noise_floor_adds_its_summary_without_clobbering_the_flag():
    res = _result()
    floor = _result()
    floor.summary = dataclasses.replace(floor.summary, identical=True)
    assert history_summary(res, floor)["noise_floor_identical"] is True
    payload = _strict_json(history_payload(res, floor))
    assert payload["noise_floor"] is False and payload["noise_floor_run"]["summary"]["identical"] is True
    assert CompareResult.from_dict(payload).noise_floor is False


def test_save_to_history_writes_one_compare_run(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(path))
    res = _result()
    run_id = save_to_history(res)
    store = Store(path)
    try:
        (run,) = store.list_runs()
        assert run.id == run_id and run.kind == "compare" and run.status == "finished"
        assert run.title == history_title(res) == "Compare FP32 vs FP8 W8A8 + FP8 KV · torch · 1 prompt"
        assert run.summary == _strict_json(history_summary(res))
        assert CompareResult.from_dict(store.get_run(run_id).payload).to_dict() == res.to_dict()
    finally:
        store.close()


def test_an_unwritable_history_returns_none(tmp_path, monkeypatch):
    # Injected fault: TRIAGE_DB names a directory, which cannot be opened as a database.
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))
    assert save_to_history(_result()) is None


def test_a_saved_comparison_has_its_start_and_duration(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "history.sqlite"))
    res = _result()
    given = save_to_history(res, started_at=time.time() - 129.0)  # the page notes its start before the loads
    derived = save_to_history(res)  # a caller that did not: the run's own timings (total 1.0 s here)
    store = Store(tmp_path / "history.sqlite")
    try:
        assert store.get_run(given).duration_s == pytest.approx(129.0, abs=5)
        assert store.get_run(derived).duration_s == pytest.approx(1.0, abs=0.5)
        assert store.get_run(given).created_at < store.get_run(given).finished_at
    finally:
        store.close()


FULL_CPU_FP8 = ("torch eager on CPU, FP8 linears through the C kernel (AVX-512), matmul decode attention, "
                "1 oneDNN-packed linears, fused RMSNorm")


def test_titles_and_verdicts_name_sides_shortly_and_keep_what_ran_in_full():
    ref = Side(Precision.FP32, ran="torch eager on CPU, matmul decode attention, 127 oneDNN-packed linears")
    cand = Side(Precision.FP8, ran=FULL_CPU_FP8)
    res = _result()
    res.reference, res.candidate = ref, cand
    rebuilt = CompareResult.from_dict(_strict_json(history_payload(res)))
    assert history_title(rebuilt) == "Compare FP32 vs FP8 W8A8 · torch eager · CPU · 1 prompt"
    assert "FP8 W8A8 vs FP32:" in rebuilt.summary.verdict and "oneDNN" not in rebuilt.summary.verdict
    assert rebuilt.candidate.label.endswith(f"({FULL_CPU_FP8})")  # the details keep every kernel
    d = history_payload(res)["candidate"]
    assert d["ran"] == FULL_CPU_FP8 and d["ran_short"] == "torch eager · CPU"
    assert d["short_label"] == "FP8 W8A8 · torch eager · CPU"
    other = Side(Precision.FP8, engine="remote", url="http://gpu-box:8000", ran="vLLM 0.32.0 server at http://gpu-box:8000")
    res.candidate = other
    assert history_title(res) == "Compare FP32 · torch eager · CPU vs FP8 W8A8 · vLLM 0.32.0 server · gpu-box:8000 · 1 prompt"


def test_an_old_runs_title_is_shortened_from_its_summary():
    old = {"reference": "FP32 (torch eager on CPU, matmul decode attention)", "reference_precision": "fp32",
           "candidate": f"FP8 E4M3 (W8A8) ({FULL_CPU_FP8})", "candidate_precision": "fp8", "prompts": 4}
    assert title_from_summary(old) == "Compare FP32 vs FP8 W8A8 · torch eager · CPU · 4 prompts"
    assert title_from_summary({"verdict": "fine"}) is None  # too little saved: the stored title stays


def test_an_old_payload_without_the_newer_fields_rebuilds():
    payload = _strict_json(history_payload(_result()))
    for side in ("reference", "candidate"):
        for k in ("ran_short", "short_label", "label", "ran"):
            payload[side].pop(k)
    for k in ("timings_s", "token_text", "noise_floor", "max_new_tokens", "top_k"):
        payload.pop(k)
    rebuilt = CompareResult.from_dict(payload)
    assert rebuilt.summary.status == _result().summary.status and rebuilt.timings == {}
    assert rebuilt.text_of(10) == "[10]"  # token text not saved: ids shown
