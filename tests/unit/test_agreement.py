"""core.compare.agreement on hand-made token sequences and logprob dicts, including vLLM-shaped ones."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from core.compare import agreement as ag


@dataclass
class Logprob:
    """The shape of vllm.logprobs.Logprob (what check_logprobs_close receives from vllm_runner)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def lp(*pairs: tuple[int, float]) -> dict[int, float]:
    return dict(pairs)


def log_dist(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64))


# ---- free-running ----

@pytest.mark.parametrize("ref, cand, expected", [
    ([1, 2, 3, 4], [1, 2, 3, 9], 1.0),  # only the first three count
    ([1, 2, 3], [1, 9, 3], 2 / 3),
    ([1, 2, 3], [7, 8, 9], 0.0),
    ([1, 2, 3], [1, 2], 2 / 3),  # the side that stopped misses position 2
    ([1], [1], 1.0),  # both stopped after one token: one position compared
    ([], [], 1.0),
])
def test_top3_match(ref, cand, expected):
    assert ag.top3_match(ref, cand) == pytest.approx(expected)


@pytest.mark.parametrize("ref, cand, div, prefix", [
    ([1, 2, 3], [1, 2, 3], None, 3),
    ([1, 2, 3], [1, 5, 3], 1, 1),
    ([5, 2, 3], [1, 2, 3], 0, 0),
    ([1, 2, 3], [1, 2], 2, 2),  # one side stopped early (EOS)
])
def test_first_divergence_and_prefix(ref, cand, div, prefix):
    assert ag.first_divergence(ref, cand) == div
    assert ag.exact_prefix_len(ref, cand) == prefix


def test_positionwise_agreement_counts_over_the_longer_output():
    assert ag.positionwise_agreement([1, 2, 3, 4], [1, 9, 3, 4]) == 0.75
    assert ag.positionwise_agreement([1, 2, 3, 4], [1, 2]) == 0.5
    assert ag.positionwise_agreement([], []) == 1.0


# ---- vLLM's check_logprobs_close rule ----

def vllm_topk(*ids_in_rank_order: int, extra: dict[int, int] | None = None) -> dict[int, Logprob]:
    """A vLLM sample-logprobs dict: top-k entries with ranks 1..k, plus optional {token: rank} beyond k (vLLM adds
    the sampled token when it is outside the top-k)."""
    d = {t: Logprob(-0.1 * (r + 1), rank=r + 1, decoded_token=f"t{t}") for r, t in enumerate(ids_in_rank_order)}
    for t, r in (extra or {}).items():
        d[t] = Logprob(-5.0 - r, rank=r)
    return d


def test_vllm_rule_passes_without_divergence():
    ids = [5, 6, 7]
    tops = [vllm_topk(5, 1), vllm_topk(6, 1), vllm_topk(7, 1)]
    r = ag.vllm_rule(ids, tops, ids, tops)
    assert r.passed and r.position is None


def test_vllm_rule_mutual_membership_at_first_divergence_passes():
    ref, cand = [5, 6, 7], [5, 8, 9]
    ref_top = [vllm_topk(5, 1), vllm_topk(6, 8, 2), vllm_topk(7)]
    cand_top = [vllm_topk(5, 1), vllm_topk(8, 6, 2), vllm_topk(9)]
    r = ag.vllm_rule(ref, ref_top, cand, cand_top)
    assert r.passed and r.position == 1 and (r.ref_token, r.cand_token) == (6, 8)
    assert r.ref_in_cand_topk and r.cand_in_ref_topk


def test_vllm_rule_fails_when_one_side_is_missing_from_the_other():
    ref, cand = [5, 6], [5, 8]
    ref_top = [vllm_topk(5), vllm_topk(6, 2, 3)]  # 8 not among the reference's alternatives
    cand_top = [vllm_topk(5), vllm_topk(8, 6)]
    r = ag.vllm_rule(ref, ref_top, cand, cand_top)
    assert not r.passed and r.position == 1
    assert r.ref_in_cand_topk is True and r.cand_in_ref_topk is False
    assert "candidate token 8" in r.detail


