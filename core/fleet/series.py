"""Time series for the fleet page: one query_range per chart for the whole fleet, the worst replicas drawn.

The query is the same aggregated `by (replica label)` expression as the table's column, so a chart costs one
request however many replicas there are; which replicas are "worst" is decided here, from the returned series.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from core.errors import InputError
from core.fleet.fleet import FleetSnapshot
from core.fleet.prom import Prometheus
from core.fleet.promql import Builder, Names
from core.fleet.selector import parse_selector

RANGES = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}
POINTS = 240  # per series: enough for a smooth line, little enough for 1,000 replicas' answer
CHARTABLE = {"ttft_p99_s": ("TTFT p99", "s"), "itl_p99_s": ("ITL p99", "s"), "ttft_p50_s": ("TTFT p50", "s"),
             "ttft_mean_s": ("TTFT mean", "s"), "queue_mean_s": ("mean queue time", "s"),
             "waiting_capacity": ("requests waiting for capacity", "requests"),
             "running": ("requests running", "requests"), "waiting": ("requests waiting", "requests"),
             "kv": ("KV cache usage", "fraction"), "preemptions_s": ("preemptions", "per s"),
             "generation_tok_s": ("generation tokens", "per s"), "prompt_tok_s": ("prompt tokens", "per s")}


@dataclass(frozen=True)
class Chart:
    column: str
    title: str
    unit: str
    promql: str
    step_s: float
    lines: dict[str, list[tuple[float, float]]]  # replica -> (unix s, value), the worst first
    replicas_total: int


def history(prom: Prometheus, snap: FleetSnapshot, column: str, range_key: str = "1h", worst: int = 5,
            replica: str | None = None) -> Chart:
    """`column` over the `range_key` up to now (or up to the snapshot's past instant, for a post-incident review) for
    the `worst` replicas (highest mean), or for one `replica`."""
    if column not in CHARTABLE:
        raise InputError(f"{column!r} cannot be charted; choose one of {', '.join(CHARTABLE)}.")
    if range_key not in RANGES:
        raise InputError(f"The range {range_key!r} is not offered; choose one of {', '.join(RANGES)}.")
    b = Builder(parse_selector(snap.selector), snap.replica_label, snap.window, Names(snap.names),
                snap.scrape_interval_s)
    if replica is not None:
        b = b.for_replica(replica)
    promql = b.replica_columns().get(column)
    if promql is None:
        raise InputError(f"This Prometheus has no series for {CHARTABLE[column][0]}.")
    end = snap.at if snap.at is not None else time.time()
    step = max(1.0, RANGES[range_key] / POINTS)
    series = prom.query_range(promql, end - RANGES[range_key], end, step)
    by_name = {s.labels.get(snap.replica_label, ""): list(s.points) for s in series if s.points}
    ranked = sorted(by_name, key=lambda n: -sum(v for _, v in by_name[n]) / len(by_name[n]))
    lines = {n: by_name[n] for n in ranked[:worst]}
    title, unit = CHARTABLE[column]
    return Chart(column, title, unit, promql, step, lines, len(by_name))
