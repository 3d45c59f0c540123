"""Precision compare: a reference and a candidate run on the same prompts, and the agreement between them.

Flow per prompt (DOMAIN.md section 3):
1. the reference greedy-generates N tokens with top-k logprobs; the candidate does the same (free-running metrics);
2. both sides score the reference continuation teacher-forced: one forward pass per prompt and side, prompts of
   similar length batched together, logits computed only for the continuation (the vocabulary projection dominates
   a small model's cost, so prompt positions are skipped);
3. core.agreement turns ids, top-k dicts and (torch) full distributions into metrics, bands and a verdict.

Sides are torch in-process (each precision loaded once; the same engine object is reused when both sides are the
same setup, which is the noise floor), a local vLLM server, or a remote OpenAI-compatible server. torch is imported
lazily, inside the torch-only helpers, so pages can import this module.
"""
from __future__ import annotations

import inspect
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from core import agreement as ag
from core.engines.base import Cancelled, EngineError, Generation, GenerationParams, Score, UnsupportedCombination
from core.errors import InputError
from core.precision import KVDtype, Precision
from core.prompts import Prompt, unique_names

ENGINES = ("torch", "vllm", "remote")
MAX_TOP_K = 20  # GenerationParams.top_logprobs and vLLM's default --max-logprobs
# Batching limits for the torch engine: padded tokens per forward pass, continuation positions whose full
# distributions are held at once (1 MiB each at Gemma's 262k vocabulary), and how much padding a batch may waste.
BATCH_TOKENS = 4096
BATCH_POSITIONS = 512
BATCH_PAD_RATIO = 1.3

ProgressFn = Callable[[float, str], None]


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

    @property
    def label(self) -> str:
        kv = ", FP8 KV cache" if self.kv_dtype is KVDtype.FP8 else ""
        where = {"torch": "torch", "vllm": "local vLLM"}.get(self.engine, f"server {self.url}")
        return f"{self.precision.label}{kv} ({where})"

    def to_dict(self) -> dict:
        return {"engine": self.engine, "model": self.model, "precision": self.precision.value,
                "kv_dtype": self.kv_dtype.value, "url": self.url or None, "label": self.label}

    @classmethod
    def from_dict(cls, d: dict) -> "Side":
        return cls(Precision(d["precision"]), KVDtype(d["kv_dtype"]), d.get("model") or "", d.get("engine", "torch"),
                   d.get("url") or "")


def load_engine(side: Side, progress: ProgressFn | None = None):
    """A ready engine for `side`. Raises UnsupportedCombination/EngineError with a message for the user."""
    if side.engine == "torch":
        from core.engines.factory import build_engine  # the CUDA-graph engine where it runs, else TorchEngine
        from core.models import parse_model

        return build_engine(parse_model(side.model), side.precision, side.kv_dtype, progress=progress)
    if side.engine == "vllm":
        from pathlib import Path

        from core.engines.vllm_engine import VllmEngine

        model_dir = None if side.model in ("", "embedded") else str(Path(side.model).expanduser())
        return VllmEngine(model_dir, side.precision, side.kv_dtype).load(progress)
    if side.engine == "remote":
        from core.engines.remote import RemoteEngine

        eng = RemoteEngine(side.url, model=side.model or None, api_key=side.api_key, timeout_s=120.0)
        eng.connect()
        reasons = eng.unsupported_reasons(side.precision, side.kv_dtype)
        if reasons:
            raise UnsupportedCombination(reasons)
        return eng
    raise InputError(f"Unknown engine {side.engine!r}; choose one of: {', '.join(ENGINES)}.")


