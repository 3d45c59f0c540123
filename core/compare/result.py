"""A comparison's data: its two sides, the per-prompt results and the summary, their JSON form, and their History run.

Pure data and serialization (no engine, no torch), so the pages, the CLI and the History page rebuild and render a
saved comparison without loading a model.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from core.compare import agreement as ag
from core.engines.base import precision_short, short_label, short_ran
from core.precision import KVDtype, Precision


@dataclass(frozen=True)
class Side:
    """One side of a comparison. For a remote server the precision and KV dtype are what the user says it runs
    (a server's launch flags decide them); the KV dtype is checked against its /metrics where possible."""

    precision: Precision = Precision.FP32
    kv_dtype: KVDtype = KVDtype.AUTO
    model: str = "embedded"  # torch/vllm: embedded, a synthetic name or a path; remote: served model name or ""
    engine: str = "torch"
    url: str = ""
    api_key: str | None = field(default=None, repr=False, compare=False)
    ran: str = field(default="", compare=False)  # what really executed (the engine's `ran`), filled in once loaded
    ran_short: str = field(default="", compare=False)  # the same in a few words (the engine's `ran_short`)

    @property
    def label(self) -> str:
        """In full, with every kernel: for details ("What ran"), the CLI and JSON."""
        kv = ", FP8 KV cache" if self.kv_dtype is KVDtype.FP8 else ""
        where = self.ran or {"torch": "torch", "vllm": "local vLLM"}.get(self.engine, f"server {self.url}")
        return f"{self.precision.label}{kv} ({where})"

    @property
    def where_short(self) -> str:
        """Engine path and device in a few words ("torch eager · CPU"); derived from `ran` for runs saved before
        ran_short existed."""
        return (self.ran_short or short_ran(self.ran)
                or {"torch": "torch", "vllm": "local vLLM"}.get(self.engine, short_ran(f"server at {self.url}")))

    @property
    def precision_short(self) -> str:
        return precision_short(self.precision, self.kv_dtype)

    @property
    def short_label(self) -> str:
        """Headline-sized: "FP8 W8A8 · torch eager · CPU"."""
        return short_label(self.precision_short, self.where_short)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "model": self.model, "precision": self.precision.value,
                "kv_dtype": self.kv_dtype.value, "url": self.url or None, "ran": self.ran or None,
                "ran_short": self.where_short, "label": self.label, "short_label": self.short_label}

    @classmethod
    def from_dict(cls, d: dict) -> "Side":
        return cls(Precision(d["precision"]), KVDtype(d.get("kv_dtype") or "auto"), d.get("model") or "",
                   d.get("engine", "torch"), d.get("url") or "", ran=d.get("ran") or "",
                   ran_short=d.get("ran_short") or "")


STOPS = {"decided": "stopped once the verdict was decided", "budget": "stopped at the time budget",
         "prompts": "every prompt given was scored"}


def stop_text(stop: str, budget_s: float | None, scored: int, given: int | None) -> str:
    """Why a run ended before it decided, for its verdict: "the 120 s budget ran out after 18 of 48 prompts"."""
    of = f" of {given}" if given else ""
    if stop == "budget" and budget_s is not None:
        return f"the {budget_s:,.0f} s budget ran out after {scored}{of} prompts"
    if stop == "prompts":
        return f"all {scored} prompts given were scored" if scored != 1 else "the one prompt given was scored"
    return ""


def side_names(reference: Side, candidate: Side) -> tuple[str, str]:
    """How a verdict and a title name the two sides: the precisions alone when both ran the same way (what ran is
    one click away), else each with its engine and device."""
    if reference.where_short == candidate.where_short:
        return reference.precision_short, candidate.precision_short
    return reference.short_label, candidate.short_label


# ---- results ----

def summarize_prompts(prompts: list["PromptResult"], reference: Side, candidate: Side,
                      token_text: dict[int, str], stopped: str = "") -> ag.Summary:
    """The summary of per-prompt results, each side's own health included: the same whether the run just finished or
    was reopened from History. `stopped`: why the run ended before it decided (said in an inconclusive verdict)."""
    health = (ag.side_health([p.ref_ids for p in prompts], [x for p in prompts for x in (p.ref_decode_topk,
                                                                                         p.ref_tf_topk)]),
              ag.side_health([p.cand_ids for p in prompts], [x for p in prompts for x in (p.cand_decode_topk,
                                                                                          p.cand_tf_topk)]))
    return ag.summarize([p.free for p in prompts], [p.tf for p in prompts], *side_names(reference, candidate),
                        health=health, text_of=lambda t: token_text.get(t, f"[{t}]"), stopped=stopped)


