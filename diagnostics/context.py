"""What the checks look at: a small, immutable CheckContext the runner fills from telemetry.

Checks are pure functions of this object, so every one of them is unit-tested with a hand-made context. An input
that could not be had is left empty and its reason is kept beside it, so a check can SKIP and say which input was
missing and why ("no GPU: NVML library not found", "no vLLM URL given").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the context only carries these; importing them here would pull prometheus_client in
    from core.deployment.liveness import Observation
    from core.telemetry.host import ProcessGrowth
    from core.telemetry.vllm_metrics import VllmSnapshot
    from diagnostics.flags import LintResult


@dataclass(frozen=True)
class Series:
    """One time series over the window. `t` is seconds since the window started; a None value is a missed reading."""

    name: str  # what a chart legend says: "GPU 0 util"
    unit: str  # "%", "bytes", "fraction", "count"
    source: str  # where it came from: "NVML", "NVML GPM", "psutil (/proc/meminfo)", "vLLM /metrics"
    t: tuple[float, ...] = ()
    v: tuple[float | None, ...] = ()

    def points(self) -> list[tuple[float, float]]:
        return [(t, v) for t, v in zip(self.t, self.v) if v is not None and not math.isnan(v)]

    def values(self) -> list[float]:
        return [v for _, v in self.points()]

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "source": self.source, "t": list(self.t), "v": list(self.v)}


@dataclass(frozen=True)
class GpuWindow:
    index: int
    name: str
    compute_capability: tuple[int, int] | None = None
    util_pct: Series | None = None  # NVML utilization.gpu: share of time any kernel ran
    dram_bw_util_pct: Series | None = None  # NVML GPM DRAM_BW_UTIL; None where GPM is unsupported (pre-Hopper)
    dram_bw_reason: str = ""  # why dram_bw_util_pct is None
    mem_total_bytes: int | None = None
    throttle_reasons: tuple[str | None, ...] = ()  # NVML clock-event reasons per reading ("SW power cap, HW thermal")
    processes: tuple[tuple[int, str], ...] = ()  # (PID, name) of the compute processes at the window's end
    lost: str = ""  # why the GPU stopped answering, if it did

    @property
    def label(self) -> str:
        cc = f", CC {self.compute_capability[0]}.{self.compute_capability[1]}" if self.compute_capability else ""
        return f"GPU {self.index} ({self.name}{cc})"


@dataclass(frozen=True)
class CheckContext:
    window_s: float = 0.0  # how long the samples span
    # GPUs: empty with a reason when there is none or NVML cannot be read.
    gpus: tuple[GpuWindow, ...] = ()
    gpu_reason: str = "no GPU data collected"
    driver_version: str | None = None  # "580.159.03"
    cuda_driver_version: tuple[int, int] | None = None  # the newest CUDA the driver supports (NVML), e.g. (13, 0)
    runtime_cuda: dict[str, tuple[int, int]] = field(default_factory=dict)  # "torch 2.11.0+cu130 (console)" -> (13, 0)
    # Host
    host_mem_available: Series | None = None  # MemAvailable in bytes
    host_mem_total_bytes: int | None = None
    host_reason: str = "no host memory data collected"
    # whose resident memory grew over the window (core.telemetry.host.RssWatch); None: not known, reason beside it
    host_growth: tuple["ProcessGrowth", ...] | None = None
    host_growth_reason: str = "process memory not read"
    server_pids: frozenset[int] = frozenset()  # the server under test's processes on this host, with descendants
    console_pids: frozenset[int] = frozenset()  # this console's process and its children
    # vLLM
    vllm_url: str | None = None
    vllm_snapshots: tuple["VllmSnapshot", ...] = ()  # successful scrapes; snapshot.t is seconds since window start
    vllm_error: str | None = None  # the last scrape error, if any scrape failed
    vllm_scrapes: int = 0  # scrapes attempted
    vllm_slowest_answer_s: float | None = None  # the slowest /metrics answer: a busy API server answers late
    # liveness rounds (/metrics, /health, canary, processes, GPU) over the window; empty with the reason why
    vllm_liveness: tuple["Observation", ...] = ()
    vllm_liveness_reason: str = "no liveness rounds taken"
    golden_round: dict | None = None  # core.compare.golden ReplicaRound.to_dict(): the replay after the window
    golden_reason: str = "no golden set given (--golden FILE, recorded with `python -m diagnostics golden record`)"
    # What the user told us
    golden_file: str | None = None
    launch_cmd: str | None = None
    requested_precision: str | None = None  # given explicitly (--precision); else fp8.capability reads the launch cmd
    flag_lint: "LintResult | None" = None  # the launch command checked against vLLM's parser (collected, not pure)

    @property
    def launch_args(self) -> list[str]:
        """The launch command split like a shell would; [] when none was given or it cannot be split."""
        from diagnostics.flags import tokenize

        if not self.launch_cmd:
            return []
        try:
            return tokenize(self.launch_cmd)
        except ValueError:
            return []

    def launch_flag_value(self, *names: str) -> str | None:
        """The value of the first of these flags in the launch command (`--x v` or `--x=v`); None if absent."""
        args = self.launch_args
        for i, tok in enumerate(args):
            head, eq, value = tok.partition("=")
            if head.replace("_", "-") in names:
                if eq:
                    return value
                return args[i + 1] if i + 1 < len(args) else ""
        return None

    def launch_has_flag(self, name: str) -> bool:
        """True if the switch is on: present, and not turned off again by a later --no-<name>."""
        state = False
        for tok in self.launch_args:
            head = tok.partition("=")[0].replace("_", "-")
            if head == name:
                state = True
            elif head == "--no-" + name[2:]:
                state = False
        return state