def test_vllm_rule_checks_only_the_first_divergence():
    ref, cand = [5, 6, 7, 7], [5, 8, 1, 2]
    ref_top = [vllm_topk(5), vllm_topk(6, 8), vllm_topk(7), vllm_topk(7)]
    cand_top = [vllm_topk(5), vllm_topk(8, 6), vllm_topk(1), vllm_topk(2)]  # later positions disagree completely
    assert ag.vllm_rule(ref, ref_top, cand, cand_top).passed


def test_vllm_rule_k_cuts_the_dict():
    ranked = list(range(100, 110))  # 10 alternatives, token 108 at rank 9
    ref_top = [vllm_topk(*ranked)]
    cand_top = [vllm_topk(108, 100)]
    assert not ag.vllm_rule([100], ref_top, [108], cand_top, k=8).passed
    assert ag.vllm_rule([100], ref_top, [108], cand_top, k=9).passed


def test_vllm_rule_ignores_the_sampled_token_vllm_adds_beyond_k():
    # vLLM adds the sampled token (rank 12) to the dict; with k=8 it is not part of the top-k.
    ref_top = [vllm_topk(1, 2, 3, 4, 5, 6, 7, 8, extra={50: 12})]
    cand_top = [vllm_topk(50, 1)]
    assert not ag.vllm_rule([1], ref_top, [50], cand_top, k=8).passed


def test_vllm_rule_missing_logprobs_fail_like_vllm_asserts():
    r = ag.vllm_rule([1, 2], [{1: -0.1}, None], [1, 3], [{1: -0.1}, {3: -0.1}])
    assert not r.passed and r.position == 1


def test_vllm_rule_prefix_only_mismatch_passes_as_in_vllm():
    tops = [vllm_topk(1), vllm_topk(2)]
    assert ag.vllm_rule([1, 2], tops, [1], tops[:1]).passed


def test_vllm_rule_accepts_json_shapes():
    # OpenAI completions with return_tokens_as_token_ids: "token_id:N" keys, float values; and {"logprob": x} values.
    ref_top = [{"token_id:6": -0.2, "token_id:8": -1.9}]
    cand_top = [{"8": {"logprob": -0.3, "rank": 1}, "6": {"logprob": -1.5, "rank": 2}}]
    assert ag.vllm_rule([6], ref_top, [8], cand_top).passed
    assert ag.normalize_topk(ref_top[0]) == {6: -0.2, 8: -1.9}


def test_topk_ids_orders_by_logprob_and_breaks_ties_on_the_lower_id():
    assert ag.topk_ids({3: -1.0, 1: -0.5, 2: -1.0, 9: -3.0}, 3) == [1, 2, 3]


# ---- teacher-forced ----

def test_kl_full_identical_is_exactly_zero():
    x = np.log(np.random.default_rng(0).dirichlet(np.ones(1000), size=5)).astype(np.float32)
    kl = ag.kl_full(x, x.copy())
    assert kl.shape == (5,) and np.all(kl == 0.0)


def test_kl_full_known_value_and_zero_probabilities():
    p, q = [0.5, 0.5, 0.0], [0.25, 0.75, 0.0]
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    with np.errstate(divide="ignore"):
        got = ag.kl_full(log_dist(p)[None], log_dist(q)[None])
    assert got[0] == pytest.approx(want)
    with pytest.raises(ValueError):
        ag.kl_full(np.zeros((2, 3)), np.zeros((2, 4)))


def test_kl_topk_is_zero_for_identical_and_a_lower_bound_of_the_full_kl():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.ones(50))
    top_p = {int(i): float(np.log(p[i])) for i in np.argsort(-p)[:8]}
    top_q = {int(i): float(np.log(q[i])) for i in np.argsort(-q)[:8]}
    assert ag.kl_topk(top_p, dict(top_p)) == 0.0
    full = float(ag.kl_full(np.log(p)[None], np.log(q)[None])[0])
    assert 0.0 <= ag.kl_topk(top_p, top_q) <= full + 1e-12


