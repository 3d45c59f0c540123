"""The document quality run: a reference precision and candidates over the same document, in windows of the model's
context, with llama.cpp's perplexity/KLD numbers for each, beside weights memory, peak memory and prefill/decode speed.

Windows: the document's tokens (no special tokens) are cut into windows of `window` tokens, BOS in front of each,
starting every `stride` tokens (the last window ends at the document's end). A token is scored once, in the first
window that reaches it, so with stride < window every scored token after the first window has at least
window - stride tokens of context. The first token of the document (context: BOS alone) is not scored.

Flow: the reference runs first (or its kept pass is read back, core/quality/refcache.py) and is unloaded; then each
candidate is loaded, scored window by window against the reference, timed for decode, and unloaded. Progress and
Cancel are checked between windows; each finished precision row goes to `on_result` at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from core.engines.base import Cancelled, EagerEngine, GenerationParams, check_stop
from core.errors import InputError
from core.precision import Precision, parse_precision
from core.quality import metrics, refcache
from core.quality.verdict import log_loss_noise
from core.textfile import DocumentError

Progress = Callable[[float, str], None]
DEFAULT_WINDOW = 512
DEFAULT_STRIDE = 256
DECODE_TOKENS = 16  # greedy tokens timed for the decode speed (short: the table's numbers are about quality)
WORST_POSITIONS = 8
CONTEXT_TOKENS = 12  # tokens of context shown before a position where the candidate differs


def _noop(*_):
    return None


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a precision, and for FP8 optional static activation scales calibrated on N
    tokens ("fp8-static:512")."""
    precision: Precision
    static_tokens: int | None = None

    @property
    def name(self) -> str:
        return f"fp8-static:{self.static_tokens}" if self.static_tokens else self.precision.value

    @property
    def label(self) -> str:
        if self.static_tokens:
            return f"FP8 E4M3 W8A8, static activation scales ({self.static_tokens:,} calibration tokens)"
        return self.precision.label


def parse_variant(text: str) -> Variant:
    text = text.strip().lower()
    if text.startswith("fp8-static"):
        _, _, n = text.partition(":")
        if not n.isdigit() or int(n) < 1:
            raise InputError(f"{text!r}: write FP8 with static scales as fp8-static:N, N calibration tokens "
                             "(e.g. fp8-static:512).")
        return Variant(Precision.FP8, int(n))
    return Variant(parse_precision(text))


def parse_variants(text: str) -> list[Variant]:
    out = [parse_variant(t) for t in text.split(",") if t.strip()]
    if not out:
        raise InputError("Name at least one candidate precision, e.g. fp8,int8,int4.")
    return out


@dataclass(frozen=True)
class Window:
    start: int  # document token offsets [start, end)
    end: int
    first_scored: int  # tokens [first_scored, end) are scored in this window


def plan_windows(n_tokens: int, window: int, stride: int, max_positions: int | None, special: int = 1) -> list[Window]:
    if window < 2:
        raise InputError(f"A window must hold at least 2 tokens; got {window}.")
    if max_positions and window + special > max_positions:
        raise InputError(f"A window of {window:,} tokens plus BOS is more than the model's {max_positions:,} "
                         f"positions; use at most {max_positions - special:,}.")
    if not 1 <= stride <= window:
        raise InputError(f"The stride must be between 1 and the window ({window:,}); got {stride:,}.")
    if n_tokens < window:
        raise DocumentError(f"The document has {n_tokens:,} tokens, shorter than one window of {window:,}. Use a "
                            "longer document, or a smaller window (the perplexity needs at least one full window).")
    out, start, prev_end = [], 0, 1
    while True:
        start = min(start, n_tokens - window)
        end = start + window
        out.append(Window(start, end, prev_end))
        if end >= n_tokens:
            return out
        prev_end, start = end, start + stride


# ---- one pass over the windows --------------------------------------------------------------------------------

def _windows_pass(engine, doc: list[int], windows: list[Window], on_window, progress: Progress, should_stop,
                  what: str) -> dict:
    """Forward each window, hand (window, log-probs [n, V] float32, targets) to on_window; returns timing."""
    import torch

    dev = engine.device.kind
    bos = engine.bos_ids
    fwd_s, tokens = 0.0, 0
    for i, w in enumerate(windows):
        try:
            check_stop(should_stop)  # the caller's, or the RunControl of the page's stoppable block
        except Cancelled as exc:
            raise Cancelled(f"Quality run cancelled while scoring {what}.") from exc
        progress(i / len(windows), f"{what}: window {i + 1} of {len(windows)}")
        ids = bos + doc[w.start:w.end]
        keep = w.end - w.first_scored + 1
        lp, seconds = engine.window_logprobs(ids, keep)
        fwd_s += seconds
        tokens += len(ids)
        with torch.inference_mode():
            on_window(w, lp, torch.tensor(doc[w.first_scored:w.end], device=dev))
    return {"forward_s": fwd_s, "prefill_tok_s": tokens / fwd_s if fwd_s > 0 else None, "tokens": tokens}


