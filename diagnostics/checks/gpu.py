"""GPU checks: is the GPU waiting on the host, or is it saturating its memory bandwidth?"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from core.stats import mean, percentile
from core.telemetry.base import BW_BOUND_SHARE, BW_LIKELY_SHARE, GPU_IDLE_UTIL_PCT, achievable_dram_bw
from diagnostics.checks import no_gpu
from diagnostics.context import CheckContext, GpuWindow, Series
from diagnostics.findings import PCT_RANGE, Chart, Check, Outcome, Severity, fail, passed, skip, warn


def load_filter(ctx: CheckContext) -> tuple[bool, list[tuple[float, float]]]:
    """(load known, [(t, requests running)]) from vLLM's scrapes. Without a vLLM URL the load is unknown."""
    running = [(s.t, s.running) for s in ctx.vllm_snapshots if s.running is not None]
    return bool(running), running


def busy_points(series: Series, running: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The readings taken while vLLM had requests running (by the nearest scrape); all of them if load is unknown."""
    points = series.points()
    if not running:
        return points
    times = [t for t, _ in running]
    kept = []
    for t, v in points:
        i = bisect.bisect_left(times, t)
        near = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))
        if running[near][1] > 0:
            kept.append((t, v))
    return kept


@dataclass(frozen=True)
class Busy:
    """One GPU field's readings taken while requests ran (all of them when the load is unknown)."""

    load_known: bool
    running: list[tuple[float, float]]
    per_gpu: dict[str, list[float]]  # GPU label -> readings
    without: list[GpuWindow]  # GPUs that gave no reading of the field


def busy_readings(ctx: CheckContext, field: str) -> Outcome | Busy:
    """The readings a GPU check decides on, or the SKIP that says which input is missing."""
    if not ctx.gpus:
        return no_gpu(ctx)
    load_known, running = load_filter(ctx)
    if running and all(r <= 0 for _, r in running):
        return skip("load: vLLM reported 0 running requests for the whole window; send traffic and run again")
    per_gpu, without = {}, []
    for g in ctx.gpus:
        series = getattr(g, field)
        pts = busy_points(series, running) if series else []
        if pts:
            per_gpu[g.label] = [v for _, v in pts]
        else:
            without.append(g)
    return Busy(load_known, running, per_gpu, without)


def _running_chart(running: list[tuple[float, float]]) -> tuple[Chart, ...]:
    if not running:
        return ()
    s = Series("requests running", "count", "vLLM /metrics", tuple(t for t, _ in running), tuple(r for _, r in running))
    return (Chart("vLLM requests running", (s,), "requests"),)


def decide_idle(ctx: CheckContext) -> Outcome:
    busy = busy_readings(ctx, "util_pct")
    if isinstance(busy, Outcome):
        return busy
    load_known, running, per_gpu = busy.load_known, busy.running, busy.per_gpu
    if not per_gpu:
        return skip("GPU utilization: NVML gave no readings during the window")
    evidence = {f"{label} mean_util_pct": round(mean(v), 1) for label, v in per_gpu.items()}
    evidence.update({f"{label} p10_util_pct": round(percentile(v, 0.1), 1) for label, v in per_gpu.items()})
    evidence["readings"] = sum(len(v) for v in per_gpu.values())
    evidence["load_known"] = load_known
    worst_label, worst = min(((label, mean(v)) for label, v in per_gpu.items()), key=lambda x: x[1])
    charts = (Chart("GPU utilization (NVML: share of time a kernel ran)",
                    tuple(g.util_pct for g in ctx.gpus if g.util_pct), "%",
                    ((GPU_IDLE_UTIL_PCT, f"{GPU_IDLE_UTIL_PCT:.0f}% idle threshold"),), PCT_RANGE),) + \
        _running_chart(running)
    remedy = ("The GPU is waiting on the host. Look at the server's CPU (tokenizer/detokenizer, sampling, "
              "Python overhead: one core at 100% is the usual sign), at data loading and the network between "
              "client and server, and at batching: send requests concurrently and let vLLM batch them "
              "(--max-num-seqs); a single sequential client leaves the GPU idle between requests.")
    if worst < GPU_IDLE_UTIL_PCT:
        if load_known:
            return fail(f"{worst_label} ran kernels only {worst:.0f}% of the time while vLLM had requests running "
                        f"(threshold {GPU_IDLE_UTIL_PCT:.0f}%): a host-side stall.", remedy,
                        evidence=evidence, charts=charts)
        return warn(f"{worst_label} ran kernels {worst:.0f}% of the time over the window (threshold "
                    f"{GPU_IDLE_UTIL_PCT:.0f}%); without a vLLM URL it is unknown whether requests were running.",
                    "If requests were running, this is a host-side stall. " + remedy +
                    " Give --vllm-url so the check counts only the time when requests were running.",
                    evidence=evidence, charts=charts)
    return passed(f"{worst_label} ran kernels {worst:.0f}% of the time "
                  f"{'while requests were running' if load_known else 'over the window'}; NVML util says a "
                  "kernel was running, not how hard it worked (see the bandwidth check).",
                  evidence=evidence, charts=charts)


def decide_bandwidth(ctx: CheckContext) -> Outcome:
    busy = busy_readings(ctx, "dram_bw_util_pct")
    if isinstance(busy, Outcome):
        return busy
    load_known, per_gpu = busy.load_known, busy.per_gpu
    reasons = [f"{g.label}: {g.dram_bw_reason or 'no GPM readings'}" for g in busy.without]
    if not per_gpu:
        return skip("DRAM bandwidth utilization (NVML GPM, Hopper and newer; DCGM DCGM_FI_PROF_DRAM_ACTIVE on older "
                    "GPUs): " + "; ".join(reasons) + ". NVML's memory util is busy time, not bandwidth")
    names = {g.label: g.name for g in ctx.gpus}
    peaks = {label: achievable_dram_bw(names[label]) for label in per_gpu}
    evidence: dict = {}
    for label, v in per_gpu.items():
        evidence[f"{label} mean_dram_bw_util_pct"] = round(mean(v), 1)
        evidence[f"{label} max_dram_bw_util_pct"] = round(max(v), 1)
        evidence[f"{label} achievable_dram_bw_util_pct"] = peaks[label][0]
        evidence[f"{label} achievable_from"] = peaks[label][1]
        evidence[f"{label} share_of_achievable_pct"] = round(100 * mean(v) / peaks[label][0], 1)
    evidence["load_known"] = load_known
    label, share = max(((label, mean(v) / peaks[label][0]) for label, v in per_gpu.items()), key=lambda x: x[1])
    top, peak = mean(per_gpu[label]), peaks[label][0]
    said = (f"{label} used {top:.0f}% of its DRAM bandwidth (NVML GPM) on average, {100 * share:.0f}% of the "
            f"{peak:.0f}% that a pure copy reaches ({peaks[label][1]})")
    charts = (Chart("DRAM bandwidth utilization (NVML GPM)",
                    tuple(g.dram_bw_util_pct for g in ctx.gpus if g.dram_bw_util_pct), "% of peak",
                    ((peak, f"{peak:.0f}% a pure copy reaches"),
                     (BW_BOUND_SHARE * peak, f"{BW_BOUND_SHARE * peak:.0f}% bound"),
                     (BW_LIKELY_SHARE * peak, f"{BW_LIKELY_SHARE * peak:.0f}% likely")), PCT_RANGE),)
    remedy = ("Every decode step reads the weights and KV cache from HBM, so fewer bytes per token is the lever: "
              "FP8 weights (--quantization fp8, or an FP8 checkpoint) halve weight bytes, --kv-cache-dtype fp8 "
              "halves KV bytes, a larger batch (more concurrent requests, --max-num-seqs) shares each weight read "
              "across more tokens, and --enable-chunked-prefill mixes compute-bound prefill into decode steps. "
              "block_size and NVLink do not change this.")
    if share > BW_BOUND_SHARE:
        return fail(f"{said}: memory-bandwidth bound.", remedy, evidence=evidence, charts=charts)
    if share > BW_LIKELY_SHARE:
        return warn(f"{said}: likely memory-bandwidth bound.", remedy, evidence=evidence, charts=charts)
    return passed(f"{said} (bound above {BW_BOUND_SHARE:.0%} of it, likely above {BW_LIKELY_SHARE:.0%}).",
                  evidence=evidence, charts=charts)


CHECKS = (
    Check("gpu.idle", "GPU idle while requests run", Severity.HIGH,
          f"NVML GPU util below {GPU_IDLE_UTIL_PCT:.0f}% over the window while vLLM has requests running", decide_idle),
    Check("gpu.bandwidth_bound", "GPU memory-bandwidth bound", Severity.MEDIUM,
          f"NVML GPM DRAM bandwidth util above {BW_BOUND_SHARE:.0%} of what a pure copy reaches on that GPU (likely "
          f"above {BW_LIKELY_SHARE:.0%})",
          decide_bandwidth),
)