def test_kl_topk_known_value():
    # Shared tokens {1, 2}; remainder buckets 0.2 and 0.4.
    ref = {1: math.log(0.6), 2: math.log(0.2)}
    cand = {1: math.log(0.3), 2: math.log(0.3)}
    want = 0.6 * math.log(0.6 / 0.3) + 0.2 * math.log(0.2 / 0.3) + 0.2 * math.log(0.2 / 0.4)
    assert ag.kl_topk(ref, cand) == pytest.approx(want)


def test_teacher_forced_per_position_metrics():
    ref = [lp((1, -0.1), (2, -2.0), (3, -3.0)), lp((4, -0.2), (5, -1.0), (6, -4.0))]
    cand = [lp((1, -0.2), (2, -1.8), (7, -3.0)), lp((5, -0.3), (4, -0.9), (6, -4.0))]
    tf = ag.teacher_forced(ref, cand, k=3)
    assert tf.top1_agree == [True, False]
    assert tf.topk_overlap == [pytest.approx(2 / 3), 1.0]
    assert tf.kl_source == ag.KL_TOPK and all(x > 0 for x in tf.kl)
    same = ag.teacher_forced(ref, ref, k=3)
    assert same.kl == [0.0, 0.0] and same.top1_agree == [True, True] and same.topk_overlap == [1.0, 1.0]


def test_teacher_forced_uses_full_distributions_when_given():
    p = log_dist([0.7, 0.2, 0.1])[None]
    q = log_dist([0.6, 0.3, 0.1])[None]
    tops_p, tops_q = [lp((0, p[0, 0]), (1, p[0, 1]))], [lp((0, q[0, 0]), (1, q[0, 1]))]
    tf = ag.teacher_forced(tops_p, tops_q, 2, p, q)
    assert tf.kl_source == ag.KL_FULL
    assert tf.kl[0] == pytest.approx(0.7 * math.log(7 / 6) + 0.2 * math.log(2 / 3))
    with pytest.raises(ValueError):
        ag.teacher_forced(tops_p, tops_q * 2, 2)


# ---- bands, summary, verdict ----

@pytest.mark.parametrize("value, name", [(1.0, "fine"), (0.92, "fine"), (0.9199, "watch"), (0.85, "watch"),
                                         (0.8499, "low agreement"), (0.0, "low agreement"), (None, "n/a")])
def test_bands(value, name):
    assert ag.band(value, "top3_match").name == name
    assert ag.band(value, "same_top").name == name


def test_band_labels_name_the_metric_and_refuse_others():
    assert "top-3 token match" in ag.band(0.9, "top3_match").label
    assert "same top token" in ag.band(0.9, "same_top").label
    with pytest.raises(ValueError):
        ag.band(0.9, "mean_kld")


def _pair(ref_ids, cand_ids, agree, kl):
    tops = [{t: -0.1} for t in ref_ids]
    ctops = [{t: -0.1} for t in cand_ids]
    free = ag.free_run(ref_ids, tops, cand_ids, ctops)
    tf = ag.TeacherForced(agree, [1.0 if a else 0.5 for a in agree], kl, ag.KL_FULL, 8)
    return free, tf


def test_summary_identical_is_the_noise_floor():
    f, t = _pair([1, 2, 3, 4], [1, 2, 3, 4], [True] * 4, [0.0] * 4)
    s = ag.summarize([f, f], [t, t], "FP32", "FP32")
    assert s.identical and s.status == "identical"
    assert s.top3_match == 1.0 and s.same_top == 1.0 and s.mean_kld == 0.0 and s.p99_kld == 0.0
    assert s.vllm_passed == s.vllm_total == 2
    assert s.verdict.startswith("Identical")


