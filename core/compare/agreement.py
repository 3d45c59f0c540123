"""Token agreement between a reference run and a candidate run. Pure: token ids, top-k
logprob dicts and, where an engine can give them, full log-probability arrays (numpy). No torch.

Two kinds of evidence, kept apart because free-running greedy outputs stop being comparable at their first
disagreement:
- free-running: both sides generate greedily on their own. The seed's "top-3 token match", the exact-prefix length,
  position-wise top-1 agreement and vLLM's `check_logprobs_close` rule come from these.
- teacher-forced: the reference continuation is fed to both sides, so every position has the same context. Per
  position top-1 agreement, top-k overlap and KL(ref || cand), aggregated like llama.cpp `perplexity --kl-divergence`
  ("mean KLD", "99.0% KLD", "same top p").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from core.errors import InputError
from core.stats import wilson_interval  # its home is core/stats.py; kept importable from here

DEFAULT_K = 8  # vLLM's FP8 KV cache test compares top-8 logprobs

# The seed's thresholds. They were written for its "top-3 token match"; we also apply them to teacher-forced top-1
# agreement (same top token), the robust version of the same question. Nothing else is banded.
BAND_FINE = 0.92
BAND_FAILED = 0.85
BANDED_METRICS = {
    "top3_match": "seed's top-3 token match",
    "same_top": "teacher-forced top-1 agreement (same top token)",
}

TopK = Mapping[Any, Any]  # token id (int, "123" or "token_id:123") -> logprob (float, vLLM Logprob, or {"logprob": x})


# ---- logprob dicts in any of the shapes engines and vLLM produce ----

def _token_id(key: Any) -> int:
    if isinstance(key, str) and ":" in key:  # vLLM's return_tokens_as_token_ids: "token_id:123"
        key = key.rsplit(":", 1)[1]
    return int(key)


def _logprob(value: Any) -> float:
    if value is None:  # JSON null: how a server serializes a NaN logprob
        return math.nan
    if hasattr(value, "logprob"):  # vllm.logprobs.Logprob
        return float(value.logprob)
    if isinstance(value, Mapping):  # the JSON form of the same
        return float(value["logprob"])
    return float(value)


def normalize_topk(d: TopK | None) -> dict[int, float]:
    """{token id: logprob} from any supported shape; None or empty -> {}."""
    return {_token_id(k): _logprob(v) for k, v in (d or {}).items()}


def topk_ids(d: TopK | None, k: int) -> list[int]:
    """The k most likely ids of a position, best first. vLLM's dicts may hold the sampled token on top of the
    requested k, so the dict is cut to k here rather than trusted to be exactly k long. Ties break on the lower id,
    as argmax does."""
    items = normalize_topk(d)
    return [t for t, _ in sorted(items.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def top1(d: TopK | None) -> int | None:
    ids = topk_ids(d, 1)
    return ids[0] if ids else None


# ---- free-running metrics ----

def top3_match(ref: Sequence[int], cand: Sequence[int], n: int = 3) -> float:
    """The seed's metric: share of the first n generated ids that are equal. A side that stopped early counts as a
    mismatch at the positions it lacks; two empty outputs agree trivially (1.0)."""
    span = min(n, max(len(ref), len(cand)))
    if span == 0:
        return 1.0
    return sum(1 for i in range(span) if i < len(ref) and i < len(cand) and ref[i] == cand[i]) / span


def first_divergence(ref: Sequence[int], cand: Sequence[int]) -> int | None:
    """Index of the first position where the ids differ (or where one side has stopped); None if identical."""
    for i, (a, b) in enumerate(zip(ref, cand)):
        if a != b:
            return i
    return None if len(ref) == len(cand) else min(len(ref), len(cand))


def exact_prefix_len(ref: Sequence[int], cand: Sequence[int]) -> int:
    d = first_divergence(ref, cand)
    return len(ref) if d is None else d


def positionwise_agreement(ref: Sequence[int], cand: Sequence[int]) -> float:
    """Free-running top-1 agreement: share of positions (over the longer output) holding the same id. Past the first
    divergence the two sides see different contexts, so this understates closeness; teacher-forced is the fair one."""
    span = max(len(ref), len(cand))
    if span == 0:
        return 1.0
    return sum(1 for a, b in zip(ref, cand) if a == b) / span


@dataclass
class VllmRule:
    """vLLM `tests/models/utils.py::check_logprobs_close`: at the first position where the ids differ, each side's
    token must be in the other's top-k logprobs; the sequences then diverge, so nothing later is checked. Like vLLM,
    only the shared length is compared (one output being a prefix of the other passes)."""

    passed: bool
    k: int
    position: int | None = None  # first differing position within the shared length; None if none
    ref_token: int | None = None
    cand_token: int | None = None
    ref_in_cand_topk: bool | None = None
    cand_in_ref_topk: bool | None = None
    detail: str = ""


def vllm_rule(ref_ids: Sequence[int], ref_topk: Sequence[TopK | None], cand_ids: Sequence[int],
              cand_topk: Sequence[TopK | None], k: int = DEFAULT_K) -> VllmRule:
    if k < 1:
        raise InputError(f"k must be at least 1; got {k}.")
    for i, (a, b) in enumerate(zip(ref_ids, cand_ids)):
        if a == b:
            continue
        ref_d = ref_topk[i] if i < len(ref_topk) else None
        cand_d = cand_topk[i] if i < len(cand_topk) else None
        if not ref_d or not cand_d:  # vLLM asserts the logprobs exist
            return VllmRule(False, k, i, a, b, None, None, f"no top-k logprobs at position {i}, so the rule cannot pass")
        a_in_b, b_in_a = a in topk_ids(cand_d, k), b in topk_ids(ref_d, k)
        problems = []
        if not a_in_b:
            problems.append(f"reference token {a} is not in the candidate's top-{k}")
        if not b_in_a:
            problems.append(f"candidate token {b} is not in the reference's top-{k}")
        detail = f"first divergence at position {i}: " + ("; ".join(problems) or f"each token is in the other's top-{k}")
        return VllmRule(not problems, k, i, a, b, a_in_b, b_in_a, detail)
    n = min(len(ref_ids), len(cand_ids))
    return VllmRule(True, k, detail=f"no divergence in the {n} shared positions")


@dataclass
class FreeRun:
    top3_match: float
    exact_prefix: int
    first_divergence: int | None
    top1_agreement: float  # position-wise, free-running
    ref_len: int
    cand_len: int
    vllm: VllmRule


def free_run(ref_ids: Sequence[int], ref_topk: Sequence[TopK | None], cand_ids: Sequence[int],
             cand_topk: Sequence[TopK | None], k: int = DEFAULT_K) -> FreeRun:
    return FreeRun(top3_match(ref_ids, cand_ids), exact_prefix_len(ref_ids, cand_ids),
                   first_divergence(ref_ids, cand_ids), positionwise_agreement(ref_ids, cand_ids),
                   len(ref_ids), len(cand_ids), vllm_rule(ref_ids, ref_topk, cand_ids, cand_topk, k))


# ---- teacher-forced metrics ----

KL_FULL = "full"  # exact, over the whole vocabulary
KL_TOPK = "top-k"  # lower bound from top-k logprobs plus one remainder bucket
KL_SOURCE_TEXT = {
    KL_FULL: "KL over the full vocabulary (exact)",
    KL_TOPK: "KL lower bound from top-k logprobs with one remainder bucket (the full distributions were not available)",
}


# Rows per float64 temporary: 2 x 262,144 positions is 4 MiB, which stays in cache between the passes below; 16 rows
# (32 MiB) ran 3x slower, as every pass went out to memory.
KL_ROWS_PER_CHUNK = 2


def kl_full(ref_logprobs: np.ndarray, cand_logprobs: np.ndarray) -> np.ndarray:
    """Per-position KL(ref || cand) in nats from [positions, vocab] log-probabilities; NaN where either side has a
    NaN (an overflowed forward pass), so it is counted as non-finite rather than as agreement."""
    if np.shape(ref_logprobs) != np.shape(cand_logprobs):
        raise ValueError(f"Distributions differ in shape: {np.shape(ref_logprobs)} vs {np.shape(cand_logprobs)}.")
    rows = np.shape(ref_logprobs)[0] if np.ndim(ref_logprobs) > 1 else None
    if rows is None:
        return _kl_rows(np.asarray(ref_logprobs), np.asarray(cand_logprobs))
    out = np.empty(rows)
    for a in range(0, rows, KL_ROWS_PER_CHUNK):  # in chunks: whole-run float64 temporaries were ~10x the input
        out[a:a + KL_ROWS_PER_CHUNK] = _kl_rows(ref_logprobs[a:a + KL_ROWS_PER_CHUNK],
                                                 cand_logprobs[a:a + KL_ROWS_PER_CHUNK])
    return out


def _kl_rows(ref_logprobs: np.ndarray, cand_logprobs: np.ndarray) -> np.ndarray:
    """sum(p * (ref - cand)) with p = exp(ref), in float64. In place, in one temporary besides p: the same
    elementwise operations as the plain expression, so the same values bit for bit, at a third of the memory
    traffic."""
    ref, cand = np.asarray(ref_logprobs), np.asarray(cand_logprobs)
    p = ref.astype(np.float64)  # a copy whatever the input dtype: exp is taken in place below
    # p * (a - a) is exactly 0, so identical inputs give exactly 0. -inf logprobs (p = 0) contribute nothing.
    with np.errstate(invalid="ignore"):
        terms = np.subtract(p, cand, dtype=np.float64)
        np.exp(p, out=p)
        np.multiply(p, terms, out=terms)
    terms[~(p > 0)] = 0.0
    # Rounding can leave a tiny negative sum for near-identical rows; KL itself is never negative.
    kl = np.maximum(terms.sum(axis=-1), 0.0)
    return np.where(np.isnan(ref).any(axis=-1) | np.isnan(cand).any(axis=-1), np.nan, kl)


# Top-k probabilities can add up to a hair over 1 (a confident token reported as logprob 0.0 in float32), leaving
# one side's remainder bucket at 0 and the other's at 1e-7: that is rounding, not a candidate with no mass there.
REMAINDER_FLOOR = 1e-6


def kl_topk(ref: TopK, cand: TopK) -> float:
    """KL(ref || cand) over the tokens both sides report, plus one bucket for the rest of the vocabulary.

    Merging outcomes into buckets can only lower KL (data-processing inequality), so this is a lower bound of the
    true KL, and exactly 0 when both sides report the same numbers. NaN when either side reports a NaN logprob."""
    r, c = normalize_topk(ref), normalize_topk(cand)
    if any(math.isnan(v) for v in (*r.values(), *c.values())):
        return math.nan
    shared = sorted(set(r) & set(c))
    p = [math.exp(r[t]) for t in shared]
    q = [math.exp(c[t]) for t in shared]
    rest_p, rest_q = 1.0 - math.fsum(p), 1.0 - math.fsum(q)
    if rest_p > REMAINDER_FLOOR or rest_q > REMAINDER_FLOOR:  # else both put all their mass on shared tokens
        p.append(max(rest_p, 0.0))
        q.append(max(rest_q, REMAINDER_FLOOR))
    kl = 0.0
    for pi, qi in zip(p, q):
        if pi <= 0.0:
            continue
        if qi <= 0.0:  # a -inf logprob: the candidate gives no mass to a token the reference expects
            return math.inf
        kl += pi * (math.log(pi) - math.log(qi))
    return max(kl, 0.0)


@dataclass
class TeacherForced:
    """Per position of the reference continuation (position i predicts token i)."""

    top1_agree: list[bool]
    topk_overlap: list[float]  # |top-k(ref) & top-k(cand)| / k
    kl: list[float]  # KL(ref || cand), nats
    kl_source: str  # KL_FULL or KL_TOPK
    k: int


def teacher_forced(ref_topk: Sequence[TopK], cand_topk: Sequence[TopK], k: int = DEFAULT_K,
                   ref_full: np.ndarray | None = None, cand_full: np.ndarray | None = None) -> TeacherForced:
    """Scores of both sides on the same (reference) continuation. KL comes from the full distributions when both are
    given, else from the top-k dicts (which may also carry the continuation token's own logprob)."""
    if len(ref_topk) != len(cand_topk):
        raise ValueError(f"Both sides must score the same positions; got {len(ref_topk)} and {len(cand_topk)}.")
    agree, overlap = [], []
    for r, c in zip(ref_topk, cand_topk):
        rk, ck = topk_ids(r, k), topk_ids(c, k)
        agree.append(bool(rk) and bool(ck) and rk[0] == ck[0])
        overlap.append(len(set(rk) & set(ck)) / k)
    if ref_full is not None and cand_full is not None:
        kl, source = kl_full(ref_full, cand_full).tolist(), KL_FULL
    else:
        kl, source = [kl_topk(r, c) for r, c in zip(ref_topk, cand_topk)], KL_TOPK
    return TeacherForced(agree, overlap, kl, source, k)


# ---- aggregation, bands and the verdict ----

@dataclass
class Band:
    metric: str
    value: float | None
    name: str  # "fine", "watch", "low agreement", "n/a", "not judged" (a side is broken)
    why: str = ""  # for "not judged": the broken side

    @property
    def label(self) -> str:
        """Says which metric the seed's band is applied to, as the UI must."""
        if self.name == NOT_JUDGED:
            return f"{NOT_JUDGED}: {self.why}"
        return f"{self.name} (seed band for the {BANDED_METRICS[self.metric]}: {BAND_RULE})"


# The seed calls its lowest band "calibration failed"; dynamic-scale FP8 and the integer precisions calibrate nothing,
# so the band says what was measured: the two sides agree too little.
LOW = "low agreement"
BAND_RULE = f">= {BAND_FINE} fine, {BAND_FAILED}-{BAND_FINE} watch, < {BAND_FAILED} {LOW}"


def band(value: float | None, metric: str = "top3_match") -> Band:
    if metric not in BANDED_METRICS:
        raise InputError(f"The seed's bands apply only to {', '.join(BANDED_METRICS)}; not to {metric!r}.")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Band(metric, value, "n/a")
    name = "fine" if value >= BAND_FINE else "watch" if value >= BAND_FAILED else LOW
    return Band(metric, value, name)


_SEVERITY = {"n/a": 0, "fine": 0, "watch": 1, LOW: 2}
INCONCLUSIVE = "inconclusive"
# Statuses where one side's own output shows it is broken: the comparison then says which, and judges nothing else.
BROKEN = ("reference broken", "candidate broken", "broken")
# What every band, card, table cell, chart and diff colour says instead of a judgement when a side is broken: an
# agreement measured against a broken side means nothing, so none of them may read as a verdict on the other side.
NOT_JUDGED = "not judged"
_BROKEN_SIDE = {"reference broken": "the reference is broken", "candidate broken": "the candidate is broken",
                "broken": "a side is broken (see the verdict)"}


def not_judged(status: str) -> str | None:
    """"not judged: the reference is broken" when the status names a broken side; None when the measures judge."""
    why = _BROKEN_SIDE.get(status)
    return None if why is None else f"{NOT_JUDGED}: {why}"
STATUSES = ("n/a", "identical", "fine", "watch", INCONCLUSIVE, LOW, *BROKEN)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


# ---- is one side broken on its own? ----

# A side whose every output of at least this many tokens is one token repeated has stopped being a language model
# (an overflowed FP16 forward pass picks token 0, the pad token, at every step); shorter outputs prove nothing.
REPEAT_MIN_TOKENS = 4


@dataclass
class SideHealth:
    """What one side's own numbers say about it, whatever the other side did."""

    positions: int  # positions with log-probabilities: its own generation plus the teacher-forced continuation
    nonfinite: int  # of those, positions where a log-probability is NaN or infinite
    outputs: int  # outputs of at least REPEAT_MIN_TOKENS tokens
    repeated: int  # of those, outputs that are one token repeated
    repeated_token: int | None = None  # the token of the first repeated output

    @property
    def nonfinite_share(self) -> float:
        return self.nonfinite / self.positions if self.positions else 0.0

    @property
    def all_repeated(self) -> bool:
        return self.outputs > 0 and self.repeated == self.outputs


def _finite_topk(d: dict[int, float]) -> bool:
    return all(math.isfinite(v) for v in d.values())


def side_health(outputs: Sequence[Sequence[int]], topks: Sequence[Sequence[TopK | None]]) -> SideHealth:
    """`outputs`: the side's generated ids per prompt; `topks`: every top-k dict it reported (its own generation and
    its teacher-forced scores, one list per prompt and kind). A top-k with a NaN or infinite value is a position where
    the forward pass overflowed (a saved run's JSON null reads back as -inf, still non-finite)."""
    positions = [n for seq in topks for d in seq if (n := normalize_topk(d))]  # an empty top-k holds no evidence
    long = [list(o) for o in outputs if len(o) >= REPEAT_MIN_TOKENS]
    repeated = [o for o in long if len(set(o)) == 1]
    return SideHealth(len(positions), sum(not _finite_topk(d) for d in positions), len(long), len(repeated),
                      repeated[0][0] if repeated else None)


def _looks_like_padding(text: str) -> bool:
    return text.strip().strip("<>[]|").lower() in ("pad", "padding")


def broken_reason(health: SideHealth | None, other: SideHealth | None,
                  text_of: Callable[[int], str] = lambda t: f"[{t}]") -> str | None:
    """Why one side's output means nothing on its own terms (None when it looks sound): non-finite log-probabilities
    (overflow), or every output one token repeated while the other side's outputs are not."""
    if health is None:
        return None
    if health.nonfinite:
        return (f"overflowed: its logits are not finite at {100 * health.nonfinite_share:.0f}% of positions "
                f"({health.nonfinite} of {health.positions})")
    if health.all_repeated and not (other and other.all_repeated):
        text = text_of(health.repeated_token)
        what = "padding" if _looks_like_padding(text) else "one token repeated"
        return f"is broken: every output is {what} ({text!r} again and again)"
    return None


# ---- the summary ----

@dataclass
class Summary:
    prompts: int
    # free-running
    top3_match: float | None  # mean over prompts
    exact_prefix_mean: float | None
    top1_agreement_free: float | None  # pooled over positions
    vllm_passed: int
    vllm_total: int
    # teacher-forced, pooled over every scored position of every prompt (as llama.cpp pools over tokens)
    positions: int
    same_top: float | None  # fraction 0-1 ("same top token %" / 100)
    mean_topk_overlap: float | None
    mean_kld: float | None  # over positions with a finite KL
    p99_kld: float | None
    max_kld: float | None
    nonfinite_kl: int  # positions where KL is NaN or inf: NaN/-inf log-probabilities, i.e. numerical overflow
    kl_source: str
    identical: bool  # every id, top-k and KL identical: what the noise floor must show
    bands: dict[str, Band] = field(default_factory=dict)
    status: str = "n/a"
    verdict: str = ""
    same_top_ci95: tuple[float, float] | None = None  # Wilson 95% interval of same_top over `positions`
    reference_health: SideHealth | None = None
    candidate_health: SideHealth | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bands"] = {k: {"value": b.value, "band": b.name, "label": b.label} for k, b in self.bands.items()}
        d["kl_source_text"] = KL_SOURCE_TEXT.get(self.kl_source, self.kl_source)
        return d


def summarize(free: Sequence[FreeRun], tf: Sequence[TeacherForced], ref_label: str = "reference",
              cand_label: str = "candidate", health: tuple[SideHealth, SideHealth] | None = None,
              text_of: Callable[[int], str] = lambda t: f"[{t}]", stopped: str = "") -> Summary:
    """Pooled numbers, bands and the verdict. `health`: (reference, candidate) as side_health gives them, so a broken
    side is named; `text_of` names a repeated token in words; `stopped`: why the run ended before it decided."""
    kl = [x for t in tf for x in t.kl]
    agree = [x for t in tf for x in t.top1_agree]
    overlap = [x for t in tf for x in t.topk_overlap]
    free_positions = sum(max(f.ref_len, f.cand_len) for f in free)
    sources = {t.kl_source for t in tf}
    finite = [x for x in kl if math.isfinite(x)]
    identical = (all(f.first_divergence is None for f in free) and all(agree) and all(o == 1.0 for o in overlap)
                 and all(x == 0.0 for x in kl))
    same = _mean([float(a) for a in agree])
    s = Summary(
        prompts=len(free),
        top3_match=_mean([f.top3_match for f in free]),
        exact_prefix_mean=_mean([f.exact_prefix for f in free]),
        top1_agreement_free=(math.fsum(f.top1_agreement * max(f.ref_len, f.cand_len) for f in free) / free_positions
                             if free_positions else None),
        vllm_passed=sum(f.vllm.passed for f in free),
        vllm_total=len(free),
        positions=len(kl),
        same_top=same,
        mean_topk_overlap=_mean(overlap),
        mean_kld=_mean(finite),
        p99_kld=float(np.percentile(finite, 99)) if finite else None,
        max_kld=max(finite) if finite else None,
        nonfinite_kl=len(kl) - len(finite),
        kl_source=KL_TOPK if KL_TOPK in sources else KL_FULL,
        identical=identical,
        same_top_ci95=wilson_interval(same, len(agree)) if agree else None,
        reference_health=health[0] if health else None,
        candidate_health=health[1] if health else None,
    )
    s.bands = {"top3_match": band(s.top3_match, "top3_match"), "same_top": band(s.same_top, "same_top")}
    s.status, s.verdict = verdict(s, ref_label, cand_label, text_of, stopped)
    if s.status in BROKEN:
        s.bands = {k: Band(b.metric, b.value, NOT_JUDGED, _BROKEN_SIDE[s.status]) for k, b in s.bands.items()}
    return s


def _broken_verdict(s: Summary, ref_label: str, cand_label: str, text_of) -> tuple[str, str] | None:
    """(status, line) when a side is broken on its own: the side is named and the other is not judged against it."""
    ref_why = broken_reason(s.reference_health, s.candidate_health, text_of)
    cand_why = broken_reason(s.candidate_health, s.reference_health, text_of)
    if ref_why and cand_why:
        return "broken", (f"Both sides are broken: the {ref_label} reference {ref_why}; the {cand_label} candidate "
                          f"{cand_why}. Nothing was judged.")
    if ref_why:
        return "reference broken", (f"Reference broken: the {ref_label} reference {ref_why}; the {cand_label} "
                                    "candidate was not judged. Choose another reference precision.")
    if cand_why:
        return "candidate broken", f"Candidate broken: the {cand_label} candidate {cand_why}."
    if s.nonfinite_kl:  # a side's log-probabilities were not kept (an older run): the KL alone shows the overflow
        return "broken", (f"Broken: KL is not finite at {s.nonfinite_kl} of {s.positions} positions (NaN or -inf "
                          "log-probabilities: numerical overflow, for example FP16 activations past 65504).")
    return None


def _interval_text(s: Summary) -> str:
    # Rounded outwards: 91.97% shown as "92" would hide why the interval leaves the fine band.
    lo, hi = s.same_top_ci95
    return f"{math.floor(1000 * lo) / 10:.1f}-{math.ceil(1000 * hi) / 10:.1f}%"


def _spans_bands(s: Summary) -> bool:
    if s.same_top_ci95 is None:
        return False
    lo, hi = s.same_top_ci95
    return band(lo, "same_top").name != band(hi, "same_top").name


# ---- the sequential design: when the evidence decides ----

def decided(s: Summary) -> bool:
    """Whether the evidence so far decides: every status but "inconclusive" (a band the 95% interval lies inside, a
    broken side, identical outputs). A comparison adds prompts until this holds or its time budget is spent."""
    return s.status != INCONCLUSIVE


def more_prompts_needed(s: Summary) -> int | None:
    """About how many more prompts would bring the 95% interval of the same-top share inside one band, at today's
    share: the interval's width shrinks as 1/sqrt(n), and positions grow with prompts, so each band edge inside the
    interval needs the prompts scaled by (half-width on that side / distance of the share to the edge)^2. 0 when
    the interval lies inside one band already; None when there is no interval, or the share sits on an edge (no
    number of prompts is sure to part them)."""
    if s.same_top_ci95 is None or s.same_top is None or not s.prompts:
        return None
    lo, hi = s.same_top_ci95
    p, factor = s.same_top, None
    for edge in (BAND_FAILED, BAND_FINE):
        if not lo < edge <= hi:
            continue
        half, gap = (p - lo, p - edge) if edge <= p else (hi - p, edge - p)
        if gap <= 0:
            return None
        factor = max(factor or 0.0, (half / gap) ** 2)
    return 0 if factor is None else max(math.ceil(s.prompts * factor) - s.prompts, 1)


def verdict(s: Summary, ref_label: str = "reference", cand_label: str = "candidate",
            text_of: Callable[[int], str] = lambda t: f"[{t}]", stopped: str = "") -> tuple[str, str]:
    """(status, one line).

    A side broken on its own (non-finite logits, all padding or one token repeated) is named first, and the other
    side is not judged against it. Otherwise the status follows the teacher-forced same-top-token band: it rests on
    every scored position, where the seed's top-3 match rests on three tokens a prompt and flips on a single near-tie.
    A failed vLLM rule (a divergent pick outside the other side's top-k, more than a near-tie) lifts "fine" to "watch"
    and lets a bad top-3 band count. When the 95% interval of the same-top share spans more than one band, the
    evidence cannot tell the bands apart: the status is "inconclusive", never a failure, with how many more prompts
    would decide it (more_prompts_needed) and `stopped`, why the run ended there ("the 120 s budget ran out")."""
    if s.prompts == 0:
        return "n/a", "No prompts were compared."
    if (broken := _broken_verdict(s, ref_label, cand_label, text_of)) is not None:
        return broken
    if s.identical:
        return "identical", (f"Identical: {cand_label} matches {ref_label} token for token, same top-k, KL 0 "
                             f"over {s.positions} positions (the noise floor).")
    same, top3 = s.bands["same_top"].name, s.bands["top3_match"].name
    status = "fine" if same == "n/a" else same
    vllm_failed = s.vllm_passed < s.vllm_total
    if vllm_failed:
        status = max(status, "watch", top3 if top3 != "n/a" else "fine", key=_SEVERITY.__getitem__)
    kld = "n/a" if s.mean_kld is None else f"{s.mean_kld:.3g} nats" + (" (lower bound)" if s.kl_source == KL_TOPK else "")
    same_txt = "n/a" if s.same_top is None else f"{100 * s.same_top:.1f}%"
    top3_txt = "n/a" if s.top3_match is None else f"{s.top3_match:.2f}"
    numbers = (f"{cand_label} vs {ref_label}: same top token {same_txt} (teacher-forced), top-3 match {top3_txt}, "
               f"mean KLD {kld}, vLLM rule passed on {s.vllm_passed}/{s.vllm_total} prompts.")
    note = ""
    if not vllm_failed and _SEVERITY[top3] > _SEVERITY[status]:
        note = (f" The seed's top-3 match is in its '{top3}' band, but every early divergence passed vLLM's top-k "
                "rule: near-ties, not a broken model.")
    if _spans_bands(s):
        # A few dozen positions cannot tell 0.85 from 0.92: say so rather than let one near-tie read as a failure.
        more = more_prompts_needed(s)
        need = (f"about {more} more prompt{'s' * (more != 1)} would decide it" if more is not None else
                "the share sits on a band's edge, so no number of prompts is sure to decide it")
        why = f"{stopped}; " if stopped else ""
        return INCONCLUSIVE, (f"Inconclusive: {why}{need}. {numbers} With {s.positions} scored positions over "
                              f"{s.prompts} prompt{'s' * (s.prompts != 1)}, same top token lies in {_interval_text(s)} (95% interval), which "
                              f"spans more than one band.{note}")
    head = {"fine": "Fine", "watch": "Watch", LOW: "Low agreement"}[status]
    return status, f"{head}: {numbers}{note}"
