"""Fill a CheckContext from live telemetry over a window.

GPU and host readings come from the process's one telemetry sampler (core.telemetry.sampler.get_sampler): the
checklist reads the rows that fall inside its window, it never polls NVML itself, and a page and a checklist run
share one poller. vLLM's /metrics is scraped here, once a second, because the sampler does not watch vLLM.
Everything impure lives in this module; the checks only see the finished context.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from core.errors import InputError
from diagnostics.context import CheckContext, GpuWindow, Series

SCRAPE_EVERY_S = 1.0
LIVENESS_EVERY_S = 3.0  # a round; its canary only where canary_due says so, at the rate canary_gap_s allows
# Prometheus's default scrape_timeout. vLLM's API server answers /metrics from the same event loop that streams
# tokens, so under load it answers late (over 3 s on a loaded 2-core CPU host), not never.
SCRAPE_TIMEOUT_S = 10.0
FINAL_WAIT_S = SCRAPE_TIMEOUT_S + 5.0  # the connect timeout's 5 s on top


def vllm_base_url(url: str) -> str:
    """The server's base URL from what a user pastes ('host:8000', '.../v1', '.../metrics'). Raises ValueError."""
    from core.errors import RemoteError
    from core.http import normalize_base_url

    text = url.strip()
    text = text[: -len("/metrics")] if text.rstrip("/").endswith("/metrics") else text
    try:
        return normalize_base_url(text.rstrip("/"))
    except RemoteError as exc:
        raise InputError(str(exc)) from None


def _major_minor(text: str | None) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


# --- which CUDA the installed PyTorch builds were made for -------------------------------------------------------

_TORCH_CUDA_SCRIPT = r"""
import importlib.util, re, pathlib
spec = importlib.util.find_spec("torch")
if spec and spec.submodule_search_locations:
    p = pathlib.Path(list(spec.submodule_search_locations)[0]) / "version.py"
    m = re.search(r"^cuda[^=]*=\s*['\"]([0-9.]+)['\"]", p.read_text(), re.M) if p.exists() else None
    v = re.search(r"^__version__[^=]*=\s*['\"]([^'\"]+)['\"]", p.read_text(), re.M) if p.exists() else None
    print((v.group(1) if v else "?") + " " + (m.group(1) if m else "none"))
"""


def _parse_torch_cuda(line: str) -> tuple[str, tuple[int, int]] | None:
    parts = line.split()
    if len(parts) != 2 or parts[1] == "none":
        return None
    version = _major_minor(".".join(parts[1].split(".")[:2]))
    return (parts[0], version) if version else None