def _json_safe(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _pairs(d: dict) -> list[list]:
    """A top-k dict as [[id, logprob], ...] best first: JSON-safe and ordered."""
    return [[t, d[t]] for t in ag.topk_ids(d, len(d))]


@dataclass
class PromptResult:
    name: str
    prompt: str
    prompt_ids: list[int]
    ref_ids: list[int]
    cand_ids: list[int]
    ref_text: str
    cand_text: str
    ref_decode_topk: list[dict[int, float]]  # each side's own top-k while generating
    cand_decode_topk: list[dict[int, float]]
    ref_tf_topk: list[dict[int, float]]  # both sides scoring the reference continuation
    cand_tf_topk: list[dict[int, float]]
    free: ag.FreeRun
    tf: ag.TeacherForced

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "prompt", "prompt_ids", "ref_ids", "cand_ids", "ref_text",
                                           "cand_text")}
        for k in ("ref_decode_topk", "cand_decode_topk", "ref_tf_topk", "cand_tf_topk"):
            d[k] = [_pairs(x) for x in getattr(self, k)]
        d["free"] = asdict(self.free)
        d["teacher_forced"] = asdict(self.tf)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PromptResult":
        # JSON null in a top-k list stood for a non-finite logprob; -inf keeps it ranked last.
        topk = {k: [{int(t): (-math.inf if lp is None else lp) for t, lp in pairs} for pairs in d[k]]
                for k in ("ref_decode_topk", "cand_decode_topk", "ref_tf_topk", "cand_tf_topk")}
        free = dict(d["free"])
        free["vllm"] = ag.VllmRule(**free["vllm"])
        tf = dict(d["teacher_forced"])
        tf["kl"] = [math.nan if x is None else x for x in tf["kl"]]  # JSON null stands for NaN/inf (overflow)
        return cls(d["name"], d["prompt"], d["prompt_ids"], d["ref_ids"], d["cand_ids"], d["ref_text"],
                   d["cand_text"], **topk, free=ag.FreeRun(**free), tf=ag.TeacherForced(**tf))


