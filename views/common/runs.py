"""Streamlit glue for timed runs: progress that tells time, a stop that reaches the engine, and the Long context
page's runs kept in session state (ss["lc_<test>"]) and saved to the history (core.long_context.history).

- RunProgress: a bar with the time since the start, work done of its total in its unit (prompt tokens, tokens,
  prompts, windows, steps) and the time left, estimated from the speed measured so far in this run. Its clock ticks
  every second even while one step (a prefill chunk, a slow decode step, a load) holds the script thread.
- stoppable(): engine calls in the block stop at a Stop (or Cancel) button it shows while the block runs, a widget
  change, a page switch or a closed tab. Streamlit asks a running script to stop by flagging its script thread, which
  it only reads at the next page update; the block hands that flag to the engine (core.engines.base.RunControl),
  which reads it between prefill chunks and decode steps, so the CPU is free within about a second of the stop.
  Its on_stop saves what the run did before anything else reaches the page, whichever way the stop came.
- wait_for_engine(): a run that must wait for another run on the same model says so and counts the seconds.
- speed_hint(): the time a run should take, from this machine's recent speed (core.store speeds), before it starts.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

import streamlit as st

from core import store
from core.engines import base, pool
from core.fmt import fmt_per_s
from core.long_context import history as hist
from core.stats import time_left_s
from core.throttle import throttled

NOBAR = {"displayModeBar": False}
STOPPED = ("The last run was stopped (Cancel, or a widget changed while it ran); results finished before it are "
           "shown and saved in the history.")


def _elapsed(seconds: float) -> str:
    """Seconds for reading at a glance: "4.2 s", "38 s", "8 min 02 s"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


class RunProgress:
    """A run's progress on the page. step(done, total, unit, what) for work counted in units; fraction(f, msg) for
    callers that only know a share (a model load, a feature's own progress(fraction, message)); waiting(seconds)
    while another run holds the engine. Page updates are throttled (core/throttle.py): they cost the run time. A
    ticker thread redraws the last state once a second when nothing else did, so the elapsed time never stands
    still while a long step runs."""

    TICK_S = 1.0

    def __init__(self, hint: str | None = None):
        self._bar = st.progress(0.0, hint or "Starting")
        self._t0 = time.monotonic()
        self._first: dict[tuple, tuple[float, float]] = {}  # per kind of work: when it was first seen, done then
        self._show = throttled(self._draw, is_last=lambda f, text: f >= 1.0)
        # what the bar shows now, as a function of the time: the ticker redraws it
        self._now: Callable[[], tuple[float, str]] = lambda: (0.0, f"{hint or 'Starting'} · "
                                                                   f"{_elapsed(time.monotonic() - self._t0)} elapsed")
        self._lock, self._drawn, self._done = threading.Lock(), time.monotonic(), threading.Event()
        _start_ticker(self)

    def text(self, done: float, total: float, unit: str, what: str = "") -> str:
        """"Prefill: 4,096 of 22,241 prompt tokens · 12 s elapsed · about 50 s left at 340 prompt tokens/s measured
        now": the estimate is this kind of work's own speed so far in the run, shown once it has run a second. Before
        the first prompt tokens are done: "Prefill: first chunk of the 22,241 prompt tokens · 3.0 s elapsed"."""
        now = time.monotonic()
        key = (unit, total) if unit == "%" else (what, unit, total)
        t_first, done_first = self._first.setdefault(key, (now, done))
        if unit == "%":
            head = f"{what}: {done:.0f}%"
        elif done == 0 and unit == "prompt tokens":  # a chunk's forward pass is running: nothing to count yet
            head = f"{what + ': ' if what else ''}first chunk of the {total:,.0f} {unit}"
        else:
            head = f"{what + ': ' if what else ''}{done:,.0f} of {total:,.0f} {unit}"
        parts = [head, f"{_elapsed(now - self._t0)} elapsed"]
        ran, did = now - t_first, done - done_first
        if (left := time_left_s(done, total, ran, did)) is not None:
            rate = "" if unit == "%" else f" at {fmt_per_s(did / ran, unit)} measured now"
            parts.append(f"about {_elapsed(left)} left{rate}")
        return " · ".join(parts)

    def step(self, done: float, total: float, unit: str, what: str = "") -> None:
        f = min(max(done / total if total else 1.0, 0.0), 1.0)
        self._now = lambda: (f, self.text(done, total, unit, what))
        self._show(*self._now())

    def fraction(self, f: float, msg: str) -> None:
        self.step(round(100 * min(max(f, 0.0), 1.0)), 100, "%", msg)

    def waiting(self, seconds: float) -> None:
        since = time.monotonic() - seconds
        self._now = lambda: (0.0, "Waiting for the run before this one to release the engine: "
                                  f"{_elapsed(time.monotonic() - since)} (a stopped run lets go within about a second)")
        self._draw(*self._now())

    def clear(self) -> None:
        self._done.set()
        with self._lock:
            self._bar.empty()

    def _draw(self, f: float, text: str) -> None:
        with self._lock:
            if not self._done.is_set():
                self._bar.progress(f, text)
                self._drawn = time.monotonic()

    def _tick(self) -> None:
        """From the ticker thread: redraw the bar if nothing drew it for a second."""
        if time.monotonic() - self._drawn >= self.TICK_S:
            self._draw(*self._now())


