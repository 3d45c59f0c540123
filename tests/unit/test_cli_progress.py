"""The progress lines long commands print: elapsed time, and the time left from the run's own pace."""
from diagnostics.cli.progress import eta_text


def test_the_estimate_comes_from_the_runs_own_pace_once_it_has_one():
    assert eta_text(0.25, 10.0) == "10 s elapsed, about 30 s left"
    assert eta_text(0.0, 5.0) == "5 s elapsed"  # nothing done yet: no pace to go by
    assert eta_text(0.5, 0.4) == "0 s elapsed"  # under a second: too early to tell
    assert eta_text(1.0, 12.0) == "12 s elapsed"
