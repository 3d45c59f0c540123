"""The vocabulary of the checklist: checks as data, what a check decides, and what a run produces.

A Check is data (stable id, title, severity, hint) plus a pure `decide(ctx) -> Outcome`. The runner turns an
Outcome into a Finding by adding the check's own fields, so a check never repeats its id or title, and owns
everything impure: timing, exceptions (-> ERROR), ordering.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Callable

from diagnostics.context import CheckContext, Series


class Status(str, Enum):
    FAIL = "FAIL"
    ERROR = "ERROR"  # the check itself broke; the run went on
    WARN = "WARN"
    PASS = "PASS"
    SKIP = "SKIP"  # an input was missing; the finding says which

    @property
    def rank(self) -> int:
        """Display order: what needs action first, SKIP last (it tells the least)."""
        return list(Status).index(self)


class Severity(IntEnum):
    """How much a failing check matters to a latency/throughput triage; orders findings of equal status."""

    LOW = 1
    MEDIUM = 2
    HIGH = 3

    @property
    def label(self) -> str:
        return self.name.lower()


PCT_RANGE = (0.0, 105.0)  # y range of percentage charts: headroom so a line at 100% is not cut in half


@dataclass(frozen=True)
class Chart:
    """The evidence as a picture: series on one y axis, with the thresholds the verdict used as lines."""

    title: str
    series: tuple[Series, ...]
    y_title: str
    thresholds: tuple[tuple[float, str], ...] = ()  # (y, label)
    y_range: tuple[float, float] | None = None  # percentages get 0-100, so 40% does not look like a full bar

    def to_dict(self) -> dict:
        return {"title": self.title, "y_title": self.y_title, "series": [s.to_dict() for s in self.series],
                "thresholds": [{"y": y, "label": label} for y, label in self.thresholds],
                "y_range": list(self.y_range) if self.y_range else None}

    @classmethod
    def from_dict(cls, d: dict) -> "Chart":
        """Back from to_dict (a History payload); absent fields take their defaults, so older payloads open."""
        series = tuple(Series(str(s.get("name", "")), str(s.get("unit", "")), str(s.get("source", "")),
                              tuple(s.get("t") or ()), tuple(s.get("v") or ())) for s in d.get("series") or ())
        thresholds = tuple((float(t["y"]), str(t.get("label", ""))) for t in d.get("thresholds") or ()
                           if isinstance(t, dict) and isinstance(t.get("y"), (int, float)))
        y_range = d.get("y_range")
        return cls(str(d.get("title", "")), series, str(d.get("y_title", "")), thresholds,
                   tuple(y_range) if y_range and len(y_range) == 2 else None)


@dataclass(frozen=True)
class Outcome:
    status: Status
    verdict: str  # one sentence: what was found
    remedy: str = ""  # what to do; empty when nothing needs doing
    evidence: dict[str, Any] = field(default_factory=dict)  # numbers; keys end in their unit (_pct, _bytes, _s)
    charts: tuple[Chart, ...] = ()
    missing: str = ""  # SKIP only: which input was missing, and why


def passed(verdict: str, **kw: Any) -> Outcome:
    return Outcome(Status.PASS, verdict, **kw)


def warn(verdict: str, remedy: str, **kw: Any) -> Outcome:
    return Outcome(Status.WARN, verdict, remedy, **kw)


def fail(verdict: str, remedy: str, **kw: Any) -> Outcome:
    return Outcome(Status.FAIL, verdict, remedy, **kw)


def skip(missing: str, **kw: Any) -> Outcome:
    """`missing` names the input and why it is missing: 'no GPU: NVML library not found'."""
    return Outcome(Status.SKIP, f"Not decided: {missing.rstrip('.')}.", missing=missing, **kw)


@dataclass(frozen=True)
class Check:
    id: str  # stable: reports, tests and users refer to it
    title: str
    severity: Severity
    hint: str  # what it looks at, in one line
    decide: Callable[[CheckContext], Outcome] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Finding:
    check_id: str
    title: str
    severity: Severity
    status: Status
    verdict: str
    remedy: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    charts: tuple[Chart, ...] = ()
    missing: str = ""
    hint: str = ""

    @classmethod
    def from_outcome(cls, check: Check, outcome: Outcome) -> "Finding":
        return cls(check.id, check.title, check.severity, outcome.status, outcome.verdict, outcome.remedy,
                   dict(outcome.evidence), outcome.charts, outcome.missing, check.hint)

    @property
    def sort_key(self) -> tuple:
        return (self.status.rank, -int(self.severity), self.check_id)

    def to_dict(self) -> dict:
        return {"id": self.check_id, "title": self.title, "severity": self.severity.label,
                "status": self.status.value, "verdict": self.verdict, "remedy": self.remedy,
                "missing": self.missing, "hint": self.hint, "evidence": self.evidence,
                "charts": [c.to_dict() for c in self.charts]}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        """Back from to_dict; an unknown status or severity (a payload from another version) is shown as it was
        saved rather than refused: status ERROR is never invented, an unknown one reads SKIP with its text kept."""
        try:
            status = Status(d.get("status"))
        except ValueError:
            status = Status.SKIP
        severity = {s.label: s for s in Severity}.get(str(d.get("severity", "")).lower(), Severity.LOW)
        charts = tuple(Chart.from_dict(c) for c in d.get("charts") or () if isinstance(c, dict))
        evidence = d.get("evidence") if isinstance(d.get("evidence"), dict) else {}
        return cls(str(d.get("id", "?")), str(d.get("title", d.get("id", "?"))), severity, status,
                   str(d.get("verdict", "")), str(d.get("remedy") or ""), evidence, charts,
                   str(d.get("missing") or ""), str(d.get("hint") or ""))


@dataclass(frozen=True)
class RunResult:
    started_at: str  # ISO 8601, local time with offset
    requested_s: float
    window_s: float  # what was sampled (shorter when cancelled)
    cancelled: bool
    host: str
    inputs: dict[str, Any]  # vllm_url, launch_cmd, requested_precision, interval_s
    findings: tuple[Finding, ...]  # in display order
    collector_notes: tuple[str, ...] = ()  # how telemetry was read (e.g. "own NVML adapter")

    def counts(self) -> dict[str, int]:
        return {s.value: sum(f.status is s for f in self.findings) for s in Status}

    def to_dict(self) -> dict:
        return {"schema": "triage-console/diagnostics-run/1", "started_at": self.started_at,
                "requested_s": self.requested_s, "window_s": self.window_s, "cancelled": self.cancelled,
                "host": self.host, "inputs": self.inputs, "counts": self.counts(),
                "collector_notes": list(self.collector_notes), "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        """Back from to_dict (a History payload or a JSON report); fields an older payload lacks take defaults."""
        def num(key: str) -> float:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) else 0.0

        findings = tuple(Finding.from_dict(f) for f in d.get("findings") or () if isinstance(f, dict))
        return cls(str(d.get("started_at", "")), num("requested_s"), num("window_s"), bool(d.get("cancelled")),
                   str(d.get("host", "")), d.get("inputs") if isinstance(d.get("inputs"), dict) else {},
                   findings, tuple(str(n) for n in d.get("collector_notes") or ()))