def _start_ticker(progress: RunProgress) -> None:
    """Tick `progress` once a second until it is cleared or its script run ends (a stop, an error, the last line).
    The thread joins the script run's context, as Streamlit's own helper threads do, and only while that run is
    executing: a tick after it would draw a stale bar into the next run's page. The checks read Streamlit's private
    state (the runner's _execing flag, the run's cursors, new at each run); tests/e2e cover them."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import add_script_run_ctx, get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    runner = getattr(getattr(ctx, "_enqueue", None), "__self__", None)
    if ctx is None or not hasattr(runner, "_execing"):  # not in a script run (a bare call in a test)
        return
    cursors = ctx.cursors

    def running() -> bool:
        return not progress._done.is_set() and runner._execing and ctx.cursors is cursors

    def tick() -> None:
        while not progress._done.wait(progress.TICK_S) and running():
            try:
                progress._tick()
            except BaseException:  # noqa: BLE001 - the run is ending (Streamlit's stop): the ticker ends with it
                return

    thread = threading.Thread(target=tick, name="RunProgress ticker", daemon=True)
    add_script_run_ctx(thread, ctx)
    thread.start()


def _script_stop_probe() -> Callable[[], bool]:
    """True once Streamlit asked this script run to stop or to rerun (a click, a widget change, a page switch, a
    closed tab). Streamlit keeps the request in the script thread's ScriptRequests and acts on it at the next page
    update; reading it here lets an engine stop between two chunks instead. A fragment's own rerun does not stop
    the script, as in Streamlit itself. The attributes are Streamlit's private state: tests/e2e cover them."""
    from streamlit.runtime.scriptrunner_utils import script_requests as sr
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    requests = getattr(get_script_run_ctx(), "script_requests", None)
    if requests is None:  # not in a script run (a bare import in a test)
        return lambda: False

    def asked() -> bool:
        state = requests._state
        if state is sr.ScriptRequestType.RERUN:
            data = requests._rerun_data
            return not sr._fragment_run_should_not_preempt_script(data.fragment_id_queue,
                                                                  data.is_fragment_scoped_rerun)
        return state is sr.ScriptRequestType.STOP

    return asked


STOP_HELP = ("Stops the run within about a second; History keeps it as cancelled. Leaving the page or closing the "
             "tab stops it the same way.")