def _engine_numbers(engine, doc: list[int], decode_tokens: int = DECODE_TOKENS) -> dict:
    """Weights, peak memory and decode speed of a loaded engine (greedy tokens after the document's start)."""
    prompt = engine.bos_ids + doc[:64]
    gen = engine.generate([prompt], GenerationParams(max_new_tokens=max(2, decode_tokens), stop_at_eos=False,
                                                     top_logprobs=0))[0]
    mem = engine.memory_report()
    kernels = engine.linear_kernels() if isinstance(engine, EagerEngine) else []  # the torch engine's numerics
    return {"ran": engine.ran, "ran_short": engine.ran_short,
            "weights_bytes": mem.weights_bytes, "weights_by_dtype": mem.weights_by_dtype, "peak_bytes": mem.peak_bytes,
            "peak_source": mem.peak_source, "decode_tok_s": gen.decode_tok_s, "kernels": kernels}


def _reference_pass(engine, doc, windows, top_k, full, progress, should_stop) -> tuple[dict, dict]:
    import numpy as np
    import torch

    parts = {"targets": [], "target_lp": [], "top1": [], "topk_ids": [], "topk_lp": [], "full": []}

    def on_window(w, lp, targets):
        parts["targets"].append(targets.cpu())
        parts["target_lp"].append(lp.gather(1, targets[:, None])[:, 0].cpu())
        parts["top1"].append(lp.argmax(dim=-1).cpu())
        if full:
            parts["full"].append(lp.cpu())
        else:
            v, i = lp.topk(top_k, dim=-1)
            parts["topk_ids"].append(i.to(torch.int32).cpu())
            parts["topk_lp"].append(v.cpu())

    timing = _windows_pass(engine, doc, windows, on_window, progress, should_stop, "reference")
    arrays = {k: torch.cat(v).numpy() for k, v in parts.items() if v}
    arrays["targets"] = arrays["targets"].astype(np.int64)
    return arrays, timing


def _candidate_pass(engine, doc, windows, ref: dict, progress, should_stop, name: str) -> tuple[dict, dict]:
    import torch

    out = {"kl": [], "top1": [], "target_lp": []}
    pos = [0]

    def on_window(w, lp, targets):
        a, b = pos[0], pos[0] + lp.shape[0]
        pos[0] = b
        dev = lp.device
        if "full" in ref:
            r = {"full": torch.as_tensor(ref["full"][a:b], device=dev)}
        else:
            r = {"topk_ids": torch.as_tensor(ref["topk_ids"][a:b], device=dev),
                 "topk_lp": torch.as_tensor(ref["topk_lp"][a:b], device=dev)}
        out["kl"] += metrics.kl_rows(r, lp).tolist()
        out["top1"] += lp.argmax(dim=-1).tolist()
        out["target_lp"] += lp.gather(1, targets[:, None])[:, 0].tolist()

    timing = _windows_pass(engine, doc, windows, on_window, progress, should_stop, name)
    return out, timing


# ---- the run ----------------------------------------------------------------------------------------------------

def _scored_positions(windows: list[Window]) -> list[int]:
    return [t for w in windows for t in range(w.first_scored, w.end)]


def _worst(engine, doc: list[int], positions: list[int], kl: list[float], ref_top1, cand_top1) -> list[dict]:
    """The positions where this candidate's distribution moved most from the reference's, with their context."""
    order = sorted(range(len(kl)), key=lambda i: -kl[i])[:WORST_POSITIONS]
    rows = []
    for i in order:
        t = positions[i]
        rows.append({"position": t, "kld": kl[i],
                     "context": engine.decode(doc[max(0, t - CONTEXT_TOKENS):t]),
                     "token": engine.token_texts([doc[t]])[0],
                     "reference_top": engine.token_texts([int(ref_top1[i])])[0],
                     "candidate_top": engine.token_texts([int(cand_top1[i])])[0]})
    return rows


