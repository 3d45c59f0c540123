"""The quality verdict (core/quality/verdict.py) on the numbers recorded for the embedded model in
docs/perf-log/quality.md (FP32 reference, shipped sample prose): each precision lands where the thresholds say."""
import math

import pytest

from core.quality import render
from core.quality.verdict import log_loss_noise, verdict, verdicts

REF = {"name": "fp32", "role": "reference", "perplexity": 26.6528, "log_loss_noise": 0.02}


def row(name, ppl, kld):
    return {"name": name, "role": "candidate", "perplexity": ppl, "kld": {"mean": kld}}


@pytest.mark.parametrize("name, ppl, kld, expected", [
    ("bf16", 26.6144, 0.00116, "fine"), ("fp8", 27.1111, 0.02173, "fine"), ("int8", 27.7479, 0.03387, "fine"),
    ("int8-wo", 26.8830, 0.00459, "fine"), ("int4-awq", 32.5608, 0.19545, "degraded"),
    ("int4", 50.0318, 0.55142, "broken")])
def test_recorded_precisions_get_the_verdicts_their_numbers_earn(name, ppl, kld, expected):
    v = verdict(row(name, ppl, kld), REF)
    assert v.name == expected, v.reason
    assert f"mean KLD {kld:.3g} nats" in v.reason


def test_an_overflow_is_broken_and_the_reference_noise_floor_raises_the_ratio_limit():
    assert verdict(row("fp16", math.nan, math.nan), REF).name == "broken"
    noisy = dict(REF, log_loss_noise=math.log(1.10))  # a short document: perplexity known to within x1.10
    v = verdict(row("int8", REF["perplexity"] * 1.08, 0.01), noisy)
    assert v.name == "fine" and "noise floor" in v.reason
    assert verdict(row("int8", REF["perplexity"] * 1.08, 0.01), REF).name == "degraded"


def test_log_loss_noise_shrinks_with_more_positions():
    few, many = log_loss_noise([-1.0, -3.0] * 10), log_loss_noise([-1.0, -3.0] * 1000)
    assert few > many > 0 and log_loss_noise([-1.0]) is None


def test_verdict_rows_and_tables_carry_the_verdict():
    result = {"rows": [REF, row("int4", 50.0, 0.55), row("fp8", 27.1, 0.02)]}
    assert {k: v.name for k, v in verdicts(result).items()} == {"int4": "broken", "fp8": "fine"}
    assert [r["verdict"] for r in render.verdict_rows(result)] == ["broken", "fine"]
    assert [r["verdict"] for r in render.compact_rows(result)] == ["reference", "broken", "fine"]
    assert [r["verdict"] for r in render.table_rows(result)] == ["", "broken", "fine"]
    assert "peak memory" in render.timing_rows(result)[0] and "peak mem" not in render.compact_rows(result)[0]
