"""Timed long-context runs on a loaded engine: one prefill + decode, a ramp over lengths, a needle test, and a
batch sweep. Every run takes `progress(fraction, message)` and `should_stop()`; a stop raises Cancelled, and the
results finished before it have already gone to `on_result`.

Prompts are token ids cut to exact lengths from a document (repeated when it is shorter), so a length on a chart is
the length the model saw. The needle test scores the answer teacher-forced (engine.score), because the embedded
model is a base model and cannot be asked to answer.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from core.engines.base import Cancelled, GenerationParams, InProcessEngine
from core.errors import InputError
from core.fmt import GIB
from core.stats import percentile

Progress = Callable[[float, str], None]
Stop = Callable[[], bool]


def _noop(*_):
    return None


# ---- prompts of exact length -----------------------------------------------------------------------------------

def plain_ids(engine, text: str) -> list[int]:
    """Token ids of `text` without special tokens."""
    return engine.encode_plain(text)


def bos(engine) -> list[int]:
    return engine.bos_ids


def exact_prompt(engine, filler: list[int], n: int) -> list[int]:
    """BOS + the filler, repeated as needed, cut so the whole prompt is exactly n tokens."""
    if not filler:
        raise InputError("The document has no tokens.")
    head = bos(engine)
    body = n - len(head)
    reps = -(-body // len(filler))
    return head + (filler * reps)[:body]


def check_length(engine, n: int, new_tokens: int) -> None:
    cap = engine.max_positions
    if cap and n + new_tokens > cap:
        raise InputError(f"{n} prompt tokens + {new_tokens} new tokens is more than the model's {cap} positions.")


# ---- memory on the CPU ------------------------------------------------------------------------------------------
# On the CPU a run that outgrows memory raises nothing: the kernel's OOM killer ends the whole server. So a CPU run
# is refused up front when one forward pass would not fit in the memory available now. The estimate is calibrated
# on the embedded model (bench/needle_memory.py; docs/perf-log/long-context.md, "Long context"): one pass over 32K
# tokens peaked 4.1 GiB above the loaded model at BF16 (0.15 GiB at 2K, 0.60 GiB at 8K) and 7.0 GiB at FP32. That fits
# 2 bytes per (query, key) pair (transformers' SDPA path materializes an n x n boolean mask for the sliding-window
# layers, and more while building it) plus about 17 activation elements per token and MLP intermediate unit. The
# guard counts 26 of those (half again), the whole KV cache, and 1 byte a pair without sliding layers (a padded
# batch materializes the full-attention mask too).
PASS_ELEMENTS_PER_INTER = 26  # activation elements per token and intermediate unit
HEADROOM_BYTES = GIB  # left for the server, the browser sessions and the OS


def pass_bytes(config, tokens: int, batch: int = 1, act_bytes: int = 2) -> int:
    """Estimated peak memory of one forward pass over `batch` x `tokens` on the CPU, beyond the loaded weights;
    act_bytes is the activations' element size (4 for FP32, 2 for BF16 and FP16, and for FP8, which computes
    in BF16)."""
    from core.long_context import kvcache

    inter = getattr(config, "intermediate_size", None) or 4 * (getattr(config, "hidden_size", None) or 4096)
    try:
        shape = kvcache.shape_from_config(config)
        masks, kv = (2 if shape.sliding_layers else 1), kvcache.kv_bytes(shape, "bf16", tokens) * act_bytes // 2
    except kvcache.KVConfigError:
        masks, kv = 2, 0
    return batch * (PASS_ELEMENTS_PER_INTER * act_bytes * inter * tokens + masks * tokens * tokens + kv)


def check_memory(engine, tokens: int, batch: int = 1) -> None:
    """Refuse a CPU run whose forward pass would not fit in the memory available now, with what would fit."""
    if not isinstance(engine, InProcessEngine):
        return  # a server sizes its own passes
    plan = engine.memory_plan()
    if plan.device.kind != "cpu":
        return  # a GPU out of memory raises an error the page shows; it does not take the server down
    room = plan.free_bytes - HEADROOM_BYTES
    need = pass_bytes(plan.config, tokens, batch, plan.act_bytes)
    if need <= room:
        return
    lo, hi = 0, tokens  # the longest prompt that would fit, for the message
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if pass_bytes(plan.config, mid, batch, plan.act_bytes) <= room else (lo, mid - 1)
    rows = f"{batch} x {tokens:,}" if batch > 1 else f"{tokens:,}"
    raise InputError(f"{rows} tokens needs about {need / GIB:.1f} GiB of memory for one forward pass on the CPU "
                     f"(estimate); {max(room, 0) / GIB:.1f} GiB is free beyond 1 GiB of headroom. Use at most "
                     f"about {lo:,} tokens{' per sequence or a smaller batch' if batch > 1 else ''}, or free memory: "
                     "running out of memory on the CPU ends the whole server.")


# ---- one run ---------------------------------------------------------------------------------------------------

@dataclass
class RunResult:
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    itl_s: list[float]
    decode_tok_s: float | None  # of the whole batch
    peak_bytes: int | None
    peak_source: str
    kv_bytes: int  # measured: the engine's cache after the run
    batch: int = 1
    wall_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.batch * self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else float("nan")

    @property
    def itl_p(self) -> dict[str, float | None]:
        return {f"p{q}": percentile(self.itl_s, q / 100) for q in (50, 90, 99)}

    @property
    def throughput_tok_s(self) -> float:
        """All new tokens of the batch over the whole request, prefill included."""
        return self.batch * self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    def summary(self) -> dict:
        p = self.itl_p
        return {"batch": self.batch, "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "ttft_ms": 1000 * self.ttft_s, "prefill_tok_s": self.prefill_tok_s,
                **{f"itl_{k}_ms": None if v is None else 1000 * v for k, v in p.items()},
                "decode_tok_s": self.decode_tok_s, "throughput_tok_s": self.throughput_tok_s,
                "kv_bytes": self.kv_bytes, "peak_bytes": self.peak_bytes}

    def to_dict(self) -> dict:
        return {**asdict(self), **self.summary()}


def _reset_peak(engine) -> None:
    if engine.device.kind == "cuda":
        import torch  # only reached with a CUDA engine, where torch is loaded already

        torch.cuda.reset_peak_memory_stats()


def run_once(engine, prompt_ids: list[int], new_tokens: int, batch: int = 1, progress: Progress = _noop,
             should_stop: Stop | None = None) -> RunResult:
    """Prefill + `new_tokens` greedy tokens (EOS ignored so every run has the same count)."""
    if new_tokens < 2:
        raise InputError("Ask for at least 2 new tokens: inter-token latency needs two.")
    check_length(engine, len(prompt_ids), new_tokens)
    check_memory(engine, len(prompt_ids) + new_tokens, batch)
    params = GenerationParams(max_new_tokens=new_tokens, stop_at_eos=False, top_logprobs=0)
    progress(0.0, f"Prefill of {len(prompt_ids)} tokens x {batch}")

    def on_step(ev):
        progress((ev.step + 1) / new_tokens, f"token {ev.step + 1} of {new_tokens}")

    _reset_peak(engine)
    t0 = time.perf_counter()
    gens = engine.generate([list(prompt_ids)] * batch, params, on_step=on_step, should_stop=should_stop)
    wall = time.perf_counter() - t0
    g = gens[0]  # rows of one batch share every timestamp
    mem = engine.memory_report()
    decode = None if g.decode_tok_s is None else batch * g.decode_tok_s  # every row emits a token per step
    return RunResult(len(prompt_ids), len(g.token_ids), g.ttft_s, g.itl_s, decode, mem.peak_bytes,
                     mem.peak_source, mem.kv_cache_bytes, batch, wall)


def _scaled(progress: Progress, i: int, n: int, label: str) -> Progress:
    return lambda f, m: progress((i + f) / n, f"{label}: {m}")


def ramp(engine, filler: list[int], lengths: list[int], new_tokens: int, progress: Progress = _noop,
         should_stop: Stop | None = None, on_result: Callable[[RunResult], None] = _noop) -> list[RunResult]:
    """One run per prompt length, shortest first, so a cancelled ramp still has its cheap points."""
    lengths = sorted(set(lengths))
    for n in lengths:
        check_length(engine, n, new_tokens)
    check_memory(engine, lengths[-1] + new_tokens)  # before the short ones: refuse now, not after an hour
    out = []
    for i, n in enumerate(lengths):
        if should_stop and should_stop():
            raise Cancelled("Ramp cancelled.")
        r = run_once(engine, exact_prompt(engine, filler, n), new_tokens,
                     progress=_scaled(progress, i, len(lengths), f"{n} tokens"), should_stop=should_stop)
        out.append(r)
        on_result(r)
    progress(1.0, "done")
    return out


def batch_sweep(engine, filler: list[int], prompt_tokens: int, new_tokens: int, batches=(1, 4, 8),
                progress: Progress = _noop, should_stop: Stop | None = None,
                on_result: Callable[[RunResult], None] = _noop) -> list[RunResult]:
    """The same prompt at each batch size: tokens/s of the whole batch."""
    prompt = exact_prompt(engine, filler, prompt_tokens)
    check_memory(engine, prompt_tokens + new_tokens, max(batches))
    out = []
    for i, b in enumerate(batches):
        if should_stop and should_stop():
            raise Cancelled("Batch sweep cancelled.")
        r = run_once(engine, prompt, new_tokens, batch=b, progress=_scaled(progress, i, len(batches), f"batch {b}"),
                     should_stop=should_stop)
        out.append(r)
        on_result(r)
    progress(1.0, "done")
    return out


# ---- needle ----------------------------------------------------------------------------------------------------

NEEDLE = "Note for the reader: the access code for the archive room is {answer}."
QUESTION = ("\n\nQuestion: What is the access code for the archive room?\n"
            "Answer: The access code for the archive room is")
ANSWER = " 7-4-1-9-3"  # Gemma makes each digit a token: several guesses a model without the fact gets wrong


@dataclass
class NeedleResult:
    depth: str  # "start", "middle", "end", or "none" for the control without the needle
    position: int  # token index where the needle starts (-1 for the control)
    prompt_tokens: int
    answer_logprob: float  # sum over the answer's tokens
    answer_tokens: int
    top1_hits: int  # answer tokens that were the model's own first choice
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def mean_logprob(self) -> float:
        return self.answer_logprob / self.answer_tokens

    @property
    def answer_prob(self) -> float:
        return math.exp(self.answer_logprob)

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_logprob": self.mean_logprob}


def needle_row(r: dict) -> dict:
    """One line of the needle table; `r` is NeedleResult.to_dict(). The control's position is "none": st.table
    renders a lone "-" as a list bullet."""
    return {"needle": "none (control)" if r["depth"] == "none" else r["depth"],
            "at token": "none" if r["position"] < 0 else str(r["position"]), "prompt tokens": r["prompt_tokens"],
            "answer logprob (sum)": f"{r['answer_logprob']:.2f}", "mean per token": f"{r['mean_logprob']:.3f}",
            "answer tokens ranked first": f"{r['top1_hits']} of {r['answer_tokens']}"}


DEPTHS = {"start": 0.0, "middle": 0.5, "end": 1.0}
NEEDLE_NOTE = (f"Fact: \"{NEEDLE.format(answer=ANSWER.strip())}\" placed at the start, middle and end of the document; "
               "the answer is scored after a question, against a control without the fact.")
RAMP_STEPS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def ramp_steps(limit: int) -> list[int]:
    """The ramp's prompt lengths (powers of two) that fit under `limit` tokens."""
    return [n for n in RAMP_STEPS if n <= limit]


