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
BW_LIKELY_PCT = 80.0  # DRAM BW util above this: "likely" memory bound
BW_BOUND_PCT = 95.0  # DRAM BW util above this: memory bound


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