@dataclass
class CompareResult:
    reference: Side
    candidate: Side
    max_new_tokens: int
    top_k: int
    prompts: list[PromptResult]
    summary: ag.Summary
    token_text: dict[int, str]  # id -> text of every id shown (tokens and top-k alternatives)
    timings: dict[str, float]
    noise_floor: bool  # the two sides are the same setup
    # Why the run ended where it did: "decided", "budget" (the time budget was spent first) or "prompts" (every prompt
    # given was scored first); "" for a run saved before the sequential design.
    stop: str = ""
    budget_s: float | None = None
    prompts_given: int | None = None  # prompts the run could draw on; `prompts` holds those it scored

    @property
    def scored_text(self) -> str:
        """"18 of 48 prompts scored, stopped at the time budget"; "" for a run saved before the sequential design."""
        if self.stop not in STOPS:
            return ""
        return f"{len(self.prompts)} of {self.prompts_given or len(self.prompts)} prompts scored, {STOPS[self.stop]}"

    def text_of(self, tok: int | None) -> str:
        return "" if tok is None else self.token_text.get(tok, f"[{tok}]")

    def to_dict(self) -> dict:
        """Strict JSON: NaN and inf (an overflowing candidate) become null, as JSON has no such numbers."""
        return _json_safe({
            "reference": self.reference.to_dict(), "candidate": self.candidate.to_dict(),
            "max_new_tokens": self.max_new_tokens, "top_k": self.top_k, "noise_floor": self.noise_floor,
            "summary": self.summary.to_dict(), "timings_s": self.timings, "stop": self.stop,
            "budget_s": self.budget_s, "prompts_given": self.prompts_given,
            "prompts": [p.to_dict() for p in self.prompts],
            "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
        })

    @classmethod
    def from_dict(cls, d: dict) -> "CompareResult":
        """Rebuild a result from to_dict()'s JSON (a saved history run). The numbers and the verdict are recomputed
        from the per-prompt metrics (JSON nulls back to NaN where KL overflowed), naming the sides as side_names()
        does: a run saved by an older version named them with every kernel, twice in one line."""
        ref, cand = Side.from_dict(d["reference"]), Side.from_dict(d["candidate"])
        prompts = [PromptResult.from_dict(p) for p in d["prompts"]]
        token_text = {int(k): v for k, v in d.get("token_text", {}).items()}
        stop, budget, given = d.get("stop") or "", d.get("budget_s"), d.get("prompts_given")
        summary = summarize_prompts(prompts, ref, cand, token_text, stop_text(stop, budget, len(prompts), given))
        timings = {k: v for k, v in d.get("timings_s", {}).items() if v is not None}
        return cls(ref, cand, d.get("max_new_tokens", max((len(p.ref_ids) for p in prompts), default=0)),
                   d.get("top_k", ag.DEFAULT_K), prompts, summary, token_text, timings,
                   bool(d.get("noise_floor", ref == cand)), stop, budget, given)

    def rows(self) -> list[dict]:
        """One row per position (over the longer output) for CSV: the reference continuation and what the candidate
        predicted on it (teacher-forced), beside the candidate's own free-running token."""
        out = []
        for p in self.prompts:
            for i in range(max(len(p.ref_ids), len(p.cand_ids))):
                ref = p.ref_ids[i] if i < len(p.ref_ids) else None
                cand = p.cand_ids[i] if i < len(p.cand_ids) else None
                tf = i < len(p.tf.kl)
                cand_top1 = ag.top1(p.cand_tf_topk[i]) if tf else None
                out.append({
                    "prompt": p.name, "position": i,
                    "ref_token_id": ref, "ref_token": self.text_of(ref),
                    "cand_free_token_id": cand, "cand_free_token": self.text_of(cand),
                    "free_same": ref is not None and ref == cand,
                    "after_first_divergence": p.free.first_divergence is not None and i >= p.free.first_divergence,
                    "cand_tf_top1_id": cand_top1, "cand_tf_top1": self.text_of(cand_top1),
                    "tf_top1_agree": p.tf.top1_agree[i] if tf else None,
                    "tf_topk_overlap": p.tf.topk_overlap[i] if tf else None,
                    "tf_kl_nats": p.tf.kl[i] if tf else None,
                })
        return out


# ---- history ----

def history_title(result: CompareResult) -> str:
    """Short enough to read whole in History's table: "Compare FP32 vs FP8 W8A8 · torch eager · CPU · 4 prompts"."""
    return _title(result.reference, result.candidate, len(result.prompts))


def _title(ref: Side, cand: Side, n: int) -> str:
    names = " vs ".join(side_names(ref, cand))
    where = f" · {ref.where_short}" if ref.where_short == cand.where_short and ref.where_short else ""
    return f"Compare {names}{where} · {n} prompt{'s' * (n != 1)}"


def title_from_summary(summary: dict | None) -> str | None:
    """The short title of a compare run saved by an older version (its title named every kernel), from its
    summary alone (History's list has no payloads); None when the summary lacks what it takes."""
    s = summary or {}
    try:
        sides = []
        for role in ("reference", "candidate"):
            prec, kv = Precision(s[f"{role}_precision"]), KVDtype(s.get(f"{role}_kv_dtype") or "auto")
            head = prec.label + (", FP8 KV cache" if kv is KVDtype.FP8 else "") + " ("
            label = s[role]
            ran = label[len(head):-1] if label.startswith(head) and label.endswith(")") else ""
            sides.append(Side(prec, kv, ran=ran, engine="torch" if ran else "remote"))
        n = int(s["prompts"])
    except (KeyError, ValueError, TypeError):
        return None
    return _title(sides[0], sides[1], n)