def default_loader(spec, device: str | None = None, calibration: str | None = None):
    """Loads a fresh TorchEngine per variant (integer precisions and static FP8 need the eager engine)."""
    def load(variant: Variant, progress: Progress):
        from core.engines.factory import EngineChoice, open_engine

        eng = open_engine(EngineChoice("torch-eager", spec, variant.precision, device=device, calibration=calibration),
                          progress)
        if variant.static_tokens:
            ids = eng.calibration_ids(calibration, variant.static_tokens)
            have = len(ids) - len(eng.bos_ids)
            if have < variant.static_tokens:
                eng.unload()
                raise InputError(f"{variant.name} calibrates on {variant.static_tokens:,} tokens; the calibration "
                                 f"text has {have:,}. Give a longer calibration text or a smaller N.")
            eng.calibrate_static_fp8(ids)
        return eng
    return load


# Sizes a quality run accepts, shown beside the page's boxes and the CLI's flags: a window of fewer tokens leaves
# too little context to say anything about a model; above the largest, one window's log-probs outgrow memory.
WINDOW_RANGE = (16, 32_000)


def check_windows(window: int, stride: int) -> None:
    """Refuse a window or stride outside their ranges before anything loads, saying the range."""
    lo, hi = WINDOW_RANGE
    if not lo <= window <= hi:
        raise InputError(f"The window must be between {lo:,} and {hi:,} tokens; got {window:,}.")
    if not 1 <= stride <= window:
        raise InputError(f"The stride must be between 1 and the window ({window:,}); got {stride:,}.")


class _Engines:
    """Each variant's engine when its turn comes. Engines this run loaded itself are unloaded when done with (a
    caller's loader keeps its own); the reference's stays only while a candidate is the same variant."""

    def __init__(self, load: Callable | None, spec, device, calibration, reference: Variant, candidates, step):
        self.owned = load is None
        self.load = load or default_loader(spec, device, calibration)
        self.reference, self.step = reference, step
        self.keep_reference = any(c == reference for c in candidates)
        self.ref_engine = None

    def get(self, variant: Variant, k: int):
        if variant == self.reference and self.ref_engine is not None:
            return self.ref_engine
        self.step(k)(0.0, f"Loading {variant.label}")
        eng = self.load(variant, lambda f, m: self.step(k)(0.3 * f, m))
        if variant == self.reference and k == 0:
            self.ref_engine = eng
        return eng

    def done_with(self, eng) -> None:
        if eng is self.ref_engine:
            if self.keep_reference:
                return
            self.ref_engine = None
        if self.owned:
            eng.unload()

    def close(self) -> None:
        if self.ref_engine is not None:
            self.keep_reference = False
            self.done_with(self.ref_engine)


@dataclass
class _Plan:
    """The document as the run scores it: its ids, its windows and the scored positions, and the key of the
    reference's kept pass."""
    doc: list[int]
    windows: list[Window]
    positions: list[int]
    full: bool  # the reference keeps the full vocabulary (else its top-k and a tail)
    meta: dict


def plan(spec, engine, doc_text: str, reference: Variant, window: int, stride: int, top_k: int,
         device: str | None) -> _Plan:
    """Tokenize with the reference's tokenizer (every variant of one model shares it) and cut the windows."""
    from core.engines.device import current_device

    doc = engine.encode_plain(doc_text)
    windows = plan_windows(len(doc), window, stride, engine.max_positions, len(engine.bos_ids))
    positions = _scored_positions(windows)
    full = len(positions) * engine.vocab_size * 4 <= refcache.FULL_LIMIT_BYTES
    meta = refcache.key_meta(f"{spec.kind}:{spec.path}:{spec.label}:{current_device(device).kind}", reference.name,
                             "auto", refcache.document_hash(doc), window, stride, 0 if full else top_k)
    return _Plan(doc, windows, positions, full, meta)


