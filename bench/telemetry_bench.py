"""Telemetry sampler cost: CPU time and achieved rate at 10 Hz and 20 Hz, per-source cost per sample, and the
memory a full 10-minute buffer takes. Target: under 1% of one core at 10 Hz.

    python -m bench.telemetry_bench [--seconds 15] [--rates 10 20]

Runs the real default sources (NVML where a driver is present, psutil host). Prints a Markdown table; record the
results, with the machine and date, in docs/perf-log/telemetry.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc
from datetime import datetime, timezone


from core.telemetry.sampler import Sampler, default_sources


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def measure_rate(rate_hz: float, seconds: float, warmup_s: float = 2.0) -> dict:
    """Run a fresh sampler thread; its cost is the process's CPU time (the main thread only sleeps) and, as the
    sampler itself reports it, the thread's CPU time over the last ~10 s."""
    sampler = Sampler(default_sources(), rate_hz=rate_hz).start()
    try:
        time.sleep(warmup_s)  # first ticks pay one-off costs (process scan, GPM anchor)
        ticks0, cpu0, wall0 = sampler.stats().ticks, time.process_time(), time.monotonic()
        time.sleep(seconds)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        st = sampler.stats()
        return {"rate": rate_hz, "achieved": (st.ticks - ticks0) / wall, "proc_cpu_pct": 100 * cpu / wall,
                "thread_cpu_pct": st.cpu_pct_of_core, "ms_per_tick": st.cpu_ms_per_tick, "overruns": st.overruns,
                "sampler": sampler}
    finally:
        sampler.stop()


def per_source_cost(n: int = 300) -> list[tuple[str, str, float]]:
    """CPU ms per sample() call of each source, called back to back (includes the slow tier 1 in 10 calls at 10 Hz
    only when real time passes, so this is the fast path; the rate runs above include everything)."""
    out = []
    for src in default_sources():
        av = src.probe()
        if not av.ok:
            out.append((src.name, f"off: {av.reason}", float("nan")))
            continue
        src.sample()
        c0 = time.thread_time()
        for _ in range(n):
            src.sample()
        out.append((src.name, av.reason, 1000 * (time.thread_time() - c0) / n))
        src.close()
    return out


def nvml_call_costs(n: int = 50) -> list[tuple[str, float, float]]:
    """(call, CPU ms, wall ms) per NVML call on GPU 0, to see which call dominates the NVML source's cost."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:
        return []
    h = nv.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "GetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "GetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "GetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "GetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "GetTemperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "GetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "GetComputeRunningProcesses": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
    }
    try:
        if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, a)
            time.sleep(0.2)
            nv.nvmlGpmSampleGet(h, b)
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version, req.numMetrics, req.sample1, req.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 4, a, b
            for i, m in enumerate((nv.NVML_GPM_METRIC_DRAM_BW_UTIL, nv.NVML_GPM_METRIC_SM_UTIL,
                                   nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC)):
                req.metrics[i].metricId = m
            calls["GpmSampleGet"] = lambda: nv.nvmlGpmSampleGet(h, b)
            calls["GpmMetricsGet (4 metrics)"] = lambda: nv.nvmlGpmMetricsGet(req)
    except Exception as exc:
        print(f"GPM per-call timing skipped: {exc}")
    out = []
    for name, fn in calls.items():
        try:
            fn()
        except Exception as exc:
            print(f"{name}: {exc}")
            continue
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(n):
            fn()
        out.append((name, 1000 * (time.thread_time() - c0) / n, 1000 * (time.perf_counter() - w0) / n))
    return out


def copy_load():
    """Start a device-to-device copy loop on GPU 0 (as in tests/gpu); returns a stop function, or None."""
    try:
        import threading

        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            for _ in range(20):
                y.copy_(x)
            torch.cuda.synchronize()

    threading.Thread(target=loop, daemon=True).start()
    return stop.set


def buffer_memory(sampler: Sampler, rate_hz: float = 10.0, window_s: float = 600.0) -> tuple[int, int, float]:
    """Bytes a full window of rows like the newest one takes (distinct value objects, as real ticks have)."""
    row = sampler.latest().values
    n = int(window_s * rate_hz)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rows = [{k: (v + 0.0 if isinstance(v, float) else v) for k, v in row.items()} for _ in range(n)]
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del rows
    return n, len(row), used / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="measurement time per rate (after 2 s warm-up)")
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--load", action="store_true", help="run a torch copy loop on GPU 0 while measuring")
    args = ap.parse_args()

    print(f"# Telemetry sampler bench, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {machine()}")
    stop_load = copy_load() if args.load else None
    if args.load:
        print("GPU copy load:", "running (its thread's CPU counts in 'process CPU')" if stop_load else "unavailable")
    results = [measure_rate(r, args.seconds) for r in args.rates]
    s = results[0]["sampler"]
    for name in ("nvml", "host"):
        print(f"source {name}: {s.availability(name).reason or 'ok'}")
    nvml = s.source("nvml")
    for g in (nvml.gpus if nvml is not None else []):
        print(f"  GPU {g.index}: {g.name}, CC {g.compute_capability}, GPM {'yes' if g.gpm.ok else 'no'}")

    print(f"\n| rate asked | achieved | sampler thread CPU (% of one core) | process CPU (% of one core) "
          f"| CPU ms per tick | overruns | {args.seconds:.0f} s each |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(f"| {r['rate']:.0f} Hz | {r['achieved']:.2f} Hz | {r['thread_cpu_pct']:.2f}% | {r['proc_cpu_pct']:.2f}% "
              f"| {r['ms_per_tick']:.3f} | {r['overruns']} | |")

    print("\n| source | what | CPU ms per sample() (fast path) |")
    print("|---|---|---:|")
    for name, what, ms in per_source_cost():
        print(f"| {name} | {what} | {ms:.3f} |")

    costs = nvml_call_costs()
    if costs:
        print("\n| NVML call (GPU 0) | CPU ms | wall ms |")
        print("|---|---:|---:|")
        for name, cpu_ms, wall_ms in costs:
            print(f"| {name} | {cpu_ms:.3f} | {wall_ms:.3f} |")
    if stop_load:
        stop_load()

    n, cols, mib = buffer_memory(s)
    print(f"\nfull 10 min buffer at 10 Hz: {n} rows x {cols} columns = {mib:.1f} MiB")
    ok = results[0]["rate"] != 10 or results[0]["thread_cpu_pct"] < 1.0
    print(f"target (< 1% of one core at 10 Hz): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
