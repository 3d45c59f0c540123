"""The fleet checklist: one refresh of the fleet view from Prometheus, every fleet check over it, saved to History.

Shared by `python -m diagnostics fleet`, `python -m diagnostics run --prometheus-url` and the Fleet page. The saved
payload holds the snapshot and the findings, never credentials (those live only in the environment).
"""
from __future__ import annotations

import datetime as dt
import socket
import time
from dataclasses import dataclass

from core import store
from core.fleet.fleet import FleetSnapshot, collect
from core.fleet.prom import Prometheus
from diagnostics.checks.fleet import CHECKS
from diagnostics.findings import RunResult
from diagnostics.report import summary_line
from diagnostics.runner import evaluate


@dataclass(frozen=True)
class FleetRun:
    snapshot: FleetSnapshot
    result: RunResult

    def to_dict(self) -> dict:
        return {"schema": "triage-console/fleet-run/1", "fleet": self.snapshot.to_dict(),
                "checklist": self.result.to_dict()}


def run(prom: Prometheus, selector: str = "", replica_label: str = "instance", window: str = "5m",
        save: bool = True, at: float | None = None) -> FleetRun:
    """The checklist now, or as it stood at unix time `at` (the queries' window ends there)."""
    t_start = time.time()  # History shows how long the refresh took: saved with its real start, not start = end
    started = dt.datetime.fromtimestamp(t_start).astimezone().isoformat(timespec="seconds")
    snap = collect(prom, selector, replica_label, window, at)
    findings = evaluate(snap, CHECKS)
    inputs = {"prometheus_url": snap.prometheus_url, "selector": snap.selector, "replica_label": snap.replica_label,
              "window": snap.window, "auth": prom.auth_description}
    if snap.at is not None:  # a post-incident review: History keeps the instant it looked at
        inputs["at"] = _iso(snap.at)
    notes = (f"Prometheus {snap.prometheus_version}; {snap.cost.requests} requests, Prometheus query time "
             f"{snap.cost.prom_eval_s * 1000:.0f} ms; GPU series: {snap.gpu_source or 'none'}", *snap.notes)
    result = RunResult(started, float(snap.window_s), float(snap.window_s), False, socket.gethostname(), inputs,
                       tuple(findings), notes)
    out = FleetRun(snap, result)
    if save:
        store.record("fleet", history_title(snap), out.to_dict(), history_summary(out), started_at=t_start)
    return out


def history_title(snap: FleetSnapshot) -> str:
    sel = f" {snap.selector}" if snap.selector else ""
    when = f", as at {_iso(snap.at)}" if snap.at is not None else ""
    return f"Fleet, {len(snap.replicas)} replicas{sel} at {snap.prometheus_url} ({snap.window}{when})"


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def history_summary(run: FleetRun) -> dict:
    snap = run.snapshot
    return {**run.result.counts(), "replicas": len(snap.replicas),
            "down": sum(r.up is False for r in snap.replicas),
            "outliers": sum(bool(r.outliers) for r in snap.replicas),
            "fleet_median_ttft_p99_s": snap.fleet_median.get("ttft_p99_s"),
            "fleet_median_itl_p99_s": snap.fleet_median.get("itl_p99_s"),
            "queries": snap.cost.queries, "summary": summary_line(run.result),
            **({"at": _iso(snap.at)} if snap.at is not None else {})}
