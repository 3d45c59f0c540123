"""The quality watch's results for Prometheus: `golden watch --metrics-port P` serves them on /metrics, one series per
replica (label `replica`: the URL watched), so a fleet's Prometheus, its rules and the Fleet page see agreement beside
latency. Values are the last answered round's; a replica that did not answer keeps its last numbers and shows
`triage_golden_answered 0`, never a made-up 0 agreement.
"""
from __future__ import annotations

import threading
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from core.compare.golden.replay import NO_ANSWER, REFUSED
from core.compare.golden.watch import Round

STATUSES = ("fine", "watch", "low agreement", "inconclusive", "broken", NO_ANSWER, REFUSED)
PREFIX = "triage_golden_"


def status_name(status: str) -> str:
    """A round's status as the `status` label: the compare's bands, and any broken side as "broken"."""
    return "broken" if "broken" in status else status


class GoldenCollector(Collector):
    """Holds the watch's latest numbers per replica; a scrape reads them (the watch thread writes with update())."""

    def __init__(self, golden_file: str):
        self.golden_file = golden_file
        self._lock = threading.Lock()
        self._replicas: dict[str, dict] = {}

    def update(self, rnd: Round) -> None:
        with self._lock:
            for r in rnd.replicas:
                cur = self._replicas.setdefault(r.url, {"rounds": 0, "numbers": None})
                cur["rounds"] += 1
                cur["last"] = rnd.started_at
                cur["status"] = status_name(r.status)
                cur["answered"] = r.status not in (NO_ANSWER, REFUSED)  # a broken replica answered, with NaN
                cur["drift"] = bool(r.drift)
                if r.summary is not None:
                    cur["numbers"] = {k: r.summary.get(k) for k in ("same_top", "top3_match", "mean_kld", "p99_kld")}

    def collect(self) -> Iterator:
        with self._lock:
            replicas = {url: dict(v) for url, v in self._replicas.items()}
        labels = ["replica", "golden"]

        def family(name: str, doc: str, kind=GaugeMetricFamily, extra: tuple[str, ...] = ()):
            return kind(PREFIX + name, doc, labels=labels + list(extra))

        same = family("same_top_ratio", "Share of golden positions where the replica's top token is the golden one "
                                        "(teacher-forced), last answered round")
        top3 = family("top3_match_ratio", "Top-3 token match with the golden set, last answered round")
        kld = family("kld_mean", "Mean KLD over the shared top-k against the golden set (nats), last answered round")
        p99 = family("kld_p99", "p99 KLD over the shared top-k against the golden set (nats), last answered round")
        answered = family("answered", "1 when the replica answered the last round, 0 when it did not")
        drift = family("drift", "1 when the last round moved beyond the noise floor since the replica's previous one")
        status = family("status", "1 for the replica's status in the last round (fine, watch, low agreement, "
                                  "inconclusive, broken, no answer, refused), 0 for the others", extra=("status",))
        rounds = family("rounds", "Rounds the watch ran on the replica", kind=CounterMetricFamily)
        last = family("last_round_timestamp_seconds", "Unix time the replica's last round started")
        for url, v in sorted(replicas.items()):
            key = [url, self.golden_file]
            nums = v["numbers"] or {}
            for fam, field in ((same, "same_top"), (top3, "top3_match"), (kld, "mean_kld"), (p99, "p99_kld")):
                if nums.get(field) is not None:
                    fam.add_metric(key, float(nums[field]))
            answered.add_metric(key, 1.0 if v["answered"] else 0.0)
            drift.add_metric(key, 1.0 if v["drift"] else 0.0)
            for s in STATUSES:
                status.add_metric(key + [s], 1.0 if v["status"] == s else 0.0)
            rounds.add_metric(key, float(v["rounds"]))
            last.add_metric(key, float(v["last"]))
        yield from (same, top3, kld, p99, answered, drift, status, rounds, last)


def serve(port: int, host: str, collector: GoldenCollector) -> None:
    """/metrics on host:port in a daemon thread (prometheus_client's own server), only this collector's series."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    start_http_server(port, host, registry=registry)
