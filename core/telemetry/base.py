"""The telemetry Source protocol, the Sample it returns, and the small helpers every source shares.

Design rules (docs/DESIGN.md): `probe()` says whether a source can work here and why not; `sample()` never
raises; a field the hardware or driver cannot give is None and carries a reason, which the UI shows as "N/A" on
hover. Units are converted once, at the source, and named in the field (util_pct, mem_used_bytes, power_w, ...),
so formatting and export never guess. This module imports nothing heavy: no torch, no pynvml.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


log = logging.getLogger("triage.telemetry")

# Checklist thresholds. Kept here, once, so the gauges' colour bands and the
# diagnostics checks cannot drift apart.
GPU_IDLE_UTIL_PCT = 70.0  # NVML GPU util below this over the window while requests run: host-side stall
# DRAM bandwidth is judged against what the GPU can reach, not against NVML's 100%: a pure device-to-device copy,
# which nothing real beats, reads 88.6-89.2% GPM DRAM_BW_UTIL on an H200 (measured by this project under
# scripts/gpu_host_check.sh's copy load), so a "95%" threshold could never fire there.
BW_LIKELY_SHARE = 0.80  # of the achievable: "likely" memory bound
BW_BOUND_SHARE = 0.95  # of the achievable: memory bound
ACHIEVABLE_DRAM_BW_PCT = {"NVIDIA H200": 89.0}  # GPU name (as NVML gives it) -> a pure copy's GPM DRAM_BW_UTIL
ASSUMED_ACHIEVABLE_DRAM_BW_PCT = 89.0  # other GPUs with GPM (Hopper and newer): the H200's, until measured there


def achievable_dram_bw(gpu_name: str) -> tuple[float, str]:
    """(the DRAM BW util % a pure copy reaches on this GPU model, where that number comes from)."""
    if gpu_name in ACHIEVABLE_DRAM_BW_PCT:
        return ACHIEVABLE_DRAM_BW_PCT[gpu_name], f"a pure copy measured on an {gpu_name}"
    return ASSUMED_ACHIEVABLE_DRAM_BW_PCT, f"not measured on a {gpu_name}: assumed from an H200's pure copy"


def bandwidth_thresholds(gpu_name: str) -> tuple[float, float]:
    """(likely, bound) in GPM DRAM BW util %, for the gauges' bands and the checklist alike."""
    peak, _ = achievable_dram_bw(gpu_name)
    return BW_LIKELY_SHARE * peak, BW_BOUND_SHARE * peak


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""  # a full sentence when not ok: what is missing and what to do


@dataclass(frozen=True)
class Sample:
    """One reading of one source. `values` is flat (key -> number, string or None) so a tick is one table row."""

    source: str  # "nvml", "host", "vllm"
    t: float  # time.time() when taken
    values: dict[str, Any]
    reasons: dict[str, str] = field(default_factory=dict)  # key -> why its value is None
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # non-tabular extras (GPU processes)


@runtime_checkable
class Source(Protocol):
    name: str

    def probe(self) -> Availability: ...

    def sample(self) -> Sample: ...  # never raises

    def close(self) -> None: ...


class FailureLog:
    """Logs a polling failure once per (source, field), not on every tick: at 10 Hz a broken field would otherwise
    write 36,000 identical lines an hour. The reason stays visible in the Sample either way."""

    def __init__(self, source: str):
        self.source = source
        self._seen: set[str] = set()

    def once(self, key: str, reason: str, level: int = logging.WARNING) -> None:
        if key not in self._seen:
            self._seen.add(key)
            log.log(level, "%s: %s unavailable: %s (logged once)", self.source, key, reason)
