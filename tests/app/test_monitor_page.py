"""The Live monitor page under streamlit.testing AppTest, against a sampler built on FakeNvml scenarios and the
real host. Whatever NVML does, the page shows no traceback."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import core.telemetry.sampler as sampler_mod
from core.monitor import pacing
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler, shutdown_sampler

from tests.fakes.nvml import A100, GPUIsLost, FakeNvml, NotSupported, multi_gpu_table

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "monitor.py")


@pytest.fixture
def page(monkeypatch):
    """Install a sampler on fake GPUs as the process singleton, then return a page runner. Each test gets its own
    refresh pacer: the process-wide one would count earlier tests' sessions as viewers."""
    monkeypatch.setattr(pacing, "_PACER", pacing.Pacer())

    def make(nvml: FakeNvml) -> AppTest:
        shutdown_sampler()
        s = Sampler([NvmlSource(nvml=nvml), HostSource()])
        s.probe()
        for _ in range(3):
            s.tick()
        sampler_mod._SAMPLER = s  # not started: the test drives ticks, so readings are deterministic
        at = AppTest.from_file(PAGE, default_timeout=30).run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    yield make
    shutdown_sampler()


def metric(at, label):
    return next(m for m in at.metric if m.label == label)


def test_no_driver_says_so_and_shows_the_host(page):
    at = page(FakeNvml(init_error=FakeNvml().NVMLError_LibraryNotFound()))
    assert "No GPU telemetry" in at.info[0].value and "No NVIDIA driver" in at.info[0].value
    assert metric(at, "Load 1 min").value != "N/A"
    buttons = at.get("download_button")
    assert [b.label for b in buttons] == ["Download buffer (CSV)", "Download buffer (Parquet)"]
    assert all(b.proto.disabled for b in buttons)  # live: a refresh could cancel the download
    at.toggle(key="monitor_paused").set_value(True).run()
    assert not any(b.proto.disabled for b in at.get("download_button"))
    assert len(at.selectbox) == 2  # window and refresh; no GPU selector without GPUs
    assert not at.error


def test_h200_gauges_and_metrics(page):
    at = page(FakeNvml())
    assert not at.info
    assert "NVML GPM" in at.caption[0].value and "compute capability 9.0" in at.caption[0].value
    assert metric(at, "Memory busy").value == "88%"
    assert "Not bandwidth" in metric(at, "Memory busy").proto.help
    assert metric(at, "Power").value == "650 W"
    assert any("throttle reasons (NVML): **SW power cap**" in c.value for c in at.caption)
    assert any("Processes on GPU 0" in c.value for c in at.caption)
    assert any("Sampler:" in c.value for c in at.caption)


def test_a100_shows_na_with_the_reason(page):
    at = page(FakeNvml(table=A100))
    sm = metric(at, "SM util")
    assert sm.value == "N/A" and "Hopper" in sm.proto.help
    assert "N/A" in at.caption[0].value  # DRAM bandwidth source: N/A, with why


def test_not_supported_field_is_na_with_the_reason(page):
    at = page(FakeNvml(table={"nvmlDeviceGetPowerUsage": NotSupported}))
    power = metric(at, "Power")
    assert power.value == "N/A" and "not supported" in power.proto.help


def test_lost_gpu_is_an_error_not_a_traceback(page):
    at = page(FakeNvml(gpus=2, table={("nvmlDeviceGetUtilizationRates", 0): GPUIsLost}))
    assert any("is lost" in e.value for e in at.error)
    assert metric(at, "Power").value == "N/A"
    at.selectbox(key="monitor_gpu").select(1).run()
    assert not at.exception and not at.error
    assert metric(at, "Power").value == "650 W"


def test_gpu_selector_pause_and_rate(page):
    at = page(FakeNvml(gpus=2, table={("nvmlDeviceGetName", 1): "NVIDIA H100 80GB HBM3"}))
    at.selectbox(key="monitor_gpu").select(1).run()
    assert "H100" in at.caption[0].value
    at.toggle(key="monitor_paused").set_value(True).run()
    assert not at.exception
    at.selectbox(key="monitor_refresh").select(5).run()
    assert not at.exception
    at.select_slider[0].set_value(20).run()
    assert not at.exception and sampler_mod._SAMPLER.stats().rate_hz == 20


