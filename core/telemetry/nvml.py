"""NVML source: every NVIDIA GPU on the host, read through the `pynvml` module (package nvidia-ml-py).

pynvml is imported lazily in probe(), never at import time, and NVML itself never creates a CUDA context, so importing
or probing this module is safe in any process. Facts this relies on:
- NVML `utilization.gpu` is the share of time any kernel ran; `utilization.memory` is the share of time memory was
  read or written ("memory busy"). Neither is bandwidth.
- DRAM bandwidth utilization comes from NVML GPM (NVML_GPM_METRIC_DRAM_BW_UTIL), Hopper and newer: GPM computes
  metrics from two samples taken an interval apart.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from core.telemetry.base import Availability, FailureLog, Sample

# NVML documents that two GPM samples must be more than 100 ms apart (its counters refresh about every 100 ms).
# With a margin, GPM values are recomputed at most every 0.2 s and carried forward between windows.
GPM_MIN_WINDOW_S = 0.2
# Clocks, temperature, throttle reasons, power limit, processes and the legacy PCIe counters change slowly or cost
# more (the legacy PCIe query blocks ~20 ms per counter), so they are read once a second and carried forward.
SLOW_PERIOD_S = 1.0

FAST_FIELDS = ("util_pct", "mem_busy_pct", "mem_used_bytes", "mem_total_bytes", "power_w")
GPM_FIELDS = ("dram_bw_util_pct", "sm_util_pct", "pcie_tx_bytes_s", "pcie_rx_bytes_s")
SLOW_FIELDS = ("power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "throttle_reasons")
GPU_FIELDS = FAST_FIELDS + GPM_FIELDS + SLOW_FIELDS

# (pynvml constant name, our field, scale to our unit). GPM reports PCIe in MiB/s.
_GPM_METRICS = (
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_bw_util_pct", 1.0),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_util_pct", 1.0),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_s", 2.0**20),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_s", 2.0**20),
)

# Clock event ("throttle") reason bits, from nvml.h; literal so decoding does not depend on the binding's version.
THROTTLE_REASONS = (
    (0x001, "idle"),
    (0x002, "applications clocks"),
    (0x004, "SW power cap"),
    (0x008, "HW slowdown"),
    (0x010, "sync boost"),
    (0x020, "SW thermal"),
    (0x040, "HW thermal"),
    (0x080, "HW power brake"),
    (0x100, "display clocks"),
)


def decode_throttle(mask: int) -> str:
    """Bit mask -> comma-separated names ("" when the clocks are not held back)."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"other (0x{mask & ~known:x})")
    return ", ".join(names)


# NVML return codes (nvml.h). Errors are matched by code, not class name: pynvml derives the class names
# (NVMLError_GpuIsLost, not ...GPUIsLost) and they have changed between binding versions.
NOT_SUPPORTED, NO_DRIVER, NO_PERMISSION, NO_LIBRARY, NO_FUNCTION, LOST = 3, 9, 4, 12, 13, 15


def _is(exc: BaseException, *codes: int) -> bool:
    return getattr(exc, "value", None) in codes and type(exc).__name__.startswith("NVMLError")


class _GpuLost(Exception):
    pass


@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str
    compute_capability: str | None  # "9.0"; None if NVML would not say
    gpm: Availability  # whether DRAM BW util (GPM) is available on this GPU, and why not
    lost: bool = False
    lost_reason: str = ""


class _Gpu:
    """Polling state of one device: its handle, fields known unsupported, GPM sample buffers, carried-forward values."""

    def __init__(self, info: GpuInfo, handle: Any):
        self.info = info
        self.handle = handle
        self.unsupported: dict[str, str] = {}  # "fn:field" -> reason. NotSupported is permanent: stop asking
        self.gpm_a = self.gpm_b = self.gpm_req = None
        self.gpm_t = 0.0
        self.gpm_vals: dict[str, float] = {}
        self.gpm_why = dict.fromkeys(GPM_FIELDS, "waiting for the first GPM window (two samples 0.2 s apart)")
        self.slow_t = -math.inf
        self.slow_vals: dict[str, Any] = {}
        self.slow_why: dict[str, str] = {}
        self.processes: list[dict[str, Any]] | None = []
        self.processes_why = ""