def test_summary_pools_positions_and_applies_bands():
    f1, t1 = _pair([1, 2, 3, 4], [1, 2, 3, 4], [True, True, True, True], [0.01, 0.02, 0.0, 0.01])
    f2, t2 = _pair([1, 2, 3, 4], [1, 2, 9, 9], [True, True, False, True], [0.0, 0.01, 0.5, 0.02])
    s = ag.summarize([f1, f2], [t1, t2], "FP16", "FP8")
    assert s.positions == 8
    assert s.same_top == pytest.approx(7 / 8)  # 0.875: watch
    assert s.top3_match == pytest.approx((1 + 2 / 3) / 2)  # 0.833: low agreement
    assert s.exact_prefix_mean == 3.0
    assert s.top1_agreement_free == pytest.approx(6 / 8)
    assert s.mean_kld == pytest.approx(0.57 / 8)
    assert s.max_kld == 0.5
    assert s.bands["same_top"].name == "watch" and s.bands["top3_match"].name == "low agreement"
    # 8 positions cannot tell the bands apart: inconclusive, never a failure, and never the word "calibration"
    assert s.status == "inconclusive" and s.verdict.startswith("Inconclusive: about ")
    assert "more prompts would decide it. FP8 vs FP16" in s.verdict
    assert "calibration" not in s.verdict.lower()


def test_failed_vllm_rule_lifts_fine_to_watch():
    ref, cand = [1, 2, 3, 4], [1, 2, 3, 5]
    free = ag.free_run(ref, [{t: -0.1} for t in ref], cand, [{t: -0.1} for t in cand])  # 5 not in ref's top-k
    assert not free.vllm.passed
    tf = ag.TeacherForced([True] * 4, [1.0] * 4, [0.001] * 4, ag.KL_FULL, 8)
    s = ag.summarize([free], [tf])
    assert s.bands["top3_match"].name == "fine" and s.bands["same_top"].name == "fine"
    assert s.status == "inconclusive"  # 4 positions: the interval spans every band
    many = ag.TeacherForced([True] * 400, [1.0] * 400, [0.001] * 400, ag.KL_FULL, 8)
    assert ag.summarize([free], [many]).status == "watch"


def test_summary_to_dict_is_json_ready():
    import json

    f, t = _pair([1, 2], [1, 3], [True, False], [0.0, 0.3])
    d = ag.summarize([f], [t]).to_dict()
    json.dumps(d)
    assert d["bands"]["top3_match"]["label"].startswith(d["bands"]["top3_match"]["band"])
    assert d["kl_source_text"].startswith("KL over the full vocabulary")


def test_near_tie_divergences_do_not_fail_the_verdict_on_top3_alone():
    # Divergence at position 1, each token in the other's top-k (a near-tie): vLLM's rule passes.
    ref, cand = [1, 2, 3, 4], [1, 7, 8, 9]
    ref_top = [{1: -0.1}, {2: -0.6, 7: -0.8}, {3: -0.1}, {4: -0.1}]
    cand_top = [{1: -0.1}, {7: -0.6, 2: -0.8}, {8: -0.1}, {9: -0.1}]
    free = ag.free_run(ref, ref_top, cand, cand_top)
    assert free.vllm.passed and free.top3_match == pytest.approx(1 / 3)
    tf = ag.TeacherForced([True] * 1990 + [False] * 10, [1.0] * 2000, [0.01] * 2000, ag.KL_FULL, 8)  # 99.5%
    s = ag.summarize([free], [tf], "FP32", "FP8")
    assert s.bands["top3_match"].name == "low agreement" and s.bands["same_top"].name == "fine"
    assert s.status == "fine" and "near-ties" in s.verdict


def test_nan_logprobs_fail_the_verdict_and_are_counted():
    # An FP16 overflow: the candidate's log-probabilities are NaN at two positions.
    ref = [1, 2, 3, 4]
    tops = [{t: -0.1} for t in ref]
    free = ag.free_run(ref, tops, ref, tops)
    ref_full = log_dist([0.7, 0.2, 0.1])[None].repeat(4, axis=0)
    cand_full = ref_full.copy()
    cand_full[2:] = np.nan
    tf = ag.teacher_forced(tops, tops, 1, ref_full, cand_full)
    assert tf.kl[:2] == [0.0, 0.0] and all(math.isnan(x) for x in tf.kl[2:])
    s = ag.summarize([free], [tf], "FP32", "FP16")
    assert s.nonfinite_kl == 2 and s.mean_kld == 0.0 and s.max_kld == 0.0
    assert s.status == "broken" and "not finite at 2 of 4 positions" in s.verdict
    assert not s.identical