# ---- results ----

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

    def text_of(self, tok: int | None) -> str:
        return "" if tok is None else self.token_text.get(tok, f"[{tok}]")

    def to_dict(self) -> dict:
        """Strict JSON: NaN and inf (an overflowing candidate) become null, as JSON has no such numbers."""
        return _json_safe({
            "reference": self.reference.to_dict(), "candidate": self.candidate.to_dict(),
            "max_new_tokens": self.max_new_tokens, "top_k": self.top_k, "noise_floor": self.noise_floor,
            "summary": self.summary.to_dict(), "timings_s": self.timings,
            "prompts": [p.to_dict() for p in self.prompts],
            "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
        })

    @classmethod
    def from_dict(cls, d: dict) -> "CompareResult":
        """Rebuild a result from to_dict()'s JSON (a saved history run). The numbers are recomputed from the
        per-prompt metrics (JSON nulls back to NaN where KL overflowed); the verdict line is the one saved, worded
        as the run showed it."""
        ref, cand = Side.from_dict(d["reference"]), Side.from_dict(d["candidate"])
        prompts = [PromptResult.from_dict(p) for p in d["prompts"]]
        summary = ag.summarize([p.free for p in prompts], [p.tf for p in prompts], ref.label, cand.label)
        summary.verdict = (d.get("summary") or {}).get("verdict") or summary.verdict
        timings = {k: v for k, v in d.get("timings_s", {}).items() if v is not None}
        return cls(ref, cand, d["max_new_tokens"], d["top_k"], prompts, summary,
                   {int(k): v for k, v in d.get("token_text", {}).items()}, timings,
                   bool(d.get("noise_floor", ref == cand)))

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


# ---- batching (torch) ----

def length_groups(lengths: Sequence[int], cont_lengths: Sequence[int] | None = None) -> list[list[int]]:
    """Indices grouped so that each group is one forward pass: similar lengths (little padding), bounded size."""
    cont_lengths = cont_lengths or [0] * len(lengths)
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        cand = cur + [i]
        width = max(lengths[j] for j in cand)
        real = sum(lengths[j] for j in cand)
        fits = (width * len(cand) <= max(BATCH_TOKENS, width) and width * len(cand) <= BATCH_PAD_RATIO * real
                and sum(cont_lengths[j] for j in cand) <= max(BATCH_POSITIONS, cont_lengths[i]))
        if cur and not fits:
            groups.append(cur)
            cand = [i]
        cur = cand
    if cur:
        groups.append(cur)
    return groups


def _is_torch(engine) -> bool:
    return getattr(engine, "name", "") == "torch" and hasattr(engine, "model")


def _torch_score_batch(engine, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
    """Teacher-forced scores of several (prompt, continuation) pairs in one forward pass of a TorchEngine.

    Same numerics as TorchEngine.score (a fresh cache of the engine's KV dtype, so an FP8 KV cache is applied to
    what attention reads), but left-padded and batched, and with logits only for the continuation positions."""
    import torch

    from core.engines.torch_engine import make_cache

    dev = engine.device.kind
    pad = engine.tokenizer.pad_token_id or 0
    seqs = [list(p) + list(c) for p, c in items]
    width = max(len(s) for s in seqs)
    keep = max(len(c) for _, c in items) + 1  # the last column predicts past the sequence; kept for simple slicing
    with torch.inference_mode(), engine.lock:
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=dev)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=dev)
        out = engine.model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=make_cache(engine.config, engine.kv_dtype), cache_position=torch.arange(width, device=dev),
            use_cache=True, logits_to_keep=keep,
        )
        scores = []
        for b, (_, cont) in enumerate(items):
            n = len(cont)
            lp = torch.log_softmax(out.logits[b, keep - 1 - n: keep - 1].float(), dim=-1)
            tv, ti = lp.topk(top_k, dim=-1)
            target = lp.gather(1, torch.tensor(cont, device=lp.device)[:, None])[:, 0]
            scores.append(Score(list(cont), target.tolist(), [dict(zip(i, v)) for i, v in zip(ti.tolist(), tv.tolist())],
                                lp.cpu().numpy()))
        return scores


