"""Speeds as the pages print them: never rounded to zero (a run at 0.4 tokens/s shown as "0 tokens/s" looks hung)."""
import pytest

from core.fmt import fmt_per_s


@pytest.mark.parametrize("per_s, text", [
    (0.38, "0.38 tokens/s"), (0.4, "0.4 tokens/s"), (0.004, "0.004 tokens/s"), (4.25, "4.2 tokens/s"),
    (9.96, "10 tokens/s"), (340.4, "340 tokens/s"), (12345.6, "12,346 tokens/s"), (0, "0 tokens/s"),
    (None, "N/A"), (float("nan"), "N/A"),
])
def test_a_speed_keeps_two_significant_digits_below_ten(per_s, text):
    assert fmt_per_s(per_s, "tokens") == text


def test_a_slow_speed_is_never_printed_as_zero():
    for per_s in (0.3, 0.05, 0.49, 0.5):
        assert not fmt_per_s(per_s, "prompt tokens").startswith("0 ")
