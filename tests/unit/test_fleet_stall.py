"""The Fleet's stall check and the alert-rules export without a vLLM server: the stall queries in every name form,
the check and the table on hand-made snapshots, the rule file (valid YAML, unique names, the check's own PromQL),
and Prometheus's own judgement of the file: `promtool check rules`, or where promtool is missing a real Prometheus
loading it. The real stall (SIGSTOP through a real Prometheus) is in tests/serving/test_stall.py."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from core.fleet.fleet import FleetSnapshot, Replica, rank
from core.fleet.prom import Cost
from core.fleet.promql import Builder, Names, stall_window
from core.fleet.selector import parse_selector
from core.fleet.table import rows, state
from diagnostics import fleet_rules
from diagnostics.__main__ import main as cli
from diagnostics.checks.fleet import CHECKS
from diagnostics.runner import evaluate
from tests import promstack

NATIVE = fleet_rules.native_names()
HOSTILE = '{namespace="prod\\"x", model_name=~"gemma.*", job!="other"}'


def test_the_stall_window_is_three_scrapes_whatever_the_rate_window():
    # Prometheus's usual 15 s scrapes: a stall shows within about a minute at --window 5m or 1h alike
    assert stall_window(300, 15.0) == ("45s", 45) and stall_window(3600, 15.0) == ("45s", 45)
    assert stall_window(300, 1.0) == ("20s", 20)  # never shorter than a long prefill
    assert stall_window(60, 60.0) == ("2m", 120)  # nor longer than two minutes
    q = Builder((), "instance", "1h", NATIVE, 15.0).replica_columns()
    assert "increase(" in q["stalled"] and "[45s])" in q["stalled"] and "offset 45s" in q["stalled"]
    # the scrape interval unknown (federated data): the rate window, clamped, as before
    assert stall_window(10) == ("20s", 20) and stall_window(30) == ("30s", 30)
    assert stall_window(300) == ("2m", 120) and stall_window(3600) == ("2m", 120)


@pytest.mark.parametrize("prefix", ["vllm:", "vllm_", "ray_vllm_"])
def test_stall_queries_are_one_per_column_in_every_name_form(prefix):
    names = Names.resolve({prefix + n for n in ("num_requests_running", "num_requests_waiting",
                                                "generation_tokens_total", "prompt_tokens_total",
                                                "request_success_total")})
    q = Builder(parse_selector('{job="vllm"}'), "pod", "5m", names).replica_columns()
    stalled = q["stalled"]
    for name in ("generation_tokens_total", "prompt_tokens_total", "request_success_total"):
        assert f'increase({{__name__="{prefix}{name}",job="vllm"}}[2m])' in stalled
    assert f'min_over_time({{__name__="{prefix}num_requests_waiting",job="vllm"}}[2m])' in stalled
    assert f'{{__name__="{prefix}num_requests_running",job="vllm"}} offset 2m' in stalled  # a window of history
    assert stalled.startswith("(sum by (pod) (min_over_time(")  # its value is the work in flight
    assert "quantile(0.5, sum by (pod) (increase(" in q["silent"] and ">= 10" in q["silent"]
    assert q["progress_last_t"].endswith("[1200s:20s])")  # 60 steps over 10 stall windows
    # without finished requests (an old vLLM) the tokens alone decide, and no silent arm (it needs them)
    old = Names.resolve({prefix + "num_requests_running", prefix + "generation_tokens_total"})
    q = Builder((), "instance", "1m", old).replica_columns()
    assert "request_success" not in q["stalled"] and "silent" not in q and "waiting" not in q["stalled"]
    assert "stalled" not in Builder((), "instance", "1m", Names.resolve({prefix + "num_requests_running"})) \
        .replica_columns()


def _snap(replicas, promql=None, **kw) -> FleetSnapshot:
    base = dict(prometheus_url="http://p:9090", selector="", replica_label="instance", window="5m", window_s=300,
                t=1000.0, replicas=replicas, promql=promql if promql is not None else
                Builder((), "instance", "5m", NATIVE).replica_columns(), names=dict(NATIVE.by_column),
                gpu_source="", no_stats_targets=[], fleet_median=rank(replicas), prometheus_version="2.42",
                cost=Cost(), elapsed_s=0.1, stall_window="2m", stall_window_s=120)
    base.update(kw)
    return FleetSnapshot(**base)


def _replica(name, up=True, **values) -> Replica:
    v = {"running": 0.0, "waiting": 0.0, "work_min": 0.0, "progress": 0.0}
    v.update(values)
    return Replica(name, [name + ":8000"], up, 1.0, "", v)


def _found(snap):
    return {f.check_id: f for f in evaluate(snap, CHECKS)}["fleet.stalled"]


def test_a_replica_with_requests_in_flight_and_no_progress_is_stalled_with_evidence_and_remedy():
    stuck = _replica("stuck", running=4.0, work_min=4.0, stalled=4.0, progress_last_t=1000.0 - 30)
    fleet = [_replica("busy", running=3.0, work_min=1.0, progress=812.0, progress_last_t=1000.0), stuck,
             _replica("idle"), _replica("gone", up=False)]
    f = _found(_snap(fleet))
    assert f.status.value == "FAIL" and "stuck" in f.verdict and "busy" not in f.verdict and "idle" not in f.verdict
    assert "4 running and 0 waiting" in f.verdict and "about 150 s" in f.verdict  # 30 s + the 2 min window
    assert "py-spy dump --pid" in f.remedy and "kill -CONT" in f.remedy and "restart" in f.remedy
    assert "increase(" in f.evidence["promql"] and f.evidence["stall_window"] == "2m"
    assert f.evidence["stuck running"] == 4.0 and f.evidence["stuck no_progress_s"] == 150
    table = rows(_snap(fleet))
    assert [r["instance"] for r in table[:2]] == ["gone", "stuck"] and table[1]["state"].startswith("STALLED (~")
    assert state(stuck) == "STALLED" and state(fleet[2]) == "up"


def test_idle_and_serving_replicas_pass_and_a_silent_one_warns():
    calm = _found(_snap([_replica("busy", running=2.0, progress=40.0), _replica("idle")]))
    assert calm.status.value == "PASS" and "1 of 2 made progress" in calm.verdict
    silent = _found(_snap([_replica("busy", progress=900.0), _replica("quiet", silent=0.0)]))
    assert silent.status.value == "WARN" and "quiet: no progress for more than 1200 s" in silent.verdict
    assert "load balancer" in silent.remedy
    skipped = _found(_snap([_replica("a")], promql={"running": "x"}))
    assert skipped.status.value == "SKIP"


def _load(text: str) -> list[dict]:
    doc = yaml.safe_load(text)
    assert list(doc) == ["groups"] and len(doc["groups"]) == 1
    return doc["groups"][0]["rules"]


@pytest.mark.parametrize("selector,label", [("", "instance"), (HOSTILE, "pod")])
def test_the_rule_file_is_valid_yaml_with_unique_names_and_the_checks_own_promql(selector, label):
    rules = fleet_rules.alert_rules(NATIVE, selector, label, "2m")
    loaded = _load(fleet_rules.rules_yaml(rules, "test"))
    names = [r["alert"] for r in loaded]
    assert len(names) == len(set(names)) and {"VllmReplicaStalled", "VllmTargetDown", "VllmKvCachePressure",
                                              "VllmReplicaSaturated", "VllmReplicaSlowTtft"} <= set(names)
    q = Builder(parse_selector(selector), label, "2m", NATIVE).replica_columns()
    by_name = {r["alert"]: r for r in loaded}
    assert by_name["VllmReplicaStalled"]["expr"] == q["stalled"]  # one source of truth: the column is the rule
    assert by_name["VllmReplicaSilent"]["expr"] == q["silent"]
    assert q["kv_peak"] in by_name["VllmKvCachePressure"]["expr"] and q["preemptions_s"] in \
        by_name["VllmKvCachePressure"]["expr"]
    assert q["queue_mean_s"] in by_name["VllmReplicaSaturated"]["expr"] and ">= 0.5" in \
        by_name["VllmReplicaSaturated"]["expr"] and ">= 0.9" in by_name["VllmReplicaSaturated"]["expr"]
    for r in loaded:
        assert r["for"] == ("0s" if r["alert"] == "TriageGoldenDrift" else "60s")  # a drift stands one round
        assert r["labels"]["severity"] in ("critical", "warning")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert f"$labels.{label}" in r["annotations"]["summary"] or r["alert"] == "VllmTargetDown" or \
            r["alert"].startswith("TriageGolden") and "$labels.replica" in r["annotations"]["summary"]
    assert {"TriageGoldenBroken", "TriageGoldenDrift", "TriageGoldenNoAnswer"} <= set(names)  # the quality watch's
    if selector:
        # up carries no model_name (it comes from vLLM's page): that matcher is left off the target-down rule
        assert by_name["VllmTargetDown"]["expr"].startswith('up{namespace="prod\\"x",job!="other"} == 0')


def _promtool_or_prometheus(path: Path) -> str:
    """promtool's verdict on the file; where promtool is missing, a real Prometheus loads it and /api/v1/rules must
    show every rule with health ok."""
    promtool = shutil.which("promtool") or str(Path(promstack.PROMETHEUS).with_name("promtool"))
    if Path(promtool).exists():
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr
    if promstack.missing_reason():
        pytest.fail(f"Neither promtool nor Prometheus to judge the rule file: {promstack.missing_reason()}")
    prom = promstack.PrometheusServer([], path.parent / "prometheus.log", rule_files=(path,)).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(prom.url + "/api/v1/rules", timeout=5) as r:  # noqa: S310 - loopback
                groups = json.load(r)["data"]["groups"]
            loaded = [x for g in groups for x in g["rules"]]
            if loaded and all(x.get("health") == "ok" for x in loaded) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert loaded and all(x.get("health") == "ok" for x in loaded), loaded
        return f"Prometheus loaded {len(loaded)} rules, health ok"
    finally:
        prom.stop()


@pytest.mark.parametrize("prefix", ["vllm:", "ray_vllm_"])
def test_prometheus_accepts_the_exported_file(tmp_path, prefix):
    path = tmp_path / "rules.yml"
    argv = ["fleet", "--alert-rules", str(path), "--selector", HOSTILE, "--replica-label", "pod", "--window", "2m"]
    if prefix == "vllm:":
        assert cli(argv) == 0
    else:  # the names a Prometheus holds, as collect() resolves them
        names = Names.resolve({prefix + "num_requests_running", prefix + "generation_tokens_total",
                               prefix + "kv_cache_usage_perc", prefix + "num_preemptions_total"})
        fleet_rules.export(str(path), names, HOSTILE, "pod", "30s", "0s", "test")
    text = path.read_text()
    assert prefix + "num_requests_running" in text
    verdict = _promtool_or_prometheus(path)
    print(verdict)
    assert "SUCCESS" in verdict or "health ok" in verdict


def test_the_fleet_command_needs_a_prometheus_or_an_alert_rules_file(capsys):
    assert cli(["fleet"]) == 2 and "--alert-rules FILE" in capsys.readouterr().err
    assert cli(["fleet", "--alert-rules", "/nonexistent-dir/x.yml"]) == 2
    assert "Cannot write the alert rules" in capsys.readouterr().err
    assert cli(["fleet", "--alert-rules", "/tmp/x.yml", "--for", "soon"]) == 2


def test_a_replica_younger_than_the_stall_window_is_too_young_to_judge_never_idle():
    """Measured at --window 2m: a replica first scraped 50 s ago with 6 requests waiting was reported among 'the rest
    had no requests in flight'. It has not had a stall window to show progress in."""
    fleet = [_replica("busy", running=2.0, work_min=2.0, progress=40.0), _replica("idle"),
             _replica("new", waiting=6.0, work_min=6.0, first_seen_t=1000.0 - 50)]
    f = _found(_snap(fleet, window="2m", window_s=120))
    assert f.status.value == "PASS", f.verdict
    assert "1 of 3 made progress, 1 had no requests in flight, new too young to judge (first seen 50 s ago" in \
        f.verdict, f.verdict
    assert f.evidence["too_young_s"] == {"new": 50}


