"""FakeNvml: a stand-in for the `pynvml` module, driven by a scenario table, for unit-testing the NVML source's
error handling without a GPU (docs/DESIGN.md allows a fake NVML for exactly this; the real path runs in tests/gpu on
the GPU machine).

The fake reuses pynvml's real exception classes and constants, so `except pynvml.NVMLError_NotSupported` behaves
as it would against a driver. Every NVML function the source calls is a method here; a scenario overrides any of
them, for every GPU or one, with a value, an exception to raise, or a function of (gpu index, call count).

Imported as tests.fakes.nvml by the telemetry unit tests and the Monitor and Diagnostics page tests; its own checks
are in tests/unit/test_telemetry_fakenvml.py.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pynvml as real

GIB = 1024**3
NotSupported = real.NVMLError_NotSupported
GPUIsLost = real.NVMLError_GpuIsLost  # pynvml spells it GpuIsLost
Unknown = real.NVMLError_Unknown
FunctionNotFound = real.NVMLError_FunctionNotFound

# The healthy H200 every scenario starts from. GPM values are what an H200 showed under a copy load.
H200 = {
    "nvmlSystemGetDriverVersion": "570.124.06",
    "nvmlSystemGetCudaDriverVersion": 12080,
    "nvmlDeviceGetName": "NVIDIA H200",
    "nvmlDeviceGetUUID": lambda i, n: f"GPU-fake-{i}",
    "nvmlDeviceGetCudaComputeCapability": (9, 0),
    "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=97, memory=88),
    "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=80 * GIB, total=141 * GIB, free=61 * GIB),
    "nvmlDeviceGetPowerUsage": 650_000,  # mW
    "nvmlDeviceGetEnforcedPowerLimit": 700_000,  # mW
    "nvmlDeviceGetClockInfo": {real.NVML_CLOCK_SM: 1980, real.NVML_CLOCK_MEM: 3201},
    "nvmlDeviceGetTemperature": 61,
    "nvmlDeviceGetCurrentClocksEventReasons": 0x4,  # SW power cap
    "nvmlDeviceGetCurrentClocksThrottleReasons": 0x4,
    "nvmlDeviceGetPcieThroughput": 1000,  # KB/s; only read without GPM
    "nvmlDeviceGetComputeRunningProcesses": [SimpleNamespace(pid=os.getpid(), usedGpuMemory=2 * GIB)],
    "nvmlGpmQueryDeviceSupport": SimpleNamespace(isSupportedDevice=1),
    "gpm": {real.NVML_GPM_METRIC_DRAM_BW_UTIL: 88.6, real.NVML_GPM_METRIC_SM_UTIL: 91.0,
            real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 12.0, real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 34.0},
    "gpm_return": {},  # metric id -> NVML return code, for one metric failing inside a good GpmMetricsGet
}

# An A100: no GPM, so no DRAM bandwidth metric and PCIe from the legacy counters.
A100 = {"nvmlDeviceGetName": "NVIDIA A100-SXM4-80GB", "nvmlDeviceGetCudaComputeCapability": (8, 0),
        "nvmlGpmQueryDeviceSupport": SimpleNamespace(isSupportedDevice=0)}


class _GpmRequest:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t (a ctypes struct that only takes real sample pointers)."""

    def __init__(self):
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(real.NVML_GPM_METRIC_MAX)]


