"""Streamlit glue for the Long context page's timed runs: a progress bar with a Cancel button, results kept in
session state (ss["lc_<test>"]) as they arrive, every run saved to the history (core.long_context.history), and the notes
a stopped run leaves behind.

Cancel works through Streamlit itself: the click reruns the page script, which stops the running one at its next
progress update (a few times a second: core/throttle.py). "lc_running" is set while a run is in progress and
cleared at its end, so finding it set at the start of a script run means the previous run was stopped.
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st


from core.long_context import history as hist
from core.throttle import throttled

NOBAR = {"displayModeBar": False}
STOPPED = ("The last run was stopped (Cancel, or a widget changed while it ran); results finished before it are "
           "shown and saved in the history.")


def metrics(rows: list[tuple[str, str, str]], per_row: int = 5) -> None:
    """st.metric from (label, value, help) tuples, in even rows of at most per_row: six in one row cut values such
    as "1,698.3 ms" short on a laptop screen."""
    lines = -(-len(rows) // per_row)
    size = -(-len(rows) // lines)
    for i in range(0, len(rows), size):
        for col, (label, value, hint) in zip(st.columns(size), rows[i:i + size]):
            col.metric(label, value, help=hint or None)


def stopped_test() -> str | None:
    """Call once per script run, before any run starts: the test whose last run did not reach its end, if any."""
    return st.session_state.pop("lc_running", None)


def run(test: str, model: str, params: dict, fn: Callable) -> None:
    """fn(progress, keep): each result goes through keep() into the session state and the history at once."""
    ss = st.session_state
    ss[f"lc_{test}"], ss.lc_running = [], test
    bar, cancel = st.progress(0.0, "Starting"), st.empty()
    cancel.button("Cancel", key=f"cancel_{test}")
    progress = throttled(lambda f, msg: bar.progress(min(max(f, 0.0), 1.0), msg), is_last=lambda f, msg: f >= 1.0)
    out = hist.run_recorded(test, model, params, lambda keep: fn(progress, keep), ss[f"lc_{test}"].append)
    if out.message:
        (st.warning if out.status == "cancelled" else st.error)(out.message)
    ss[f"lc_{test}_warning"] = out.warning
    bar.empty()
    cancel.empty()
    ss.lc_running = None


def results(test: str, stopped: str | None, chart: Callable | None = None, row: Callable | None = None) -> list:
    """A test's notes, then its chart and table when given; returns its results. The notes stay inside the test's
    tab, so the tabs keep their place on the page, and with it the selected tab."""
    ss = st.session_state
    if stopped == test:
        st.warning(STOPPED)
    if ss.get(f"lc_{test}_warning"):
        st.warning(ss[f"lc_{test}_warning"])
    got = ss.get(f"lc_{test}") or []
    if got and chart:
        st.plotly_chart(chart(got), key=f"lc_{test}_chart", config=NOBAR)
        st.table([row(r) for r in got])
    return got


def time_left(elapsed_s: float, fraction: float) -> str:
    """"12 s elapsed, about 40 s left": the estimate is the speed measured so far in this run applied to what is
    left (a busy host is slower than an idle one, and its own speed says so); none until a measurable share is done."""
    text = f"{_seconds(elapsed_s)} elapsed"
    if 0.02 <= fraction < 1.0 and elapsed_s >= 2.0:
        text += f", about {_seconds(elapsed_s * (1.0 - fraction) / fraction)} left"
    return text


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{int(s // 60)} min {s % 60:02.0f} s"


def timed_progress(bar, clock: Callable[[], float] = time.monotonic) -> Callable[[float, str], None]:
    """progress(fraction, message) for `bar` (an st.progress), throttled, each message followed by time_left."""
    t0 = clock()

    def show(f: float, msg: str) -> None:
        f = min(max(f, 0.0), 1.0)
        bar.progress(f, f"{msg} · {time_left(clock() - t0, f)}")
    return throttled(show, is_last=lambda f, msg: f >= 1.0)
