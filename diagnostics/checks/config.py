"""Configuration checks: what was asked for against what the hardware, driver and vLLM can do."""
from __future__ import annotations

from core.precision import Device, KVDtype, Precision, unsupported_reasons
from diagnostics.checks import no_gpu
from diagnostics.context import CheckContext
from diagnostics.findings import Check, Outcome, Severity, fail, passed, skip, warn

NO_LAUNCH = "launch command: none given (--launch-cmd, or the launch command field on the page)"
CUDA12_DRIVER = "R525"  # the oldest Linux driver branch that runs CUDA 12.x applications (minor version compat)


def requested_precision(ctx: CheckContext) -> tuple[str | None, str]:
    """(precision or None, where it was read). Explicit beats the launch command; an FP8 checkpoint name counts."""
    if ctx.requested_precision:
        return ctx.requested_precision.lower(), "requested precision"
    if ctx.launch_cmd is None:
        return None, ""
    quant = ctx.launch_flag_value("--quantization", "-q")
    if quant:
        return quant.lower(), f"--quantization {quant}"
    from diagnostics.flags import split_program

    _, args = split_program(ctx.launch_args)
    model = next((a for a in args if not a.startswith("-")), "") or (ctx.launch_flag_value("--model") or "")
    if "fp8" in model.lower():
        return "fp8", f"model {model} (an FP8 checkpoint by its name)"
    return "none", "launch command (no --quantization)"


def decide_fp8_capability(ctx: CheckContext) -> Outcome:
    precision, where = requested_precision(ctx)
    if precision is None:
        return skip("requested precision: no launch command or precision given")
    if not precision.startswith("fp8") or precision == Precision.FP8_WEIGHT_ONLY.value:
        # weight-only FP8 upcasts for the matmul, so it runs wherever BF16 runs
        return passed(f"FP8 W8A8 is not requested ({where}).", evidence={"requested": precision, "from": where})
    if not ctx.gpus:
        return no_gpu(ctx)
    evidence = {"requested": precision, "from": where}
    evidence.update({g.label: "CC unknown" if g.compute_capability is None else
                     f"CC {g.compute_capability[0]}.{g.compute_capability[1]}" for g in ctx.gpus})
    for g in ctx.gpus:
        if g.compute_capability is None:
            continue
        device = Device(kind="cuda", name=g.name, capability=g.compute_capability)
        reasons = unsupported_reasons(Precision.FP8, KVDtype.AUTO, device, engine="vllm")
        if reasons:
            return fail(reasons[0],
                        "Expect FP8 to save memory here, not time: say so by choosing FP8 weight-only, or use BF16; "
                        "FP8 W8A8 compute needs compute capability 8.9 or newer (Ada, Hopper, Blackwell: L4, L40S, "
                        "H100, H200, ...).", evidence=evidence)
    if all(g.compute_capability is None for g in ctx.gpus):
        return skip("compute capability: NVML did not report it")
    return passed(f"FP8 requested ({where}) on compute capability >= 8.9: W8A8 runs on FP8 tensor cores.",
                  evidence=evidence)


def decide_driver(ctx: CheckContext) -> Outcome:
    if not ctx.gpus:
        return no_gpu(ctx)
    drv = ctx.cuda_driver_version
    if drv is None:
        return skip("CUDA driver version: NVML did not report it")
    text = f"{drv[0]}.{drv[1]}"
    evidence = {"driver_version": ctx.driver_version or "unknown", "driver_cuda": text}
    evidence.update({f"{label} cuda": f"{c[0]}.{c[1]}" for label, c in ctx.runtime_cuda.items()})
    if drv < (12, 0):
        return fail(f"Driver {ctx.driver_version} supports CUDA up to {text}: current PyTorch and vLLM CUDA builds "
                    "need CUDA 12 or newer.", f"Install a driver of branch {CUDA12_DRIVER} or newer (the newest "
                    "your OS supports), or pin a PyTorch/vLLM build made for CUDA 11.", evidence=evidence)
    too_new = {label: c for label, c in ctx.runtime_cuda.items() if c[0] > drv[0]}
    if too_new:
        label, c = next(iter(too_new.items()))
        return fail(f"{label} is built for CUDA {c[0]}.{c[1]}, but driver {ctx.driver_version} supports only CUDA "
                    f"{text}: it cannot create a CUDA context.",
                    f"Upgrade the driver to one that supports CUDA {c[0]}.{c[1]}, or install the build for CUDA "
                    f"{drv[0]}.x.", evidence=evidence)
    minor = {label: c for label, c in ctx.runtime_cuda.items() if c > drv}
    if minor:
        label, c = next(iter(minor.items()))
        return warn(f"{label} is built for CUDA {c[0]}.{c[1]}, newer than the driver's {text}: it runs through minor "
                    "version compatibility, but kernels compiled from PTX at run time (Triton, torch.compile) can "
                    "fail with 'unsupported toolchain'.",
                    f"Upgrade the driver to one that supports CUDA {c[0]}.{c[1]}.", evidence=evidence)
    built = ", ".join(f"{label} (CUDA {c[0]}.{c[1]})" for label, c in ctx.runtime_cuda.items())
    return passed(f"Driver {ctx.driver_version} supports CUDA {text}"
                  + (f", enough for {built}." if built else "; no CUDA build of PyTorch was found to compare with."),
                  evidence=evidence)


