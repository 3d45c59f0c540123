"""Skip gpu-marked tests cleanly where there is no NVIDIA GPU: no `nvidia-smi`, no pynvml, or NVML finds none."""
from __future__ import annotations

import shutil

import pytest


def _why_no_gpu() -> str | None:
    try:
        import pynvml
    except ImportError:
        return "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                return "NVML found no GPUs"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no driver library, driver not loaded, ...
        if shutil.which("nvidia-smi") is None:
            return f"no NVIDIA driver: nvidia-smi not found and NVML failed ({exc})"
        return f"NVML failed: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _why_no_gpu()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU: {reason}"))
