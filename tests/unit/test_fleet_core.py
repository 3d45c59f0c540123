"""Fleet triage without a Prometheus: selectors and their escaping, PromQL building, ranking, the fleet checks on
hand-made snapshots, the table, and the exporter's text (over the fake NVML)."""
from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest

from core.errors import InputError
from core.fleet.fleet import FleetSnapshot, Replica, rank
from core.fleet.prom import Cost, Prometheus, auth_from_env
from core.fleet.promql import Builder, Names, discovery_query, host_of, parse_window
from core.fleet.selector import Matcher, parse_selector, quote, render
from core.fleet.table import as_text, rows
from core.telemetry.exporter import TelemetryCollector, reasons_to_mask, registry
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource, decode_throttle
from diagnostics.checks.fleet import CHECKS
from diagnostics.runner import evaluate
from tests.fakes.nvml import FakeClock, FakeNvml


def test_selector_parses_the_four_operators_and_reemits_them_escaped():
    m = parse_selector(' {namespace="prod", pod=~"vllm-.*" ,job!="x", model_name!~\'a|b\'} ')
    assert [(x.label, x.op, x.value) for x in m] == [("namespace", "=", "prod"), ("pod", "=~", "vllm-.*"),
                                                    ("job", "!=", "x"), ("model_name", "!~", "a|b")]
    assert render(m) == 'namespace="prod",pod=~"vllm-.*",job!="x",model_name!~"a|b"'
    assert parse_selector("") == () and parse_selector("{}") == () and parse_selector('job="x"')[0].value == "x"


def test_a_hostile_value_stays_inside_its_quotes():
    m = parse_selector(r'{job="x\"} or vector(1) or {a=\"\\"}')
    assert m[0].value == 'x"} or vector(1) or {a="\\'
    assert render(m) == r'job="x\"} or vector(1) or {a=\"\\"'
    assert quote('a\nb"c\\') == r'"a\nb\"c\\"'


@pytest.mark.parametrize("text", ['{job="x"} or vector(1)', '"}', 'job="x"} or {a="b"', "sum(up)", "{job=x}",
                                  '{job="x" instance="y"}', '{job="x"', '{__name__="up"}', '{job=~"("}',
                                  '{job="a\\q"}', '{1job="x"}', '{job=="x"}'])
def test_anything_but_matchers_is_refused(text):
    with pytest.raises(InputError, match="not a label selector"):
        parse_selector(text)


def test_window_and_label_names():
    assert parse_window("5m") == ("5m", 300) and parse_window(" 24h ") == ("24h", 86400)
    for bad in ("5", "5 m", "1d", "5s", "25h", "5m) or vector(1"):
        with pytest.raises(InputError):
            parse_window(bad)
    assert host_of("10.0.0.5:8000") == "10.0.0.5" and host_of("[::1]:9400") == "[::1]" and host_of("pod-a") == "pod-a"


def test_queries_are_one_per_column_aggregated_by_the_replica_label():
    names = Names.resolve({"vllm:num_requests_running", "vllm_num_requests_waiting", "vllm:gpu_cache_usage_perc",
                           "vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count",
                           "vllm:num_preemptions_total"})
    assert names.get("kv") == "vllm:gpu_cache_usage_perc" and names.get("waiting") == "vllm_num_requests_waiting"
    assert names.get("itl") == "vllm:time_per_output_token_seconds" and names.get("prompt_tokens") is None
    b = Builder(parse_selector('{namespace="a\\"b"}'), "pod", "5m", names)
    q = b.replica_columns()
    assert q["ttft_p99_s"] == ('histogram_quantile(0.99, sum by (le, pod) (rate({__name__="vllm:time_to_first_token_'
                               'seconds_bucket",namespace="a\\"b"}[5m])))')
    assert all(re.search(r"by \([^)]*\bpod\b", v) for v in q.values())
    assert "prompt_tok_s" not in q and "preemptions_s" in q
    assert b.for_replica('x"y').matchers[-1] == Matcher("pod", "=", 'x"y')
    assert 'namespace="a\\"b"' in discovery_query(b.matchers)
    gpu = b.gpu_columns("host")
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in gpu["dram_bw_pct"] and "triage_gpu_dram_bw_util_percent" in gpu["dram_bw_pct"]
    assert ") * 1048576.0) or " in gpu["fb_used_bytes"]  # MiB to bytes, exactly


def _snap(replicas, **kw) -> FleetSnapshot:
    med = rank(replicas)
    base = dict(prometheus_url="http://p:9090", selector="", replica_label="instance", window="5m", window_s=300,
                t=0.0, replicas=replicas, promql={"ttft_p99_s": "histogram_quantile(...)"}, names={}, gpu_source="",
                no_stats_targets=[], fleet_median=med, prometheus_version="2.42", cost=Cost(), elapsed_s=0.1)
    base.update(kw)
    return FleetSnapshot(**base)


def _replica(name, ttft=0.1, up=True, **values):
    v = {"ttft_p99_s": ttft, "itl_p99_s": 0.02, "prompt_tok_s": 100.0, "generation_tok_s": 50.0, "kv_peak": 0.3,
         "preemptions_s": 0.0, "running_avg": 2.0}
    v.update(values)
    return Replica(name, [name + ":8000"], up, 1.0, "", v)


