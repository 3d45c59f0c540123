"""The fake NVML's own checks (tests/fakes/nvml.py), so a broken fake cannot make the real tests pass vacuously."""
from __future__ import annotations

import pynvml as real
import pytest

from tests.fakes.nvml import FakeNvml, NotSupported


def test_fake_raises_real_pynvml_errors():
    nv = FakeNvml(table={"nvmlDeviceGetPowerUsage": NotSupported})
    with pytest.raises(real.NVMLError_NotSupported):
        nv.nvmlDeviceGetPowerUsage(0)
    assert nv.NVMLError_GpuIsLost is real.NVMLError_GpuIsLost


def test_fake_never_forwards_functions_to_the_real_library():
    with pytest.raises(AttributeError):
        FakeNvml().nvmlDeviceGetFanSpeed  # noqa: B018


def test_fake_per_gpu_override():
    nv = FakeNvml(gpus=2, table={("nvmlDeviceGetName", 1): "NVIDIA A100"})
    assert nv.nvmlDeviceGetName(0) == "NVIDIA H200"
    assert nv.nvmlDeviceGetName(1) == "NVIDIA A100"
