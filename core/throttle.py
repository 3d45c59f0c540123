"""Rate-limit page updates made from inside a timed loop.

Every Streamlit update (a progress bar, a growing code block) is a websocket message the browser re-renders. Sent
once per token they slow the very decode being timed, most on a small CPU where the browser shares the cores, so
timed loops update the page at most a few times a second; the last update always goes through.
"""
from __future__ import annotations

import time
from typing import Callable

UPDATE_INTERVAL_S = 0.25


def throttled(fn: Callable[..., None], interval_s: float = UPDATE_INTERVAL_S,
              is_last: Callable[..., bool] = lambda *a: False, clock: Callable[[], float] = time.monotonic):
    """fn, called at most once per interval_s; a call for which is_last(*args) is true always goes through."""
    last = [float("-inf")]

    def call(*args) -> None:
        now = clock()
        if is_last(*args) or now - last[0] >= interval_s:
            last[0] = now
            fn(*args)

    return call
