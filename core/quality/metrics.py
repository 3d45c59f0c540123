"""The quality table's numbers, llama.cpp's perplexity tool's set: perplexity, KL divergence of a candidate from the
reference (mean, median, p99, p99.9, max), same top token % with its Wilson 95% interval, and the RMS of the change in
the correct token's probability (delta-p).

Per-position KL is computed in torch while a candidate's full log-probs are at hand (`kl_rows`), against the reference
as kept in its cache: the full vocabulary, or the top-k log-probs plus the rest of the mass as one "tail" bucket
(which never overstates KL: merging outcomes can only lower it).
"""
from __future__ import annotations

import math

from core.stats import percentile, wilson_interval


def kl_rows(ref, cand_lp):
    """KL(ref || cand) per row, nats, >= 0. `cand_lp` [n, V] float32 log-probs; `ref` is {"full": [n, V]} or
    {"topk_ids": [n, k], "topk_lp": [n, k]} (torch tensors on cand_lp's device)."""
    import torch

    if "full" in ref:
        r = ref["full"]
        return (r.exp() * (r - cand_lp)).sum(dim=-1).clamp(min=0.0)
    ids, r = ref["topk_ids"].long(), ref["topk_lp"]
    c = cand_lp.gather(1, ids)
    head = (r.exp() * (r - c)).sum(dim=-1)
    tail_r = (1.0 - r.exp().sum(dim=-1)).clamp(min=0.0)
    tail_c = (1.0 - c.exp().sum(dim=-1)).clamp(min=1e-30)
    tail = torch.where(tail_r > 0, tail_r * (tail_r.clamp(min=1e-30).log() - tail_c.log()), torch.zeros_like(tail_r))
    return (head + tail).clamp(min=0.0)


def perplexity(target_logprobs: list[float]) -> float:
    return math.exp(-sum(target_logprobs) / len(target_logprobs))


def kld_summary(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "median": percentile(values, 0.5), "p99": percentile(values, 0.99),
            "p99_9": percentile(values, 0.999), "max": max(values)}


def same_top(ref_top: list[int], cand_top: list[int]) -> dict:
    n = len(ref_top)
    share = sum(1 for a, b in zip(ref_top, cand_top) if a == b) / n
    lo, hi = wilson_interval(share, n)
    return {"share": share, "ci95": [lo, hi], "positions": n}


def rms_delta_p(ref_target_lp: list[float], cand_target_lp: list[float]) -> float:
    """Root mean square of p_cand(correct token) - p_ref(correct token), as llama.cpp's "RMS delta-p"."""
    d = [math.exp(c) - math.exp(r) for r, c in zip(ref_target_lp, cand_target_lp)]
    return math.sqrt(sum(x * x for x in d) / len(d))
