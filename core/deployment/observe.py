"""The impure half of the liveness verdict: look at one vLLM server once per round (liveness.py judges).

A round: scrape /metrics, GET /health, read the server's processes when it runs on this host, send the 1-token canary
where canary_due says so (after the scrape, so the scrape's gauges never count it; dated within the round, so the
checks can tell which scrapes count it), and read the GPU's activity where NVML sees the server's processes. Every
step records its failure as evidence instead of raising: a dead server is a verdict, not an error. Only `connect()`
raises, for a URL that is not a vLLM server at all.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import requests

from core.deployment.liveness import Canary, GpuActivity, Observation, Proc, Tracker, Verdict, canary_due
from core.errors import RemoteError, TriageError
from core.http import http_get, new_session, normalize_base_url, request

CANARY_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 5.0
SCRAPE_TIMEOUT_S = 5.0
CANARY_PROMPT = "Hello"
KEEP_S = 120.0  # the rounds canary_due looks back on (the canary's rate, the last progress)


def is_local(base_url: str) -> bool:
    """The server runs on this host (loopback, or one of this host's addresses): its processes can be read."""
    import psutil

    host = urlsplit(base_url).hostname or ""
    try:
        addrs = {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(host, None)}
    except (OSError, ValueError):
        return False
    mine = {ipaddress.ip_address(a.address.split("%")[0]) for nic in psutil.net_if_addrs().values() for a in nic
            if a.family in (socket.AF_INET, socket.AF_INET6)}
    return all(a.is_loopback or a.is_unspecified or a in mine for a in addrs)


def _role(proc: Any) -> str | None:
    try:
        text = proc.name() + " " + " ".join(proc.cmdline()[:4])
    except Exception:  # gone or not ours to read
        return "child"
    if "resource_tracker" in text:
        return None  # multiprocessing's bookkeeper: its state says nothing about the engine
    if "EngineCore" in text:
        return "engine core"  # vLLM v1 renames it VLLM::EngineCore (comm "VLLM::EngineCor")
    return "worker" if "Worker" in text else "child"


class ProcessWatch:
    """The server's process tree on this host: the process listening on the URL's port and its descendants.

    Processes seen once are remembered by pid and start time, so one that dies (and takes the listening socket with
    it) is reported as gone rather than forgotten; a new listener (a restarted server) starts the memory afresh."""

    def __init__(self, port: int):
        self.port = port
        self.known: dict[int, tuple[str, str, float]] = {}  # pid -> (role, name, create_time)
        self.api_pid: int | None = None

    def _listener(self) -> int | None:
        import psutil

        for c in psutil.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port and c.pid:
                return c.pid
        return None

    def read(self) -> tuple[tuple[Proc, ...] | None, str]:
        import psutil

        try:
            pid = self._listener()
        except (psutil.AccessDenied, OSError) as exc:
            return None, f"cannot list listening sockets here ({exc}); run as the server's user or root"
        if pid is not None:
            if pid != self.api_pid:
                self.known, self.api_pid = {}, pid
            try:
                api = psutil.Process(pid)
                tree = [(api, "API server")] + [(c, _role(c)) for c in api.children(recursive=True)]
                for p, role in tree:
                    if role is not None and p.pid not in self.known:
                        self.known[p.pid] = (role, p.name(), p.create_time())
            except psutil.Error:
                pass  # it changed while we looked; next round
        if not self.known:
            return None, f"no process listens on port {self.port} on this host"
        out = []
        for pid, (role, name, created) in self.known.items():
            try:
                p = psutil.Process(pid)
                state = p.status() if p.create_time() == created else "gone"
            except psutil.NoSuchProcess:
                state = "gone"
            except psutil.Error as exc:
                state = f"unreadable ({type(exc).__name__})"
            out.append(Proc(pid, role, name, state))
        return tuple(out), ""


class GpuWatch:
    """NVML utilization of the GPUs that the server's processes are on (NVML sees only this host's GPUs)."""

    def __init__(self, nvml: Any = None):
        self._nvml, self._source, self._reason = nvml, None, ""

    def read(self, pids: set[int]) -> GpuActivity:
        if self._source is None and not self._reason:
            from core.telemetry.nvml import NvmlSource

            source = NvmlSource(self._nvml)
            av = source.probe()
            self._source, self._reason = (source, "") if av.ok else (None, av.reason)
        if self._source is None:
            return GpuActivity(None, self._reason)
        if not pids:
            return GpuActivity(None, "the server is not on this host; NVML sees only this host's GPUs")
        sample = self._source.sample()
        used = [g.index for g in self._source.gpus
                if any(p.get("pid") in pids for p in sample.tables.get(f"gpu{g.index}.processes") or [])]
        utils = [sample.values.get(f"gpu{i}.util_pct") for i in used]
        utils = [u for u in utils if u is not None]
        if not utils:
            return GpuActivity(None, "NVML lists none of the server's processes on a GPU (a container may hide "
                                     "their pids)")
        return GpuActivity(max(utils), "", tuple(used))

    def close(self) -> None:
        if self._source is not None:
            self._source.close()


class Observer:
    """One server, looked at once per `observe()`. Call `connect()` first: it checks the URL is a vLLM server."""

    def __init__(self, base_url: str, api_key: str | None = None, canary_timeout_s: float = CANARY_TIMEOUT_S,
                 nvml: Any = None):
        self.base_url = normalize_base_url(base_url)
        self.api_key, self.canary_timeout_s = api_key, canary_timeout_s
        self.model: str | None = None
        self._session = new_session()
        port = urlsplit(self.base_url).port or (443 if self.base_url.startswith("https") else 80)
        self.processes = ProcessWatch(port) if is_local(self.base_url) else None
        self.gpus = GpuWatch(nvml)
        self.rounds: list[Observation] = []  # this observer's rounds of the last KEEP_S: when a canary is due

    def connect(self) -> str:
        from core.engines.remote import RemoteEngine

        info = RemoteEngine(self.base_url, api_key=self.api_key, timeout_s=10.0).connect()
        self.model = info.models[0]
        return self.model

    def observe(self) -> Observation:
        from core.telemetry.vllm_metrics import scrape

        t = time.monotonic()
        snap, scrape_error = None, ""
        try:
            snap = scrape(self.base_url, timeout_s=SCRAPE_TIMEOUT_S, api_key=self.api_key)
        except TriageError as exc:
            scrape_error = str(exc)
        health, health_error = None, ""
        try:
            health = http_get(self.base_url + "/health", HEALTH_TIMEOUT_S, self.api_key, self._session).status_code
        except RemoteError as exc:
            health_error = str(exc)
        # The processes before the canary: a stopped engine core cannot answer one (canary_due sends none), and
        # waiting out its timeout would only delay the round that names the stop (and leave a queued request behind).
        procs, why = self.processes.read() if self.processes else (None, "the server is not on this host")
        obs = Observation(t, health, health_error, snap, scrape_error, None, None, procs, why)
        self.rounds = [o for o in self.rounds if o.t >= t - KEEP_S]
        if canary_due([*self.rounds, obs]):
            obs = dataclasses.replace(obs, canary=self.canary(round_t=t))
        self.rounds.append(obs)
        gpu = self.gpus.read({p.pid for p in procs or () if p.state != "gone"})
        return dataclasses.replace(obs, gpu=gpu)

    def canary(self, round_t: float | None = None) -> Canary | None:
        """One 1-token completion; `round_t` (the round's start) dates its sending as sent_after_s."""
        if self.model is None:
            try:
                self.connect()
            except TriageError:
                return None
        url = self.base_url + "/v1/completions"
        body = {"model": self.model, "prompt": CANARY_PROMPT, "max_tokens": 1, "temperature": 0.0}
        t0 = time.monotonic()
        after = 0.0 if round_t is None else t0 - round_t
        try:
            resp = request("POST", url, self.canary_timeout_s, self.api_key, self._session, json=body)
        except RemoteError as exc:
            took = time.monotonic() - t0
            if isinstance(exc.__cause__, requests.ReadTimeout):
                return Canary(False, took, f"no token within {self.canary_timeout_s:g} s", True, after)
            return Canary(False, took, str(exc), sent_after_s=after)
        took = time.monotonic() - t0
        if resp.status_code != 200:
            return Canary(False, took, f"HTTP {resp.status_code}: {resp.text[:160]}", sent_after_s=after)
        return Canary(True, took, sent_after_s=after)

    def close(self) -> None:
        self.gpus.close()
        self._session.close()


class LivenessWatch:
    """Observes one server on a thread, every `interval_s`, for a page that reads `latest()` when it redraws.

    It stops by itself when nobody read it for `idle_stop_s` (a closed browser tab, or paused panels, leave no thread
    behind, and no canaries reach the server after the page is gone); a page that redraws starts a new one."""

    def __init__(self, base_url: str, api_key: str | None = None, interval_s: float = 2.0,
                 idle_stop_s: float = 10.0):
        self.observer = Observer(base_url, api_key)
        self.base_url = self.observer.base_url
        self.tracker = Tracker()
        self.interval_s, self.idle_stop_s = interval_s, idle_stop_s
        self._verdict: Verdict | None = None
        self._read_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-watch", daemon=True)

    def start(self) -> "LivenessWatch":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def latest(self) -> Verdict | None:
        self._read_at = time.monotonic()
        return self._verdict

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() - self._read_at < self.idle_stop_s:
                t0 = time.monotonic()
                self._verdict = self.tracker.add(self.observer.observe())
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))
        finally:
            self.observer.close()
