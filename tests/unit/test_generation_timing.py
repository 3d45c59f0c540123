"""A generation's timing summary: the decode rate counts every gap, so the tail of the gaps is reported beside it."""
import pytest

from core.engines.base import Generation


def test_one_long_gap_shows_in_the_tail_and_the_rate_not_in_the_median():
    gen = Generation(prompt_ids=[1, 2], token_ids=[3, 4, 5, 6, 7], token_times=[0.10, 0.15, 0.20, 0.25, 0.90])
    t = gen.timing_summary()
    assert t["itl_median_s"] == pytest.approx(0.05)
    assert t["itl_max_s"] == pytest.approx(0.65)
    assert t["itl_p90_s"] == pytest.approx(0.47)  # interpolated between the 0.05 and 0.65 gaps
    assert t["decode_tok_s"] == pytest.approx(4 / 0.80)  # well below 1 / median (20 tok/s)


def test_a_single_token_has_no_gaps():
    t = Generation(prompt_ids=[1], token_ids=[2], token_times=[0.3]).timing_summary()
    assert t["itl_median_s"] is None and t["itl_p90_s"] is None and t["itl_max_s"] is None
    assert t["decode_tok_s"] is None
