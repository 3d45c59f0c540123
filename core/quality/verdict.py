"""A quality verdict per precision: fine, degraded or broken, from its mean KLD against the reference and its
perplexity ratio, read against the reference's own noise floor. Pure: rows of a quality run in, words out.

The thresholds, in nats of mean KL(reference || candidate) and in candidate / reference perplexity:
- broken: mean KLD >= 0.5, or perplexity ratio >= 1.5, or numbers that are not finite (an overflow);
- degraded: mean KLD >= 0.05, or perplexity ratio >= 1.05 beyond the reference's noise floor;
- fine: below both.
Anchors: llama.cpp on Llama-3-8B against FP16 has Q8_0 at 0.00136 nats and Q4_K_M at 0.031, so "fine" holds 8-bit
formats and well-made 4-bit ones; on the embedded Gemma 3 270M (docs/perf-log/quality.md) BF16, FP8, INT8 and INT8
weight-only read fine, INT4 AWQ (0.195 nats, perplexity x1.22) degraded and plain INT4 (0.55 nats, x1.88) broken.

The noise floor: the reference's perplexity is itself a mean over the document's positions, known only to within
its 95% interval (1.96 standard errors of the mean log-loss). A perplexity ratio inside that interval is no evidence
of a change, so the ratio threshold for "degraded" is the larger of 1.05 and the floor. KLD needs no such floor: the
reference against itself is exactly 0 on the in-process engines (the compare page's noise floor checks that).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KLD_DEGRADED = 0.05
KLD_BROKEN = 0.5
PPL_RATIO_DEGRADED = 1.05
PPL_RATIO_BROKEN = 1.5
Z95 = 1.96

THRESHOLDS_TEXT = (f"broken: mean KLD >= {KLD_BROKEN} nats or perplexity >= {PPL_RATIO_BROKEN}x the reference's "
                   f"(or not finite); degraded: mean KLD >= {KLD_DEGRADED} nats or perplexity >= "
                   f"{PPL_RATIO_DEGRADED}x, beyond the reference's own noise floor (the 95% interval of its "
                   "perplexity over this document); fine: below both")


def log_loss_noise(target_logprobs: list[float]) -> float | None:
    """The 95% half-width of the mean log-loss (ln perplexity) over these positions: the reference's noise floor,
    as a factor exp(floor) on perplexity. None with fewer than two positions."""
    n = len(target_logprobs)
    if n < 2:
        return None
    mean = math.fsum(target_logprobs) / n
    var = math.fsum((x - mean) ** 2 for x in target_logprobs) / (n - 1)
    return Z95 * math.sqrt(var / n)


@dataclass(frozen=True)
class Verdict:
    name: str  # "fine", "degraded", "broken", or "n/a" for the reference
    reason: str


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def verdict(row: dict, reference: dict) -> Verdict:
    """The verdict of one candidate row of a quality run against its reference row."""
    if row.get("role") == "reference":
        return Verdict("n/a", "the reference")
    kld = (row.get("kld") or {}).get("mean")
    ppl, ref_ppl = row.get("perplexity"), reference.get("perplexity")
    if not (_finite(kld) and _finite(ppl) and _finite(ref_ppl) and ref_ppl > 0):
        return Verdict("broken", "its numbers are not finite (the forward pass overflowed)")
    ratio = ppl / ref_ppl
    floor = reference.get("log_loss_noise")
    floor_ratio = math.exp(floor) if _finite(floor) else 1.0
    ratio_limit = max(PPL_RATIO_DEGRADED, floor_ratio)
    numbers = f"mean KLD {kld:.3g} nats, perplexity x{ratio:.3f}"
    for name, kld_limit, limit in (("broken", KLD_BROKEN, PPL_RATIO_BROKEN), ("degraded", KLD_DEGRADED, ratio_limit)):
        crossed = ([f"KLD >= {kld_limit} nats"] if kld >= kld_limit else []) + \
                  ([f"perplexity >= x{limit:.3f}"] if ratio >= limit else [])
        if crossed:
            return Verdict(name, f"{numbers}: {' and '.join(crossed)}")
    floor_note = ", the reference's noise floor" if floor_ratio > PPL_RATIO_DEGRADED else ""
    return Verdict("fine", f"{numbers}: under {KLD_DEGRADED} nats and x{ratio_limit:.3f}{floor_note}")


def verdicts(result: dict) -> dict[str, Verdict]:
    """Candidate name -> its verdict, for every candidate row of a result (none without a reference row)."""
    rows = result.get("rows") or []
    ref = next((r for r in rows if r.get("role") == "reference"), None)
    if ref is None:
        return {}
    return {r["name"]: verdict(r, ref) for r in rows if r.get("role") != "reference"}
