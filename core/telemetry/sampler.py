"""One sampler thread per process, feeding a ring buffer that every browser session reads.

Streamlit reruns page scripts per session and per tick; if each session polled NVML itself, ten open tabs would
poll ten times. Instead `get_sampler()` returns a module-level singleton whose single daemon thread samples every
source at `rate_hz` into a bounded deque (at least 10 minutes), and pages only read from it. The thread measures
its own CPU time (time.thread_time) so its cost is visible on the page and in bench/telemetry_bench.py.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from core.telemetry.base import Availability, Sample, Source

log = logging.getLogger("triage.telemetry")

DEFAULT_RATE_HZ = 10.0
DEFAULT_WINDOW_S = 600.0  # 10 minutes: long enough to see a leak's slope or an idle stretch
MIN_RATE_HZ, MAX_RATE_HZ = 0.5, 50.0


@dataclass(frozen=True)
class Snapshot:
    """The newest tick of every source together."""

    t: float | None
    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def reason(self, key: str) -> str:
        return self.reasons.get(key, "no reading yet" if self.t is None else "not measured by any source here")


@dataclass(frozen=True)
class SamplerStats:
    rate_hz: float  # asked for
    achieved_hz: float  # measured over the last ~10 s
    cpu_pct_of_core: float  # the thread's CPU time / wall time over the last ~10 s, in % of one core
    cpu_ms_per_tick: float
    ticks: int
    overruns: int  # ticks that started late because the previous one ran past its slot
    buffered: int
    capacity: int


class Sampler:
    def __init__(self, sources: Iterable[Source], rate_hz: float = DEFAULT_RATE_HZ,
                 window_s: float = DEFAULT_WINDOW_S):
        self._sources = list(sources)
        self._window_s = window_s
        self._rate_hz = _clamp(rate_hz)
        self._lock = threading.Lock()
        self._buf: deque[dict[str, Any]] = deque(maxlen=self._capacity())
        self._latest = Snapshot(None)
        self._availability: dict[str, Availability] = {}
        self._live: list[Source] = []
        self._probed = False
        self._ticks = self._overruns = 0
        self._cost: deque[tuple[float, float]] = deque(maxlen=self._cost_len())  # (monotonic, thread cpu)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _capacity(self) -> int:
        return int(math.ceil(self._window_s * self._rate_hz)) + 1

    def _cost_len(self) -> int:
        return max(2, int(10 * self._rate_hz) + 1)

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def probe(self) -> None:
        """Probe every source, once. Happens on first use, never at import: probing NVML loads the driver library."""
        if self._probed:
            return
        self._probed = True
        for src in self._sources:
            try:
                av = src.probe()
            except Exception as exc:  # a broken probe must not take the host side down with it
                av = Availability(False, f"{src.name} probe failed: {exc}")
            self._availability[src.name] = av
            if av.ok:
                self._live.append(src)
            else:
                log.info("telemetry source %s off: %s", src.name, av.reason)

    def start(self) -> "Sampler":
        if self._thread is not None:
            return self
        self.probe()
        self._thread = threading.Thread(target=self._run, name="telemetry-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0 / self._rate_hz + 1.0)
        for src in self._sources:
            try:
                src.close()
            except Exception:
                pass

    def set_rate(self, rate_hz: float) -> None:
        """Change the sample rate; the buffer is resized to keep the same time window (newest rows kept)."""
        with self._lock:
            self._rate_hz = _clamp(rate_hz)
            self._buf = deque(self._buf, maxlen=self._capacity())
            self._cost = deque(self._cost, maxlen=self._cost_len())

    # --- the thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_t += 1.0 / self._rate_hz
            delay = next_t - time.monotonic()
            if delay < 0:  # late: start the next tick now rather than bursting to catch up
                with self._lock:
                    self._overruns += 1
                next_t, delay = time.monotonic(), 0.0
            # time.sleep, not Event.wait(timeout): a timed wait costs about twice the CPU per wake-up (measured
            # 0.15 vs 0.07 ms), a third of this thread's whole budget at 10 Hz. stop() waits out one period instead.
            time.sleep(delay)

    def tick(self) -> None:
        """Take one sample of every live source. Public so tests and the bench can drive it without the thread."""
        self.probe()
        row: dict[str, Any] = {"t": time.time()}
        reasons: dict[str, str] = {}
        tables: dict[str, list[dict[str, Any]]] = {}
        for src in self._live:
            try:
                s: Sample = src.sample()
            except Exception as exc:  # sample() must not raise; if one does anyway, keep the others going
                log.exception("telemetry source %s raised from sample()", src.name)
                reasons[f"{src.name}.*"] = f"{src.name} failed: {exc}"
                continue
            row.update(s.values)
            reasons.update(s.reasons)
            tables.update(s.tables)
        with self._lock:
            self._buf.append(row)
            self._latest = Snapshot(row["t"], row, reasons, tables)
            self._ticks += 1
            self._cost.append((time.monotonic(), time.thread_time()))

    # --- readers (any thread) ------------------------------------------------------------------------------------
    def availability(self, name: str) -> Availability:
        return self._availability.get(name, Availability(False, f"no {name} source in this sampler"))

    def source(self, name: str) -> Any:
        return next((s for s in self._sources if s.name == name), None)

    def latest(self) -> Snapshot:
        with self._lock:
            return self._latest

    def rows(self, seconds: float | None = None) -> list[dict[str, Any]]:
        """The buffered rows (newest last), optionally only the last `seconds`. Rows are shared: do not mutate."""
        with self._lock:
            rows = list(self._buf)
        if seconds is not None and rows:
            cutoff = rows[-1]["t"] - seconds
            rows = [r for r in rows if r["t"] >= cutoff]
        return rows

    def series(self, keys: Iterable[str], seconds: float, max_points: int = 600) -> dict[str, list]:
        """Columns for charts: "t" plus each key, bucket-averaged down to at most `max_points` points so a
        10-minute window at 20 Hz does not ship 12,000 points to every browser every second."""
        keys = list(keys)
        rows = self.rows(seconds)
        step = max(1, math.ceil(len(rows) / max_points))
        out: dict[str, list] = {"t": [r["t"] for r in rows[step - 1::step]]}
        for key in keys:
            col = [r.get(key) for r in rows]
            if step == 1:
                out[key] = col
                continue
            pts = []
            for i in range(0, len(col) - step + 1, step):
                nums = [v for v in col[i:i + step] if isinstance(v, (int, float))]
                pts.append(sum(nums) / len(nums) if nums else None)
            out[key] = pts
        return out

    def stats(self) -> SamplerStats:
        with self._lock:
            cost = list(self._cost)
            rate, ticks, overruns, n, cap = self._rate_hz, self._ticks, self._overruns, len(self._buf), self._buf.maxlen
        achieved = cpu_pct = ms = 0.0
        if len(cost) >= 2 and cost[-1][0] > cost[0][0]:
            wall = cost[-1][0] - cost[0][0]
            cpu = cost[-1][1] - cost[0][1]
            achieved = (len(cost) - 1) / wall
            cpu_pct = 100.0 * cpu / wall
            ms = 1000.0 * cpu / (len(cost) - 1)
        return SamplerStats(rate, achieved, cpu_pct, ms, ticks, overruns, n, cap or 0)


def _clamp(rate_hz: float) -> float:
    return min(MAX_RATE_HZ, max(MIN_RATE_HZ, float(rate_hz)))


# --- the process-wide singleton ------------------------------------------------------------------------------------
_SAMPLER: Sampler | None = None
_LOCK = threading.Lock()


def default_sources() -> list[Source]:
    from core.telemetry.host import HostSource
    from core.telemetry.nvml import NvmlSource

    return [NvmlSource(), HostSource(watch=("self", "vllm"))]


def get_sampler(rate_hz: float | None = None) -> Sampler:
    """The one sampler of this process, started on first use. The lock makes two sessions' first page loads,
    which Streamlit runs on two threads at once, create one sampler, not two."""
    global _SAMPLER
    with _LOCK:
        if _SAMPLER is None:
            _SAMPLER = Sampler(default_sources(), rate_hz or DEFAULT_RATE_HZ).start()
        elif rate_hz is not None and rate_hz != _SAMPLER.stats().rate_hz:
            _SAMPLER.set_rate(rate_hz)
        return _SAMPLER


def shutdown_sampler() -> None:
    """Stop and forget the singleton (tests, benchmarks, interpreter exit)."""
    global _SAMPLER
    with _LOCK:
        if _SAMPLER is not None:
            _SAMPLER.stop()
            _SAMPLER = None
