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