def score_many(engine, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
    """Teacher-forced scores for every (prompt ids, continuation ids) pair: batched forward passes on torch, parallel
    prompt_logprobs requests on a server (which batches them itself)."""
    if _is_torch(engine):
        return _torch_score_batch(engine, items, top_k)
    if "full" in inspect.signature(engine.score).parameters:  # an in-process engine (the fast CUDA one): exact KL
        return [engine.score(p, c, top_k, full=True) for p, c in items]
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        return list(pool.map(lambda it: engine.score(it[0], it[1], top_k), items))


def _generate(engine, texts: list[str], params: GenerationParams, should_stop) -> list[Generation]:
    if not _is_torch(engine):
        return engine.generate(texts, params, should_stop=should_stop)
    # Left padding makes every row as long as the longest prompt: group by length so one long prompt does not
    # multiply the prefill of the short ones.
    gens: list[Generation | None] = [None] * len(texts)
    for group in length_groups([len(engine.encode(t)) for t in texts]):
        for i, g in zip(group, engine.generate([texts[i] for i in group], params, should_stop=should_stop)):
            gens[i] = g
    return gens  # type: ignore[return-value]


def _with_target(score: Score) -> list[dict[int, float]]:
    return [{**ag.normalize_topk(d), tok: lp} if not math.isnan(lp) else ag.normalize_topk(d)
            for d, tok, lp in zip(score.top_logprobs, score.continuation_ids, score.target_logprobs)]


def _token_texts(engines, ids: set[int]) -> dict[int, str]:
    for eng in engines:
        fn = getattr(eng, "token_texts", None)
        if fn is not None:
            order = sorted(ids)
            return dict(zip(order, fn(order)))
    return {}  # servers give no per-token text here; ids are shown as [id]


# ---- the run ----

def compare(ref_engine, cand_engine, prompts: Sequence[Prompt | str], *, max_new_tokens: int = 32,
            top_k: int = ag.DEFAULT_K, reference: Side | None = None, candidate: Side | None = None,
            progress: ProgressFn | None = None, should_stop: Callable[[], bool] | None = None) -> CompareResult:
    """Generate with both sides, score the reference continuation on both, and measure agreement.

    Pass the same engine object twice for the noise floor: it still generates and scores twice, so a
    non-deterministic engine shows up as less than 1.0."""
    if not 1 <= top_k <= MAX_TOP_K:
        raise InputError(f"top-k must be between 1 and {MAX_TOP_K}; got {top_k}.")
    prompts = unique_names([p if isinstance(p, Prompt) else Prompt(f"prompt-{i + 1}", p)
                            for i, p in enumerate(prompts)])
    if not prompts:
        raise InputError("Give at least one prompt.")
    reference, candidate = reference or Side(), candidate or Side()
    progress = progress or (lambda f, m: None)
    stop = should_stop or (lambda: False)
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, top_logprobs=top_k).validated()
    texts = [p.text for p in prompts]
    t: dict[str, float] = {}

    def timed(key: str, fn):
        if stop():
            raise Cancelled("Comparison cancelled.")
        t0 = time.perf_counter()
        value = fn()
        t[key] = time.perf_counter() - t0
        return value

    t_start = time.perf_counter()
    progress(0.0, f"Reference ({reference.label}) generating {max_new_tokens} tokens for {len(prompts)} prompts")
    ref_gens = timed("reference_generate", lambda: _generate(ref_engine, texts, params, stop))
    progress(0.35, f"Candidate ({candidate.label}) generating")
    cand_gens = timed("candidate_generate", lambda: _generate(cand_engine, texts, params, stop))

    # Teacher-forced: both sides score the reference continuation. Prompts whose reference output is empty
    # (immediate EOS) have nothing to score.
    scorable = [i for i, g in enumerate(ref_gens) if g.token_ids and g.prompt_ids]
    tf_topk: dict[int, tuple[list[dict], list[dict]]] = {}
    tfs: dict[int, ag.TeacherForced] = {}
    t["reference_score"] = t["candidate_score"] = t["metrics"] = 0.0
    groups = (length_groups([len(ref_gens[i].prompt_ids) + len(ref_gens[i].token_ids) for i in scorable],
                            [len(ref_gens[i].token_ids) for i in scorable]) if scorable else [])
    for n, group in enumerate(groups):
        idx = [scorable[j] for j in group]
        items = [(ref_gens[i].prompt_ids, ref_gens[i].token_ids) for i in idx]
        progress(0.7 + 0.25 * n / len(groups), f"Scoring the reference continuation teacher-forced "
                                               f"(batch {n + 1}/{len(groups)}, {len(idx)} prompts)")
        rs = timed("_r", lambda: score_many(ref_engine, items, top_k))
        cs = timed("_c", lambda: score_many(cand_engine, items, top_k))
        t["reference_score"] += t.pop("_r")
        t["candidate_score"] += t.pop("_c")
        t0 = time.perf_counter()
        for i, r, c in zip(idx, rs, cs):
            r_top, c_top = [ag.normalize_topk(d) for d in r.top_logprobs], [ag.normalize_topk(d) for d in c.top_logprobs]
            if r.full_logprobs is not None and c.full_logprobs is not None:
                tfs[i] = ag.teacher_forced(r_top, c_top, top_k, r.full_logprobs, c.full_logprobs)
            else:
                # A server reports the continuation token's own logprob beside its top-k: add it, it tightens the
                # top-k KL bound (and, ranking below the top-k, changes neither top-1 nor overlap).
                tfs[i] = ag.teacher_forced(_with_target(r), _with_target(c), top_k)
            tf_topk[i] = (r_top, c_top)  # the full arrays are dropped here: 1 MiB per position
        t["metrics"] += time.perf_counter() - t0

    progress(0.97, "Computing agreement")
    results = []
    for i, (p, r, c) in enumerate(zip(prompts, ref_gens, cand_gens)):
        r_tf, c_tf = tf_topk.get(i, ([], []))
        results.append(PromptResult(
            p.name, p.text, r.prompt_ids, r.token_ids, c.token_ids, r.text, c.text,
            [ag.normalize_topk(d) for d in r.top_logprobs], [ag.normalize_topk(d) for d in c.top_logprobs],
            r_tf, c_tf,
            ag.free_run(r.token_ids, r.top_logprobs, c.token_ids, c.top_logprobs, top_k),
            tfs.get(i) or ag.TeacherForced([], [], [], ag.KL_FULL, top_k)))
    summary = ag.summarize([r.free for r in results], [r.tf for r in results], reference.label, candidate.label)
    ids = {t_ for r in results for t_ in r.ref_ids + r.cand_ids}
    ids |= {t_ for r in results for k in ("ref_decode_topk", "cand_decode_topk", "ref_tf_topk", "cand_tf_topk")
            for d in getattr(r, k) for t_ in d}
    t["total"] = time.perf_counter() - t_start
    progress(1.0, "Done")
    return CompareResult(reference, candidate, max_new_tokens, top_k, results, summary,
                         _token_texts([ref_engine, cand_engine], ids), t, noise_floor=reference == candidate)


