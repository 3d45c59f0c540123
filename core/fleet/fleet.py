"""One refresh of the fleet view: discover the replicas, run every column's query once, join and rank them.

A refresh sends a fixed number of requests whatever the fleet's size (about 35: discovery, one per column, the
targets list); they run in parallel. Every target of the vLLM scrape jobs is a replica, also one that never
exported a series (down since Prometheus started: a crash-looping new pod). Means are exact (rate of _sum over rate
of _count); a quantile is interpolated inside its bucket, whose bounds are kept beside it. The result is plain data
(FleetSnapshot) that the fleet checks, the page, the CLI and History all read.
"""
from __future__ import annotations

import datetime as dt
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from core.fleet.prom import Cost, PromError, Prometheus
from core.fleet.promql import (ANATOMY, HISTOGRAMS, HOST, PREFIXES, QUANTILED, Builder, Names, REPLICA_LABELS,
                               discovery_query, first_seen_step_s, host_of, parse_window, stall_window)
from core.fleet.selector import Matcher, check_label_name, parse_selector, quote, render
from core.stats import mad, median, robust_z

OUTLIER_Z = 3.5  # robust z beyond which a replica is marked (Iglewicz and Hoaglin's usual cut-off)
OUTLIER_MIN_RATIO = 1.5  # ...and at least this far from the median as a ratio, so a tight fleet flags no one
# higher is worse; the exact means first (what a replica's users waited on average), then the interpolated quantiles
MEANS = ("ttft_mean_s", "queue_mean_s", "e2e_mean_s")
RANKED = MEANS + ("ttft_p99_s", "itl_p99_s", "ttft_p50_s", "itl_p50_s")
PARALLEL = 8
# No ratio against a value under this: a mean queue of 23 µs is no queue at all, and 16 s against it is not "689647x"
# slower. 10 ms is below vLLM's coarsest resolution that matters for TTFT, queue and e2e; ITL steps are milliseconds.
RATIO_FLOOR_S = {"itl_p50_s": 0.001, "itl_p99_s": 0.001}
DEFAULT_RATIO_FLOOR_S = 0.01


def ratio_floor(col: str) -> float:
    """The smallest value of a column a ratio may be taken against (see RATIO_FLOOR_S)."""
    return RATIO_FLOOR_S.get(col, DEFAULT_RATIO_FLOOR_S)


class NoVllmSeries(PromError):
    """The selector matches no vLLM series in this Prometheus."""


@dataclass
class Replica:
    name: str  # the replica label's value
    instances: list[str]
    up: bool | None  # None: none of its targets is in /api/v1/targets (federated or remote-written data)
    last_scrape_age_s: float | None = None
    last_error: str = ""
    values: dict[str, float | None] = field(default_factory=dict)  # the replica columns (running, ttft_p99_s, ...)
    gpu: dict[str, float | None] = field(default_factory=dict)  # the GPU columns of its host or pod
    # column -> robust z for the columns it stands out in; None where the others agree exactly (MAD 0)
    outliers: dict[str, float | None] = field(default_factory=dict)
    # quantile column -> [lower, upper] seconds of the bucket it fell in (upper None: +Inf); the quantile is
    # interpolated anywhere inside it (a p99 of 74 s from the 40-80 s bucket may be a slowest request of 42 s)
    buckets: dict[str, list[float | None]] = field(default_factory=dict)
    # the quality watch's last round for it (`golden watch --metrics-port`, scraped by the same Prometheus):
    # status, same_top, mean_kld, drift, golden; empty where no watch covers it
    golden: dict[str, Any] = field(default_factory=dict)

    def value(self, col: str) -> float | None:
        return self.values.get(col, self.gpu.get(col))


