"""The pace of live refreshes: what the viewers together cost the server, and the interval that keeps it in budget.

Every session's refresh runs Python on the server, under one interpreter lock. When the viewers together need more
than BUDGET_CORE of a core, a page or a click elsewhere waits behind their refreshes (eight monitors on two busy cores
once kept the console from switching pages at all). So each refresh records its CPU and wall-clock time, and every
viewer's interval is stretched to the smallest that keeps the viewers within the budget. A refresh that takes far
longer in wall-clock time than in CPU is waiting for the interpreter or the cores (a generation, another process):
the server is behind, and the interval stretches to twice that time. The page says which applies.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

BUDGET_CORE = 0.2  # all live refreshes together: at most a fifth of one core
BEHIND_FACTOR = 2.0  # the interval is at least this many times a refresh's wall-clock time
WINDOW_S = 10.0  # costs and viewers are judged over this much recent time
MAX_INTERVAL_S = 10  # slower than this the page stops being live; beyond it the budget gives


@dataclass(frozen=True)
class Pace:
    interval_s: int  # what refreshes run at now
    asked_s: int
    viewers: int  # sessions that refreshed in the last WINDOW_S
    cpu_ms_per_refresh: float  # means over those refreshes
    wall_ms_per_refresh: float
    load_core: float  # their CPU over the window, in cores
    reason: str = ""  # why slower than asked: "budget" or "behind"

    @property
    def slowed(self) -> bool:
        return self.interval_s > self.asked_s

    def describe(self) -> str:
        load = (f"{self.viewers} viewer{'s' if self.viewers != 1 else ''}, {self.cpu_ms_per_refresh:.0f} ms server "
                f"CPU and {self.wall_ms_per_refresh:.0f} ms wall time per refresh, {100 * self.load_core:.0f}% of a "
                f"core together")
        if not self.slowed:
            return f"Refreshing every {self.interval_s} s: {load}."
        why = (f"at {self.asked_s} s the viewers together would take more than {100 * BUDGET_CORE:.0f}% of a core"
               if self.reason == "budget" else "the server is behind: refreshes wait far longer than they compute")
        return f"Refreshing every {self.interval_s} s instead of {self.asked_s} s, {why}. {load}."


class Pacer:
    def __init__(self, budget_core: float = BUDGET_CORE, window_s: float = WINDOW_S, clock=time.monotonic):
        self._budget, self._window, self._clock = budget_core, window_s, clock
        self._lock = threading.Lock()
        self._runs: deque[tuple[float, str, float, float]] = deque()  # (when, session, CPU s, wall s)

    def record(self, session: str, cpu_s: float, wall_s: float) -> None:
        now = self._clock()
        with self._lock:
            self._runs.append((now, session, cpu_s, wall_s))
            self._forget(now)

    def forget(self, session: str) -> None:
        """A session that paused or left stops counting at once."""
        with self._lock:
            self._runs = deque(r for r in self._runs if r[1] != session)

    def _forget(self, now: float) -> None:
        while self._runs and self._runs[0][0] < now - self._window:
            self._runs.popleft()

    def pace(self, asked_s: int) -> Pace:
        """The interval for a viewer who asked for `asked_s`: whole seconds, at least what the CPU budget needs for
        every current viewer at that pace and BEHIND_FACTOR times a refresh's wall time. Both depend on the cost of a
        refresh and the number of viewers, not on the interval in force, so the pace does not swing back and forth."""
        with self._lock:
            self._forget(self._clock())
            runs = list(self._runs)
        if not runs:
            return Pace(asked_s, asked_s, 0, 0.0, 0.0, 0.0)
        viewers = len({r[1] for r in runs})
        cpu_total = sum(r[2] for r in runs)
        cpu = cpu_total / len(runs)
        wall = sum(r[3] for r in runs) / len(runs)
        for_budget = math.ceil(viewers * cpu / self._budget - 1e-9)
        for_wall = math.ceil(BEHIND_FACTOR * wall - 1e-9)
        interval = max(asked_s, min(MAX_INTERVAL_S, max(for_budget, for_wall)))
        reason = "" if interval == asked_s else "budget" if for_budget >= for_wall else "behind"
        return Pace(interval, asked_s, viewers, 1000 * cpu, 1000 * wall, cpu_total / self._window, reason)


_PACER = Pacer()


def get_pacer() -> Pacer:
    """The one pacer of this process: every session's refreshes share one server."""
    return _PACER