def test_median_and_mad_flag_the_one_slow_replica_and_not_a_tight_fleet():
    fleet = [_replica(f"r{i}", 0.1 + 0.001 * i) for i in range(9)] + [_replica("slow", 0.9)]
    snap = _snap(fleet)
    assert [r.name for r in fleet if r.outliers] == ["slow"]
    assert snap.fleet_median["ttft_p99_s"] == pytest.approx(0.1045)
    assert not [r for r in _snap([_replica(f"r{i}", 0.1 + 0.01 * i) for i in range(10)]).replicas if r.outliers]
    assert rows(snap)[0]["instance"] == "slow" and "▲" in rows(snap)[0]["TTFT p99"]
    assert "slow" in as_text(snap).splitlines()[1]


def test_fleet_checks_on_a_sick_fleet():
    fleet = [_replica(f"r{i}") for i in range(6)]
    fleet.append(_replica("slow", 1.0))
    fleet.append(_replica("full", kv_peak=0.99, preemptions_s=0.5))
    fleet.append(_replica("idle", prompt_tok_s=1.0, generation_tok_s=1.0))
    fleet.append(_replica("gone", up=False))
    fleet[-1].last_error = "connection refused"
    fleet[0].gpu = {"gpu_util_pct": 20.0, "dram_bw_pct": 87.0, "xid": 79.0}
    snap = _snap(fleet, no_stats_targets=[{"instance": "h:8001", "job": "vllm", "url": "http://h:8001/metrics"}])
    found = {f.check_id: f for f in evaluate(snap, CHECKS)}
    want = {"fleet.replica_down": ("FAIL", "gone"), "vllm.metrics_off": ("FAIL", "h:8001"),
            "vllm.kv_pressure": ("FAIL", "full"), "gpu.idle": ("FAIL", "r0"), "gpu.bandwidth_bound": ("FAIL", "r0"),
            "fleet.slow_replica": ("FAIL", "slow"), "fleet.load_imbalance": ("WARN", "idle"),
            "fleet.xid": ("FAIL", "r0")}
    for cid, (status, name) in want.items():
        assert found[cid].status.value == status and name in found[cid].verdict, (cid, found[cid])
    assert "histogram_quantile" in found["fleet.slow_replica"].evidence["promql"]


def test_fleet_checks_on_a_healthy_fleet_without_gpus():
    found = {f.check_id: f.status.value for f in evaluate(_snap([_replica(f"r{i}") for i in range(4)]), CHECKS)}
    assert found == {"fleet.replica_down": "PASS", "vllm.metrics_off": "PASS", "vllm.kv_pressure": "PASS",
                     "gpu.idle": "SKIP", "gpu.bandwidth_bound": "SKIP", "fleet.slow_replica": "PASS",
                     "fleet.load_imbalance": "PASS", "fleet.xid": "SKIP"}


def test_credentials_come_from_the_environment_and_are_never_shown():
    assert auth_from_env({"TRIAGE_PROM_TOKEN": "t0k"})[:2] == ("t0k", None)
    assert auth_from_env({"TRIAGE_PROM_USER": "u", "TRIAGE_PROM_PASSWORD": "pw"})[1] == ("u", "pw")
    p = Prometheus("prom:9090", env={"TRIAGE_PROM_USER": "u", "TRIAGE_PROM_PASSWORD": "pw"})
    assert p.base_url == "http://prom:9090" and "pw" not in repr(p) and "pw" not in p.auth_description
    with pytest.raises(InputError, match="no credentials in the URL"):
        Prometheus("http://u:pw@prom:9090")
    with pytest.raises(Exception, match="not an http"):
        Prometheus("javascript:alert(1)")


def test_exporter_text_over_the_fake_nvml():
    clock = FakeClock()
    nvml = NvmlSource(FakeNvml(gpus=2), clock=clock)
    col = TelemetryCollector(nvml, HostSource(watch=()))
    clock.advance(1.0)
    text = generate_latest(registry(col)).decode()
    for name in ("triage_gpu_util_percent", "triage_gpu_dram_bw_util_percent", "triage_gpu_sm_util_percent",
                 "triage_gpu_memory_used_bytes", "triage_gpu_memory_free_bytes", "triage_gpu_power_watts",
                 "triage_gpu_sm_clock_hertz", "triage_gpu_clock_event_reasons",
                 "triage_host_memory_available_bytes"):
        assert f"\n{name}" in text, name
    assert 'gpu="1"' in text
    assert reasons_to_mask(decode_throttle(0x44)) == 0x44


def test_the_exporter_command_imports_no_streamlit_torch_or_requests():
    import subprocess
    import sys

    code = ("import sys; from diagnostics.__main__ import COMMAND_MODULES; from core.telemetry import exporter; "
            "exporter.registry(exporter.TelemetryCollector()); "
            "print(sorted(m for m in ('streamlit', 'torch', 'pandas', 'requests', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
