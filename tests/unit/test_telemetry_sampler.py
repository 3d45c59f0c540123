"""The sampler: one thread per process, a ring buffer holding the window, rate changes, and a source that breaks."""
from __future__ import annotations

import threading
import time

import pytest

import core.telemetry.sampler as sampler_mod
from core.telemetry.base import Availability, Sample
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler, get_sampler, shutdown_sampler
from tests.fakes.nvml import FakeNvml


class Counter:
    """A trivial source: value = call count."""

    name = "count"

    def __init__(self):
        self.n = 0

    def probe(self):
        return Availability(True)

    def sample(self):
        self.n += 1
        return Sample(self.name, time.time(), {"count.n": self.n})

    def close(self):
        pass


class Broken(Counter):
    name = "broken"

    def sample(self):
        raise RuntimeError("boom")


class Absent(Counter):
    name = "absent"

    def probe(self):
        return Availability(False, "not on this machine")


@pytest.fixture(autouse=True)
def no_singleton():
    shutdown_sampler()
    yield
    shutdown_sampler()


def threads():
    return [t for t in threading.enumerate() if t.name == "telemetry-sampler"]


def test_ring_buffer_holds_ten_minutes_at_10hz_and_keeps_the_window_on_rate_change():
    s = Sampler([Counter()], rate_hz=10)
    assert s.stats().capacity >= 10 * 60 * 10
    for _ in range(7000):
        s.tick()
    rows = s.rows()
    assert len(rows) == s.stats().capacity and rows[-1]["count.n"] == 7000  # oldest dropped, newest kept
    s.set_rate(20)
    assert s.stats().capacity >= 10 * 60 * 20
    assert s.rows()[-1]["count.n"] == 7000 and len(s.rows()) == len(rows)


def test_rate_is_clamped():
    s = Sampler([Counter()], rate_hz=1000)
    assert s.stats().rate_hz == sampler_mod.MAX_RATE_HZ


def test_a_broken_or_absent_source_does_not_stop_the_others():
    s = Sampler([Broken(), Counter(), Absent()]).start()
    try:
        s.tick()
        snap = s.latest()
        assert snap.values["count.n"] >= 1
        assert "boom" in snap.reasons["broken.*"]
        assert s.availability("absent") == Availability(False, "not on this machine")
    finally:
        s.stop()


def test_series_downsamples_by_bucket_mean():
    s = Sampler([Counter()])
    for _ in range(1000):
        s.tick()
    cols = s.series(["count.n", "missing.key"], seconds=3600, max_points=100)
    assert len(cols["t"]) == len(cols["count.n"]) == 100
    assert cols["count.n"][0] == pytest.approx(5.5)  # mean of 1..10
    assert cols["missing.key"] == [None] * 100


def test_one_thread_per_process_even_when_many_sessions_start_at_once(monkeypatch):
    monkeypatch.setattr(sampler_mod, "default_sources", lambda: [Counter()])
    shutdown_sampler()  # a page run earlier in this process may have started the singleton
    time.sleep(0.05)
    before = set(threads())  # a test's own Sampler still winding down is not this singleton's thread
    got = []
    workers = [threading.Thread(target=lambda: got.append(get_sampler())) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len({id(s) for s in got}) == 1
    assert len(set(threads()) - before) == 1
    shutdown_sampler()
    time.sleep(0.05)
    assert set(threads()) - before == set()


def test_thread_samples_and_measures_its_own_cost(monkeypatch):
    monkeypatch.setattr(sampler_mod, "default_sources", lambda: [Counter()])
    s = get_sampler(rate_hz=20)
    deadline = time.monotonic() + 5
    while s.stats().ticks < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    st = s.stats()
    assert st.ticks >= 10 and st.achieved_hz > 0 and st.cpu_pct_of_core >= 0
    assert get_sampler(rate_hz=5).stats().rate_hz == 5  # rate is configurable on the live singleton


def test_end_to_end_with_fake_gpus_and_the_real_host():
    s = Sampler([NvmlSource(nvml=FakeNvml(gpus=2)), HostSource()]).start()
    try:
        s.tick()
        v = s.latest().values
        assert v["gpu1.util_pct"] == 97 and v["host.mem_available_bytes"] > 0
        assert s.source("nvml").gpus[1].name == "NVIDIA H200"
    finally:
        s.stop()
