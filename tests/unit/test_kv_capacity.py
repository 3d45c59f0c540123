"""The KV calculator starts from the memory of the device actually present, and says which."""
import psutil

from core.engines.torch.engine import current_device
from core.long_context import kvcache as kv
from core.precision import Device

GIB = 1024 ** 3


def test_on_this_host_the_capacity_is_its_memory_labelled_host_memory():
    size, what = kv.default_capacity(current_device("cpu"))
    assert size == psutil.virtual_memory().total and what == "host memory"
    r = kv.report(kv.builtin_shape(next(iter(kv.BUILTIN_CONFIGS))), "bf16", 1000, gpu_mem_bytes=size,
                  weights_bytes=0, gpu_memory_utilization=0.9, memory_kind=what)
    tokens_fit = dict((label, help_) for label, _, help_ in kv.headline(r))["Tokens that fit"]
    assert "fit in host memory" in tokens_fit and "Host memory x 0.9" in tokens_fit


def test_on_a_gpu_it_is_the_gpu_memory_by_name():
    h200 = Device("cuda", "NVIDIA H200", (9, 0), 143 * GIB)
    assert kv.default_capacity(h200) == (143 * GIB, "GPU memory (NVIDIA H200)")
