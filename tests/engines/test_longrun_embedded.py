"""Long-context runs on the real embedded model at BF16 on the CPU. Short on purpose (CI has 2 cores): a 1K-token
prompt, a 512-token needle test (two teacher-forced passes) and a handful of new tokens. Timings are checked for
plausibility only, never against numbers."""
import math

import pytest

from core.engines.base import Cancelled
from core.long_context import document as longdoc
from core.long_context import kvcache
from core.long_context import runs as longrun
from core.stats import percentile

NEW = 4


@pytest.fixture(scope="module")
def engine(engine_cache):
    return engine_cache("bf16")


@pytest.fixture(scope="module")
def filler(engine):
    doc = longdoc.sample_document(1200, lambda s: longdoc.count_tokens(engine.tokenizer, s))
    return longrun.plain_ids(engine, doc)


def test_prefill_and_decode_give_plausible_ttft_and_itl(engine, filler):
    prompt = longrun.exact_prompt(engine, filler, 1024)
    assert len(prompt) == 1024 and prompt[0] == engine.tokenizer.bos_token_id
    seen = []
    r = longrun.run_once(engine, prompt, NEW, progress=lambda f, m: seen.append(f))
    assert r.prompt_tokens == 1024 and r.new_tokens == NEW
    assert math.isfinite(r.ttft_s) and r.ttft_s > 0
    assert len(r.itl_s) == NEW - 1 and all(math.isfinite(x) and x > 0 for x in r.itl_s)
    p = r.itl_p
    assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= max(r.itl_s)
    assert r.decode_tok_s > 0 and r.wall_s >= r.ttft_s
    assert seen[0] == 0.0 and seen[-1] == 1.0
    # the cache the engine measured is what the calculator predicts for the tokens it holds (prompt + fed tokens);
    # transformers keeps window - 1 tokens in a sliding layer between steps, vLLM-style arithmetic keeps window
    held = 1024 + NEW - 1
    predicted = kvcache.kv_bytes(kvcache.builtin_shape("embedded"), "bf16", held)
    assert predicted - 15 * 1024 <= r.kv_bytes <= predicted
    d = r.to_dict()
    assert d["itl_p50_ms"] == pytest.approx(1000 * p["p50"])


def test_needle_prompts_place_the_fact_at_each_depth_with_equal_lengths(engine, filler):
    prompts, answer = longrun.needle_prompts(engine, filler, 1024)
    needle = longrun.plain_ids(engine, "\n" + longrun.NEEDLE.format(answer=longrun.ANSWER) + "\n")
    assert [d for d, _, _ in prompts] == ["none", "start", "middle", "end"]
    assert {len(ids) for _, _, ids in prompts} == {1024}
    question = longrun.plain_ids(engine, longrun.QUESTION)
    for depth, pos, ids in prompts[1:]:
        assert ids[pos:pos + len(needle)] == needle
        assert ids[-len(question):] == question
    positions = [pos for _, pos, _ in prompts[1:]]
    assert positions[0] == 1 and positions[0] < positions[1] < positions[2]  # start is right after BOS
    assert positions[2] + len(needle) + len(question) == 1024  # end: the fact right before the question
    assert engine.decode(answer).strip() == longrun.ANSWER.strip()


def test_needle_scores_are_finite_and_the_fact_is_used(engine, filler):
    # two teacher-forced passes (control and middle) keep this affordable on 2 cores
    results = longrun.needle_test(engine, filler, 512, depths=("middle",))
    assert [r.depth for r in results] == ["none", "middle"]
    for r in results:
        assert r.answer_tokens >= 5 and len(r.token_logprobs) == r.answer_tokens
        assert all(math.isfinite(x) and x <= 0 for x in r.token_logprobs)
        assert r.answer_logprob == pytest.approx(sum(r.token_logprobs))
    control, middle = results
    # a fact in the middle of the filler is used: it lifts the answer far above the model's blind guess
    assert middle.answer_logprob > control.answer_logprob + 5


def test_ramp_and_batch_sweep_report_each_point_and_cancel_keeps_finished_ones(engine, filler):
    got = []
    runs = longrun.ramp(engine, filler, [128, 64], 2, on_result=got.append)
    assert [r.prompt_tokens for r in runs] == [64, 128] and got == runs
    sweep = longrun.batch_sweep(engine, filler, 32, 2, batches=(1, 4))
    assert [r.batch for r in sweep] == [1, 4] and all(r.decode_tok_s > 0 for r in sweep)

    done = []
    with pytest.raises(Cancelled):
        longrun.ramp(engine, filler, [32, 48, 64], 2, should_stop=lambda: len(done) >= 1, on_result=done.append)
    assert [r.prompt_tokens for r in done] == [32]


def test_lengths_beyond_the_model_are_refused_before_running(engine, filler):
    with pytest.raises(ValueError, match="positions"):
        longrun.ramp(engine, filler, [64, engine.max_positions], 4)
    # the needle goes up to the model's positions less the answer it scores, and no further
    cap = longrun.needle_max_tokens(engine)
    assert cap == engine.max_positions - len(longrun.plain_ids(engine, longrun.ANSWER)) == 32758
    with pytest.raises(ValueError, match=r"Use at most 32,758 tokens"):
        longrun.needle_test(engine, filler, cap + 1)
    assert longrun.needle_max_tokens(engine, 4096) == 4086  # a configured max length caps it too
    with pytest.raises(ValueError, match=r"within 4,096 positions\. Use at most 4,086"):
        longrun.needle_test(engine, filler, 4087, max_length=4096)


def test_percentiles_match_numpy():
    import numpy as np

    values = [0.05, 0.01, 0.2, 0.03, 0.07, 0.04, 0.5]
    for q in (0.5, 0.9, 0.99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, 100 * q)))
    assert percentile([], 0.5) is None


def test_a_cpu_run_that_would_not_fit_in_memory_is_refused_before_it_starts(engine):
    import psutil

    # the needle at the model's full length fits with room to spare on a 24 GiB machine (measured peaks 5.2 GiB
    # in all at BF16, 7.7 GiB at FP32, docs/perf-log/long-context.md); the estimate stays above what the pass itself
    # took
    assert 4.1 * 2**30 < longrun.pass_bytes(engine.config, 32768) < 8 * 2**30
    assert 7.0 * 2**30 < longrun.pass_bytes(engine.config, 32768, act_bytes=4) < 12 * 2**30
    # a batch whose pass needs more than twice the memory free now: refused with what would fit, nothing run
    per_row = longrun.pass_bytes(engine.config, 4096)
    batch = 2 * psutil.virtual_memory().available // per_row + 1
    with pytest.raises(ValueError, match=r"GiB of memory for one forward pass on the CPU .* Use at most about") as e:
        longrun.check_memory(engine, 4096, batch)
    assert f"{batch} x 4,096 tokens" in str(e.value) and "ends the whole server" in str(e.value)
