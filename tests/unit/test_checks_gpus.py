"""The checks that compare a host's GPUs (diagnostics/checks/gpus.py): over hand-made windows, and once through the
real collector on the fault-injecting NVML fake with 1, 2 and 8 GPUs."""
from __future__ import annotations

import time

import pytest

from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler
from diagnostics.collect import WindowCollector
from diagnostics.context import CheckContext, GpuWindow, Series
from diagnostics.findings import Status
from diagnostics.registry import get
from diagnostics.runner import evaluate
from tests.fakes.nvml import FakeNvml, multi_gpu_table

GIB = 2**30


def decide(check_id, ctx):
    (finding,) = evaluate(ctx, [get(check_id)])
    return finding


def window(i, util, bw=None, name="NVIDIA H200", mem=141 * GIB, throttle=(), procs=()) -> GpuWindow:
    def s(values, what):
        return Series(f"GPU {i} {what}", "%", "test", tuple(float(t) for t in range(len(values))), tuple(values))

    return GpuWindow(i, name, (9, 0), s(util, "util"), s(bw, "DRAM BW util") if bw else None, "", mem,
                     tuple(throttle), tuple(procs))


def test_one_gpu_is_never_imbalanced_and_two_alike_pass():
    one = CheckContext(gpus=(window(0, [5.0] * 10),))
    for check in ("gpu.imbalance", "gpu.mixed_models"):
        f = decide(check, one)
        assert f.status is Status.SKIP and "nothing to compare" in f.verdict
    f = decide("gpu.imbalance", CheckContext(gpus=(window(0, [95.0] * 10), window(1, [90.0] * 10))))
    assert f.status is Status.PASS and "90-95%" in f.verdict


def test_one_idle_gpu_among_busy_peers_is_named():
    gpus = tuple(window(i, [97.0] * 10, [85.0] * 10) for i in range(7)) + (window(7, [97.0] * 10, [20.0] * 10),)
    f = decide("gpu.imbalance", CheckContext(gpus=gpus))
    assert f.status is Status.WARN and "GPU 7" in f.verdict and "DRAM BW util 20% against 85%" in f.verdict
    assert f.evidence["GPU 7 (NVIDIA H200, CC 9.0) mean_dram_bw_util_pct"] == 20.0
    two = CheckContext(gpus=(window(0, [98.0] * 10), window(1, [10.0] * 10)))
    f = decide("gpu.imbalance", two)
    assert f.status is Status.WARN and "GPU 1 (NVIDIA H200, CC 9.0) util 10% against 98%" in f.verdict


def test_a_throttled_gpu_is_named_and_a_power_cap_is_not_counted():
    capped = ["SW power cap"] * 10
    hot = ["SW power cap, HW thermal"] * 6 + ["SW power cap"] * 4
    f = decide("gpu.throttled", CheckContext(gpus=(window(0, [90.0] * 10, throttle=capped),
                                                   window(1, [90.0] * 10, throttle=hot))))
    assert f.status is Status.WARN and "while its 1 peer did not" in f.verdict
    assert "GPU 1 (NVIDIA H200, CC 9.0): HW thermal in 60% of readings" in f.verdict
    f = decide("gpu.throttled", CheckContext(gpus=(window(0, [90.0] * 10, throttle=capped),)))
    assert f.status is Status.PASS
    assert decide("gpu.throttled", CheckContext(gpus=(window(0, [90.0]),))).status is Status.SKIP


def test_a_foreign_process_on_vllms_gpu():
    vllm = (101, "VLLM::EngineCore")
    f = decide("gpu.foreign_process", CheckContext(gpus=(window(0, [90.0], procs=[vllm, (202, "python")]),
                                                         window(1, [0.0], procs=[(303, "python")]))))
    assert f.status is Status.WARN and "GPU 0" in f.verdict and "python (PID 202)" in f.verdict
    assert "GPU 1" not in f.verdict  # not a GPU vLLM uses
    assert decide("gpu.foreign_process", CheckContext(gpus=(window(0, [90.0], procs=[vllm]),))).status is Status.PASS
    assert decide("gpu.foreign_process", CheckContext(gpus=(window(0, [90.0]),))).status is Status.SKIP


def test_mixed_models_or_memory_sizes():
    f = decide("gpu.mixed_models", CheckContext(gpus=(window(0, [1.0]), window(1, [1.0], name="NVIDIA A100", mem=80 * GIB))))
    assert f.status is Status.WARN and "GPU 1: NVIDIA A100, 80 GiB" in f.verdict
    assert decide("gpu.mixed_models", CheckContext(gpus=(window(0, [1.0]), window(1, [1.0])))).status is Status.PASS


@pytest.mark.parametrize("n", [1, 2, 8])
def test_through_the_collector_on_fake_gpus(n):
    table = multi_gpu_table(n) if n > 1 else {}
    s = Sampler([NvmlSource(nvml=FakeNvml(gpus=n, table=table))])
    s.probe()
    c = WindowCollector(s)
    c.begin()
    for _ in range(4):
        s.tick()
        time.sleep(0.01)
    c.end()
    ctx = c.context()
    assert len(ctx.gpus) == n and all(g.mem_total_bytes == 141 * GIB for g in ctx.gpus if not g.lost)
    assert all(g.processes and g.processes[0][1] for g in ctx.gpus if not g.lost)
    imbalance = decide("gpu.imbalance", ctx)
    if n == 1:
        assert imbalance.status is Status.SKIP  # no false imbalance on a single GPU
        return
    assert ctx.gpus[-1].lost and "is lost" in ctx.gpus[-1].lost
    mixed = decide("gpu.mixed_models", ctx)  # the lost GPU's unknown size is not a different kind
    assert mixed.status is (Status.SKIP if n == 2 else Status.PASS)
    if n > 2:  # GPU 1 reads 3% util against 97% for the rest, and is thermally throttled
        assert imbalance.status is Status.WARN and "GPU 1 (NVIDIA H200, CC 9.0) util 3%" in imbalance.verdict
        throttled = decide("gpu.throttled", ctx)
        assert throttled.status is Status.WARN and "GPU 1" in throttled.verdict and "HW thermal" in throttled.verdict