def history_summary(result: CompareResult, noise: CompareResult | None = None) -> dict:
    """The headline numbers, one level deep, so the History page can put two comparisons side by side field by
    field. Percentages are 0-100 and KL is in nats, as the page shows them."""
    s = result.summary
    ref, cand = result.reference, result.candidate
    out = {
        "reference": ref.label, "candidate": cand.label, "reference_short": ref.short_label,
        "candidate_short": cand.short_label, "model": cand.model or ref.model or None,
        "reference_precision": ref.precision.value, "reference_kv_dtype": ref.kv_dtype.value,
        "candidate_precision": cand.precision.value, "candidate_kv_dtype": cand.kv_dtype.value,
        "prompts": s.prompts, "positions": s.positions, "max_new_tokens": result.max_new_tokens, "top_k": result.top_k,
        "mean_kld_nats": s.mean_kld, "p99_kld_nats": s.p99_kld, "max_kld_nats": s.max_kld,
        "same_top_pct": None if s.same_top is None else 100.0 * s.same_top,
        "top3_match": s.top3_match, "mean_topk_overlap": s.mean_topk_overlap,
        "exact_prefix_mean_tokens": s.exact_prefix_mean, "top1_agreement_free": s.top1_agreement_free,
        "vllm_rule_passed": s.vllm_passed, "vllm_rule_total": s.vllm_total,
        "nonfinite_kl_positions": s.nonfinite_kl, "kl_source": s.kl_source,
        "verdict_band": s.status, "top3_match_band": s.bands["top3_match"].name,
        "same_top_band": s.bands["same_top"].name, "verdict": s.verdict,
        "total_s": result.timings.get("total"), "load_s": result.timings.get("load"),
    }
    if noise is not None:
        out["noise_floor_identical"] = noise.summary.identical
    return _json_safe(out)


def history_payload(result: CompareResult, noise: CompareResult | None = None) -> dict:
    """Everything CompareResult.from_dict needs to rebuild the run; the noise floor adds only its summary (its
    per-prompt data would double the size and says nothing new when it is clean)."""
    payload = result.to_dict()
    if noise is not None:
        payload["noise_floor_run"] = {"summary": noise.summary.to_dict(), "timings_s": _json_safe(noise.timings)}
    return payload


def run_seconds(result: CompareResult, noise: CompareResult | None = None) -> float:
    """Wall seconds the comparison took, loads included (the noise floor's too): its start for a caller that did not
    note one."""
    return sum((r.timings.get("total") or 0.0) + (r.timings.get("load") or 0.0) for r in (result, noise) if r)


def save_to_history(result: CompareResult, noise: CompareResult | None = None,
                    started_at: float | None = None) -> int | None:
    """Save one comparison as a "compare" run; the run id, or None when the history could not be written (the
    caller still has its result, and core.store logs why). started_at (unix seconds, before the engines loaded)
    gives the run its start and duration; without it they are worked out from the run's own timings."""
    import time

    from core import store

    start = time.time() - run_seconds(result, noise) if started_at is None else started_at
    return store.record("compare", history_title(result), history_payload(result, noise),
                        history_summary(result, noise), started_at=start)


def save_stopped(reference: Side, candidate: Side, prompts: int, started_at: float, stopped_at: float,
                 partial: CompareResult | None = None) -> int | None:
    """A comparison stopped before its end, saved as cancelled with what it had: its sides and prompt count, and
    `partial`, the batches of prompts it scored before the stop (History reopens their numbers). The run id, or
    None."""
    from core import store

    scored = len(partial.prompts) if partial is not None else 0
    summary = {"reference": reference.label, "candidate": candidate.label, "prompts": prompts,
               "reference_precision": reference.precision.value, "reference_kv_dtype": reference.kv_dtype.value,
               "candidate_precision": candidate.precision.value, "candidate_kv_dtype": candidate.kv_dtype.value}
    if scored:
        summary = {**history_summary(partial), **summary, "prompts": scored, "prompts_given": prompts}
        error = (f"Stopped after {scored} of {prompts} prompts were scored: the numbers are over those {scored}.")
    else:
        error = "Stopped before the first batch of prompts was scored: there are no numbers to keep."
    return store.record("compare", _title(reference, candidate, scored or prompts),
                        history_payload(partial) if scored else None, summary, started_at=started_at,
                        status="cancelled", error=error, finished_at=stopped_at)


def last_run_hint(kind: str = "compare") -> str | None:
    """How long the last finished run of `kind` took on this machine, from History: a hint measured here, where a
    constant would be an idle machine's figure. None when there is none (or the history cannot be read)."""
    from core import store
    from core.errors import TriageError

    try:
        runs = store.list_runs(kind, limit=1, status="finished")
    except (TriageError, OSError):
        return None
    if not runs or runs[0].duration_s is None:
        return None
    return f"the last one on this machine ({runs[0].title}) took {runs[0].duration_s:,.0f} s, loads included"
