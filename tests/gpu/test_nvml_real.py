"""The real NVML and GPM path on a real GPU, under a device-to-device copy load (run on the GPU machine):

    PYTHONUNBUFFERED=1 python3 -m pytest -q -m gpu tests/gpu/test_nvml_real.py -s

A large copy keeps a kernel running all the time (GPU util near 100%) and streams DRAM (GPM DRAM BW util far
above idle; 88.6% was measured on an H200). Skipped without a GPU (tests/gpu/conftest.py).
"""
from __future__ import annotations

import statistics
import threading
import time

import pytest

from core.telemetry.nvml import GPU_FIELDS, NvmlSource
from core.telemetry.sampler import Sampler

pytestmark = pytest.mark.gpu


def _window(s: Sampler, seconds: float, key: str) -> list[float]:
    return [r[key] for r in s.rows(seconds) if r.get(key) is not None]


def _summary(s: Sampler, seconds: float, prefix: str) -> dict[str, float | None]:
    out = {}
    for f in ("util_pct", "mem_busy_pct", "dram_bw_util_pct", "sm_util_pct", "power_w", "sm_clock_mhz",
              "mem_clock_mhz", "temp_c", "pcie_tx_bytes_s", "pcie_rx_bytes_s"):
        vals = _window(s, seconds, prefix + f)
        out[f] = statistics.median(vals) if vals else None
    return out


def test_real_nvml_reads_a_copy_load():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    src = NvmlSource()
    sampler = Sampler([src], rate_hz=10)
    sampler.start()
    try:
        av = sampler.availability("nvml")
        assert av.ok, av.reason
        uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
        gpu = next((g for g in src.gpus if uuid and uuid in g.uuid), src.gpus[0])
        p = f"gpu{gpu.index}."
        print(f"\n{gpu.name} (NVML index {gpu.index}), compute capability {gpu.compute_capability}, "
              f"driver {src.driver_version}, CUDA (driver) {src.cuda_driver_version}, GPM: {gpu.gpm}")

        n = 1 << 30  # 4 GiB of float32 per buffer: far larger than L2, so every copy streams DRAM
        a = torch.empty(n, dtype=torch.float32, device="cuda")
        b = torch.empty_like(a)
        torch.cuda.synchronize()
        time.sleep(2.0)
        idle = _summary(sampler, 1.5, p)

        stop = threading.Event()

        def load():
            while not stop.is_set():
                for _ in range(20):
                    b.copy_(a)
                torch.cuda.synchronize()

        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        time.sleep(1.5)  # let NVML's own averaging window (up to 1 s) fill with the load
        t0 = time.monotonic()
        time.sleep(5.0)
        busy = _summary(sampler, time.monotonic() - t0, p)
        dram = _window(sampler, time.monotonic() - t0, p + "dram_bw_util_pct")
        util = _window(sampler, time.monotonic() - t0, p + "util_pct")
        stop.set()
        worker.join(10)

        snap = sampler.latest()
        print(f"{'field':<18}{'idle (median)':>16}{'copy load (median)':>20}")
        for f in busy:
            print(f"{f:<18}{_show(idle[f]):>16}{_show(busy[f]):>20}")
        print(f"DRAM BW util under load: min {min(dram, default=float('nan')):.1f}, "
              f"max {max(dram, default=float('nan')):.1f}, n={len(dram)}; GPU util min {min(util, default=0):.0f}")
        print("throttle reasons:", snap.values.get(p + "throttle_reasons"))
        print("processes:", snap.tables.get(p + "processes"))
        print("N/A fields:", {f: snap.reasons[p + f] for f in GPU_FIELDS if snap.values.get(p + f) is None})
        print("sampler:", sampler.stats())

        assert busy["util_pct"] is not None and busy["util_pct"] >= 90, busy
        if gpu.gpm.ok:
            assert busy["dram_bw_util_pct"] is not None
            assert busy["dram_bw_util_pct"] >= 50 and busy["dram_bw_util_pct"] >= (idle["dram_bw_util_pct"] or 0) + 30
        else:
            print("GPM not supported on this GPU; DRAM BW assertion skipped:", gpu.gpm.reason)
    finally:
        sampler.stop()


def _show(v: float | None) -> str:
    return "N/A" if v is None else f"{v:,.1f}"
