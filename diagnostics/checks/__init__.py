"""Checks, one module per area; each module exports CHECKS (a tuple of Check). See diagnostics/registry.py."""
from diagnostics.context import CheckContext
from diagnostics.findings import Outcome, skip

NO_DRIVER = "No NVIDIA driver here"  # how core.telemetry.nvml starts the reason when libnvidia-ml is absent
NO_DRIVER_REMEDY = ("Run the checklist on the GPU host itself (`python -m diagnostics run`, or the console started "
                    "there). In a container, give it the GPUs and the driver: `docker run --gpus all` with the NVIDIA "
                    "Container Toolkit, or a `nvidia.com/gpu` resource on Kubernetes; `nvidia-smi` must work inside it.")


def no_gpu(ctx: CheckContext) -> Outcome:
    """The SKIP of every GPU check when NVML gave nothing; where the driver is simply absent, it also says how to
    run where the GPUs are (the other reasons carry their own fix: driver not loaded, no permission)."""
    remedy = NO_DRIVER_REMEDY if ctx.gpu_reason.startswith(NO_DRIVER) else ""
    return skip(f"no GPU: {ctx.gpu_reason}", remedy=remedy)