def needle_prompts(engine, filler: list[int], total_tokens: int, depths=("start", "middle", "end"),
                   answer: str = ANSWER) -> tuple[list[tuple[str, int, list[int]]], list[int]]:
    """[(depth, needle position, prompt ids)] with the control (no needle) first, and the answer ids. Every prompt
    has the same length: the filler is shortened by the needle's tokens."""
    needle = plain_ids(engine, "\n" + NEEDLE.format(answer=answer) + "\n")
    question, answer_ids = plain_ids(engine, QUESTION), plain_ids(engine, answer)
    head = bos(engine)
    room = total_tokens - len(head) - len(question) - len(needle)
    if room < 16:
        raise InputError(f"{total_tokens} tokens is too short for a needle test; use at least "
                         f"{len(head) + len(question) + len(needle) + 16}.")
    body = exact_prompt(engine, filler, room + len(head))[len(head):]
    out = [("none", -1, head + body[:len(needle)] + body + question)]  # control: filler in place of the needle
    for d in depths:
        at = round(DEPTHS[d] * room)
        out.append((d, len(head) + at, head + body[:at] + needle + body[at:] + question))
    return out, answer_ids


def needle_max_tokens(engine, max_length: int | None = None) -> int | None:
    """Longest needle-test prompt: the answer is scored after it, so prompt + answer must fit the model's positions
    (and the configured max length, when one is given)."""
    caps = [c for c in (engine.max_positions, max_length) if c]
    return min(caps) - len(plain_ids(engine, ANSWER)) if caps else None