def decide_enforce_eager(ctx: CheckContext) -> Outcome:
    if ctx.launch_cmd is None:
        return skip(NO_LAUNCH)
    if not ctx.launch_has_flag("--enforce-eager"):
        return passed("CUDA graphs are on (no --enforce-eager in the launch command).")
    evidence = {"flag": "--enforce-eager"}
    itl = next((s.histograms.get("itl") for s in reversed(ctx.vllm_snapshots) if s.histograms.get("itl")), None)
    if itl is not None and itl.quantile(0.5) is not None:
        evidence["inter_token_latency_p50_s"] = round(itl.quantile(0.5), 4)
    return warn("--enforce-eager turns CUDA graphs off: each decode step launches its kernels one by one from the "
                "host, which adds latency, most at small batch sizes.",
                "On a latency-sensitive service remove --enforce-eager: vLLM then captures CUDA graphs at start "
                "(a slower start and some memory). Keep it only for debugging or when start time or memory matter "
                "more than latency. (Articles that advise --enforce-eager for batch-size latency have it backwards.)",
                evidence=evidence)


def decide_unknown_flags(ctx: CheckContext) -> Outcome:
    if ctx.launch_cmd is None:
        return skip(NO_LAUNCH)
    lint = ctx.flag_lint
    if lint is None:
        return skip("vLLM flag table: the launch command was not checked against vLLM's parser")
    evidence = {"checked_against": lint.table_source, "vllm_version": lint.vllm_version,
                "flags_known": len(lint.flags), "issues": [
                    {"flag": i.flag, "kind": i.kind, "message": i.message, "suggestion": i.suggestion or "",
                     "real_way": i.real_way or ""} for i in lint.issues]}
    errors = [i for i in lint.issues if i.is_error]
    warnings = [i for i in lint.issues if not i.is_error]

    def advice(issues) -> str:
        """One line per issue ("- flag: what to do"): several flags in one paragraph are hard to read."""
        lines = []
        for i in issues:
            if i.real_way:
                lines.append(f"- {i.flag}: {i.real_way}")
            elif i.suggestion:
                lines.append(f"- {i.flag}: use {i.suggestion}.")
            else:
                lines.append(f"- {i.flag}: {i.message}")
        return "\n".join(lines)

    if errors:
        names = ", ".join(i.flag for i in errors)
        return fail(f"{len(errors)} argument(s) that vLLM {lint.vllm_version} does not have: {names}; vLLM stops "
                    "at start with 'unrecognized arguments'.", advice(errors + warnings), evidence=evidence)
    if warnings:
        return warn(f"The launch command works but has {len(warnings)} warning(s): "
                    + ", ".join(i.flag for i in warnings) + ".", advice(warnings), evidence=evidence)
    return passed(f"All {len(lint.flags)} flag(s) exist in vLLM {lint.vllm_version}.", evidence=evidence)


CHECKS = (
    Check("fp8.capability", "FP8 on a GPU without FP8 tensor cores", Severity.HIGH,
          "FP8 requested (--quantization fp8 or an FP8 checkpoint) on compute capability below 8.9",
          decide_fp8_capability),
    Check("driver.too_old", "Driver too old for the CUDA build", Severity.HIGH,
          "the CUDA version the driver supports (NVML) against CUDA 12 and the CUDA PyTorch was built for",
          decide_driver),
    Check("vllm.enforce_eager", "--enforce-eager on a latency-sensitive service", Severity.MEDIUM,
          "--enforce-eager in the launch command (CUDA graphs off)", decide_enforce_eager),
    Check("vllm.unknown_flags", "Unknown or removed vLLM flags", Severity.HIGH,
          "every flag of the launch command against vLLM's own argument parser", decide_unknown_flags),
)