@pytest.mark.parametrize("share, n", [(10 / 12, 12), (0.9, 200), (0.0, 5), (1.0, 5), (0.97, 5000)])
def test_wilson_interval_contains_the_share_and_narrows_with_n(share, n):
    lo, hi = ag.wilson_interval(share, n)
    assert 0.0 <= lo <= share <= hi <= 1.0
    lo4, hi4 = ag.wilson_interval(share, 4 * n)
    assert hi4 - lo4 < hi - lo


def test_an_interval_that_spans_bands_is_inconclusive_never_a_failure():
    # 10 of 12 positions agree (83%, the low band), but 12 positions allow anything from about 55% to 95%.
    few = ag.TeacherForced([True] * 10 + [False] * 2, [1.0] * 12, [0.01] * 12, ag.KL_FULL, 8)
    ref = list(range(12))
    free = ag.free_run(ref, [{t: -0.1} for t in ref], ref, [{t: -0.1} for t in ref])
    s = ag.summarize([free], [few], "FP32", "FP8")
    assert s.status == "inconclusive" and s.verdict.startswith("Inconclusive: about ")
    assert "With 12 scored positions over 1 prompt, same top token lies in 55.1-95.4% (95% interval)" in s.verdict
    # 2,000 positions at 80% settle it: low agreement, said without the seed's word "calibration"
    low = ag.TeacherForced([True] * 1600 + [False] * 400, [1.0] * 2000, [0.01] * 2000, ag.KL_FULL, 8)
    s = ag.summarize([free], [low], "FP32", "FP8")
    assert s.status == "low agreement" and s.verdict.startswith("Low agreement: FP8 vs FP32")
    # 5,000 positions at 97% settle it: no caveat.
    many = ag.TeacherForced([True] * 4850 + [False] * 150, [1.0] * 5000, [0.01] * 5000, ag.KL_FULL, 8)
    s = ag.summarize([free], [many], "FP32", "FP8")
    assert s.status == "fine" and "interval" not in s.verdict


# ---- a side broken on its own ----

def _overflowed_reference(n_prompts: int = 2, n: int = 8):
    """What an FP16 Gemma 3 reference gives: NaN log-probabilities everywhere and token 0 (<pad>) at every step."""
    nan = float("nan")
    ref_ids, cand_ids = [[0] * n for _ in range(n_prompts)], [list(range(10, 10 + n)) for _ in range(n_prompts)]
    ref_top = [[{0: nan, 1: nan}] * n for _ in range(n_prompts)]
    cand_top = [[{t: -0.1, 0: -5.0} for t in ids] for ids in cand_ids]
    free = [ag.free_run(r, rt, c, ct) for r, rt, c, ct in zip(ref_ids, ref_top, cand_ids, cand_top)]
    tf = [ag.teacher_forced(rt, ct, 2) for rt, ct in zip(ref_top, cand_top)]
    health = (ag.side_health(ref_ids, ref_top + ref_top), ag.side_health(cand_ids, cand_top + cand_top))
    return free, tf, health


def test_an_overflowed_reference_is_named_and_the_candidate_not_judged():
    free, tf, health = _overflowed_reference()
    assert health[0].nonfinite_share == 1.0 and health[0].all_repeated and health[0].repeated_token == 0
    assert health[1].nonfinite == 0 and not health[1].all_repeated
    s = ag.summarize(free, tf, "FP16", "FP8 W8A8", health=health, text_of={0: "<pad>"}.get)
    assert s.status == "reference broken"
    assert s.verdict.startswith("Reference broken: the FP16 reference overflowed: its logits are not finite at "
                                "100% of positions (32 of 32); the FP8 W8A8 candidate was not judged."), s.verdict
    assert "calibration" not in s.verdict.lower()