def check_needle_length(engine, total_tokens: int, max_length: int | None = None) -> None:
    cap = needle_max_tokens(engine, max_length)
    if cap and total_tokens > cap:
        limit = min(c for c in (engine.max_positions, max_length) if c)
        raise InputError(f"A needle test of {total_tokens:,} tokens does not fit: the answer is scored after the "
                         f"prompt, within {limit:,} positions. Use at most {cap:,} tokens.")


def needle_test(engine, filler: list[int], total_tokens: int, depths=("start", "middle", "end"),
                progress: Progress = _noop, should_stop: Stop | None = None,
                on_result: Callable[[NeedleResult], None] = _noop,
                max_length: int | None = None) -> list[NeedleResult]:
    """Teacher-forced log-probability of the answer after the question, with the fact at each depth and without
    it (the control: what the model guesses). A fact that is used lifts the answer far above the control."""
    check_needle_length(engine, total_tokens, max_length)
    prompts, answer = needle_prompts(engine, filler, total_tokens, depths)
    out = []
    for i, (depth, pos, ids) in enumerate(prompts):
        if should_stop and should_stop():
            raise Cancelled("Needle test cancelled.")
        check_memory(engine, len(ids) + len(answer))  # before each pass: free memory may have changed meanwhile
        progress(i / len(prompts), f"scoring with the needle at {depth}" if pos >= 0 else "scoring the control")
        s = engine.score(ids, answer, top_k=1)
        hits = sum(1 for t, top in zip(answer, s.top_logprobs) if max(top, key=top.get) == t)
        r = NeedleResult(depth, pos, len(ids), sum(s.target_logprobs), len(answer), hits, s.target_logprobs)
        out.append(r)
        on_result(r)
    progress(1.0, "done")
    return out