def _rendered(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it for these labels (the golden rules use `$labels.X` only)."""
    for k, v in labels.items():
        text = text.replace(f"{{{{ $labels.{k} }}}}", v)
    return text


@pytest.mark.parametrize("selector", ["", '{job="vllm"}'])
def test_the_quality_watch_rules_keep_to_the_fleets_replicas_in_promtool(tmp_path, selector):
    """One watch exports a broken round for two replicas, one of this fleet (job vllm) and one of another job's:
    Prometheus's own rule engine (`promtool test rules`) fires TriageGoldenBroken for the fleet's replica only when the
    rules were written for the fleet's selector, and for both without one."""
    promtool = shutil.which("promtool") or str(Path(promstack.PROMETHEUS).with_name("promtool"))
    if not Path(promtool).exists():
        pytest.fail(f"no promtool beside {promstack.PROMETHEUS} (scripts/setup.sh --dev installs Debian's prometheus)")
    rules = [r for r in fleet_rules.alert_rules(NATIVE, selector, "instance", "2m", for_="0s")
             if r.alert == "TriageGoldenBroken"]
    (tmp_path / "rules.yml").write_text(fleet_rules.rules_yaml(rules, "test"))
    ours, theirs = "10.0.0.1:8000", "10.0.0.9:8000"
    watch = {"job": "golden-watch", "instance": "127.0.0.1:9400", "golden": "gold.json", "status": "broken"}

    def series(name: str, labels: dict[str, str]) -> dict:
        return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": "1x20"}

    def expected(replica: str) -> dict:
        labels = {**watch, "replica": f"http://{replica}/", "severity": "critical",
                  "triage_check": "fleet.quality_outlier", **({"replica_instance": replica} if selector else {})}
        return {"exp_labels": labels, "exp_annotations": {"summary": _rendered(rules[0].summary, labels),
                                                          "description": _rendered(rules[0].description, labels)}}

    firing = [ours] if selector else [ours, theirs]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [series("up", {"job": "vllm", "instance": ours}),
                         series("up", {"job": "other", "instance": theirs}),
                         series("triage_golden_status", {**watch, "replica": f"http://{ours}/"}),
                         series("triage_golden_status", {**watch, "replica": f"http://{theirs}/"})],
        "alert_rule_test": [{"eval_time": "2m", "alertname": "TriageGoldenBroken",
                             "exp_alerts": [expected(r) for r in firing]}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