@contextlib.contextmanager
def stoppable(progress: RunProgress | None = None, prefill_unit: str = "prompt tokens", *, button: str | None = None,
              label: str = "Stop", where=None, on_stop: Callable[[float], object] | None = None,
              key: str | None = None) -> Iterator[base.RunControl]:
    """Engine calls in the block stop when the user stops the script (Cancelled within about a second on the torch
    engine, a closed stream on a server); the prefill's chunks count on `progress`.

    button: the key of a `label` button shown here (or in the container `where`) while the block runs (outside any
    form: its click reruns the script, which is the stop). on_stop(stopped_at): called once when the block ends by a
    stop, before anything else reaches the page, whether the engine saw it (Cancelled) or Streamlit ended the script
    at a page update inside the block (a page switch or a closed tab ends it there, not as Cancelled); the stop goes
    on after it. key: where the block leaves its outcome for last_stop(), in the session state."""
    outcome = {"stopped": False, "saved": None, "ended": threading.Event()}
    if key:
        st.session_state[key] = outcome  # before the run: a session state write is a page update, where a stop ends it
    box = None
    if button:
        box = (where or st).empty()
        box.button(label, key=button, icon=":material/stop_circle:", help=STOP_HELP)
    on_prefill = (lambda done, total: progress.step(done, total, prefill_unit, "Prefill")) if progress else None
    control = base.RunControl(should_stop=_script_stop_probe(), on_prefill=on_prefill)
    try:
        with base.controlled(control):
            yield control
    except BaseException as exc:
        # a stop is Cancelled, or Streamlit's own stop/rerun (not an Exception); any other error is not a stop
        if isinstance(exc, base.Cancelled) or not isinstance(exc, Exception):
            outcome["stopped"] = True
            if on_stop is not None:
                outcome["saved"] = on_stop(control.stopped_at or time.time())
        raise
    finally:
        outcome["ended"].set()
        if box is not None:
            box.empty()


def last_stop(key: str, wait_s: float = 5.0) -> dict | None:
    """Once per script run, before the page starts a run: the outcome stoppable(key=...) left if that run was stopped
    ({"saved": what its on_stop returned}), else None. A stop reruns the script at once, beside the stopped run still
    unwinding (Streamlit's fast reruns): this waits up to wait_s for that run to end."""
    last = st.session_state.pop(key, None)
    return last if last is not None and last["ended"].wait(wait_s) and last["stopped"] else None


def wait_for_engine(engine, progress: RunProgress) -> None:
    """Wait, saying so on `progress`, while another run (another tab's, or one stopped a moment ago) holds `engine`."""
    pool.wait_until_free(engine, progress.waiting, check=base.check_stop)


def speed_hint(what: str, setup_key: str, amount: float, unit: str) -> str | None:
    """"about 40 s at this machine's recent 550 prompt tokens/s on this setup", or None before any run measured it."""
    per_s = store.recent_speed(what, setup_key)
    if not per_s:
        return None
    return f"about {_elapsed(amount / per_s)} at this machine's recent {fmt_per_s(per_s, unit)} on this setup"


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


def run(test: str, model: str, params: dict, engine, fn: Callable, hint: str | None = None) -> None:
    """fn(progress, keep): each result goes through keep() into the session state and the history at once; `hint`
    says before the start how long it should take."""
    ss = st.session_state
    ss[f"lc_{test}"], ss.lc_running = [], test
    if hint:
        st.caption(f"Expected: {hint}.")
    progress = RunProgress()

    def go(keep):
        wait_for_engine(engine, progress)
        return fn(progress.fraction, keep)

    with stoppable(progress, button=f"cancel_{test}", label="Cancel"):  # run_recorded saves a stopped run itself
        out = hist.run_recorded(test, model, params, go, ss[f"lc_{test}"].append)
    if out.message:
        (st.warning if out.status == "cancelled" else st.error)(out.message)
    ss[f"lc_{test}_warning"] = out.warning
    progress.clear()
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