def headline(run: dict) -> list[tuple[str, str, str]]:
    """(label, value, help) for a run's metrics row; `run` is RunResult.to_dict()."""
    def ms(v):
        return "N/A" if v is None else f"{v:,.1f} ms"

    peak = "N/A" if run["peak_bytes"] is None else f"{run['peak_bytes'] / GIB:.2f} GiB"
    ttft = run["ttft_ms"]
    return [("TTFT", f"{ttft:,.0f} ms" if ttft < 10_000 else f"{ttft / 1000:,.1f} s",
             f"prefill {run['prefill_tok_s']:,.1f} prompt tokens/s"),
            *[(f"ITL {q}", ms(run[f"itl_{q}_ms"]), f"{len(run['itl_s'])} gaps") for q in ("p50", "p90", "p99")],
            ("Decode", f"{run['decode_tok_s']:,.1f} tok/s", "tokens after the first, per second"),
            ("Peak memory", peak, run["peak_source"])]


def table_row(run: dict) -> dict:
    """One line of a results table, as text rounded for reading; `run` is RunResult.to_dict()."""
    def r1(v):
        return "N/A" if v is None else f"{v:,.1f}"

    return {"batch": run["batch"], "prompt tokens": run["prompt_tokens"], "TTFT (ms)": f"{run['ttft_ms']:,.0f}",
            "prefill tok/s": r1(run["prefill_tok_s"]), "ITL p50 (ms)": r1(run["itl_p50_ms"]),
            "ITL p90 (ms)": r1(run["itl_p90_ms"]), "ITL p99 (ms)": r1(run["itl_p99_ms"]),
            "decode tok/s": r1(run["decode_tok_s"]), "tok/s incl. prefill": r1(run["throughput_tok_s"]),
            "KV cache (MiB)": r1(run["kv_bytes"] / 2**20)}