def test_every_call_failing_at_once_still_renders(page):
    everything = {name: NotSupported for name in dir(FakeNvml) if name.startswith("nvmlDevice")}
    del everything["nvmlDeviceGetCount"], everything["nvmlDeviceGetHandleByIndex"]  # GPUs open; every reading fails
    at = page(FakeNvml(table=everything))
    assert not at.exception
    assert all(metric(at, label).value == "N/A" for label in ("Memory busy", "Power", "SM clock", "PCIe TX"))


def test_gauges_trends_and_the_refresh_pace_are_shown(page):
    at = page(FakeNvml())
    (gauges,) = [m.value for m in at.markdown if "data-gauge" in m.value]
    assert all(t in gauges for t in ("GPU util", "DRAM BW util", "GPU memory used", "Host MemAvailable"))
    assert len(at.get("vega_lite_chart")) == 2  # trends: Vega-Lite, whose data the browser updates in place
    assert any(c.value.startswith("Refreshing every 1 s: 1 viewer") for c in at.caption)
    at.toggle(key="monitor_paused").set_value(True).run()
    assert not any(c.value.startswith("Refreshing every") for c in at.caption)  # paused: not a viewer


@pytest.mark.parametrize("n", [2, 8])
def test_every_gpu_at_once_with_the_chosen_one_in_detail(page, n):
    at = page(FakeNvml(gpus=n, table=multi_gpu_table(n)))
    assert any(h.value == f"All {n} GPUs" for h in at.subheader)
    (table,) = [m.value for m in at.markdown if "data-gpu-table" in m.value]
    assert table.count("<tr>") == n + 1  # a header and a row per GPU
    assert f"{n - 1}: NVIDIA H200</td><td colspan" in table and "is lost" in table  # one row that says why
    assert 'title="N/A: not supported' in table  # GPU 0's power, with the reason on hover
    if n > 2:
        assert "HW thermal" in table
    assert len(at.get("vega_lite_chart")) == 4  # util and DRAM BW by GPU, then the chosen GPU's two
    assert any(h.value == "GPU 0 in detail" for h in at.subheader)
    at.selectbox(key="monitor_gpu").set_value(n - 1).run()
    assert any(h.value == f"GPU {n - 1} in detail" for h in at.subheader)
    assert any("is lost" in e.value for e in at.error)  # the lost GPU's detail says so
    assert not at.exception


def test_one_gpu_has_no_all_gpu_table(page):
    at = page(FakeNvml())
    assert not [m for m in at.markdown if "data-gpu-table" in m.value] and not at.subheader


def test_recorded_mode_replays_the_h200_recording_without_the_live_sampler(monkeypatch):
    """Recorded: the banner says where and when, the gauges and readings come from the recording, and this
    machine's sampler is never started (nothing live is mixed in)."""
    from core.recordings import available

    monkeypatch.setattr(pacing, "_PACER", pacing.Pacer())
    shutdown_sampler()
    rec = available("monitor")[0]
    at = AppTest.from_file(PAGE, default_timeout=30)
    at.session_state["monitor_source"] = "Recorded"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert sampler_mod._SAMPLER is None
    (banner,) = at.warning
    assert "Recorded on NVIDIA H200" in banner.value and "not live" in banner.value and rec.date in banner.value
    assert float(metric(at, "Power").value.split()[0]) > 100  # under the recorded load
    assert any("BF16 decode" in m.value for m in at.markdown)
    assert len(at.get("vega_lite_chart")) == 2
    assert not at.get("download_button")  # the live buffer's downloads belong to live mode
    start = at.slider[0].min
    at.slider[0].set_value(start).run()  # the first second: before the load
    assert not at.exception and "no load running" in " ".join(m.value for m in at.markdown)
    at.session_state["monitor_source"] = "Live"
    at.run()  # back to live: the recording's banner goes, the sampler starts
    assert not at.warning and sampler_mod._SAMPLER is not None
    shutdown_sampler()