def run(reference: Side, candidate: Side, prompts: Sequence[Prompt | str], *, max_new_tokens: int = 32,
        top_k: int = ag.DEFAULT_K, progress: ProgressFn | None = None, should_stop=None,
        loader: Callable[[Side, ProgressFn | None], object] = load_engine) -> CompareResult:
    """Load both sides (once each; the same object when they are the same setup) and compare."""
    progress = progress or (lambda f, m: None)
    from core.http import normalize_base_url

    for side in (reference, candidate):  # a mistyped URL is reported before minutes of loading the other side
        if side.engine == "remote":
            normalize_base_url(side.url)
    t0 = time.perf_counter()
    started = []
    try:
        ref = loader(reference, lambda f, m: progress(0.1 * f, f"Reference: {m}"))
        started.append((reference, ref))
        cand = ref if candidate == reference else loader(candidate,
                                                         lambda f, m: progress(0.1 + 0.1 * f, f"Candidate: {m}"))
        started.append((candidate, cand))
        load_s = time.perf_counter() - t0
        result = compare(ref, cand, prompts, max_new_tokens=max_new_tokens, top_k=top_k, reference=reference,
                         candidate=candidate, progress=lambda f, m: progress(0.2 + 0.8 * f, m),
                         should_stop=should_stop)
    finally:
        # A vLLM side is a server process started for this comparison alone: stop it, whoever called.
        for side, engine in started:
            if side.engine == "vllm":
                engine.unload()
    result.timings["load"] = load_s
    return result


# ---- history ----

def history_title(result: CompareResult) -> str:
    n = len(result.prompts)
    return (f"{result.reference.label} vs {result.candidate.label} · {n} prompt{'s' * (n != 1)} · "
            f"{result.max_new_tokens} tokens")


def history_summary(result: CompareResult, noise: CompareResult | None = None) -> dict:
    """The headline numbers, one level deep, so the History page can put two comparisons side by side field by
    field. Percentages are 0-100 and KL is in nats, as the page shows them."""
    s = result.summary
    ref, cand = result.reference, result.candidate
    out = {
        "reference": ref.label, "candidate": cand.label, "model": cand.model or ref.model or None,
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


def save_to_history(result: CompareResult, noise: CompareResult | None = None) -> int | None:
    """Save one comparison as a "compare" run; the run id, or None when the history could not be written (the
    caller still has its result, and core.store logs why)."""
    from core import store

    return store.record("compare", history_title(result), history_payload(result, noise),
                        history_summary(result, noise))


__all__ = ["Side", "CompareResult", "PromptResult", "compare", "run", "load_engine", "score_many", "length_groups",
           "history_title", "history_summary", "history_payload", "save_to_history", "EngineError"]
