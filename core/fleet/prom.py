"""A Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics) as the fleet's only data source.

Credentials come from the environment only (TRIAGE_PROM_TOKEN, or TRIAGE_PROM_USER + TRIAGE_PROM_PASSWORD), so they
are never typed into a page, saved in History or shown. Requests go through core/http: TLS verified, no redirects,
no proxies or .netrc from the environment, bounded timeouts. Every answer is checked for Prometheus's JSON envelope;
`status: error` is raised with Prometheus's own message. The client counts what it sent and what Prometheus says the
queries cost, so a refresh's price is visible (bench/fleet_bench.py).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from core.errors import InputError, RemoteError
from core.http import json_body, new_session, normalize_base_url, request
from core.settings import Settings, settings

ENV_TOKEN = "TRIAGE_PROM_TOKEN"
ENV_USER, ENV_PASSWORD = "TRIAGE_PROM_USER", "TRIAGE_PROM_PASSWORD"
TIMEOUT_S = 15.0
EXPECTED = "a Prometheus HTTP API (Prometheus, Thanos, Mimir or VictoriaMetrics)"
# What to verify when the URL cannot be reached at all (refused, timed out, unknown host): the fleet page's most
# common first error, so it names Prometheus rather than a vLLM server.
UNREACHABLE = ("Check the Prometheus URL and port (Prometheus listens on 9090 unless configured otherwise; Thanos "
               "Query on 10902, VictoriaMetrics on 8428), that it is running, and that this console's host can reach "
               "it (a firewall, or on Kubernetes a Service or `kubectl port-forward`).")


class PromError(RemoteError):
    """Prometheus answered, but with an error (bad query, timeout, not an API); the message is Prometheus's own."""


@dataclass
class Cost:
    """What this client has asked of Prometheus: requests, and the query time Prometheus reported for them."""

    requests: int = 0
    queries: int = 0  # /query and /query_range calls
    prom_eval_s: float = 0.0  # Prometheus's own evalTotalTime (stats=all); 0 where the server does not report it
    wall_s: float = 0.0

    def minus(self, older: "Cost") -> "Cost":
        return Cost(self.requests - older.requests, self.queries - older.queries,
                    self.prom_eval_s - older.prom_eval_s, self.wall_s - older.wall_s)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float | None  # None for NaN (e.g. histogram_quantile over no observations)


@dataclass(frozen=True)
class RangeSeries:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (unix seconds, value), NaN dropped


def auth_from_env(env: dict | None = None) -> tuple[str | None, tuple[str, str] | None, str]:
    """(bearer token, basic auth, a description without the secret) from the environment."""
    s = settings() if env is None else Settings.from_env(env)
    token, user, password = s.prom_token, s.prom_user, s.prom_password
    if token:
        return token, None, f"bearer token from ${ENV_TOKEN}"
    if user:
        return None, (user, password or ""), f"basic auth as {user!r} from ${ENV_USER}/${ENV_PASSWORD}"
    return None, None, "no credentials"


def normalize_prom_url(url: str) -> str:
    if not (url or "").strip():
        raise InputError("No Prometheus URL given. Enter the base URL of the Prometheus (or Thanos, Mimir, "
                         "VictoriaMetrics) that scrapes your vLLM servers, e.g. http://prometheus:9090.")
    base = normalize_base_url(url)
    if urlsplit(base).username or urlsplit(base).password:
        raise InputError(f"Put no credentials in the URL; set ${ENV_TOKEN} or ${ENV_USER}/${ENV_PASSWORD} in the "
                         "console's environment instead (they are never saved or shown).")
    return base


class Prometheus:
    def __init__(self, url: str, timeout_s: float = TIMEOUT_S, env: dict | None = None):
        self.base_url = normalize_prom_url(url)
        self.timeout_s = timeout_s
        self._token, self._basic, self.auth_description = auth_from_env(env)
        self._session = new_session()
        self._lock = threading.Lock()
        self.cost = Cost()

    def __repr__(self) -> str:  # never the credentials
        return f"Prometheus({self.base_url!r}, {self.auth_description})"

    # --- the API ----------------------------------------------------------------------------------------------
    def buildinfo(self) -> dict:
        return self._get("/api/v1/status/buildinfo", {})

    def targets(self) -> list[dict]:
        return list(self._get("/api/v1/targets", {"state": "active"}).get("activeTargets", []))

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        params = {"query": promql, "stats": "all"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params, query=True)
        kind, result = data.get("resultType"), data.get("result", [])
        if kind == "scalar":
            return [Sample({}, _num(result[1]))]
        if kind != "vector":
            raise PromError(f"{self.base_url} answered a {kind!r} for {promql!r}; a vector was expected.")
        return [Sample(r.get("metric", {}), _num(r["value"][1])) for r in result]

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}",
                  "stats": "all"}
        data = self._get("/api/v1/query_range", params, query=True)
        out = []
        for r in data.get("result", []):
            pts = tuple((float(t), v) for t, raw in r.get("values", []) if (v := _num(raw)) is not None)
            out.append(RangeSeries(r.get("metric", {}), pts))
        return out

    # --- one request ------------------------------------------------------------------------------------------
    def _get(self, path: str, params: dict, query: bool = False) -> dict:
        url = self.base_url + path
        t0 = time.perf_counter()
        try:
            resp = request("GET", url, self.timeout_s, self._token, self._session, params=params, auth=self._basic,
                           unauthorized=f"Prometheus refused the credentials ({self.auth_description}). Set "
                                        f"${ENV_TOKEN} (bearer) or ${ENV_USER}/${ENV_PASSWORD} (basic auth) in the "
                                        "console's environment.",
                           service="Prometheus", check=UNREACHABLE)
            body = json_body(resp, url, EXPECTED)
        finally:
            with self._lock:
                self.cost.requests += 1
                self.cost.queries += query
                self.cost.wall_s += time.perf_counter() - t0
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            raise PromError(f"{url} answered HTTP {resp.status_code} with JSON that is not a Prometheus API answer "
                            f"(no status field); expected {EXPECTED}.")
        if body["status"] == "error":
            what = f" for {params['query']!r}" if "query" in params else ""
            raise PromError(f"Prometheus answered {body.get('errorType', 'error')}{what}: {body.get('error', '?')}")
        data = body.get("data")
        if query and isinstance(data, dict):
            timings = (data.get("stats") or {}).get("timings") or {}
            with self._lock:
                self.cost.prom_eval_s += float(timings.get("evalTotalTime", 0.0) or 0.0)
        return data if isinstance(data, dict) else {"result": data}


def _num(raw) -> float | None:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v
