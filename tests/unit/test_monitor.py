"""The Live monitor's shared frames, SVG gauges, trend specs and refresh pacing (core/monitor), on a real sampler
over the fake NVML and the real host."""
from __future__ import annotations

import html

import pytest

from core.monitor import charts
from core.monitor.frames import FRESH_S, SharedCache, live_frame
from core.monitor.pacing import BUDGET_CORE, MAX_INTERVAL_S, Pacer
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler
from tests.fakes.nvml import FakeNvml


def test_gauge_shows_value_source_and_band_colour():
    svg = charts.gauge(97.0, "GPU util", source="NVML utilization.gpu", bands=charts.util_bands(70.0))
    assert "97%" in svg and "NVML utilization.gpu" in svg and "<svg" in svg
    assert 'stroke="rgb(118, 185, 0)"' in svg  # the bar takes the colour of the band it ends in (OK)
    low = charts.gauge(12.0, "GPU util", bands=charts.util_bands(70.0))
    assert 'stroke="rgb(255, 176, 32)"' in low  # in the idle band: warning colour
    bw = charts.bandwidth_bands(80.0, 95.0)
    assert [(lo, hi) for lo, hi, _ in bw] == [(0.0, 80.0), (80.0, 95.0), (95.0, 100.0)] and bw[2][2] == charts.BAD


def test_gauge_na_shows_the_reason_on_hover_and_escapes_everything():
    svg = charts.gauge_row([charts.gauge(None, "DRAM BW <util>", source="NVML GPM",
                                         na_reason='GPM needs Hopper <script>"x"</script>')])
    assert ">N/A</text>" in svg
    assert f"<title>{html.escape('GPM needs Hopper <script>')}" in svg and "<script>" not in svg
    assert "DRAM BW &lt;util&gt;" in svg
    assert charts.gauge(5.0, "x", max_value=0.0)  # a zero total (no reading yet) draws, never divides by zero


def test_gauge_clamps_past_the_dial():
    assert "150%" in charts.gauge(150.0, "x") and "-5%" in charts.gauge(-5.0, "x")


def test_trend_spec_depends_on_what_is_drawn_not_on_the_data():
    a = charts.trend_spec("GPU", ["a", "b"], y_title="%", y_range=(0, 105), hlines=[(70, "idle"), (95, "bound")])
    assert a == charts.trend_spec("GPU", ["a", "b"], y_title="%", y_range=(0, 105),
                                  hlines=[(70, "idle"), (95, "bound")])
    assert len(a["layer"]) == 3 and a["layer"][0]["encoding"]["color"]["scale"]["domain"] == ["a", "b"]
    df = charts.trend_frame([1.0, 2.0], {"a": [1, None], "b": [2 * 2**30, 3 * 2**30]}, scale=1.0)
    assert len(df) == 4 and df["value"].isna().sum() == 1  # a gap stays a gap
    gib = charts.trend_frame([1.0], {"m": [2 * 2**30]}, scale=2**30)
    assert gib["value"].tolist() == [2.0]


@pytest.fixture
def sampler():
    s = Sampler([NvmlSource(nvml=FakeNvml()), HostSource()])
    s.probe()
    for _ in range(3):
        s.tick()
    yield s
    s.stop()


def test_frame_is_shared_until_the_newest_tick_is_half_a_second_newer(sampler, monkeypatch):
    cache = SharedCache()
    monkeypatch.setattr("core.monitor.frames._CACHE", cache)
    f1 = live_frame(sampler, 0, 300)
    assert live_frame(sampler, 0, 300) is f1 and cache.builds == 1 and cache.hits == 1
    assert live_frame(sampler, None, 300) is not f1  # another choice is another frame
    sampler.tick()  # a newer tick, but within FRESH_S of the one the frame was built from: still shared
    assert live_frame(sampler, 0, 300) is f1
    t_built = f1.snapshot.t
    monkeypatch.setattr("time.time", lambda: t_built + FRESH_S + 0.1)
    sampler.tick()
    f2 = live_frame(sampler, 0, 300)
    assert f2 is not f1 and f2.snapshot.t > t_built
    assert "GPU util" in f2.gauges_html and "Host MemAvailable" in f2.gauges_html
    assert f2.util_labels[0] == "GPU util (NVML)" and set(f2.util_trend["series"]) == set(f2.util_labels)


def test_frame_without_a_gpu_shows_the_host(sampler):
    f = live_frame(sampler, None, 60)
    assert "Host CPU" in f.gauges_html and f.util_labels == ("host CPU (psutil)",)
    assert f.mem_labels == ("host MemAvailable",)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_pacer_keeps_the_asked_interval_while_cheap():
    clock = Clock()
    p = Pacer(clock=clock)
    assert p.pace(1).interval_s == 1 and p.pace(1).viewers == 0
    p.record("a", 0.010, 0.012)
    pace = p.pace(2)
    assert (pace.interval_s, pace.viewers, round(pace.cpu_ms_per_refresh)) == (2, 1, 10) and not pace.slowed
    assert "Refreshing every 2 s: 1 viewer, 10 ms server CPU and 12 ms wall time" in pace.describe()


def test_pacer_stretches_for_many_costly_viewers_and_says_so():
    clock = Clock()
    p = Pacer(clock=clock)
    for i in range(8):
        p.record(f"s{i}", 0.040, 0.050)  # 8 x 40 ms a second = 32% of a core, budget 20%
    pace = p.pace(1)
    assert pace.interval_s == 2 and pace.slowed and pace.viewers == 8
    assert pace.reason == "budget" and "instead of 1 s" in pace.describe()
    assert f"more than {100 * BUDGET_CORE:.0f}% of a core" in pace.describe()
    assert p.pace(5).interval_s == 5  # a slower asked pace already fits
    for i in range(8):
        p.record(f"s{i}", 10.0, 10.0)
    assert p.pace(1).interval_s == MAX_INTERVAL_S  # never slower than the cap


def test_pacer_forgets_old_runs_and_paused_sessions():
    clock = Clock()
    p = Pacer(clock=clock)
    for i in range(8):
        p.record(f"s{i}", 0.040, 0.050)
    for i in range(7):
        p.forget(f"s{i}")
    assert p.pace(1).interval_s == 1 and p.pace(1).viewers == 1
    clock.t += 11
    assert p.pace(1).viewers == 0


def test_pacer_backs_off_when_the_server_is_behind():
    p = Pacer(clock=Clock())
    p.record("a", 0.010, 0.900)  # 10 ms of work took 900 ms: waiting for the interpreter or the cores
    pace = p.pace(1)
    assert pace.interval_s == 2 and pace.reason == "behind" and "the server is behind" in pace.describe()


def test_gpu_table_escapes_names_processes_and_reasons():
    hostile = '<img src=x onerror=alert(1)>"'
    table = charts.gpu_table([
        {"gpu": f"0: {hostile}", "lost": "", "cells": [(hostile, 0.5, hostile)] + [("N/A", None, f"N/A: {hostile}")]
         * (len(charts.GPU_TABLE_COLUMNS) - 1)},
        {"gpu": "1: x", "lost": f"GPU 1 is lost {hostile}", "cells": []}])
    assert "<img" not in table and "&lt;img src=x onerror=alert(1)&gt;&quot;" in table
    assert table.count("<tr>") == 3 and 'colspan="8"' in table