def test_a_candidate_that_only_pads_is_named_broken():
    free, tf, (ref_h, cand_h) = _overflowed_reference()
    padding = ag.SideHealth(positions=16, nonfinite=0, outputs=2, repeated=2, repeated_token=0)
    s = ag.summarize(free, tf, "BF16", "FP16", health=(cand_h, padding), text_of={0: "<pad>"}.get)
    assert s.status == "candidate broken"
    assert "the FP16 candidate is broken: every output is padding ('<pad>' again and again)" in s.verdict
    # Both sides repeating one token is the model's habit on these prompts, not a broken side.
    f, t = _pair([1, 2, 3, 4], [1, 2, 3, 5], [True] * 4, [0.01] * 4)
    both = ag.summarize([f], [t], "BF16", "FP8", health=(padding, padding))
    assert both.status not in ag.BROKEN


def test_side_health_ignores_short_outputs_and_empty_topk():
    h = ag.side_health([[5, 5, 5], [7, 7, 7, 7]], [[{}, {1: -0.1}], [{2: float("-inf")}]])
    assert (h.outputs, h.repeated, h.repeated_token) == (1, 1, 7)
    assert (h.positions, h.nonfinite) == (2, 1)  # a saved run's null reads back as -inf: still non-finite


# ---- rounding and non-finite inputs ----

def test_topk_probabilities_summing_a_hair_over_one_are_rounding_not_infinite_kl():
    # A confident token reported as logprob 0.0 (float32) leaves the candidate no remainder, the reference 1e-7.
    kl = ag.kl_topk({1: -1e-7, 2: -17.5, 3: -18.0}, {1: 0.0, 2: -17.0, 3: -18.5})
    assert math.isfinite(kl) and kl < 1e-6
    assert ag.kl_topk({1: -0.1, 2: -3.0}, {2: -0.01, 1: float("-inf")}) == math.inf  # a real zero stays infinite


def test_nan_on_either_side_is_nan_never_agreement():
    assert math.isnan(ag.kl_topk({1: float("nan")}, {1: -0.1}))
    assert math.isnan(ag.kl_topk({1: -0.1}, {1: -0.1, 2: None}))  # a server's NaN arrives as JSON null
    ok = [math.log(0.9), math.log(0.1)]
    kl = ag.kl_full(np.array([[np.nan, np.nan], ok]), np.array([ok, [np.nan, 0.0]]))
    assert np.isnan(kl).all()
    assert ag.kl_full(np.array([ok]), np.array([ok]))[0] == 0.0


def kl_plain(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """The KL expression kl_full computes in place and in chunks, in one pass over whole float64 copies."""
    ref, cand = ref.astype(np.float64), cand.astype(np.float64)
    p = np.exp(ref)
    with np.errstate(invalid="ignore"):
        return np.maximum(np.where(p > 0, p * (ref - cand), 0.0).sum(axis=-1), 0.0)


def test_full_kl_in_chunks_and_in_place_equals_the_plain_expression_bit_for_bit():
    rng = np.random.default_rng(0)
    ref, cand = (np.log(rng.dirichlet(np.ones(500), size=3 * ag.KL_ROWS_PER_CHUNK + 5)) for _ in range(2))
    assert np.array_equal(ag.kl_full(ref, cand), kl_plain(ref, cand))
    # float32 input, as engines give it, with zero probabilities on either side
    ref32, cand32 = ref.astype(np.float32), cand.astype(np.float32)
    ref32[0, :3], cand32[1, :3], ref32[2, :3], cand32[2, :3] = -np.inf, -np.inf, -np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        assert np.array_equal(ag.kl_full(ref32, cand32), kl_plain(ref32, cand32))
    assert ag.kl_full(ref32, cand32)[1] == np.inf  # the candidate gives no mass to tokens the reference expects