class NvmlSource:
    """GPU telemetry for every GPU NVML sees. `nvml` may be a stand-in module (tests use a FakeNvml)."""

    name = "nvml"

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.monotonic):
        self._nv = nvml
        self._clock = clock
        self._availability: Availability | None = None
        self._gpus: list[_Gpu] = []
        self._fail = FailureLog(self.name)
        self._pid_names: dict[int, str] = {}
        self.driver_version: str | None = None
        self.cuda_driver_version: str | None = None  # the newest CUDA this driver supports, "12.8"

    @property
    def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    # --- probe ---------------------------------------------------------------------------------------------------
    def probe(self) -> Availability:
        if self._availability is None:
            self._availability = self._probe()
        return self._availability

    def _probe(self) -> Availability:
        if self._nv is None:
            try:
                import pynvml  # lazy: the package is optional on CPU-only machines
            except ImportError:
                return Availability(False, "The nvidia-ml-py package (module pynvml) is not installed, so GPU "
                                           "telemetry is off. Install it with `pip install nvidia-ml-py`.")
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except Exception as exc:
            return Availability(False, _init_failure(exc))
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as exc:
            return Availability(False, f"NVML started but could not count GPUs ({_err(exc)}). Check `nvidia-smi`.")
        if count == 0:
            return Availability(False, "NVML started but found no GPUs. Check `nvidia-smi` and, in a container, "
                                       "that the GPUs are passed through (--gpus all).")
        self.driver_version = self._static(nv.nvmlSystemGetDriverVersion)
        cuda = self._static(nv.nvmlSystemGetCudaDriverVersion)
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        for index in range(count):
            self._gpus.append(self._open_gpu(index))
        return Availability(True, f"{count} GPU(s) via NVML, driver {self.driver_version or 'N/A'}")

    def _static(self, fn: Callable, *args: Any, lost_raises: bool = False) -> Any:
        """A reading that only decorates (names, versions): on failure it is None, logged once."""
        try:
            return fn(*args)
        except Exception as exc:
            if lost_raises and _is(exc, LOST):
                raise
            self._fail.once(getattr(fn, "__name__", "static"), _err(exc))
            return None

    def _open_gpu(self, index: int) -> _Gpu:
        nv = self._nv
        gpu = _Gpu(GpuInfo(index, f"GPU {index}", "", None, Availability(False, "GPU not reachable")), None)
        try:
            gpu.handle = nv.nvmlDeviceGetHandleByIndex(index)
            gpu.info.name = self._static(nv.nvmlDeviceGetName, gpu.handle, lost_raises=True) or gpu.info.name
            gpu.info.uuid = self._static(nv.nvmlDeviceGetUUID, gpu.handle, lost_raises=True) or ""
            cc = self._static(nv.nvmlDeviceGetCudaComputeCapability, gpu.handle, lost_raises=True)
        except Exception as exc:  # no handle, or lost while we looked at it
            self._mark_lost(gpu, exc)
            return gpu
        gpu.info.compute_capability = f"{cc[0]}.{cc[1]}" if cc else None
        gpu.info.gpm = self._gpm_setup(gpu)
        if not gpu.info.gpm.ok:  # PCIe then comes from the legacy counters, in the slow tier
            gpu.gpm_why = dict.fromkeys(("dram_bw_util_pct", "sm_util_pct"), gpu.info.gpm.reason)
        return gpu

    def _gpm_setup(self, g: _Gpu) -> Availability:
        nv, info = self._nv, g.info
        unsupported = Availability(False, f"NVML GPM is not supported on {info.name} (needs Hopper or newer, "
                                          f"compute capability >= 9.0; found {info.compute_capability or 'unknown'}), "
                                          "so DRAM bandwidth utilization is N/A. 'Memory busy' is not bandwidth; "
                                          "use DCGM (DCGM_FI_PROF_DRAM_ACTIVE) where available.")
        try:
            if not nv.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice:
                return unsupported
            g.gpm_a, g.gpm_b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            req = nv.c_nvmlGpmMetricsGet_t()  # reused every window: metric ids are set once
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(_GPM_METRICS)
            for i, (const, _, _) in enumerate(_GPM_METRICS):
                req.metrics[i].metricId = getattr(nv, const)
            g.gpm_req = req
            nv.nvmlGpmSampleGet(g.handle, g.gpm_a)
            g.gpm_t = self._clock()
            return Availability(True, "NVML GPM")
        except Exception as exc:
            if _is(exc, LOST):
                self._mark_lost(g, exc)
            self._free_gpm(g)
            if _is(exc, NOT_SUPPORTED, NO_FUNCTION):
                return unsupported
            return Availability(False, f"NVML GPM could not start on {info.name}: {_err(exc)}")

    def _free_gpm(self, g: _Gpu) -> None:
        for buf in (g.gpm_a, g.gpm_b):
            if buf is not None:
                try:
                    self._nv.nvmlGpmSampleFree(buf)
                except Exception:
                    pass
        g.gpm_a = g.gpm_b = g.gpm_req = None

    # --- sample --------------------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        now, t = self._clock(), time.time()
        values: dict[str, Any] = {}
        reasons: dict[str, str] = {}
        tables: dict[str, list[dict[str, Any]]] = {}
        for g in self._gpus:
            prefix = f"gpu{g.info.index}."
            vals: dict[str, Any] = dict.fromkeys(GPU_FIELDS)
            why: dict[str, str] = {}
            try:
                if not g.info.lost:
                    self._sample_gpu(g, now, vals, why)
            except _GpuLost as lost:
                self._mark_lost(g, lost.__cause__ or lost)
            except Exception as exc:  # backstop: sample() never raises
                self._fail.once(prefix + "*", f"unexpected error: {exc!r}")
                why = {f: f"unexpected error while polling: {_err(exc)}" for f in GPU_FIELDS}
                vals = dict.fromkeys(GPU_FIELDS)
            if g.info.lost:
                vals = dict.fromkeys(GPU_FIELDS)
                why = {f: g.info.lost_reason for f in GPU_FIELDS}
            for f in GPU_FIELDS:
                values[prefix + f] = vals[f]
                if vals[f] is None:
                    reasons[prefix + f] = why.get(f, "no reading")
            tables[prefix + "processes"] = [] if g.info.lost else (g.processes or [])
            if g.processes is None and not g.info.lost:
                reasons[prefix + "processes"] = g.processes_why
        return Sample(self.name, t, values, reasons, tables)

    def _sample_gpu(self, g: _Gpu, now: float, vals: dict, why: dict) -> None:
        h = g.handle
        util = self._read(g, why, ("util_pct", "mem_busy_pct"), "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            vals["util_pct"], vals["mem_busy_pct"] = float(util.gpu), float(util.memory)
        mem = self._read(g, why, ("mem_used_bytes", "mem_total_bytes"), "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            vals["mem_used_bytes"], vals["mem_total_bytes"] = int(mem.used), int(mem.total)
        mw = self._read(g, why, ("power_w",), "nvmlDeviceGetPowerUsage", h)
        if mw is not None:
            vals["power_w"] = mw / 1000.0
        self._gpm_tick(g, now)
        vals.update(g.gpm_vals)
        why.update(g.gpm_why)
        if now - g.slow_t >= SLOW_PERIOD_S:
            g.slow_t = now
            self._slow(g)
        vals.update(g.slow_vals)
        why.update(g.slow_why)

    def _slow(self, g: _Gpu) -> None:
        nv, h = self._nv, g.handle
        vals: dict[str, Any] = {}
        why: dict[str, str] = {}
        mw = self._read(g, why, ("power_limit_w",), "nvmlDeviceGetEnforcedPowerLimit", h)
        vals["power_limit_w"] = None if mw is None else mw / 1000.0
        vals["sm_clock_mhz"] = self._read(g, why, ("sm_clock_mhz",), "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        vals["mem_clock_mhz"] = self._read(g, why, ("mem_clock_mhz",), "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM)
        vals["temp_c"] = self._read(g, why, ("temp_c",), "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        # "Clocks event reasons" replaced "throttle reasons" in newer drivers; older ones only have the latter.
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(nv, fn) or _key(fn, "throttle_reasons") in g.unsupported:
            fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        mask = self._read(g, why, ("throttle_reasons",), fn, h)
        vals["throttle_reasons"] = None if mask is None else decode_throttle(int(mask))
        if g.gpm_req is None:  # without GPM, the legacy PCIe counters (20 ms each; KB/s, read as KiB/s)
            for field, counter in (("pcie_tx_bytes_s", nv.NVML_PCIE_UTIL_TX_BYTES),
                                   ("pcie_rx_bytes_s", nv.NVML_PCIE_UTIL_RX_BYTES)):
                kb = self._read(g, why, (field,), "nvmlDeviceGetPcieThroughput", h, counter)
                vals[field] = None if kb is None else kb * 1024.0
        # vLLM and torch run as compute processes; graphics contexts are not what this console watches.
        procs = self._read(g, why, ("processes",), "nvmlDeviceGetComputeRunningProcesses", h)
        g.processes_why = why.pop("processes", "")
        g.processes = None if procs is None else [
            {"pid": p.pid, "name": self._pid_name(p.pid), "gpu_mem_bytes": p.usedGpuMemory} for p in procs]
        g.slow_vals = {k: v for k, v in vals.items() if v is not None}
        g.slow_why = why

    def _gpm_tick(self, g: _Gpu, now: float) -> None:
        if g.gpm_req is None or now - g.gpm_t < GPM_MIN_WINDOW_S:
            return  # keep the last window's values
        nv, req = self._nv, g.gpm_req
        try:
            nv.nvmlGpmSampleGet(g.handle, g.gpm_b)
            req.sample1, req.sample2 = g.gpm_a, g.gpm_b
            nv.nvmlGpmMetricsGet(req)
        except Exception as exc:
            if _is(exc, LOST):
                raise _GpuLost() from exc
            reason = f"NVML GPM read failed: {_err(exc)}"
            self._fail.once(f"gpu{g.info.index}.gpm", reason)
            g.gpm_vals, g.gpm_why = {}, {f: reason for f in GPM_FIELDS}
            return
        vals, why = {}, {}
        for i, (_, field, scale) in enumerate(_GPM_METRICS):
            metric = req.metrics[i]
            if metric.nvmlReturn == 0 and math.isfinite(metric.value):
                vals[field] = float(metric.value) * scale
            else:
                why[field] = f"GPM metric not available on this GPU (NVML return code {metric.nvmlReturn})"
                self._fail.once(f"gpu{g.info.index}.{field}", why[field])
        g.gpm_a, g.gpm_b = g.gpm_b, g.gpm_a  # the newest sample opens the next window
        g.gpm_t = now
        g.gpm_vals, g.gpm_why = vals, why

    def _read(self, g: _Gpu, why: dict, fields: tuple[str, ...], fn_name: str, *args: Any) -> Any:
        """One NVML call for `fields`. Failure -> None and a reason per field; GPUIsLost ends polling of this GPU."""
        known = g.unsupported.get(_key(fn_name, fields[0]))
        if known:
            why.update(dict.fromkeys(fields, known))
            return None
        nv = self._nv
        try:
            return getattr(nv, fn_name)(*args)
        except Exception as exc:
            if _is(exc, LOST):
                raise _GpuLost() from exc
            if _is(exc, NOT_SUPPORTED, NO_FUNCTION) or isinstance(exc, AttributeError):
                reason = f"not supported by this GPU or driver ({fn_name}: {_err(exc)})"
                g.unsupported[_key(fn_name, fields[0])] = reason
            else:
                reason = f"{fn_name} failed: {_err(exc)}"
            why.update(dict.fromkeys(fields, reason))
            self._fail.once(f"gpu{g.info.index}.{fields[0]}", reason)
            return None

    def _mark_lost(self, g: _Gpu, exc: BaseException) -> None:
        """Stop polling a GPU that is gone: asking again every tick only returns the same error, slowly."""
        g.info.lost = True
        if _is(exc, LOST):
            g.info.lost_reason = (f"GPU {g.info.index} is lost ({_err(exc)}): it fell off the bus or stopped "
                                  "answering. Check `dmesg` for Xid errors (79 = fallen off the bus), then reset "
                                  "the GPU or reboot the node.")
        else:
            g.info.lost_reason = f"NVML could not open GPU {g.info.index} ({_err(exc)}). Check `nvidia-smi`."
        self._fail.once(f"gpu{g.info.index}", g.info.lost_reason)
        self._free_gpm(g)
        g.processes = []

    def _pid_name(self, pid: int) -> str:
        name = self._pid_names.get(pid)
        if name is None:
            try:
                import psutil  # lazy: the GPU side must also work where psutil is absent

                name = psutil.Process(pid).name()
            except Exception:  # no psutil, another PID namespace (container), or already gone: ask the driver
                name = self._static(self._nv.nvmlSystemGetProcessName, pid) or "?"
            if len(self._pid_names) > 1000:
                self._pid_names.clear()
            self._pid_names[pid] = name
        return name

    def close(self) -> None:
        for g in self._gpus:
            self._free_gpm(g)
        if self._availability is not None and self._availability.ok:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
        self._gpus = []
        self._availability = None


def _key(fn_name: str, field: str) -> str:
    return f"{fn_name}:{field}"


def _err(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"NVML: {text}" if "NVML" in type(exc).__name__ else text


def _init_failure(exc: Exception) -> str:
    if _is(exc, NO_LIBRARY):
        return ("No NVIDIA driver here: libnvidia-ml.so.1 was not found (no NVIDIA GPU, or the driver is not "
                "installed or not mounted into this container). GPU telemetry is off.")
    if _is(exc, NO_DRIVER):
        return "The NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded). Check `nvidia-smi` and dmesg."
    if _is(exc, NO_PERMISSION):
        return "NVML refused access (No Permission). Run as a user allowed to read /dev/nvidia*."
    return f"NVML could not start ({_err(exc)}). Check `nvidia-smi`."
