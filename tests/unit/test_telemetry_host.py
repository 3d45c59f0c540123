"""The host source on this machine's real /proc, plus failures forced through psutil."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

import core.telemetry.host as host_mod
from core.telemetry.host import HOST_FIELDS, HostSource, parse_watch
from tests.fakes.nvml import FakeClock


def two_readings(src, clock):
    src.sample()
    clock.advance(1.1)
    time.sleep(0.1)  # CPU counters tick in 10 ms jiffies: let a few pass for real
    return src.sample()


def test_real_host_fields_and_units():
    clock = FakeClock()
    src = HostSource(clock=clock)
    assert src.probe().ok
    s = two_readings(src, clock)
    v = s.values
    for f in HOST_FIELDS:
        assert f"host.{f}" in v
        assert v[f"host.{f}"] is not None or s.reasons[f"host.{f}"]
    assert 0 < v["host.mem_available_bytes"] <= v["host.mem_total_bytes"]
    assert v["host.cpu_pct"] is not None and 0 <= v["host.cpu_pct"] <= 100
    assert v["proc.console.rss_bytes"] > 10 * 2**20 and v["proc.console.count"] == 1


def test_first_reading_explains_missing_rates():
    s = HostSource(clock=FakeClock()).sample()
    assert s.values["host.cpu_pct"] is None and "two readings" in s.reasons["host.cpu_pct"]


def test_watch_by_pid_and_by_name():
    tag = f"telemetry-test-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(30)", tag])
    try:
        clock = FakeClock()
        src = HostSource(watch=["self", str(child.pid), tag, "no-such-process-xyz"], clock=clock)
        v = src.sample().values
        assert v[f"proc.pid{child.pid}.rss_bytes"] > 0
        assert v[f"proc.{tag}.rss_bytes"] > 0 and v[f"proc.{tag}.count"] == 1
        s = src.sample()
        assert s.values["proc.no-such-process-xyz.count"] == 0
        assert "no running process" in s.reasons["proc.no-such-process-xyz.rss_bytes"]
        child.kill()
        child.wait()
        clock.advance(1.1)
        s = src.sample()  # the watched process died: N/A with the reason, no exception
        assert s.values.get(f"proc.pid{child.pid}.rss_bytes") is None
        assert f"PID {child.pid}" in s.reasons[f"proc.pid{child.pid}.rss_bytes"]
    finally:
        child.kill()


def test_rewatch_replaces_the_list():
    src = HostSource(watch=["self"])
    src.watch(["1"])
    assert src.watch_specs == ["1"]
    s = src.sample()
    # PID 1 always exists; reading its RSS may be denied in a container, which must then say why.
    assert s.values["proc.pid1.count"] in (0, 1)
    assert s.values.get("proc.pid1.rss_bytes") is not None or "PID 1" in s.reasons["proc.pid1.rss_bytes"]
    assert not any(k.startswith("proc.console.") for k in s.values)  # the old list is gone


# Each injected failure and the exact fields it must turn into N/A with its reason; every other field keeps its value
# (or the reason a healthy reading on this host gives too, e.g. no swap).
MEM = ("host.mem_available_bytes", "host.mem_total_bytes")
FAILURES = {
    "virtual_memory": MEM,
    "cpu_times": ("host.cpu_pct",),
    "swap_memory": ("host.swap_used_bytes", "host.swap_total_bytes"),
    "disk_io_counters": ("host.disk_read_bytes_s", "host.disk_write_bytes_s"),
    "net_io_counters": ("host.net_rx_bytes_s", "host.net_tx_bytes_s"),
    "_cmdlines": ("proc.vllm.rss_bytes", "proc.vllm.count"),  # the name scan: the PID watch ("self") is unaffected
}


@pytest.mark.parametrize("target", list(FAILURES))
def test_psutil_failures_become_reasons(monkeypatch, target):
    clock = FakeClock()
    healthy = two_readings(HostSource(watch=["self", "vllm"], clock=clock), clock)

    def boom(*a, **k):
        raise OSError("simulated /proc failure")

    monkeypatch.setattr(host_mod if target.startswith("_") else psutil, target, boom)
    clock = FakeClock()
    src = HostSource(watch=["self", "vllm"], clock=clock)
    s = two_readings(src, clock)  # must not raise
    affected = FAILURES[target]
    for key in affected:
        assert s.values.get(key) is None, key
        assert "simulated /proc failure" in s.reasons.get(key, ""), (key, s.reasons.get(key))
    keys = set(healthy.values) | set(healthy.reasons) | set(s.values) | set(s.reasons)
    for key in keys - set(affected):
        assert "simulated" not in s.reasons.get(key, ""), key
        if healthy.values.get(key) is not None:
            assert s.values.get(key) is not None, (key, s.reasons.get(key))
    assert s.values["host.mem_available_bytes" if target != "virtual_memory" else "host.load1"] is not None
    assert s.values["proc.console.rss_bytes"] > 10 * 2**20


def test_no_disk_counters_in_a_container(monkeypatch):
    monkeypatch.setattr(psutil, "disk_io_counters", lambda: None)
    clock = FakeClock()
    s = two_readings(HostSource(clock=clock), clock)
    assert s.values["host.disk_read_bytes_s"] is None and "no disk" in s.reasons["host.disk_read_bytes_s"]


def test_without_psutil_the_source_says_so(monkeypatch):
    monkeypatch.setattr(host_mod, "psutil", None)
    av = HostSource().probe()
    assert not av.ok and "pip install psutil" in av.reason


def test_parse_watch():
    assert parse_watch(["self", " 42 ", "vllm serve", ""]) == [
        ("console", os.getpid()), ("pid42", 42), ("vllm_serve", "vllm serve")]


GROWER = ("import sys, time\nblocks = []\nfor _ in range(int(sys.argv[1])):\n"
          "    blocks.append(bytearray(16 * 2**20))\n    for i in range(0, len(blocks[-1]), 4096):\n"
          "        blocks[-1][i] = 1\n    time.sleep(float(sys.argv[2]))\nprint('grown', flush=True)\n"
          "time.sleep(60)\n")


def spawn_grower(blocks: int, pause_s: float) -> subprocess.Popen:
    """A real process that grows its resident memory by `blocks` x 16 MiB, one block every `pause_s`."""
    return subprocess.Popen([sys.executable, "-c", GROWER, str(blocks), str(pause_s)], stdout=subprocess.PIPE,
                            text=True)


def test_rss_watch_names_a_real_process_that_grew_and_its_part():
    from core.telemetry.host import RssWatch, descendants

    watch = RssWatch(every_s=0.0)
    watch.look()
    proc = spawn_grower(12, 0.0)  # 192 MiB, started inside the window
    try:
        assert proc.stdout.readline().strip() == "grown"
        watch.look()
        grown = {g.pid: g for g in watch.growth()}
        g = grown[proc.pid]
        assert g.started and g.growth >= 180 * 2**20 and "python" in g.name, g
        assert "started in the window" in g.describe() and f"pid {proc.pid}" in g.describe()
        assert proc.pid in descendants([os.getpid()], watch.table_pids())  # the test's child
    finally:
        proc.kill()
        proc.wait()


def _falling_ctx(growth, **kw):
    from diagnostics.context import CheckContext, Series

    # MemAvailable falls 600 MiB over 40 s, steadily: a WARN or FAIL unless someone else took it
    t = tuple(float(i) for i in range(41))
    v = tuple(8 * 2**30 - 15 * 2**20 * i for i in range(41))
    return CheckContext(host_mem_available=Series("MemAvailable", "bytes", "psutil", t, v), host_growth=growth, **kw)


def test_host_memory_taken_by_another_process_is_not_the_deployments():
    from core.telemetry.host import ProcessGrowth
    from diagnostics.checks.host import decide_mem_leak
    from diagnostics.findings import Status

    pip = ProcessGrowth(900, 1, "python -m pip install torch", 0, 610 * 2**20, 610 * 2**20, True, False)
    engine = ProcessGrowth(501, 500, "VLLM::EngineCore", 900 * 2**20, 1500 * 2**20, 1500 * 2**20, False, False)
    url = "http://127.0.0.1:8000"
    out = decide_mem_leak(_falling_ctx((pip,), vllm_url=url, server_pids=frozenset({500, 501}),
                                       console_pids=frozenset({77})))
    assert out.status is Status.PASS, out
    assert "not from the deployment" in out.verdict and "pip install torch (pid 900) +610 MiB" in out.verdict
    assert out.evidence["deployment_growth_mib"] == 0
    # the server's own engine core grew: that is the deployment's, named with its part
    out = decide_mem_leak(_falling_ctx((engine, pip), vllm_url=url, server_pids=frozenset({500, 501})))
    assert out.status in (Status.WARN, Status.FAIL) and "server under test: VLLM::EngineCore (pid 501)" in out.verdict
    # no server named: the host is what is checked, so the fall is said, with who grew
    out = decide_mem_leak(_falling_ctx((pip,)))
    assert out.status in (Status.WARN, Status.FAIL) and "other: python -m pip install torch" in out.verdict
    # growth unknown: said, never read as "nobody grew"
    out = decide_mem_leak(_falling_ctx(None, host_growth_reason="psutil could not list the processes: denied"))
    assert out.status in (Status.WARN, Status.FAIL) and "not known (psutil could not list" in out.verdict