class FakeNvml:
    """A fake pynvml module. `table` overrides H200 defaults; keys are function names, or (name, gpu index)."""

    c_nvmlGpmMetricsGet_t = _GpmRequest

    def __init__(self, gpus: int = 1, table: dict | None = None, init_error: Exception | None = None):
        self.gpu_count = gpus
        self.table: dict[Any, Any] = {**H200, **(table or {})}
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.freed = 0

    def __getattr__(self, name: str) -> Any:
        # Constants and exception classes come from the real binding; NVML *functions* never do.
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(real, name)
        raise AttributeError(name)

    def _answer(self, name: str, gpu: int | None, *args: Any) -> Any:
        self.calls[name] = self.calls.get(name, 0) + 1
        value = self.table.get((name, gpu), self.table.get(name))
        if isinstance(value, type) and issubclass(value, BaseException):
            raise value()
        if isinstance(value, BaseException):
            raise value
        if callable(value):
            return value(gpu, self.calls[name])
        if isinstance(value, dict) and args:
            return value[args[0]]
        return value

    # --- library and system ----------------------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.table.get("nvmlDeviceGetCount", self.gpu_count)

    def nvmlSystemGetDriverVersion(self):
        return self._answer("nvmlSystemGetDriverVersion", None)

    def nvmlSystemGetCudaDriverVersion(self):
        return self._answer("nvmlSystemGetCudaDriverVersion", None)

    def nvmlSystemGetProcessName(self, pid):
        return "fake-process"

    # --- devices: the handle is the index ----------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, i):
        self._answer("nvmlDeviceGetHandleByIndex", i)
        return i

    def nvmlDeviceGetName(self, h):
        return self._answer("nvmlDeviceGetName", h)

    def nvmlDeviceGetUUID(self, h):
        return self._answer("nvmlDeviceGetUUID", h)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self._answer("nvmlDeviceGetCudaComputeCapability", h)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._answer("nvmlDeviceGetUtilizationRates", h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._answer("nvmlDeviceGetMemoryInfo", h)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._answer("nvmlDeviceGetPowerUsage", h)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._answer("nvmlDeviceGetEnforcedPowerLimit", h)

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._answer("nvmlDeviceGetClockInfo", h, clock)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._answer("nvmlDeviceGetTemperature", h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._answer("nvmlDeviceGetCurrentClocksEventReasons", h)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._answer("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self._answer("nvmlDeviceGetPcieThroughput", h)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._answer("nvmlDeviceGetComputeRunningProcesses", h)

    # --- GPM -------------------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        return self._answer("nvmlGpmQueryDeviceSupport", h)

    def nvmlGpmSampleAlloc(self):
        self._answer("nvmlGpmSampleAlloc", None)
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmSampleGet(self, h, sample):
        self._answer("nvmlGpmSampleGet", h)
        sample.gpu = h
        return sample

    def nvmlGpmMetricsGet(self, req):
        self._answer("nvmlGpmMetricsGet", req.sample2.gpu)
        values, codes = self.table["gpm"], self.table["gpm_return"]
        for m in req.metrics[: req.numMetrics]:
            m.nvmlReturn = codes.get(m.metricId, 0)
            m.value = values.get(m.metricId, 0.0) if m.nvmlReturn == 0 else 0.0
        return req


# Every NVML function NvmlSource may call while sampling; the failure tests run each through each error.
SAMPLED_CALLS = ["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
                 "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses",
                 "nvmlGpmSampleGet", "nvmlGpmMetricsGet"]
PROBE_CALLS = ["nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetHandleByIndex",
               "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetCudaComputeCapability",
               "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet"]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def multi_gpu_table(n: int) -> dict:
    """An n-GPU host with one GPU of each kind of trouble: the last GPU lost, GPU 0 without power readings, and
    (from 3 GPUs on) GPU 1 thermally throttled and nearly idle while the others are busy."""
    table: dict[Any, Any] = {("nvmlDeviceGetUtilizationRates", n - 1): GPUIsLost,
                             ("nvmlDeviceGetPowerUsage", 0): NotSupported}
    if n > 2:
        table[("nvmlDeviceGetCurrentClocksEventReasons", 1)] = 0x40  # HW thermal
        table[("nvmlDeviceGetCurrentClocksThrottleReasons", 1)] = 0x40
        table[("nvmlDeviceGetUtilizationRates", 1)] = SimpleNamespace(gpu=3, memory=1)
    return table
