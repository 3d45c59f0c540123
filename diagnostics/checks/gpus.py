"""Checks that compare the GPUs of one host: a slow tensor-parallel group is often one GPU that is idle while its
peers work, throttled while they are not, shared with another process, or a different model. Each finding names the
GPU. On a one-GPU host the comparisons have nothing to compare and SKIP; they never report an imbalance there."""
from __future__ import annotations

from statistics import median

from core.stats import mean
from diagnostics.checks.gpu import busy_readings
from diagnostics.checks import no_gpu
from diagnostics.context import CheckContext, GpuWindow
from diagnostics.findings import PCT_RANGE, Chart, Check, Outcome, Severity, passed, skip, warn

IMBALANCE_POINTS = 25.0  # a GPU this many percentage points below its peers' median is lagging
# Clock-event reasons that mean the GPU slowed itself down. "SW power cap" is left out: a GPU at full load sits at
# its power limit, and the clocks it gives up there are the expected price of that load.
SLOWDOWN_REASONS = ("HW slowdown", "HW thermal", "SW thermal", "HW power brake")
THROTTLED_SHARE = 0.2  # throttled in at least this share of the window's readings
SERVER_PROCESS_MARKS = ("vllm", "enginecore")  # vLLM's process titles: "VLLM::EngineCore", "vllm serve ..."


def _need_two(ctx: CheckContext) -> Outcome | None:
    if not ctx.gpus:
        return no_gpu(ctx)
    if len(ctx.gpus) < 2:
        return skip(f"one GPU ({ctx.gpus[0].label}): nothing to compare it with")
    return None


def decide_imbalance(ctx: CheckContext) -> Outcome:
    missing = _need_two(ctx)
    if missing:
        return missing
    util = busy_readings(ctx, "util_pct")
    if isinstance(util, Outcome):
        return util
    if len(util.per_gpu) < 2:
        return skip("fewer than two GPUs gave utilization readings during the window")
    bw = busy_readings(ctx, "dram_bw_util_pct")
    fields = {"util": {k: mean(v) for k, v in util.per_gpu.items()}}
    if not isinstance(bw, Outcome) and len(bw.per_gpu) >= 2:
        fields["DRAM BW util"] = {k: mean(v) for k, v in bw.per_gpu.items()}
    evidence: dict = {f"{label} mean_{name.replace(' ', '_').lower()}_pct": round(m, 1)
                      for name, means in fields.items() for label, m in means.items()}
    evidence["load_known"] = util.load_known
    lagging = []
    for name, means in fields.items():
        for label, m in means.items():
            peers = median(x for other, x in means.items() if other != label)
            if peers - m >= IMBALANCE_POINTS:
                lagging.append(f"{label} {name} {m:.0f}% against {peers:.0f}% for its peers")
    charts = (Chart("GPU utilization by GPU (NVML)", tuple(g.util_pct for g in ctx.gpus if g.util_pct), "%",
                    (), PCT_RANGE),)
    when = "while vLLM had requests running" if util.load_known else "over the window"
    if lagging:
        return warn(f"One GPU works far less than its peers {when}: " + "; ".join(lagging) + ".",
                    "In a tensor-parallel group every GPU waits for the slowest, so the group runs at the pace of "
                    "this one. Check that it belongs to the group (CUDA_VISIBLE_DEVICES, --tensor-parallel-size), "
                    "that no other process uses it (the foreign-process check), its clocks and throttle reasons, and "
                    "its link to its peers (`nvidia-smi topo -m`: NVLink against PCIe, NUMA node). With one replica "
                    "per GPU (data parallel), an idle replica means the router sends it less traffic.",
                    evidence=evidence, charts=charts)
    lo, hi = min(fields["util"].values()), max(fields["util"].values())
    return passed(f"The {len(fields['util'])} GPUs worked alike {when}: mean util {lo:.0f}-{hi:.0f}%"
                  f" (a GPU {IMBALANCE_POINTS:.0f} points below its peers' median would be flagged).",
                  evidence=evidence, charts=charts)


def _slowdown_share(g: GpuWindow) -> tuple[float, set[str], int]:
    """(share of readings with a slowdown reason, the reasons seen, readings) for one GPU."""
    readings = [r for r in g.throttle_reasons if r is not None]
    seen: set[str] = set()
    slowed = 0
    for r in readings:
        active = {x.strip() for x in r.split(",")} & set(SLOWDOWN_REASONS)
        seen |= active
        slowed += bool(active)
    return (slowed / len(readings) if readings else 0.0), seen, len(readings)


