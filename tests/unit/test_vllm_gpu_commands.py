"""vLLM on a GPU host, without one: the command lines and refusal rules the console would use there (CUDA vLLM is not
installed on the GPU machine either, so these are checked here against vLLM 0.32's real flag table and its kernel
selection, read from its source: FP8 W8A8 kernels need compute capability 8.9, Marlin's W8A16 runs from 7.5 and is
what `--linear-backend marlin` forces)."""
from __future__ import annotations

import pytest

from core.compare.result import Side
from core.compare.run import vllm_gpu_share
from core.engines.vllm_engine import cuda_device, kernel_mismatch, linear_kernels, server_command
from core.precision import Device, KVDtype, Precision, unsupported_reasons
from diagnostics.flags import committed_table, lint_command
from tests.fakes.nvml import A100, FakeNvml

H200 = Device("cuda", "NVIDIA H200", (9, 0))
A100_DEV = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
T4 = Device("cuda", "Tesla T4", (7, 5))
V100 = Device("cuda", "Tesla V100", (7, 0))


def command(precision: Precision, share: float | None = None) -> list[str]:
    return server_command("python", "/models/m", 8000, precision, KVDtype.AUTO, served_name="m", max_model_len=2048,
                          cpu=False, kv_cache_bytes=None, gpu_memory_utilization=share)


def flag_value(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_w8a8_asks_for_fp8_and_lets_vllm_pick_its_w8a8_kernels():
    cmd = command(Precision.FP8)
    assert flag_value(cmd, "--quantization") == "fp8"
    assert "--linear-backend" not in cmd


def test_weight_only_forces_the_marlin_w8a16_kernels_on_every_gpu():
    cmd = command(Precision.FP8_WEIGHT_ONLY)
    assert flag_value(cmd, "--quantization") == "fp8"
    assert flag_value(cmd, "--linear-backend") == "marlin"


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16, Precision.FP16, Precision.FP8,
                                       Precision.FP8_WEIGHT_ONLY])
def test_every_command_line_uses_only_real_vllm_flags(precision):
    result = lint_command(command(precision, 0.45)[1:], committed_table())
    assert result.ok, [i.message for i in result.issues]


@pytest.mark.parametrize("device, refused", [(H200, set()), (A100_DEV, {Precision.FP8}), (T4, {Precision.FP8}),
                                             (V100, {Precision.FP8, Precision.FP8_WEIGHT_ONLY})])
def test_refusals_follow_the_kernels_vllm_has_for_the_gpu(device, refused):
    got = {p for p in (Precision.FP8, Precision.FP8_WEIGHT_ONLY)
           if unsupported_reasons(p, KVDtype.AUTO, device, engine="vllm")}
    assert got == refused


def test_the_device_comes_from_nvml_so_the_rules_see_the_real_capability():
    assert cuda_device(FakeNvml()) == Device("cuda", "NVIDIA H200", (9, 0), None)
    a100 = cuda_device(FakeNvml(table=A100))
    assert a100.capability == (8, 0)
    assert unsupported_reasons(Precision.FP8, KVDtype.AUTO, a100, engine="vllm")


def test_the_device_follows_cuda_visible_devices(monkeypatch):
    nvml = FakeNvml(gpus=2, table={("nvmlDeviceGetName", 1): "NVIDIA A100-SXM4-80GB",
                                   ("nvmlDeviceGetCudaComputeCapability", 1): (8, 0)})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert cuda_device(nvml).name == "NVIDIA A100-SXM4-80GB"


def test_two_servers_of_a_comparison_share_one_gpu():
    ref, cand = Side(Precision.BF16, engine="vllm"), Side(Precision.FP8, engine="vllm")
    share = vllm_gpu_share(ref, cand)
    cmds = [command(s.precision, share) for s in (ref, cand)]
    shares = [float(flag_value(c, "--gpu-memory-utilization")) for c in cmds]
    assert sum(shares) <= 0.9  # vLLM's default for one server; both fit where one would
    assert vllm_gpu_share(ref, ref) is None  # the noise floor is one server
    assert vllm_gpu_share(Side(Precision.BF16), cand) is None  # one server beside the torch engine
    assert "--gpu-memory-utilization" not in command(Precision.BF16)


def test_the_cpu_build_never_gets_a_gpu_memory_share():
    cmd = server_command("python", "/m", 8000, Precision.BF16, KVDtype.AUTO, served_name="m", max_model_len=2048,
                         cpu=True, kv_cache_bytes=2**30, gpu_memory_utilization=0.45)
    assert "--gpu-memory-utilization" not in cmd and flag_value(cmd, "--kv-cache-memory-bytes") == str(2**30)


# vLLM 0.32 logs its choice per linear method at start-up (vllm/model_executor/kernels/linear/__init__.py).
LOG_W8A8 = ("(EngineCore pid=1) INFO 12-01 10:00:00 [__init__.py:759] Selected CutlassFP8ScaledMMLinearKernel for "
            "Fp8LinearMethod\n")
LOG_MARLIN = ("(EngineCore pid=1) INFO 12-01 10:00:00 [__init__.py:759] Selected MarlinFP8ScaledMMLinearKernel for "
              "Fp8LinearMethod\n")


def test_the_kernels_vllm_chose_are_read_from_its_log():
    assert linear_kernels("noise\n" + LOG_W8A8) == {"Fp8LinearMethod": "CutlassFP8ScaledMMLinearKernel"}
    assert linear_kernels("INFO no selection here") == {}


def test_a_silent_fallback_is_refused_with_what_ran():
    assert kernel_mismatch(Precision.FP8, linear_kernels(LOG_W8A8)) is None
    assert kernel_mismatch(Precision.FP8_WEIGHT_ONLY, linear_kernels(LOG_MARLIN)) is None
    msg = kernel_mismatch(Precision.FP8, linear_kernels(LOG_MARLIN))
    assert "MarlinFP8ScaledMMLinearKernel" in msg and "W8A16" in msg
    assert "W8A8" in kernel_mismatch(Precision.FP8_WEIGHT_ONLY, linear_kernels(LOG_W8A8))
    assert kernel_mismatch(Precision.BF16, {}) is None