@dataclass
class FleetSnapshot:
    prometheus_url: str
    selector: str
    replica_label: str
    window: str
    window_s: int
    t: float  # unix seconds of the evaluation
    replicas: list[Replica]
    promql: dict[str, str]  # column -> the query it came from
    names: dict[str, str]  # column -> the vLLM metric name found
    gpu_source: str  # "dcgm-exporter", "triage exporter", "" (no GPU series)
    no_stats_targets: list[dict[str, str]]  # up targets of the vLLM jobs that export no vllm series
    fleet_median: dict[str, float | None]
    prometheus_version: str
    cost: Cost
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    gpu_keys: list[str] = field(default_factory=list)  # hosts (or pods) that have GPU series, whatever the replicas
    asked_replica_label: str = ""  # the label asked for, where none of the series carried it (replica_label: used)
    stall_window: str = ""  # the window the stall columns judge progress over (promql.stall_window)
    stall_window_s: int = 0
    scrape_interval_s: float | None = None  # the replicas' targets' scrape interval; None: not in /api/v1/targets
    at: float | None = None  # the past instant asked for (--at, the page's time picker); None: evaluated now

    def over(self, window: str | None = None) -> str:
        """What a sentence's numbers cover: 'the last 5m', or for a past instant 'the 5m up to
        2026-12-06T03:10:00+01:00' (a review is of then, not of the minutes before it ran). `window`: the stall
        window or another; the rate window by default."""
        window = window or self.window
        if self.at is None:
            return f"the last {window}"
        return f"the {window} up to {instant_text(self.at)}"

    def stalled(self, r: Replica) -> str | None:
        """"stalled" (no progress with work in flight), "silent" (no progress, no work shown, while peers serve) or
        None, from the stall columns."""
        return "stalled" if r.values.get("stalled") is not None else "silent" if r.values.get("silent") is not None \
            else None

    def no_progress_s(self, r: Replica) -> tuple[float, bool]:
        """(seconds, more): how long the replica has made no progress, about (to the subquery's step and a scrape);
        more=True where it made none in the whole lookback, so the seconds are a lower bound."""
        last = r.values.get("progress_last_t")
        if last is None:
            return 10.0 * self.stall_window_s, True
        # the stall-window increase stays above 0 for about a window after the last counter change
        return max(float(self.stall_window_s), self.t - last + self.stall_window_s), False

    def younger_than_window(self, r: Replica) -> float | None:
        """Seconds since the replica's first sample, where that was inside the window (else None): its rates are
        averaged over a window it was not there for the whole of."""
        return self._younger_than(r, self.window_s)

    def younger_than_stall_window(self, r: Replica) -> float | None:
        """Seconds since the replica's first sample, where that was inside the stall window (else None): it has not
        had a whole stall window to show progress in, so it is too young to judge."""
        return self._younger_than(r, self.stall_window_s)

    def _younger_than(self, r: Replica, seconds: int) -> float | None:
        first = r.values.get("first_seen_t")
        step = first_seen_step_s(max(self.window_s, self.stall_window_s))
        if first is None or first <= self.t - seconds + 2 * step:
            return None
        return max(0.0, self.t - first)

    def to_dict(self) -> dict[str, Any]:
        """For History and --json; holds no credentials (the client never puts them in the snapshot)."""
        d = asdict(self)
        d["schema"] = "triage-console/fleet/1"
        return d

    def replica(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FleetSnapshot":
        """Back from to_dict (a History payload or --json); fields an older payload lacks take empty defaults, so
        what it has is shown and the rest reads N/A."""
        def dict_of(v: Any) -> dict:
            return v if isinstance(v, dict) else {}

        def replica(r: dict) -> Replica:
            return Replica(str(r.get("name", "")), list(r.get("instances") or []), r.get("up"),
                           r.get("last_scrape_age_s"), str(r.get("last_error") or ""), dict_of(r.get("values")),
                           dict_of(r.get("gpu")), dict_of(r.get("outliers")), dict_of(r.get("buckets")),
                           dict_of(r.get("golden")))

        cost = {k: v for k, v in dict_of(d.get("cost")).items() if k in Cost.__dataclass_fields__}
        return cls(str(d.get("prometheus_url", "")), str(d.get("selector") or ""),
                   str(d.get("replica_label") or "instance"), str(d.get("window") or ""),
                   int(d.get("window_s") or 0), float(d.get("t") or 0.0),
                   [replica(r) for r in d.get("replicas") or () if isinstance(r, dict)],
                   dict_of(d.get("promql")), dict_of(d.get("names")), str(d.get("gpu_source") or ""),
                   list(d.get("no_stats_targets") or []), dict_of(d.get("fleet_median")),
                   str(d.get("prometheus_version") or "?"), Cost(**cost), float(d.get("elapsed_s") or 0.0),
                   list(d.get("notes") or []), list(d.get("gpu_keys") or []), str(d.get("asked_replica_label") or ""),
                   str(d.get("stall_window") or ""), int(d.get("stall_window_s") or 0),
                   d.get("scrape_interval_s"), d.get("at"))


def instant_text(t: float) -> str:
    """Unix seconds as this console's local time with its offset, to the second: 2026-12-06T03:10:00+01:00."""
    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def collect(prom: Prometheus, selector: str = "", replica_label: str = "instance", window: str = "5m",
            at: float | None = None) -> FleetSnapshot:
    """One refresh, evaluated now or at unix time `at` (the window ends there; a replica is up or down as its `up`
    series was then). Raises TriageError subclasses for what a user must fix (URL, auth, selector, nothing found)."""
    matchers = parse_selector(selector)
    label = check_label_name(replica_label, "replica label")
    window, window_s = parse_window(window)
    t0, cost0, now = time.perf_counter(), Cost(**asdict(prom.cost)), time.time() if at is None else at
    names = names_at(prom, matchers, now, also_at=now - window_s)
    targets = prom.targets()
    interval = scrape_interval(targets, names.jobs)
    past = at is not None and at < time.time() - 2 * (interval or 15.0)
    if past:
        targets = _targets_at(prom, targets, names.jobs, at)
    results, version, queries, gpu_key = _query_all(prom, matchers, label, window, names, now, interval)
    notes, asked = [], ""
    members = results.get("members", [])
    if label != "instance" and members and not any(s.labels.get(label) for s in members):
        # Grouping by an absent label merges the whole fleet into one unnamed row; instance always exists.
        asked, label = label, "instance"
        notes.append(f"Warning: no vLLM series under this selector carries the label {asked!r}, so replicas are named "
                     f"by instance instead. On Kubernetes, {asked!r} comes from a relabel rule in the scrape config "
                     "(e.g. __meta_kubernetes_pod_name -> pod); check the labels on the series in Prometheus.")
        results, version, queries, gpu_key = _query_all(prom, matchers, label, window, names, now, interval)
    replicas = _join(results, label, gpu_key, targets, matchers, time.time())
    gpu_source = _gpu_source(prom, results, now) if any(results.get(f"gpu:{c}") for c in ("gpu_util_pct",
                                                                                         "dram_bw_pct")) else ""
    med = rank(replicas)
    _golden(prom, replicas, now)
    if label not in REPLICA_LABELS:
        notes.append(f"Replica label {label!r} is not one of the usual {', '.join(REPLICA_LABELS)}.")
    unlabelled = sorted({s.labels.get("instance", "?") for s in results.get("members", []) if not s.labels.get(label)})
    if unlabelled:
        notes.append(f"Warning: the series of {', '.join(unlabelled[:10])} have no {label!r} label; they are merged "
                     "into one row with an empty name.")
    notes += _missing_notes(names, replicas)
    gpu_keys = sorted({s.labels.get(gpu_key, "") for c in ("gpu_util_pct", "dram_bw_pct")
                       for s in results.get(f"gpu:{c}", [])})
    snap = FleetSnapshot(prom.base_url, selector or "", label, window, window_s, now, replicas,
                         dict(queries), dict(names.by_column), gpu_source,
                         _no_stats(targets, replicas), med, version, Cost(), 0.0, notes, gpu_keys, asked,
                         *stall_window(window_s, interval), interval, at if past else None)
    snap.cost = prom.cost.minus(cost0)
    snap.elapsed_s = time.perf_counter() - t0
    return snap


def names_at(prom: Prometheus, matchers: tuple[Matcher, ...] | str, at: float | None = None,
             also_at: float | None = None) -> Names:
    """Which name form and version of each vLLM series this Prometheus holds under the selector (one query; a second
    at `also_at` where the first finds none: a fleet whose every target just went down has only stale series now,
    and is shown down, not as an empty Prometheus)."""
    if isinstance(matchers, str):
        matchers = parse_selector(matchers)
    found = prom.query(discovery_query(matchers), at)
    if not Names.resolve({s.labels.get("__name__", "") for s in found}).get("running") and also_at is not None:
        found = prom.query(discovery_query(matchers), also_at)
    names = Names.resolve({s.labels.get("__name__", "") for s in found},
                          frozenset(s.labels["job"] for s in found if s.labels.get("job")))
    if not names.get("running"):
        where = f" under {{{render(matchers)}}}" if matchers else ""
        raise NoVllmSeries(f"Prometheus at {prom.base_url} has no vLLM series{where} (looked for vllm:*, vllm_* and "
                           "ray_vllm_* names of num_requests_running). Check the selector, and that Prometheus "
                           "scrapes the vLLM servers' /metrics (Status > Targets in its UI).")
    return names


def scrape_interval(targets: list[dict], jobs: frozenset[str]) -> float | None:
    """The longest scrape interval of the targets of these jobs (the stall window needs samples across it)."""
    found = [_seconds(t.get("scrapeInterval")) for t in targets if t.get("labels", {}).get("job") in jobs]
    return max((s for s in found if s), default=None)


def _seconds(text: str | None) -> float | None:
    """Prometheus's durations as /api/v1/targets writes them: '15s', '1m', '1m30s', '500ms'."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text or "")
    total = sum(float(v) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for v, u in parts)
    return total or None


def _targets_at(prom: Prometheus, targets: list[dict], jobs: frozenset[str], at: float) -> list[dict]:
    """The targets as they stood at a past instant: health from their `up` series then (the targets API tells only
    of now), no last error or scrape time; a target with no `up` sample then is left out."""
    if not jobs:
        return []
    regex = "|".join(re.escape(j) for j in sorted(jobs))
    up = {s.labels.get("instance"): s.value for s in prom.query(f"up{{job=~{quote(regex)}}}", at)}
    return [{"labels": t.get("labels", {}), "scrapeUrl": t.get("scrapeUrl", ""),
             "health": "up" if up[i] == 1 else "down"}
            for t in targets if (i := t.get("labels", {}).get("instance")) in up and up[i] is not None]


def _query_all(prom: Prometheus, matchers: tuple[Matcher, ...], label: str, window: str, names: Names, now: float,
               interval: float | None):
    b = Builder(matchers, label, window, names, interval)
    queries = b.replica_columns()
    gpu_key = "pod" if label == "pod" else HOST
    queries.update({f"gpu:{k}": v for k, v in b.gpu_columns(gpu_key).items()})
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {col: pool.submit(prom.query, q, now) for col, q in queries.items()}
        build_f = pool.submit(_version, prom)
        results = {col: f.result() for col, f in futures.items()}
        version = build_f.result()
    return results, version, queries, gpu_key


def _missing_notes(names: Names, replicas: list[Replica]) -> list[str]:
    """Which anatomy series this Prometheus (or a replica) lacks: their columns read N/A, which must not pass for 0."""
    native = PREFIXES[0]
    missing = [native + HISTOGRAMS[c][0] for c in ANATOMY if not names.get(c)]
    if not names.get("waiting_by_reason"):
        missing.append(native + "num_requests_waiting_by_reason")
    notes = []
    if missing:
        notes.append(f"No {', '.join(missing)} series under this selector (per-phase histograms came with vLLM 0.6's "
                     "v1 metrics, waiting_by_reason with 0.11): those columns are N/A, unknown rather than 0.")
    if names.get("queue"):
        old = [r.name for r in replicas if r.values.get("ttft_mean_s") is not None
               and r.values.get("queue_mean_s") is None]
        if old:
            notes.append(f"{', '.join(old[:10])} finished requests but export no {names.get('queue')} (an older "
                         "vLLM?): their queue, prefill and decode columns are N/A, not 0.")
    return notes


def rank(replicas: list[Replica]) -> dict[str, float | None]:
    """Mark each replica's columns that stand far above the fleet's median (median and MAD, not mean and sd)."""
    med = {}
    for col in RANKED:
        vals = [v for r in replicas if (v := r.values.get(col)) is not None]
        m, spread = median(vals), mad(vals)
        med[col] = m
        if m is None or len(vals) < 3:
            continue
        for r in replicas:
            v = r.values.get(col)
            if v is None or m <= 0 or v < OUTLIER_MIN_RATIO * m:
                continue
            z = robust_z(v, m, spread)
            if z is None or z >= OUTLIER_Z:  # MAD 0: most replicas agree exactly, so this one stands out
                r.outliers[col] = round(z, 1) if z is not None else None
    return med


def _version(prom: Prometheus) -> str:
    try:
        return str(prom.buildinfo().get("version", "unknown"))
    except PromError:  # Thanos and some proxies do not serve buildinfo; the rest works without it
        return "unknown"


def _join(results: dict, label: str, gpu_key: str, targets: list[dict], matchers: tuple[Matcher, ...],
          now: float) -> list[Replica]:
    by_instance = {t.get("labels", {}).get("instance"): t for t in targets}
    rows: dict[str, Replica] = {}
    for s in results.get("members", []):
        name = s.labels.get(label, "")
        r = rows.setdefault(name, Replica(name, [], None))
        if "instance" in s.labels and s.labels["instance"] not in r.instances:
            r.instances.append(s.labels["instance"])
    for t in _silent_targets(targets, rows, matchers):
        lab = t["labels"]
        name = lab.get(label) or lab.get("instance", "")
        rows.setdefault(name, Replica(name, [], None)).instances.append(lab.get("instance", ""))
    for col, samples in results.items():
        if col == "members" or col.endswith("_bounds") or col.startswith("gpu:"):
            continue
        for s in samples:
            if (r := rows.get(s.labels.get(label, ""))) is not None:
                r.values[col] = s.value
    gpu = {col[4:]: {s.labels.get(gpu_key, ""): s.value for s in samples}
           for col, samples in results.items() if col.startswith("gpu:")}
    bounds: dict[tuple[str, str], list[float]] = {}  # (histogram, replica) -> its bucket bounds
    for hist in QUANTILED:
        for s in results.get(f"{hist}_bounds", []):
            if "le" in s.labels:
                bounds.setdefault((hist, s.labels.get(label, "")), []).append(float(s.labels["le"]))
    for r in rows.values():
        _health(r, by_instance, now)
        _derive(r, {hist: sorted(bounds.get((hist, r.name), [])) for hist in QUANTILED})
        keys = [r.name] if gpu_key == "pod" else sorted({host_of(i) for i in r.instances})
        for col, per_key in gpu.items():
            vals = [per_key[k] for k in keys if per_key.get(k) is not None]
            r.gpu[col] = (max(vals) if col in ("xid", "dram_bw_pct") else sum(vals) / len(vals)) if vals else None
    return sorted(rows.values(), key=lambda r: r.name)


def _silent_targets(targets: list[dict], rows: dict[str, Replica], matchers: tuple[Matcher, ...]) -> list[dict]:
    """Targets of the replicas' scrape jobs that are not up and gave no series in the window: down since Prometheus
    started (a crash-looping new pod never exports one), or down for longer than the window. Matchers on labels the
    target does not carry (model_name, engine: those come from the server's own page) cannot be judged and are
    passed over."""
    seen = {i for r in rows.values() for i in r.instances}
    by_instance = {t.get("labels", {}).get("instance"): t for t in targets}
    jobs = {by_instance[i].get("labels", {}).get("job") for i in seen if i in by_instance}
    return [t for t in targets if (lab := t.get("labels", {})).get("job") in jobs and t.get("health") != "up"
            and lab.get("instance") not in seen and all(m.matches(lab) for m in matchers if m.label in lab)]


def _derive(r: Replica, bounds: dict[str, list[float]]) -> None:
    """The shares (from the exact means) and the bucket each quantile fell in."""
    v = r.values

    def share(part: str, whole: str) -> None:
        a, b = v.get(f"{part}_mean_s"), v.get(f"{whole}_mean_s")
        if a is not None and b:
            v[f"{part}_share_{whole}"] = a / b

    share("queue", "ttft")
    share("prefill", "ttft")
    for phase in ANATOMY:
        share(phase, "e2e")
    for hist, les in bounds.items():
        for col in (f"{hist}_p50_s", f"{hist}_p99_s"):
            if (q := v.get(col)) is not None and les:
                r.buckets[col] = bucket_of(q, les)


def bucket_of(value: float, bounds: list[float]) -> list[float | None]:
    """[lower, upper] of the bucket histogram_quantile answered `value` from (upper None: +Inf). It answers inside the
    first bucket whose count reaches the rank: the smallest bound at or above the answer is that bucket's top (its
    highest finite bound also stands for the +Inf bucket)."""
    upper = next((le for le in bounds if le >= value), math.inf)
    lower = max((le for le in bounds if le < upper), default=0.0)
    return [lower, None if upper == math.inf else upper]


def _health(r: Replica, by_instance: dict, now: float) -> None:
    found = [by_instance[i] for i in r.instances if i in by_instance]
    if not found:
        return
    health = [t.get("health") for t in found]
    # "unknown": not scraped yet (a target Prometheus just discovered): neither up nor down
    r.up = False if "down" in health else True if all(h == "up" for h in health) else None
    r.last_error = "; ".join(t.get("lastError", "") for t in found if t.get("lastError"))
    ages = [now - ts for t in found if t.get("lastScrape") and (ts := _iso_to_unix(t["lastScrape"])) > 0]
    r.last_scrape_age_s = max(0.0, max(ages)) if ages else None


def _iso_to_unix(text: str) -> float:
    # Prometheus writes RFC 3339 with nanoseconds ("2026-12-01T17:05:01.123456789Z"); Python reads microseconds.
    head, _, frac = text.rstrip("Z").partition(".")
    tz = ""
    for sign in "+-":
        if sign in frac:
            frac, tz = frac.split(sign, 1)[0], sign + frac.split(sign, 1)[1]
    stamp = dt.datetime.fromisoformat(head + (tz or "+00:00"))
    return stamp.timestamp() + (float("0." + frac) if frac.isdigit() else 0.0)


def _no_stats(targets: list[dict], replicas: list[Replica]) -> list[dict[str, str]]:
    """Healthy targets in the same scrape jobs as the replicas that export no vLLM series: --disable-log-stats."""
    seen = {i for r in replicas for i in r.instances}
    by_instance = {t.get("labels", {}).get("instance"): t for t in targets}
    jobs = {by_instance[i].get("labels", {}).get("job") for i in seen if i in by_instance}
    return [{"instance": lab.get("instance", ""), "job": lab.get("job", ""), "url": t.get("scrapeUrl", "")}
            for t in targets if (lab := t.get("labels", {})).get("job") in jobs and t.get("health") == "up"
            and lab.get("instance") not in seen]


# The quality watch's gauges (`golden watch --metrics-port`, core/compare/golden/export.py) are read by their
# published names, as DCGM's are: a wire contract the README lists, not an import.
GOLDEN = "triage_golden_"


# A replica's statuses from the worst down: where two watches (or two golden sets) cover one replica, the Fleet shows
# the one that needs a look, and says how many there are.
GOLDEN_SEVERITY = ("broken", "low agreement", "no answer", "watch", "inconclusive", "refused", "fine")


def _golden(prom: Prometheus, replicas: list[Replica], now: float) -> None:
    """Each replica's last quality-watch round, from the watch's gauges (label `replica`: the URL it watched, matched
    to the replica by host:port). Nothing is filled where no watch is scraped. Each watch's series (its golden set,
    its own scrape target) are read apart, never mixed; the worst of them stands for the replica."""
    from urllib.parse import urlsplit

    by_target = {i: r for r in replicas for i in r.instances}
    found: dict[tuple, dict[str, Any]] = {}
    for s in prom.query(f'{{__name__=~"{GOLDEN}(status|same_top_ratio|kld_mean|drift)"}}', now):  # one query
        r = by_target.get(urlsplit(s.labels.get("replica", "")).netloc)
        if r is None:
            continue
        watch = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("__name__", "status")))
        g = found.setdefault((r.name, watch), {"golden": s.labels.get("golden", "")})
        col = s.labels.get("__name__", "")[len(GOLDEN):]
        if col == "status":
            if s.value == 1:
                g["status"] = s.labels.get("status", "")
        else:
            g[col] = s.value

    def severity(g: dict[str, Any]) -> tuple[int, bool]:
        status = g["status"]
        return (GOLDEN_SEVERITY.index(status) if status in GOLDEN_SEVERITY else len(GOLDEN_SEVERITY),
                not g.get("drift"))

    for r in replicas:
        watches = [g for (name, _), g in found.items() if name == r.name and "status" in g]
        if watches:
            r.golden = {**min(watches, key=severity), **({"watches": len(watches)} if len(watches) > 1 else {})}


def _gpu_source(prom: Prometheus, results: dict, now: float) -> str:
    # The `or` in each GPU query hides which exporter answered; the metric name is not in the result, so ask once.
    found = prom.query('count({__name__=~"DCGM_FI_DEV_GPU_UTIL|triage_gpu_util_percent"}) by (__name__)', now)
    names = {s.labels.get("__name__") for s in found}
    return "dcgm-exporter" if "DCGM_FI_DEV_GPU_UTIL" in names else "triage exporter" if names else ""