def decide_throttled(ctx: CheckContext) -> Outcome:
    if not ctx.gpus:
        return no_gpu(ctx)
    shares = {g.label: _slowdown_share(g) for g in ctx.gpus}
    if not any(n for _, _, n in shares.values()):
        return skip("throttle reasons: NVML gave no clock-event readings during the window")
    evidence = {f"{label} slowed_share": round(s, 2) for label, (s, _, n) in shares.items() if n}
    evidence.update({f"{label} reasons": ", ".join(sorted(seen)) for label, (_, seen, _) in shares.items() if seen})
    throttled = [(label, s, seen) for label, (s, seen, _) in shares.items() if s >= THROTTLED_SHARE]
    if not throttled:
        return passed(f"No GPU slowed itself down ({', '.join(SLOWDOWN_REASONS)}) in {THROTTLED_SHARE:.0%} or more "
                      "of the readings; a power cap at full load is not counted.", evidence=evidence)
    named = "; ".join(f"{label}: {', '.join(sorted(seen))} in {s:.0%} of readings" for label, s, seen in throttled)
    peers = len(ctx.gpus) - len(throttled)
    alone = f", while {'its' if len(throttled) == 1 else 'their'} {peers} peer{'s' if peers != 1 else ''} did not" \
        if peers else ""
    return warn(f"Throttled{alone}: {named}.",
                "Thermal slowdown: check the GPU's cooling (fans, airflow, the temperature on the Live monitor) and "
                "the data centre's inlet temperature; HW slowdown or a power brake: the board's power supply or an "
                "external signal (`nvidia-smi -q -d PERFORMANCE`). One throttled GPU slows its whole "
                "tensor-parallel group.", evidence=evidence)


def _is_server(name: str) -> bool:
    return any(mark in name.lower() for mark in SERVER_PROCESS_MARKS)


def decide_foreign_process(ctx: CheckContext) -> Outcome:
    if not ctx.gpus:
        return no_gpu(ctx)
    serving = [g for g in ctx.gpus if any(_is_server(name) for _, name in g.processes)]
    if not serving:
        return skip("no vLLM process on any GPU (looked for process names containing 'vllm' or 'EngineCore')")
    evidence = {f"{g.label} processes": ", ".join(f"{name} ({pid})" for pid, name in g.processes) for g in serving}
    foreign = {g.label: [f"{name} (PID {pid})" for pid, name in g.processes if not _is_server(name)] for g in serving}
    foreign = {label: procs for label, procs in foreign.items() if procs}
    if foreign:
        return warn("Another process shares a GPU with vLLM: " +
                    "; ".join(f"{label}: {', '.join(p)}" for label, p in foreign.items()) + ".",
                    "It takes compute time and memory that vLLM sized itself against at start "
                    "(--gpu-memory-utilization is a share of the whole GPU). Stop it or move it to another GPU; "
                    "to keep both, lower --gpu-memory-utilization so the two fit.", evidence=evidence)
    return passed(f"Only vLLM's processes run on the GPU{'s' if len(serving) > 1 else ''} it uses "
                  f"({', '.join(g.label for g in serving)}).", evidence=evidence)


def decide_mixed(ctx: CheckContext) -> Outcome:
    missing = _need_two(ctx)
    if missing:
        return missing
    known = [g for g in ctx.gpus if g.mem_total_bytes and not g.lost]  # a lost GPU tells neither
    if len(known) < 2:
        return skip("fewer than two GPUs reported their memory size during the window")
    kinds = {(g.name, g.mem_total_bytes) for g in known}

    def kind(g: GpuWindow) -> str:
        return f"{g.name}, {g.mem_total_bytes / 2**30:.0f} GiB"

    evidence = {g.label: kind(g) for g in known}
    if len(kinds) > 1:
        return warn("GPUs of different models or memory sizes on one host: " +
                    "; ".join(f"GPU {g.index}: {kind(g)}" for g in known) + ".",
                    "A tensor-parallel group runs at the pace of its slowest GPU and vLLM sizes the KV cache for "
                    "its smallest. Group GPUs of one kind (CUDA_VISIBLE_DEVICES) and run the others as a separate "
                    "replica.", evidence=evidence)
    return passed(f"All {len(known)} GPUs that answered are the same: {kind(known[0])}.", evidence=evidence)


CHECKS = (
    Check("gpu.imbalance", "One GPU idle while its peers work", Severity.HIGH,
          f"a GPU's util or DRAM BW util {IMBALANCE_POINTS:.0f}+ points below its peers' median", decide_imbalance),
    Check("gpu.throttled", "GPU throttled", Severity.MEDIUM,
          f"NVML clock-event reasons {', '.join(SLOWDOWN_REASONS)} in {THROTTLED_SHARE:.0%}+ of readings",
          decide_throttled),
    Check("gpu.foreign_process", "Another process on vLLM's GPU", Severity.MEDIUM,
          "a compute process that is not vLLM on a GPU where vLLM runs", decide_foreign_process),
    Check("gpu.mixed_models", "GPUs of different kinds", Severity.LOW,
          "GPUs of different models or memory sizes on one host", decide_mixed),
)
