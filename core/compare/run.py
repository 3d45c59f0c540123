"""Precision compare: a reference and a candidate run on the same prompts, and the agreement between them.

Flow per prompt:
1. the reference greedy-generates N tokens with top-k logprobs; the candidate does the same (free-running metrics);
2. both sides score the reference continuation teacher-forced: prompts of similar length batched together, logits
   computed only for the continuation (the vocabulary projection dominates a small model's cost, so prompt positions
   are skipped); a torch side runs only the continuation tokens, over the cache its generation's prompt pass left;
3. core.compare.agreement turns ids, top-k dicts and (torch) full distributions into metrics, bands and a verdict.

Sides are torch in-process (each precision loaded once; the same engine object is reused when both sides are the
same setup, which is the noise floor), a local vLLM server, or a remote OpenAI-compatible server. torch is imported
lazily, inside the torch-only helpers, so pages can import this module.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Sequence

from core.compare import agreement as ag
from core.compare.prompts import Prompt, unique_names
from core.compare.result import CompareResult, PromptResult, Side, stop_text, summarize_prompts
from core.engines.base import (Cancelled, EagerEngine, EngineError, GenerationParams, InProcessEngine, Score,
                               length_groups)
from core.errors import InputError

ENGINES = ("torch", "vllm", "remote")
MAX_TOP_K = 20  # GenerationParams.top_logprobs and vLLM's default --max-logprobs
# Both sides keep every position's top-k and score the whole continuation teacher-forced: past a few hundred tokens
# free-running outputs have long parted, and the run only grows.
MAX_NEW_TOKENS = 512
# The sequential design: prompts run in batches of this many (each batch one batched generation per side, as the
# whole set was before), and the interval is checked after each batch.
BATCH_PROMPTS = 6
DEFAULT_BUDGET_S = 120
LIMITS = {"max_new_tokens": ("Max new tokens", 1, MAX_NEW_TOKENS), "top_k": ("Top-k", 1, MAX_TOP_K),
          "budget_s": ("Time budget (s)", 10, 3600)}


def check_request(max_new_tokens: int, top_k: int) -> None:
    """Refuse numbers outside LIMITS before anything loads, saying the allowed range."""
    for (name, lo, hi), value in zip(list(LIMITS.values())[:2], (max_new_tokens, top_k)):
        if not lo <= value <= hi:
            raise InputError(f"{name} must be between {lo:,} and {hi:,}; got {value:,}.")


def check_budget(budget_s: float | None) -> None:
    """Refuse a time budget outside LIMITS["budget_s"] (None: no budget)."""
    name, lo, hi = LIMITS["budget_s"]
    if budget_s is not None and not lo <= budget_s <= hi:
        raise InputError(f"{name} must be between {lo:,} and {hi:,} seconds; got {budget_s:,}.")


ProgressFn = Callable[[float, str], None]


# Two local vLLM servers of a comparison share one GPU: each takes this much of its memory instead of vLLM's default
# 0.9, which would leave the second server no room to start.
VLLM_SHARED_GPU_FRACTION = 0.45


def vllm_gpu_share(reference: Side, candidate: Side) -> float | None:
    """The GPU memory fraction for each local vLLM server when a comparison starts two (None: one server or none,
    which keeps vLLM's default). On a CPU host the fraction is not passed on (see server_command)."""
    two_servers = reference.engine == candidate.engine == "vllm" and reference != candidate
    return VLLM_SHARED_GPU_FRACTION if two_servers else None


def load_engine(side: Side, progress: ProgressFn | None = None, gpu_share: float | None = None):
    """A ready engine for `side` (through core.engines.factory.open_engine). Raises UnsupportedCombination/
    EngineError with a message for the user. `gpu_share`: the GPU memory fraction a local vLLM server may take."""
    from core.engines.factory import EngineChoice, open_engine

    if side.engine not in ENGINES:
        raise InputError(f"Unknown engine {side.engine!r}; choose one of: {', '.join(ENGINES)}.")
    return open_engine(EngineChoice(side.engine, side.model, side.precision, side.kv_dtype, url=side.url,
                                    api_key=side.api_key, gpu_share=gpu_share), progress)


def score_many(engine, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
    """Teacher-forced scores for every (prompt ids, continuation ids) pair, batched as the engine does best."""
    return engine.score_many(items, top_k)


def _generate(engine, texts: list[str], params: GenerationParams, stop):
    """Generations, and the prompt pass kept for scoring where the engine keeps one (the torch engine; else None)."""
    if isinstance(engine, EagerEngine):
        return engine.generate_keeping_prompt_pass(texts, params, should_stop=stop)
    return engine.generate(texts, params, should_stop=stop), None


def _score(engine, kept, idx: list[int], items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
    """Teacher-forced scores of prompts idx: after the kept prompt pass where there is one (only the continuations
    run; the compare's long prompt is not prefilled a second time), else score_many."""
    if kept is not None:
        return engine.score_after_prompt_pass(kept, idx, [c for _, c in items], top_k, full=True)
    return score_many(engine, items, top_k)


def _with_target(score: Score) -> list[dict[int, float]]:
    return [{**ag.normalize_topk(d), tok: lp} if not math.isnan(lp) else ag.normalize_topk(d)
            for d, tok, lp in zip(score.top_logprobs, score.continuation_ids, score.target_logprobs)]


def _token_texts(engines, ids: set[int]) -> dict[int, str]:
    for eng in engines:
        if isinstance(eng, InProcessEngine):
            order = sorted(ids)
            return dict(zip(order, eng.token_texts(order)))
    return {}  # servers give no per-token text here; ids are shown as [id]


# ---- the run, in stages ----

# Shares of a comparison's progress bar: generation (both sides) and the teacher-forced scoring. Measured on the
# default compare on 2 CPU cores, generation is about two thirds of the time.
GENERATE_SHARE = 0.7


def prompt_list(prompts: Sequence[Prompt | str]) -> list[Prompt]:
    """Named prompts, names made unique; refuses an empty list."""
    out = unique_names([p if isinstance(p, Prompt) else Prompt(f"prompt-{i + 1}", p) for i, p in enumerate(prompts)])
    if not out:
        raise InputError("Give at least one prompt.")
    return out


def _counting_steps(stop: Callable[[], bool], on_step: Callable[[int], None]) -> Callable[[], bool]:
    """`stop`, which also counts its calls: engines ask it once per decode step (and once per prefill chunk, which
    a compare's short prompts take one of), so the count tells how far a batched generation has come."""
    n = [0]

    def asked() -> bool:
        n[0] += 1
        on_step(n[0])
        return stop()
    return asked


def generations(engines: tuple, sides: tuple[Side, Side], texts: list[str], params: GenerationParams, stop,
                progress: ProgressFn, timings: dict[str, float]) -> list[tuple[list, object]]:
    """Each side's greedy generations of every prompt (batched), with the prompt pass kept for scoring where the
    engine keeps one; progress in decode steps of max_new_tokens."""
    out = []
    n, total = len(texts), params.max_new_tokens
    for k, (engine, side, role) in enumerate(zip(engines, sides, ("Reference", "Candidate"))):
        if stop():
            raise Cancelled("Comparison cancelled.")
        base = GENERATE_SHARE * k / 2

        def step(i: int, base=base, role=role, side=side) -> None:
            i = min(i, total)
            progress(base + GENERATE_SHARE / 2 * i / total,
                     f"{role} ({side.short_label}) generating: token {i} of {total}, {n} prompt{'s' * (n != 1)} "
                     "batched")
        step(0)
        t0 = time.perf_counter()
        out.append(_generate(engine, texts, params, _counting_steps(stop, step)))
        timings[f"{role.lower()}_generate"] = time.perf_counter() - t0
    return out


def _teacher_forced_pair(r: Score, c: Score, top_k: int) -> tuple[ag.TeacherForced, tuple[list[dict], list[dict]]]:
    r_top, c_top = [ag.normalize_topk(d) for d in r.top_logprobs], [ag.normalize_topk(d) for d in c.top_logprobs]
    if r.full_logprobs is not None and c.full_logprobs is not None:
        return ag.teacher_forced(r_top, c_top, top_k, r.full_logprobs, c.full_logprobs), (r_top, c_top)
    # A server reports the continuation token's own logprob beside its top-k: add it, it tightens the top-k KL bound
    # (and, ranking below the top-k, changes neither top-1 nor overlap).
    return ag.teacher_forced(_with_target(r), _with_target(c), top_k), (r_top, c_top)


def teacher_forced_scores(engines: tuple, kept: tuple, ref_gens: list, top_k: int, stop, progress: ProgressFn,
                          timings: dict[str, float]) -> dict[int, tuple[ag.TeacherForced, tuple[list, list]]]:
    """Prompt index -> (teacher-forced metrics, both sides' top-k) for every prompt whose reference continuation is
    not empty (an immediate EOS has nothing to score); prompts of similar length are scored together."""
    scorable = [i for i, g in enumerate(ref_gens) if g.token_ids and g.prompt_ids]
    for key in ("reference_score", "candidate_score", "metrics"):
        timings[key] = 0.0
    groups = (length_groups([len(ref_gens[i].prompt_ids) + len(ref_gens[i].token_ids) for i in scorable],
                            [len(ref_gens[i].token_ids) for i in scorable]) if scorable else [])
    out, done = {}, 0
    for group in groups:
        if stop():
            raise Cancelled("Comparison cancelled.")
        idx = [scorable[j] for j in group]
        progress(GENERATE_SHARE + (0.97 - GENERATE_SHARE) * done / len(scorable),
                 f"Scoring the reference continuation teacher-forced: prompt {done + 1}-{done + len(idx)} of "
                 f"{len(scorable)}")
        items = [(ref_gens[i].prompt_ids, ref_gens[i].token_ids) for i in idx]
        scores = []
        for engine, kept_pass, key in zip(engines, kept, ("reference_score", "candidate_score")):
            t0 = time.perf_counter()
            scores.append(_score(engine, kept_pass, idx, items, top_k))
            timings[key] += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i, r, c in zip(idx, *scores):
            out[i] = _teacher_forced_pair(r, c, top_k)  # the full arrays are dropped here: 1 MiB per position
        timings["metrics"] += time.perf_counter() - t0
        done += len(idx)
    return out


def prompt_results(prompts: list[Prompt], ref_gens: list, cand_gens: list, scored: dict, top_k: int
                   ) -> list[PromptResult]:
    """Per-prompt results: both generations, their top-k, the free-running and teacher-forced metrics."""
    results = []
    for i, (p, r, c) in enumerate(zip(prompts, ref_gens, cand_gens)):
        tf, (r_tf, c_tf) = scored.get(i, (ag.TeacherForced([], [], [], ag.KL_FULL, top_k), ([], [])))
        results.append(PromptResult(
            p.name, p.text, r.prompt_ids, r.token_ids, c.token_ids, r.text, c.text,
            [ag.normalize_topk(d) for d in r.top_logprobs], [ag.normalize_topk(d) for d in c.top_logprobs],
            r_tf, c_tf, ag.free_run(r.token_ids, r.top_logprobs, c.token_ids, c.top_logprobs, top_k), tf))
    return results


def shown_ids(results: list[PromptResult]) -> set[int]:
    """Every token id a view shows: both outputs and every top-k alternative."""
    ids = {t for r in results for t in r.ref_ids + r.cand_ids}
    return ids | {t for r in results for topks in (r.ref_decode_topk, r.cand_decode_topk, r.ref_tf_topk,
                                                   r.cand_tf_topk) for d in topks for t in d}


# on_prompts(done, needed, message): prompts scored (fractional within a batch) of those needed so far.
PromptsFn = Callable[[float, int, str], None]


def _needed(summary: ag.Summary, scored: int, given: int) -> int:
    """Prompts the run needs so far: those scored, plus what the interval says it lacks (at least the next batch),
    never more than were given."""
    more = ag.more_prompts_needed(summary) or 0
    return min(given, scored + max(more, min(BATCH_PROMPTS, given - scored)))


def _add_timings(total: dict[str, float], batch: dict[str, float]) -> None:
    for k, v in batch.items():
        total[k] = total.get(k, 0.0) + v


def compare(ref_engine, cand_engine, prompts: Sequence[Prompt | str], *, max_new_tokens: int = 32,
            top_k: int = ag.DEFAULT_K, reference: Side | None = None, candidate: Side | None = None,
            progress: ProgressFn | None = None, should_stop: Callable[[], bool] | None = None,
            budget_s: float | None = None, spent_s: float = 0.0, on_prompts: PromptsFn | None = None,
            on_batch: Callable[[CompareResult], None] | None = None) -> CompareResult:
    """Generate with both sides, score the reference continuation on both, and measure agreement: prompts in
    batches of BATCH_PROMPTS, in order, until the 95% interval of the same-top share lies inside one band
    (agreement.decided), every prompt is scored, or the next batch would end past `budget_s` (seconds, of which
    `spent_s` went before this call, loading; the next batch's time is this run's own pace per prompt so far; None:
    no budget). The first batch always runs.

    progress(fraction, message) follows the prompts needed so far; on_prompts(done, needed, message) counts them;
    on_batch(result so far) after each batch (what a stopped run keeps).

    Pass the same engine object twice for the noise floor: it still generates and scores twice, so a
    non-deterministic engine shows up as less than 1.0."""
    check_request(max_new_tokens, top_k)
    prompts = prompt_list(prompts)
    reference, candidate = reference or Side(), candidate or Side()
    stop = should_stop or (lambda: False)
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, top_logprobs=top_k).validated()
    t: dict[str, float] = {}
    t_start = time.perf_counter()
    engines = (ref_engine, cand_engine)
    given, results, needed, why = len(prompts), [], min(BATCH_PROMPTS, len(prompts)), "prompts"

    def report(done: float, msg: str) -> None:
        if on_prompts is not None:
            on_prompts(done, needed, msg)
        if progress is not None:
            progress(min(done / needed, 1.0), f"{msg} ({done:.0f} of {needed} prompts needed so far scored)")

    def result(stopped: str) -> CompareResult:
        token_text = _token_texts(engines, shown_ids(results))
        text = stop_text(stopped, budget_s, len(results), given)
        summary = summarize_prompts(results, reference, candidate, token_text, text)
        return CompareResult(reference, candidate, max_new_tokens, top_k, list(results), summary, token_text,
                             dict(t, total=time.perf_counter() - t_start), noise_floor=reference == candidate,
                             stop=stopped, budget_s=budget_s, prompts_given=given)

    for first in range(0, given, BATCH_PROMPTS):
        batch = prompts[first:first + BATCH_PROMPTS]
        scored, n = len(results), len(batch)
        tb: dict[str, float] = {}

        def in_batch(f: float, m: str, scored=scored, n=n) -> None:  # f: the share of this batch done
            report(scored + n * f, m)
        (ref_gens, ref_kept), (cand_gens, cand_kept) = generations(
            engines, (reference, candidate), [p.text for p in batch], params, stop, in_batch, tb)
        scored_tf = teacher_forced_scores(engines, (ref_kept, cand_kept), ref_gens, top_k, stop, in_batch, tb)
        results += prompt_results(batch, ref_gens, cand_gens, scored_tf, top_k)
        _add_timings(t, tb)
        summary = summarize_prompts(results, reference, candidate, {})
        if on_batch is not None:
            on_batch(result(""))
        if ag.decided(summary):
            why = "decided"
            break
        elapsed = time.perf_counter() - t_start
        pace = elapsed / len(results) * min(BATCH_PROMPTS, given - len(results))  # the next batch, at this pace
        if len(results) < given and budget_s is not None and spent_s + elapsed + pace > budget_s:
            why = "budget"
            break
        needed = _needed(summary, len(results), given)
    report(len(results), "Computing agreement")
    out = result(why)
    if progress is not None:
        progress(1.0, "Done")
    return out


def run(reference: Side, candidate: Side, prompts: Sequence[Prompt | str], *, max_new_tokens: int = 32,
        top_k: int = ag.DEFAULT_K, progress: ProgressFn | None = None, should_stop=None,
        loader: Callable[[Side, ProgressFn | None], object] = load_engine, budget_s: float | None = DEFAULT_BUDGET_S,
        on_prompts: PromptsFn | None = None, on_batch: Callable[[CompareResult], None] | None = None
        ) -> CompareResult:
    """Load both sides (once each; the same object when they are the same setup) and compare until decided or
    `budget_s` (loads included) is spent."""
    check_request(max_new_tokens, top_k)
    check_budget(budget_s)
    progress = progress or (lambda f, m: None)
    from core.http import normalize_base_url

    for side in (reference, candidate):  # a mistyped URL is reported before minutes of loading the other side
        if side.engine == "remote":
            normalize_base_url(side.url)
    if loader is load_engine and (share := vllm_gpu_share(reference, candidate)) is not None:
        loader = functools.partial(load_engine, gpu_share=share)
    t0 = time.perf_counter()
    started = []
    try:
        ref = loader(reference, lambda f, m: progress(0.1 * f, f"Reference: {m}"))
        started.append((reference, ref))
        cand = ref if candidate == reference else loader(candidate,
                                                         lambda f, m: progress(0.1 + 0.1 * f, f"Candidate: {m}"))
        started.append((candidate, cand))
        load_s = time.perf_counter() - t0
        # Say what really ran beside what was asked: the eager or the CUDA-graph torch engine, vLLM's kernels.
        reference, candidate = (dataclasses.replace(side, ran=eng.ran, ran_short=eng.ran_short)
                                for side, eng in ((reference, ref), (candidate, cand)))
        result = compare(ref, cand, prompts, max_new_tokens=max_new_tokens, top_k=top_k, reference=reference,
                         candidate=candidate,
                         # counted prompts replace the share of the bar once the loads are done
                         progress=None if on_prompts else lambda f, m: progress(0.2 + 0.8 * f, m),
                         should_stop=should_stop, budget_s=budget_s, spent_s=load_s, on_prompts=on_prompts,
                         on_batch=on_batch)
    finally:
        # A vLLM side is a server process started for this comparison alone: stop it, whoever called.
        for side, engine in started:
            if side.engine == "vllm":
                engine.unload()
    result.timings["load"] = load_s
    return result


__all__ = ["compare", "run", "load_engine", "score_many", "EngineError"]