def runtime_cuda(vllm_python: str | None) -> dict[str, tuple[int, int]]:
    """{"torch 2.11.0+cu130 (console)": (13, 0), ...}: read from torch/version.py of each environment, in a
    subprocess that never imports torch (a second or more, and a CUDA context is not wanted here)."""
    out: dict[str, tuple[int, int]] = {}
    for label, python in (("console", sys.executable), ("vLLM env", vllm_python)):
        if not python or not Path(python).exists() or (label != "console" and Path(python) == Path(sys.executable)):
            continue
        try:
            proc = subprocess.run([python, "-c", _TORCH_CUDA_SCRIPT], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = _parse_torch_cuda(proc.stdout.strip())
        if found:
            out[f"torch {found[0]} ({label})"] = found[1]
    return out


# --- the window ----------------------------------------------------------------------------------------------------

class WindowCollector:
    """Marks a window on the shared sampler and scrapes vLLM during it. Call begin(), poll() often, then context().

    Scrapes run on a thread, one at a time (as Prometheus never scrapes a target twice at once): a slow answer does
    not hold up the window's ticks and fails only past SCRAPE_TIMEOUT_S; ticks due meanwhile are skipped."""

    def __init__(self, sampler: Any, vllm_url: str | None = None, scrape_every_s: float = SCRAPE_EVERY_S):
        self.sampler = sampler
        self.vllm_url = vllm_url
        self.scrape_every_s = scrape_every_s
        self.snapshots: list[Any] = []
        self.scrapes = 0
        self.last_error: str | None = None
        self.slowest_answer_s: float | None = None
        self._t0_wall = self._t0_mono = 0.0
        self._t1_wall: float | None = None
        self._next_scrape = 0.0
        self._in_flight: threading.Thread | None = None
        self.liveness: list[Any] = []
        self.liveness_reason = "no vLLM URL given" if not vllm_url else "no liveness round finished in the window"
        self._liveness_stop = threading.Event()
        self._liveness_thread: threading.Thread | None = None
        from core.telemetry.host import RssWatch

        self.rss = RssWatch()  # whose memory grew: a falling MemAvailable is told apart by process

    def begin(self) -> None:
        self._t0_wall, self._t0_mono = time.time(), time.monotonic()
        self.rss.look(force=True)
        self._next_scrape = self._t0_mono
        if self.vllm_url:
            self._liveness_thread = threading.Thread(target=self._liveness, name="vllm-liveness", daemon=True)
            self._liveness_thread.start()

    def end(self) -> None:
        """Close the window: readings the sampler takes after this are not part of it."""
        self._t1_wall = time.time()
        self.rss.look(force=True)
        self._liveness_stop.set()
        if self._liveness_thread is not None:
            self._liveness_thread.join(FINAL_WAIT_S)  # a round in progress finishes (its canary times out first)

    def _liveness(self) -> None:
        from core.deployment.observe import Observer
        from core.errors import TriageError

        try:
            observer = Observer(self.vllm_url)
        except TriageError as exc:
            self.liveness_reason = str(exc)
            return
        try:
            while not self._liveness_stop.is_set():
                # a round that began inside the window is kept even if it ends after it: its canary may be in the
                # window's last scrape, and the checks account for every canary the server counted
                inside = self._t1_wall is None
                obs = observer.observe()
                if inside:
                    self.liveness.append(dataclasses.replace(obs, t=obs.t - self._t0_mono))
                self._liveness_stop.wait(LIVENESS_EVERY_S)
        finally:
            observer.close()

    def elapsed(self) -> float:
        return time.monotonic() - self._t0_mono

    def poll(self, final: bool = False) -> None:
        """Start a scrape of vLLM if one is due and none is in flight. `final` closes the window with a scrape: the
        one in flight if any (it started inside the window), else a new one; it waits for that answer."""
        self.rss.look()
        if not self.vllm_url:
            return
        busy = self._in_flight is not None and self._in_flight.is_alive()
        if not busy and (final or time.monotonic() >= self._next_scrape):
            self._next_scrape = time.monotonic() + self.scrape_every_s
            self.scrapes += 1
            self._in_flight = threading.Thread(target=self._scrape, name="vllm-scrape", daemon=True)
            self._in_flight.start()
        if final and self._in_flight is not None:
            # requests' read timeout bounds each wait for bytes, not the whole answer: a trickling server is cut here
            self._in_flight.join(FINAL_WAIT_S)
            if self._in_flight.is_alive():
                self.last_error = f"{self.vllm_url}/metrics sent no complete answer within {FINAL_WAIT_S:g} s."
            self._in_flight = None

    def _scrape(self) -> None:
        from core.telemetry.vllm_metrics import scrape

        t = time.monotonic()
        try:
            snap = scrape(self.vllm_url, timeout_s=SCRAPE_TIMEOUT_S)
        except Exception as exc:  # RemoteError, MetricsError, or anything the network throws
            self.last_error = str(exc) or type(exc).__name__
            return
        took = time.monotonic() - t
        self.slowest_answer_s = max(took, self.slowest_answer_s or 0.0)
        if self._t1_wall is None:  # an answer after the window closed (a cut trickle) is not part of it
            self.snapshots.append(dataclasses.replace(snap, t=snap.t - self._t0_mono))

    def context(self, **inputs: Any) -> CheckContext:
        """The readings since begin() as a CheckContext; `inputs` are the user's (launch_cmd, flag_lint, ...)."""
        t1 = self._t1_wall if self._t1_wall is not None else time.time()
        rows = [r for r in self.sampler.rows() if self._t0_wall <= r["t"] <= t1]
        window = t1 - self._t0_wall
        ts = tuple(round(r["t"] - self._t0_wall, 3) for r in rows)

        def series(key: str, name: str, unit: str, source: str) -> Series | None:
            vals = tuple(r.get(key) for r in rows)
            return Series(name, unit, source, ts, vals) if any(v is not None for v in vals) else None

        gpus, gpu_reason = [], ""
        nvml_av = self.sampler.availability("nvml")
        nvml = self.sampler.source("nvml")
        if not nvml_av.ok or nvml is None:
            gpu_reason = nvml_av.reason or "NVML is not available"
        else:
            for info in nvml.gpus:
                p = f"gpu{info.index}."
                util = series(p + "util_pct", f"GPU {info.index} util", "%", "NVML utilization.gpu")
                bw = series(p + "dram_bw_util_pct", f"GPU {info.index} DRAM BW util", "%", "NVML GPM DRAM_BW_UTIL")
                reason = "" if bw else (info.gpm.reason or self.sampler.latest().reason(p + "dram_bw_util_pct"))
                if info.lost:
                    reason = info.lost_reason
                cc = _major_minor(info.compute_capability)
                total = next((r.get(p + "mem_total_bytes") for r in reversed(rows) if r.get(p + "mem_total_bytes")),
                             None)
                procs = self.sampler.latest().tables.get(p + "processes") or []
                gpus.append(GpuWindow(info.index, info.name, cc, util, bw, reason,
                                      mem_total_bytes=int(total) if total else None,
                                      throttle_reasons=tuple(r.get(p + "throttle_reasons") for r in rows),
                                      processes=tuple((x["pid"], x["name"]) for x in procs),
                                      lost=info.lost_reason if info.lost else ""))
        host = series("host.mem_available_bytes", "MemAvailable", "bytes", "psutil (/proc/meminfo MemAvailable)")
        total = next((r.get("host.mem_total_bytes") for r in reversed(rows) if r.get("host.mem_total_bytes")), None)
        host_av = self.sampler.availability("host")
        host_reason = "" if host else (host_av.reason if not host_av.ok else "no host readings in the window")
        from diagnostics.flags import vllm_python

        return CheckContext(
            window_s=round(window, 3),
            gpus=tuple(gpus),
            gpu_reason=gpu_reason,
            driver_version=getattr(nvml, "driver_version", None) if nvml_av.ok else None,
            cuda_driver_version=_major_minor(getattr(nvml, "cuda_driver_version", None)) if nvml_av.ok else None,
            runtime_cuda=runtime_cuda(vllm_python()) if gpus else {},
            host_mem_available=host,
            host_mem_total_bytes=int(total) if total else None,
            host_reason=host_reason,
            **self._growth(),
            vllm_url=self.vllm_url,
            vllm_snapshots=tuple(self.snapshots),
            vllm_error=self.last_error,
            vllm_scrapes=self.scrapes,
            vllm_slowest_answer_s=self.slowest_answer_s,
            vllm_liveness=tuple(self.liveness),
            vllm_liveness_reason=self.liveness_reason,
            **inputs,
        )

    def _growth(self) -> dict[str, Any]:
        """Whose RSS grew, and which pids are the server under test's (its process tree as liveness saw it) and the
        console's, for host.mem_leak to judge the deployment apart from the rest of the host."""
        import os

        from core.telemetry.host import descendants

        growth = self.rss.growth()
        parents = self.rss.table_pids()
        server = {p.pid for obs in self.liveness for p in obs.processes or ()}
        return {"host_growth": None if growth is None else tuple(growth),
                "host_growth_reason": self.rss.reason or "fewer than two looks at the processes in the window",
                "server_pids": frozenset(descendants(server, parents)) if server else frozenset(),
                "console_pids": frozenset(descendants([os.getpid()], parents))}

    def notes(self) -> list[str]:
        stats = self.sampler.stats()
        notes = [f"GPU and host readings: the console's telemetry sampler at {stats.rate_hz:g} Hz "
                 f"(achieved {stats.achieved_hz:.1f} Hz)."]
        if self.vllm_url:
            notes.append(f"vLLM: {self.vllm_url}/metrics scraped every {self.scrape_every_s:g} s "
                         f"({len(self.snapshots)} of {self.scrapes} scrapes answered"
                         + (f", the slowest in {self.slowest_answer_s:.2f} s" if self.slowest_answer_s else "") + ").")
        return notes
