"""Run progress and stops (views/common/runs.py): rates never read 0, the first prefill chunk is named, the clock
ticks while one step holds the script thread, and a stop of any kind reaches on_stop once, before it goes on."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from core.engines import base
from views.common import runs


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(runs.time, "monotonic", c)
    return c


def test_a_slow_rate_keeps_its_digits(clock):
    progress = runs.RunProgress()
    assert progress.text(1, 48, "tokens", "Decode").startswith("Decode: 1 of 48 tokens · 0.0 s elapsed")
    clock.t += 10.0  # 4 tokens in 10 s: 0.4 tokens/s, once printed "0 tokens/s"
    text = progress.text(5, 48, "tokens", "Decode")
    assert "at 0.4 tokens/s measured now" in text and "about 1 min 47 s left" in text, text


def test_the_first_prefill_chunk_is_named_with_the_prompt_length(clock):
    progress = runs.RunProgress()
    clock.t += 3.0
    assert progress.text(0, 22106, "prompt tokens", "Prefill") == \
        "Prefill: first chunk of the 22,106 prompt tokens · 3.0 s elapsed"


def test_the_speed_hint_keeps_its_digits(monkeypatch):
    monkeypatch.setattr(runs.store, "recent_speed", lambda what, key: 0.35)
    assert runs.speed_hint("decode", "x", 7, "tokens") == \
        "about 20 s at this machine's recent 0.35 tokens/s on this setup"


class InjectedPageSwitch(BaseException):
    """Stands in for Streamlit's StopException, which only a live script run raises at a page update."""


@pytest.mark.parametrize("stop", [lambda: base.check_stop(lambda: True), lambda: (_ for _ in ()).throw(
    InjectedPageSwitch())])
def test_every_kind_of_stop_reaches_on_stop_once_and_goes_on(stop):
    seen = []
    with pytest.raises((base.Cancelled, InjectedPageSwitch)):
        with runs.stoppable(on_stop=seen.append):
            stop()
    assert len(seen) == 1 and seen[0] > 0


def test_an_error_is_not_a_stop():
    seen = []
    with pytest.raises(ValueError):
        with runs.stoppable(on_stop=seen.append):
            raise ValueError("bad input")
    assert seen == []


def test_the_clock_ticks_while_one_step_holds_the_script_thread():
    # A step of 3 s (a prefill chunk under load): nothing else draws, yet the bar's elapsed time moves on.
    def script():
        import time

        from views.common import runs

        runs.RunProgress("Expected: about 2 min")
        time.sleep(3.0)

    at = AppTest.from_function(script, default_timeout=60).run()
    assert not at.exception, at.exception
    text = at.get("progress")[0].proto.text
    assert text.startswith("Expected: about 2 min · ") and text.endswith(" s elapsed") and " 0.0 s" not in text, text



def test_the_next_script_run_learns_that_the_last_run_was_stopped_and_what_on_stop_saved():
    def script():
        import streamlit as st

        from core.engines import base
        from views.common import runs

        last = runs.last_stop("k")  # once per script run, before a run starts
        st.write(f"last: {None if last is None else last['saved']}")
        stop = st.session_state.get("stop", True)
        try:
            with runs.stoppable(key="k", on_stop=lambda at: 7):
                base.check_stop(lambda: stop)
        except base.Cancelled:
            pass

    at = AppTest.from_function(script, default_timeout=60).run()
    assert at.markdown[0].value == "last: None"
    at.session_state["stop"] = False
    at.run()
    assert at.markdown[0].value == "last: 7"  # the first run was stopped, and its on_stop returned 7
    at.run()
    assert at.markdown[0].value == "last: None"  # the second ran to its end


def test_the_estimate_bench_scores_a_steady_run_exact_and_a_slowing_one_short():
    """bench/estimate_error.py holds the pages' estimate (core.stats.time_left_s) against the time really left."""
    from bench.estimate_error import estimates

    steady = [(float(t), 100.0 * t) for t in range(41)]  # 100 units a second for 40 s
    rows = estimates(steady, 4000.0)
    assert [r["quarter"] for r in rows] == [0.25, 0.5, 0.75]
    assert all(r["ratio"] == pytest.approx(1.0) for r in rows), rows
    slowing = [(float(t), 100.0 * t) for t in range(21)] + [(20.0 + t, 2000.0 + 50.0 * t) for t in range(1, 41)]
    late = estimates(slowing, 4000.0)[-1]  # at 75% it had gone at 100/s, then 50/s: the estimate is short
    assert late["ratio"] < 1.0 and late["true_s"] == pytest.approx(20.0)
