"""The NVML source against FakeNvml: right units and names when all is well, and None-with-a-reason (never an
exception) when any call raises NotSupported, GPUIsLost or anything else."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from core.telemetry.nvml import GPM_FIELDS, GPM_MIN_WINDOW_S, GPU_FIELDS, NvmlSource, decode_throttle
from tests.fakes.nvml import (A100, GIB, PROBE_CALLS, SAMPLED_CALLS, FakeClock, FakeNvml, FunctionNotFound,
                                     GPUIsLost, NotSupported, Unknown)


def make(table=None, gpus=1, **kw):
    clock = FakeClock()
    nv = FakeNvml(gpus=gpus, table=table, **kw)
    src = NvmlSource(nvml=nv, clock=clock)
    return src, nv, clock


def run(src, clock, ticks=4, step=0.3):
    samples = []
    for _ in range(ticks):
        samples.append(src.sample())
        clock.advance(step)
    return samples


def assert_well_formed(sample, gpus=1):
    """Every field of every GPU is present; every None carries a non-empty reason."""
    for i in range(gpus):
        for f in GPU_FIELDS:
            key = f"gpu{i}.{f}"
            assert key in sample.values
            if sample.values[key] is None:
                assert sample.reasons.get(key), f"{key} is None without a reason"


def test_healthy_h200_units_and_names():
    src, nv, clock = make()
    assert src.probe().ok
    assert src.driver_version == "570.124.06" and src.cuda_driver_version == "12.8"
    (gpu,) = src.gpus
    assert (gpu.name, gpu.compute_capability, gpu.gpm.ok) == ("NVIDIA H200", "9.0", True)

    first = src.sample()
    assert "first GPM window" in first.reasons["gpu0.dram_bw_util_pct"]  # one GPM sample is not a measurement
    clock.advance(0.25)
    v = src.sample().values
    assert v["gpu0.util_pct"] == 97 and v["gpu0.mem_busy_pct"] == 88
    assert v["gpu0.dram_bw_util_pct"] == pytest.approx(88.6) and v["gpu0.sm_util_pct"] == 91
    assert v["gpu0.pcie_tx_bytes_s"] == 12 * 2**20 and v["gpu0.pcie_rx_bytes_s"] == 34 * 2**20
    assert v["gpu0.mem_used_bytes"] == 80 * GIB and v["gpu0.mem_total_bytes"] == 141 * GIB
    assert v["gpu0.power_w"] == 650 and v["gpu0.power_limit_w"] == 700
    assert (v["gpu0.sm_clock_mhz"], v["gpu0.mem_clock_mhz"], v["gpu0.temp_c"]) == (1980, 3201, 61)
    assert v["gpu0.throttle_reasons"] == "SW power cap"
    assert "nvmlDeviceGetPcieThroughput" not in nv.calls  # GPM gives PCIe; the blocking legacy query is not used


def test_processes_per_gpu_are_named():
    src, _, clock = make()
    src.probe()
    s = src.sample()
    (proc,) = s.tables["gpu0.processes"]
    assert proc["gpu_mem_bytes"] == 2 * GIB and proc["name"]  # our own PID, named through psutil


def test_a100_has_no_gpm_and_says_why():
    src, nv, clock = make(A100)
    src.probe()
    assert not src.gpus[0].gpm.ok and "Hopper" in src.gpus[0].gpm.reason
    s = run(src, clock)[-1]
    assert s.values["gpu0.dram_bw_util_pct"] is None
    assert "Hopper" in s.reasons["gpu0.dram_bw_util_pct"] and "not bandwidth" in s.reasons["gpu0.dram_bw_util_pct"]
    assert s.values["gpu0.pcie_tx_bytes_s"] == 1000 * 1024  # legacy counter, KB/s
    assert s.values["gpu0.util_pct"] == 97
    assert "nvmlGpmSampleGet" not in nv.calls
    assert_well_formed(s)


def test_gpm_samples_stay_at_least_the_minimum_window_apart():
    clock, taken = FakeClock(), []
    nv = FakeNvml(table={"nvmlGpmSampleGet": lambda gpu, n: taken.append(clock.now)})
    src = NvmlSource(nvml=nv, clock=clock)
    src.probe()
    assert len(taken) == 1  # the anchor, taken at probe
    values = [s.values["gpu0.dram_bw_util_pct"] for s in run(src, clock, ticks=12, step=0.05)]  # 20 Hz
    gaps = [b - a for a, b in zip(taken, taken[1:])]
    assert len(gaps) == 2 and min(gaps) >= GPM_MIN_WINDOW_S - 1e-9
    assert nv.calls["nvmlGpmMetricsGet"] == 2
    assert values[-1] == pytest.approx(88.6)  # carried forward between windows


def test_one_gpm_metric_failing_leaves_the_others():
    src, _, clock = make({"gpm_return": {FakeNvml().NVML_GPM_METRIC_SM_UTIL: 3}})
    src.probe()
    s = run(src, clock)[-1]
    assert s.values["gpu0.sm_util_pct"] is None and "return code 3" in s.reasons["gpu0.sm_util_pct"]
    assert s.values["gpu0.dram_bw_util_pct"] == pytest.approx(88.6)


# The scenario table: every call NvmlSource makes while sampling, the fields it feeds, through every kind of error.
FEEDS = {
    "nvmlDeviceGetUtilizationRates": ("util_pct", "mem_busy_pct"),
    "nvmlDeviceGetMemoryInfo": ("mem_used_bytes", "mem_total_bytes"),
    "nvmlDeviceGetPowerUsage": ("power_w",),
    "nvmlDeviceGetEnforcedPowerLimit": ("power_limit_w",),
    "nvmlDeviceGetClockInfo": ("sm_clock_mhz", "mem_clock_mhz"),
    "nvmlDeviceGetTemperature": ("temp_c",),
    "nvmlDeviceGetCurrentClocksEventReasons": ("throttle_reasons",),  # unless NotSupported: see the fallback
    "nvmlDeviceGetComputeRunningProcesses": (),  # a table, not a field: checked below
    "nvmlGpmSampleGet": GPM_FIELDS,
    "nvmlGpmMetricsGet": GPM_FIELDS,
}
assert set(FEEDS) == set(SAMPLED_CALLS)


@pytest.mark.parametrize("error", [NotSupported, Unknown, GPUIsLost], ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", SAMPLED_CALLS)
def test_any_sampled_call_can_fail(call, error):
    src, nv, clock = make(gpus=2)
    assert src.probe().ok
    nv.table[call] = error  # from now on, while sampling (tests below cover failures during probe)
    samples = run(src, clock, ticks=5)  # must not raise
    last = samples[-1]
    assert_well_formed(last, gpus=2)
    if error is GPUIsLost:
        assert all(last.values[f"gpu0.{f}"] is None for f in GPU_FIELDS)
        assert "lost" in last.reasons["gpu0.util_pct"] and "Xid" in last.reasons["gpu0.util_pct"]
        assert src.gpus[0].lost and src.gpus[1].lost  # the table makes both GPUs fail
        calls = dict(nv.calls)
        run(src, clock, ticks=3)
        assert nv.calls == calls  # a lost GPU is not asked again every tick
        return
    feeds = FEEDS[call]
    if call == "nvmlDeviceGetCurrentClocksEventReasons" and error is NotSupported:
        feeds = ()  # retried once with the pre-R535 name, which the fake still answers
    for f in GPU_FIELDS:  # exactly the fields this call feeds are N/A, each with a reason naming the failure
        if f in feeds:
            assert last.values[f"gpu0.{f}"] is None and error().__str__() in last.reasons[f"gpu0.{f}"]
        else:
            assert last.values[f"gpu0.{f}"] is not None, f
    if call == "nvmlDeviceGetComputeRunningProcesses":
        assert last.tables["gpu0.processes"] == [] and last.reasons["gpu0.processes"]


@pytest.mark.parametrize("error", [NotSupported, Unknown, GPUIsLost], ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", PROBE_CALLS)
def test_any_probe_call_can_fail(call, error):
    src, _, clock = make({call: error})
    src.probe()  # may be ok or not; must not raise
    for s in run(src, clock):
        assert_well_formed(s, gpus=len(src.gpus))
    if call.startswith("nvmlSystem"):  # versions are decoration: the GPU is still polled
        assert s.values["gpu0.util_pct"] == 97
    elif error is GPUIsLost or call == "nvmlDeviceGetHandleByIndex":
        assert src.gpus[0].lost and s.values["gpu0.util_pct"] is None and s.reasons["gpu0.util_pct"]
    else:
        assert not src.gpus[0].lost and s.values["gpu0.util_pct"] == 97
        if call.startswith("nvmlGpm"):  # no GPM: DRAM BW is N/A with the reason, PCIe comes from the old counters
            assert s.values["gpu0.dram_bw_util_pct"] is None and "GPM" in s.reasons["gpu0.dram_bw_util_pct"]
            assert s.values["gpu0.pcie_rx_bytes_s"] == 1000 * 1024


def test_only_the_lost_gpu_goes_dark():
    def lost_after_three(gpu, n):
        if n > 3:
            raise GPUIsLost()
        return FakeNvml().table["nvmlDeviceGetUtilizationRates"]

    src, _, clock = make({("nvmlDeviceGetUtilizationRates", 1): lost_after_three}, gpus=2)
    src.probe()
    last = run(src, clock, ticks=8)[-1]
    assert src.gpus[1].lost and not src.gpus[0].lost
    assert last.values["gpu1.power_w"] is None and "is lost" in last.reasons["gpu1.power_w"]
    assert last.values["gpu0.util_pct"] == 97
    assert last.tables["gpu1.processes"] == []


def test_not_supported_is_asked_once_and_logged_once(caplog):
    src, nv, clock = make({"nvmlDeviceGetPowerUsage": NotSupported})
    src.probe()
    with caplog.at_level(logging.WARNING, logger="triage.telemetry"):
        last = run(src, clock, ticks=20)[-1]
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 1
    assert last.values["gpu0.power_w"] is None and "not supported" in last.reasons["gpu0.power_w"]
    assert len([r for r in caplog.records if "power_w" in r.getMessage()]) == 1


def test_transient_errors_are_retried_but_logged_once(caplog):
    src, nv, clock = make({"nvmlDeviceGetUtilizationRates": Unknown})
    src.probe()
    with caplog.at_level(logging.WARNING, logger="triage.telemetry"):
        run(src, clock, ticks=20)
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 20
    assert len([r for r in caplog.records if "util_pct" in r.getMessage()]) == 1


def test_old_driver_falls_back_to_throttle_reasons():
    src, _, clock = make({"nvmlDeviceGetCurrentClocksEventReasons": FunctionNotFound,
                          "nvmlDeviceGetCurrentClocksThrottleReasons": 0x44})
    src.probe()
    last = run(src, clock, ticks=6)[-1]  # 1.5 s: the second slow tick uses the old name
    assert last.values["gpu0.throttle_reasons"] == "SW power cap, HW thermal"


@pytest.mark.parametrize("error, text", [
    (FakeNvml().NVMLError_LibraryNotFound(), "No NVIDIA driver"),
    (FakeNvml().NVMLError_DriverNotLoaded(), "not loaded"),
    (Unknown(), "could not start"),
])
def test_probe_explains_a_missing_driver(error, text):
    src, _, clock = make(init_error=error)
    av = src.probe()
    assert not av.ok and text in av.reason
    assert src.sample().values == {}


def test_no_gpus():
    src, _, _ = make({"nvmlDeviceGetCount": 0})
    av = src.probe()
    assert not av.ok and "no GPUs" in av.reason


def test_close_frees_gpm_buffers():
    src, nv, _ = make(gpus=2)
    src.probe()
    src.close()
    assert nv.freed == 4


def test_decode_throttle():
    assert decode_throttle(0) == ""
    assert decode_throttle(0x1) == "idle"
    assert decode_throttle(0x44) == "SW power cap, HW thermal"
    assert decode_throttle(0x1000) == "other (0x1000)"


def test_importing_telemetry_touches_no_gpu():
    """Importing core.telemetry (and the chart builders) must not import torch or pynvml: no CUDA context."""
    code = ("import sys; import core.telemetry.sampler, core.telemetry.nvml, core.telemetry.host, "
            "core.telemetry.base, core.monitor.frames; "
            "bad = [m for m in ('torch', 'pynvml') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
