"""The memory one CPU run takes: this process's resident size sampled during the run, above what it held at the start.

`getrusage().ru_maxrss` is the process's lifetime high-water mark: it only rises across the runs of a ramp or a
batch table and includes the models other sessions loaded, so it cannot say what one run needed. glibc keeps freed
memory for reuse, which would hide a run's allocations from an RSS difference; `malloc_trim(0)` hands it back first.
Sampling misses a spike shorter than the period; the source label says how it was measured.
"""
from __future__ import annotations

import ctypes
import os
import threading

PERIOD_S = 0.005
SOURCE = f"this run's peak resident memory above its start (process RSS sampled every {PERIOD_S * 1000:.0f} ms)"
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the difference then only misses reused memory
        pass


class RunPeakRss:
    """`with RunPeakRss() as peak: ...` then `peak.bytes` (None where /proc cannot be read)."""

    def __init__(self, period_s: float = PERIOD_S):
        self.period_s = period_s
        self.bytes: int | None = None
        self._stop = threading.Event()
        self._start = self._peak = 0

    def __enter__(self) -> "RunPeakRss":
        try:
            trim_heap()
            self._start = self._peak = _rss_bytes()
        except OSError:
            return self
        self._thread = threading.Thread(target=self._watch, name="run-peak-rss", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            self._peak = max(self._peak, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if not hasattr(self, "_thread"):
            return
        self._stop.set()
        self._thread.join()
        self.bytes = max(0, max(self._peak, _rss_bytes()) - self._start)