def reference_row(engine, p: _Plan, reference: Variant, top_k: int, decode_tokens: int, use_cache: bool,
                  progress: Progress, should_stop) -> tuple[dict, dict, str | None]:
    """(the reference's kept arrays, its table row, its cache file): read back from the kept pass when one
    matches, else computed and kept. The row carries the reference's own noise floor (log_loss_noise)."""
    cached = refcache.load(p.meta) if use_cache else None
    if cached is not None:
        progress(1.0, "Reference read from its kept pass")
        ref = {k: v for k, v in cached.items() if k not in ("row", "path")}
        row = dict(cached["row"], reused=True)
        row.setdefault("log_loss_noise", log_loss_noise(ref["target_lp"].tolist()))
        return ref, row, cached["path"]
    ref, timing = _reference_pass(engine, p.doc, p.windows, top_k, p.full, lambda f, m: progress(0.3 + 0.6 * f, m),
                                  should_stop)
    target = ref["target_lp"].tolist()
    row = {"name": reference.name, "label": reference.label, "role": "reference",
           "perplexity": metrics.perplexity(target), "log_loss_noise": log_loss_noise(target), "kld": None,
           "same_top": None, "rms_dp": None, **timing, **_engine_numbers(engine, p.doc, decode_tokens)}
    path = str(refcache.save(p.meta, ref, row)) if use_cache else None
    row["reused"] = False
    return ref, row, path


def candidate_row(engine, p: _Plan, ref: dict, cand: Variant, decode_tokens: int, progress: Progress,
                  should_stop) -> dict:
    """One candidate's table row: its pass over the windows against the reference's kept one."""
    got, timing = _candidate_pass(engine, p.doc, p.windows, ref, lambda f, m: progress(0.3 + 0.6 * f, m),
                                  should_stop, cand.name)
    ref_top1 = ref["top1"].tolist()
    return {"name": cand.name, "label": cand.label, "role": "candidate",
            "perplexity": metrics.perplexity(got["target_lp"]),
            "kld": metrics.kld_summary(got["kl"]), "same_top": metrics.same_top(ref_top1, got["top1"]),
            "rms_dp": metrics.rms_delta_p(ref["target_lp"].tolist(), got["target_lp"]), **timing,
            **_engine_numbers(engine, p.doc, decode_tokens), "kld_values": got["kl"],
            "worst": _worst(engine, p.doc, p.positions, got["kl"], ref_top1, got["top1"])}


def run(spec, doc_text: str, reference: Variant, candidates: list[Variant], *, window: int = DEFAULT_WINDOW,
        stride: int = DEFAULT_STRIDE, top_k: int = refcache.DEFAULT_TOP_K, device: str | None = None,
        decode_tokens: int = DECODE_TOKENS,
        calibration: str | None = None, document_name: str = "document", use_cache: bool = True,
        load: Callable | None = None, progress: Progress = _noop, should_stop=None,
        on_result: Callable[[dict], None] = _noop) -> dict:
    """The quality table of `candidates` against `reference` over the document. `load(variant, progress)` gives an
    engine (default: a fresh TorchEngine, unloaded after its pass; a caller's loader keeps its engines).
    Progress counts windows: the reference's, then each candidate's."""
    from core.textfile import check_text

    check_text(doc_text, document_name)
    check_windows(window, stride)
    if not candidates:
        raise InputError("Name at least one candidate precision.")
    steps = 1 + len(candidates)
    t_start = time.perf_counter()

    def step(k: int):
        return lambda f, m: progress((k + min(max(f, 0.0), 1.0)) / steps, f"{m} (precision {k + 1} of {steps})")

    engines = _Engines(load, spec, device, calibration, reference, candidates, step)
    try:
        ref_engine = engines.get(reference, 0)
        p = plan(spec, ref_engine, doc_text, reference, window, stride, top_k, device)
        ref, ref_row, cache_path = reference_row(ref_engine, p, reference, top_k, decode_tokens, use_cache, step(0),
                                                 should_stop)
        engines.done_with(ref_engine)
        on_result(ref_row)
        rows = [ref_row]
        for k, cand in enumerate(candidates, start=1):
            eng = engines.get(cand, k)
            try:
                row = candidate_row(eng, p, ref, cand, decode_tokens, step(k), should_stop)
            finally:
                engines.done_with(eng)
            on_result(row)
            rows.append(row)
    finally:
        engines.close()
    progress(1.0, "done")
    return {"model": spec.label, "reference": reference.name, "candidates": [c.name for c in candidates],
            "document": {"name": document_name, "sha256": p.meta["document_sha256"], "tokens": len(p.doc),
                         "chars": len(doc_text)},
            "window": window, "stride": stride, "windows": len(p.windows), "positions": len(p.positions),
            "reference_cache": {"path": cache_path, "reused": ref_row["reused"],
                                "kept": "full vocabulary" if p.full else f"top-{top_k} log-probs + tail"},
            "calibration": "shipped sample prose" if calibration is None else f"user text ({len(calibration):,} chars)",
            "rows": rows, "total_s": time.perf_counter() - t_start}
