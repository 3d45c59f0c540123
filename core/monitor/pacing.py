"""The pace of live refreshes: what the viewers together cost the server, and the interval that keeps it in budget.

Every session's refresh runs Python on the server, under one interpreter lock. When the viewers together need more
than BUDGET_CORE of a core, a page or a click elsewhere waits behind their refreshes (eight monitors on two busy cores
once kept the console from switching pages at all). So each refresh records its own CPU time, and every viewer's
interval is stretched to what the budget allows; the page says so.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

BUDGET_CORE = 0.2  # all live refreshes together: at most a fifth of one core
WINDOW_S = 10.0  # costs and viewers are judged over this much recent time
MAX_INTERVAL_S = 10  # slower than this the page stops being live; beyond it the budget gives


@dataclass(frozen=True)
class Pace:
    interval_s: int  # what refreshes run at now
    asked_s: int
    viewers: int  # sessions that refreshed in the last WINDOW_S
    cpu_ms_per_refresh: float  # mean over those refreshes
    load_core: float  # their CPU over the window, in cores

    @property
    def slowed(self) -> bool:
        return self.interval_s > self.asked_s

    def describe(self) -> str:
        load = (f"{self.viewers} viewer{'s' if self.viewers != 1 else ''}, {self.cpu_ms_per_refresh:.0f} ms server "
                f"CPU per refresh, {100 * self.load_core:.0f}% of a core together")
        if self.slowed:
            return (f"Refreshing every {self.interval_s} s instead of {self.asked_s} s: {load}; slowed to keep the "
                    f"console responsive (budget {100 * BUDGET_CORE:.0f}% of a core).")
        return f"Refreshing every {self.interval_s} s: {load}."


class Pacer:
    def __init__(self, budget_core: float = BUDGET_CORE, window_s: float = WINDOW_S, clock=time.monotonic):
        self._budget, self._window, self._clock = budget_core, window_s, clock
        self._lock = threading.Lock()
        self._runs: deque[tuple[float, str, float]] = deque()  # (when, session, CPU seconds)

    def record(self, session: str, cpu_s: float) -> None:
        now = self._clock()
        with self._lock:
            self._runs.append((now, session, cpu_s))
            self._forget(now)

    def forget(self, session: str) -> None:
        """A session that paused or left stops counting at once."""
        with self._lock:
            self._runs = deque(r for r in self._runs if r[1] != session)

    def _forget(self, now: float) -> None:
        while self._runs and self._runs[0][0] < now - self._window:
            self._runs.popleft()

    def pace(self, asked_s: int) -> Pace:
        """The interval for a viewer who asked for `asked_s`: the smallest whole number of seconds at which every
        current viewer refreshing at that pace stays within the budget. It depends on the cost per refresh and the
        number of viewers, not on the interval in force, so it does not swing back and forth."""
        with self._lock:
            self._forget(self._clock())
            runs = list(self._runs)
        viewers = len({r[1] for r in runs})
        cost = sum(r[2] for r in runs) / len(runs) if runs else 0.0
        needed = math.ceil(viewers * cost / self._budget - 1e-9) if viewers else 0
        interval = max(asked_s, min(MAX_INTERVAL_S, needed))
        return Pace(interval, asked_s, viewers, 1000 * cost, sum(r[2] for r in runs) / self._window)


_PACER = Pacer()


def get_pacer() -> Pacer:
    """The one pacer of this process: every session's refreshes share one server."""
    return _PACER
