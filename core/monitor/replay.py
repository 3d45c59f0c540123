"""A monitor recording (core/recordings, kind "monitor") replayed through the same frame builder as the live page.

The payload, as `python -m bench.record_demo h200` writes it:
    gpus: [{index, name, compute_capability, gpm: {ok, reason}}], driver_version, cuda_driver_version,
    nvml: {ok, reason}, sampled_hz (the sampler's rate), replay_hz (rows kept per second),
    t: [unix seconds], columns: {sampler key ("gpu0.util_pct", "host.cpu_pct", ...): [value per t]},
    segments: [{label, start, end, steps, tokens_per_s}] (what ran on the GPU when), checklist_window: {start, end},
    reasons: {key: why it is N/A}, tables: {"gpu0.processes": [...]}, notes: [...]
Replay stands in for the sampler (latest, series, source, availability), frozen at one moment of the recording, so
the gauges and trends come from frames._build exactly as they do live.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Iterable

from core.telemetry.base import Availability
from core.telemetry.nvml import GpuInfo
from core.telemetry.sampler import Snapshot


class RecordingFormatError(ValueError):
    pass


@dataclass(frozen=True)
class _Nvml:
    gpus: list[GpuInfo]
    driver_version: str | None
    cuda_driver_version: str | None


def check(payload: dict) -> None:
    """Raise RecordingFormatError naming what is wrong with a monitor payload."""
    t, cols = payload.get("t"), payload.get("columns")
    if not isinstance(t, list) or len(t) < 2:
        raise RecordingFormatError("a monitor recording needs at least two rows of times ('t')")
    if not isinstance(cols, dict) or not cols:
        raise RecordingFormatError("a monitor recording needs 'columns'")
    bad = [k for k, v in cols.items() if not isinstance(v, list) or len(v) != len(t)]
    if bad:
        raise RecordingFormatError(f"columns of another length than 't': {', '.join(bad[:5])}")


class Replay:
    """The sampler's reader side over a recording, at moment `at` (unix seconds; None: the last row). With `whole`,
    series() spans the whole recording, not only what came before the moment: a replay shows the run end to end
    with the moment marked."""

    def __init__(self, payload: dict, at: float | None = None, whole: bool = True):
        check(payload)
        self.whole = whole
        self.payload = payload
        self.t: list[float] = payload["t"]
        self.columns: dict[str, list] = payload["columns"]
        self.i = len(self.t) - 1 if at is None else max(0, bisect.bisect_right(self.t, at) - 1)
        self._nvml = _Nvml([GpuInfo(index=g["index"], name=g["name"], uuid="", compute_capability=g.get(
            "compute_capability"), gpm=Availability(bool((g.get("gpm") or {}).get("ok")),
                                                    str((g.get("gpm") or {}).get("reason", ""))))
                            for g in payload.get("gpus") or []],
                           payload.get("driver_version"), payload.get("cuda_driver_version"))

    @property
    def start(self) -> float:
        return self.t[0]

    @property
    def end(self) -> float:
        return self.t[-1]

    @property
    def now(self) -> float:
        return self.t[self.i]

    def latest(self) -> Snapshot:
        values = {k: v[self.i] for k, v in self.columns.items()}
        values["t"] = self.now
        reasons = dict(self.payload.get("reasons") or {})
        for k, v in values.items():
            if v is None and k not in reasons:
                reasons[k] = "no reading at this moment of the recording"
        return Snapshot(self.now, values, reasons, dict(self.payload.get("tables") or {}))

    def series(self, keys: Iterable[str], seconds: float, max_points: int = 600) -> dict[str, list]:
        """Like Sampler.series: the rows of the last `seconds` up to this moment, averaged down to max_points."""
        if self.whole:
            rows = range(len(self.t))
        else:
            rows = range(bisect.bisect_left(self.t, self.now - seconds), self.i + 1)
        step = max(1, math.ceil(len(rows) / max_points))
        out: dict[str, list] = {"t": [self.t[j] for j in rows][step - 1::step]}
        for key in keys:
            col = self.columns.get(key) or [None] * len(self.t)
            vals = [col[j] for j in rows]
            if step == 1:
                out[key] = vals
                continue
            pts = []
            for a in range(0, len(vals) - step + 1, step):
                nums = [v for v in vals[a:a + step] if isinstance(v, (int, float))]
                pts.append(sum(nums) / len(nums) if nums else None)
            out[key] = pts
        return out

    def source(self, name: str) -> Any:
        return self._nvml if name == "nvml" else None

    def availability(self, name: str) -> Availability:
        if name == "nvml":
            n = self.payload.get("nvml") or {}
            return Availability(bool(n.get("ok")), str(n.get("reason", "")))
        return Availability(True, "")

    def segment_at(self, t: float | None = None) -> dict | None:
        """The load phase running at `t` (default: this moment), if any."""
        t = self.now if t is None else t
        return next((s for s in self.payload.get("segments") or [] if s["start"] <= t <= s["end"]), None)

    def default_moment(self) -> float:
        """Where a replay opens: the middle of the first load phase (busy gauges), else the last row."""
        segs = self.payload.get("segments") or []
        return (segs[0]["start"] + segs[0]["end"]) / 2 if segs else self.end
