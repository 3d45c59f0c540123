"""The sequential design's stopping rule (core.compare.agreement.decided / more_prompts_needed) on the numbers a real
default compare gave: FP8 W8A8 vs FP32 on the embedded model, 6 prompts of 32 tokens, same top token at 182 of 192
positions (94.8%, 95% interval 90.6-97.2%)."""
from __future__ import annotations

import math

import pytest

from core.compare import agreement as ag
from core.compare.result import stop_text
from core.stats import wilson_interval


def summary(agree: int, prompts: int, per_prompt: int = 32, stopped: str = "") -> ag.Summary:
    """A summary of `prompts` prompts whose teacher-forced same-top positions agree `agree` times in all."""
    free, tf, left = [], [], agree
    for _ in range(prompts):
        ids = list(range(per_prompt))
        free.append(ag.free_run(ids, [{t: -0.1} for t in ids], ids, [{t: -0.1} for t in ids]))
        k = min(left, per_prompt)
        left -= k
        tf.append(ag.TeacherForced([True] * k + [False] * (per_prompt - k), [1.0] * per_prompt, [0.01] * per_prompt,
                                   ag.KL_FULL, 8))
    return ag.summarize(free, tf, "FP32", "FP8 W8A8", stopped=stopped)


def test_the_reported_six_prompts_are_inconclusive_and_say_how_many_more():
    s = summary(182, 6)
    assert s.same_top_ci95 == pytest.approx(wilson_interval(182 / 192, 192))
    assert not ag.decided(s)
    # the lower half-width (94.8 - 90.7) against the distance to the fine band's edge (94.8 - 92.0): (4.1 / 2.8)^2
    # is 2.17 times the prompts, 14 in all
    lo = s.same_top_ci95[0]
    factor = ((s.same_top - lo) / (s.same_top - ag.BAND_FINE)) ** 2
    assert ag.more_prompts_needed(s) == math.ceil(6 * factor) - 6 == 8
    assert s.verdict.startswith("Inconclusive: about 8 more prompts would decide it. FP8 W8A8 vs FP32")
    assert "With 192 scored positions over 6 prompts, same top token lies in 90.6-97.2% (95% interval)" in s.verdict


def test_the_estimate_is_what_it_takes_at_the_same_share():
    # 14 prompts at the same 94.8%: the interval now lies inside the fine band, and the run stops there
    s = summary(round(182 / 192 * 448), 14)
    assert ag.decided(s) and s.status == "fine" and s.same_top_ci95[0] >= ag.BAND_FINE
    assert ag.more_prompts_needed(s) == 0
    # Wilson's interval narrows a little faster than 1/sqrt(n) on its lower side (11 prompts would do here), so the
    # estimate errs towards enough; 10 are still too few
    assert not ag.decided(summary(round(182 / 192 * 320), 10))


def test_a_budget_that_ran_out_is_named_in_the_verdict():
    why = stop_text("budget", 120, 18, 48)
    assert why == "the 120 s budget ran out after 18 of 48 prompts"
    s = summary(round(0.925 * 576), 18, stopped=why)
    assert s.verdict.startswith("Inconclusive: the 120 s budget ran out after 18 of 48 prompts; about ")
    assert "more prompts would decide it" in s.verdict
    assert stop_text("decided", 120, 6, 48) == ""  # a decided run needs no excuse


def test_a_share_on_a_band_edge_has_no_estimate():
    s = summary(round(ag.BAND_FINE * 800), 25)  # 736 of 800: exactly 92.0%
    assert s.same_top == ag.BAND_FINE and not ag.decided(s)
    assert ag.more_prompts_needed(s) is None
    assert "sits on a band's edge" in s.verdict


def test_an_interval_across_both_edges_needs_the_larger_of_the_two():
    s = summary(28, 1)  # 28 of 32 (87.5%): the interval runs from the low band to the fine band
    lo, hi = s.same_top_ci95
    assert lo < ag.BAND_FAILED and hi >= ag.BAND_FINE
    low_side = ((s.same_top - lo) / (s.same_top - ag.BAND_FAILED)) ** 2
    high_side = ((hi - s.same_top) / (ag.BAND_FINE - s.same_top)) ** 2
    assert ag.more_prompts_needed(s) == math.ceil(max(low_side, high_side)) - 1


def test_identical_and_broken_runs_decide_at_once():
    ids = list(range(8))
    free = ag.free_run(ids, [{t: -0.1} for t in ids], ids, [{t: -0.1} for t in ids])
    same = ag.TeacherForced([True] * 8, [1.0] * 8, [0.0] * 8, ag.KL_FULL, 8)
    assert ag.decided(ag.summarize([free], [same]))  # the noise floor: 8 positions are enough
