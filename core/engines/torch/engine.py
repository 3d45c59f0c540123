"""The default engine: a transformers model in this process at a chosen precision, with our own decode loop.

Our own loop (rather than `generate`) gives per-token timestamps, top-k logprobs at every position, streaming,
cancellation and an FP8 KV cache, and skips `generate`'s per-step bookkeeping.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from transformers.cache_utils import DynamicCache

from core.engines.torch import fp8, fp8_cpu, int_cpu, quant
from core.engines.torch import cpu_fast
from core.engines.torch.kv import JOINABLE, cache_bytes, join_caches, make_cache
from core.engines.base import (
    ByteTokenizer,
    EngineError,
    EngineUnloaded,
    Generation,
    GenerationParams,
    MemoryReport,
    Score,
    StreamEvent,
    UnsupportedCombination,
    append_step,
    check_stop,
    length_groups,
    report_prefill,
    stop_if_asked,
)
from core.engines.device import (  # noqa: F401 - count_weight_bytes, load_peak_bytes: this engine's sizes, for tests
    available_bytes, count_weight_bytes, current_device, fit_problem, load_peak_bytes)
from core.engines.hf_side import HFSide, pick_next, score_from_logprobs
from core.models import (ModelError, ModelSpec, damaged_gguf, embedded_model_dir, load_config,
                         synthetic_config, trust_remote_code)
from core.errors import InputError
from core.precision import KVDtype, Precision, unsupported_reasons
from core.telemetry import run_peak
from core.telemetry.run_peak import RunPeakRss

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# Prompts share a prefill pass when left padding adds at most this many tokens to it; the passes then decode as one
# batch (on a CPU a decode step costs ~0.1 s, most of it reading the weights, the same for one row or eight).
PREFILL_PAD_TOKENS = 256
# A prompt goes through the model in chunks of PREFILL_CHUNK tokens so that a stop lands between two of them: about
# 1 s of CPU for the embedded model on 2 cores (it prefilled 260-300 tokens/s at BF16 on 2 busy cores:
# docs/perf-log/long-context.md, "Stopping a run"). The size is fixed, not fitted to measured time: chunk boundaries
# change the last bits of the logits, and a prompt must score the same bits on every run (the compare's metrics rest
# on it).
PREFILL_CHUNK = 256


def left_padded(rows: list[list[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids as one batch, each row left-padded with `pad` to the longest (so every row's next token lands in the
    same column), and the attention mask that hides the padding."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


@dataclass
class PromptPass:
    """What a generation's prompt pass computed, kept for scoring continuations of the same prompts afterwards: a
    copy of the cache as it stood before the first decode step, the attention mask over its columns (left padding
    hidden), and each row's log-probabilities at its last prompt position (which predict the first new token)."""

    cache: DynamicCache
    mask: torch.Tensor
    first_logprobs: torch.Tensor


class TorchEngine(HFSide):
    name = "torch"

    def __init__(self, spec: ModelSpec, precision: Precision, kv_dtype: KVDtype = KVDtype.AUTO,
                 device: str | None = None, progress: Callable[[float, str], None] | None = None,
                 calibration: str | None = None):
        self.spec, self.precision, self.kv_dtype = spec, precision, kv_dtype
        self.device = current_device(device)
        self.dtype = DTYPES[precision.base_dtype]
        self.lock = threading.Lock()  # one generation at a time per loaded model; sessions queue here
        self.last_kv_bytes = 0
        self.last_run_peak_bytes: int | None = None  # CPU only: the last generation's or scoring's own peak
        progress = progress or (lambda f, m: None)

        reasons = self.unsupported_reasons(precision, kv_dtype)
        if reasons:
            raise UnsupportedCombination(reasons)
        progress(0.0, f"Preparing {spec.label}")
        model_dir = embedded_model_dir(lambda f, m: progress(0.6 * f, m)) if spec.kind == "embedded" else None
        config = synthetic_config(spec.path) if spec.kind == "synthetic" else load_config(spec)
        problem = fit_problem(spec, config, precision, self.device, available_bytes(self.device))
        if problem:
            raise EngineError(problem)
        progress(0.65, f"Loading weights at {precision.label}")
        if self.device.kind == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.model, self.tokenizer = self._load(spec, config, model_dir)
        if precision.is_fp8:
            progress(0.9, "Quantizing Linear weights to FP8 E4M3")
            self.n_fp8_linears = fp8.quantize_linears(self.model, w8a8=precision is Precision.FP8)
        elif precision.is_int:  # calibration: AWQ's text (None: the shipped sample prose)
            progress(0.9, f"Quantizing Linear weights to {precision.label}")
            self.quant_info = quant.quantize_model(self.model, precision,
                                                   quant.calibration_ids(self.tokenizer, calibration))
        self.model.eval()
        # An inference engine's weights never need gradients. With them, a call outside inference_mode (a test, a
        # bench, a helper) runs the oneDNN-packed lm_head through autograd: 3 s a row instead of 12 ms on an AVX-512
        # EPYC, a 981-token prefill 13 s instead of 1.3 s.
        self.model.requires_grad_(False)
        # after quantizing: the fast path packs the linears left at the base dtype (all of them at FP32/BF16, lm_head
        # at FP8 and the integer precisions)
        self.cpu_fast = (cpu_fast.speed_up(self.model, available_bytes(self.device)) if self.device.kind == "cpu"
                         else [])
        self.config = self.model.config
        eos = getattr(self.model.generation_config, "eos_token_id", None) if not spec.random_weights else None
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.max_positions = getattr(self.config, "max_position_embeddings", None)
        progress(1.0, "Loaded")

    @property
    def ran(self) -> str:
        text = f"torch eager on {self.device.name}"
        if self.precision.is_fp8 and self.device.kind == "cpu":  # which FP8 Linear path executes (fp8.py)
            text += (f", FP8 linears through the C kernel ({fp8_cpu.isa()})" if fp8_cpu.available()
                     else ", FP8 linears dequantized eagerly")
        if self.precision.is_int and self.precision is not Precision.INT8 and self.device.kind == "cpu":
            text += (", integer weights dequantized in C" if int_cpu.available()
                     else ", integer weights dequantized by torch ops")
        if self.precision.is_int and self.device.kind == "cuda":
            # the reference numerics, one torch op after another: the fast path's integer kernels are the speed
            text += (", integer linears as torch ops one at a time: eager GPU integer runs are not representative "
                     "of integer speed")
        return ", ".join([text] + self.cpu_fast)

    @property
    def ran_short(self) -> str:
        return f"torch eager · {self.device.name}"

    def unsupported_reasons(self, precision: Precision, kv_dtype: KVDtype) -> list[str]:
        return unsupported_reasons(precision, kv_dtype, self.device, engine="torch")

    def _load(self, spec: ModelSpec, config, model_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = self.device.kind
        try:
            if spec.kind == "synthetic":
                with torch.device(dev):
                    model = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
                # from_config on CPU already draws random weights; make the scale sane for bf16/fp16 activations
                with torch.no_grad():
                    for p in model.parameters():
                        if p.dim() > 1:
                            p.normal_(0.0, 0.02)
                return model, ByteTokenizer()
            if spec.kind == "gguf":
                p = Path(spec.path)
                kw = dict(gguf_file=p.name)
                src = str(p.parent)
            else:
                kw, src = {}, str(model_dir or spec.path)
            trust = trust_remote_code()
            model = AutoModelForCausalLM.from_pretrained(src, dtype=self.dtype, trust_remote_code=trust, **kw)
            tokenizer = AutoTokenizer.from_pretrained(src, trust_remote_code=trust, **kw)
        except Exception as exc:  # noqa: BLE001 - a user's file that fails to parse gets one clear message
            if spec.kind == "gguf":
                raise damaged_gguf(Path(spec.path), exc) from exc
            if not isinstance(exc, (OSError, ValueError, KeyError)):
                raise
            raise ModelError(f"Could not load {spec.label}: {exc}") from exc
        return model.to(dev), tokenizer

    # ---- generation ----
    def stream(self, prompt: str | list[int], params: GenerationParams) -> Iterator[StreamEvent]:
        ids = self.encode(prompt)
        yield from self._decode([ids], params.validated(), [Generation(ids)], None)

    def generate(self, prompts, params: GenerationParams, on_step=None, should_stop=None) -> list[Generation]:
        return self._generate(prompts, params, on_step, should_stop, None)

    def generate_keeping_prompt_pass(self, prompts, params: GenerationParams,
                                     should_stop=None) -> tuple[list[Generation], PromptPass | None]:
        """`generate`, and what its prompt pass computed, for `score_after_prompt_pass` (None where this model's
        cache layers cannot be copied row by row or the copy would not fit: `_can_keep`)."""
        kept: list[PromptPass] = []
        gens = self._generate(prompts, params, None, should_stop, kept)
        return gens, (kept[0] if kept else None)

    def _generate(self, prompts, params: GenerationParams, on_step, should_stop, kept: list | None):
        params = params.validated()
        if not prompts:
            raise InputError("Give at least one prompt.")
        if any(isinstance(p, str) and not p.strip() for p in prompts):
            raise InputError("A prompt is empty; type some text.")
        ids = [self.encode(p) for p in prompts]
        gens = [Generation(i) for i in ids]
        for event in self._decode(ids, params, gens, should_stop, kept):
            if on_step:
                on_step(event)
        for g in gens:
            g.text = self.decode(g.token_ids)
        return gens

    @torch.inference_mode()
    def _decode(self, ids: list[list[int]], params: GenerationParams, gens: list[Generation],
                should_stop, kept: list | None = None) -> Iterator[StreamEvent]:
        self.check_lengths(ids, params)
        with self.lock, self._run_peak():
            self._ensure_loaded()
            dev = self.device.kind
            batch = len(ids)
            pad = self.tokenizer.pad_token_id or 0
            input_ids, mask = left_padded(ids, pad, dev)
            gen = torch.Generator(device=dev)
            if params.seed is not None:
                gen.manual_seed(params.seed)
            cache = make_cache(self.config, self.kv_dtype)
            groups = length_groups([len(i) for i in ids], pad_tokens=PREFILL_PAD_TOKENS)
            if len(groups) > 1 and not all(type(layer) in JOINABLE for layer in cache.layers):
                groups = [list(range(batch))]
            done = [False] * batch
            past = 0
            t0 = time.perf_counter()
            for step in range(params.max_new_tokens):
                stop_if_asked(should_stop, gens, done)
                if step == 0 and len(groups) > 1:
                    logits, cache = self._prefill_groups(ids, groups, pad, should_stop)
                elif step == 0:
                    logits = self._prefill(input_ids, mask, cache, 0, 1, should_stop)[:, -1, :]
                else:
                    logits = self._last_logits(input_ids, mask, cache, past)
                past += input_ids.shape[1]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                if step == 0 and kept is not None and self._can_keep(cache):
                    rows = torch.arange(batch, device=dev)  # a copy: the decode steps append to `cache`
                    kept.append(PromptPass(join_caches([cache], rows, self.config, self.kv_dtype), mask, logprobs))
                nxt = pick_next(logprobs, params, gen)
                k = params.top_logprobs
                emitted, now = append_step(gens, done, nxt, logprobs.gather(1, nxt[:, None])[:, 0],
                                           logprobs.topk(k, dim=-1) if k else None, t0, self.eos_ids,
                                           params.stop_at_eos)
                yield StreamEvent(step, emitted, [self.decode(g.token_ids) for g in gens], now)
                if all(done):
                    break
                input_ids = nxt[:, None]
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=dev)], dim=1)
            self.last_kv_bytes = cache_bytes(cache)

    def _can_keep(self, cache: DynamicCache) -> bool:
        """Whether a copy of the prompt pass's cache can be kept: its layers join row by row, and the copy takes at
        most a quarter of the memory free now (a compare holds one side's copy while the other side generates,
        beside that side's own cache and copy; past that, scoring runs the prompts again instead)."""
        return (all(type(layer) in JOINABLE for layer in cache.layers)
                and cache_bytes(cache) <= available_bytes(self.device) // 4)

    def _forward(self, input_ids, mask, cache: DynamicCache, past: int, keep: int) -> torch.Tensor:
        """One forward pass of the new tokens `input_ids` after `past` cached columns (`mask` covers both) into
        `cache`: the logits of each row's last `keep` positions. Positions count each row's real tokens, so a
        left-padded row starts at 0 and the pad columns sit at 0 too (the mask keeps them out)."""
        q = input_ids.shape[1]
        return self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)[:, -q:],
            past_key_values=cache, cache_position=torch.arange(past, past + q, device=input_ids.device),
            use_cache=True, logits_to_keep=keep,
        ).logits

    def _last_logits(self, input_ids, mask, cache: DynamicCache, past: int) -> torch.Tensor:
        return self._forward(input_ids, mask, cache, past, 1)[:, -1, :]

    def _prefill(self, input_ids, mask, cache: DynamicCache, past: int, keep: int, should_stop=None,
                 done_before: int = 0, total: int | None = None) -> torch.Tensor:
        """`_forward` of a prompt in chunks of PREFILL_CHUNK tokens, checking for a stop before each: the same logits of the last
        `keep` positions as one pass (tests/engines/test_torch_engine.py), but a stop lands within a chunk's time.
        Reports prompt tokens done (after `done_before` of `total`) to the caller's RunControl."""
        n = input_ids.shape[1]
        total = total or n
        done, size = 0, PREFILL_CHUNK
        # a chunk is run alone only while what it leaves still holds the `keep` positions whose logits are returned
        while n - done - size >= max(keep, 1):
            check_stop(should_stop)
            self._forward(input_ids[:, done:done + size], mask[:, :past + done + size], cache, past + done, 1)
            done += size
            report_prefill(done_before + done, total)
        check_stop(should_stop)
        logits = self._forward(input_ids[:, done:], mask, cache, past + done, keep)
        report_prefill(done_before + n, total)
        return logits

    def _prefill_groups(self, ids: list[list[int]], groups: list[list[int]], pad: int, should_stop=None):
        """The first step of a batch whose prompts differ in length: each group of similar lengths is prefilled in
        its own pass (a long prompt would pad every short one to its length), then the caches join into one for the
        batch's decode steps, which read the weights once for every row. Returns the last position's logits in the
        batch's row order and the joined cache."""
        dev = self.device.kind
        logits, parts = [], []
        widths = [max(len(ids[i]) for i in g) for g in groups]
        for j, group in enumerate(groups):
            cache = make_cache(self.config, self.kv_dtype)
            g_ids, g_mask = left_padded([ids[i] for i in group], pad, dev)
            logits.append(self._prefill(g_ids, g_mask, cache, 0, 1, should_stop, sum(widths[:j]),
                                        sum(widths))[:, -1, :])
            parts.append(cache)
        order = [i for g in groups for i in g]  # row of the concatenated groups -> row of the batch
        where = torch.tensor(sorted(range(len(order)), key=order.__getitem__), device=dev)
        return torch.cat(logits).index_select(0, where), join_caches(parts, where, self.config, self.kv_dtype)

    # ---- teacher-forced scoring ----
    @torch.inference_mode()
    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 8, full: bool = False) -> Score:
        """One forward pass over prompt + continuation; position i scores continuation_ids[i]."""
        if not prompt_ids or not continuation_ids:
            raise InputError("Scoring needs a non-empty prompt and continuation.")
        with self.lock, self._run_peak():
            self._ensure_loaded()
            ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], device=self.device.kind)
            cache = make_cache(self.config, self.kv_dtype)
            n = len(continuation_ids)
            # Only the n positions that predict the continuation (plus the last, dropped): full-vocabulary logits
            # at every prompt position would cost ~4 GiB at 8K tokens for a 262K vocabulary.
            logits = self._prefill(ids, torch.ones_like(ids), cache, 0, n + 1)[0]
            lp = torch.log_softmax(logits[:n].float(), dim=-1)
            return score_from_logprobs(lp, continuation_ids, top_k, full)

    @torch.inference_mode()
    def score_after_prompt_pass(self, kept: PromptPass, rows: list[int], continuations: list[list[int]],
                                top_k: int = 8, full: bool = False) -> list[Score]:
        """Teacher-forced scores of continuations[j] after the prompt of row rows[j] of a kept prompt pass: only
        the continuation goes through the model, its first token's prediction is the pass's own last position, and
        the prompt's K/V come from the kept cache, so a long prompt is not run again. The same function as `score`
        on the same ids (equal up to float rounding: tests/engines/test_torch_engine.py)."""
        if not rows or any(not c for c in continuations) or len(rows) != len(continuations):
            raise InputError("Scoring needs a non-empty continuation for each prompt.")
        with self.lock, self._run_peak():
            self._ensure_loaded()
            dev = self.device.kind
            where = torch.tensor(rows, device=dev)
            n = max(len(c) for c in continuations) - 1  # tokens to feed: each continuation but its last
            rest = None
            if n:
                pad = self.tokenizer.pad_token_id or 0
                # right padding: it follows every real token, so causal attention keeps it out of their positions
                ids = torch.tensor([list(c[:-1]) + [pad] * (n + 1 - len(c)) for c in continuations], device=dev)
                mask = torch.cat([kept.mask.index_select(0, where), torch.ones_like(ids)], dim=1)
                # a copy of the kept rows: the pass appends to the cache it is given
                cache = join_caches([kept.cache], where, self.config, self.kv_dtype)
                logits = self._forward(ids, mask, cache, kept.mask.shape[1], n)
                rest = torch.log_softmax(logits.float(), dim=-1)
            scores = []
            for j, (r, cont) in enumerate(zip(rows, continuations)):
                lp = kept.first_logprobs[r:r + 1]
                if len(cont) > 1:
                    lp = torch.cat([lp, rest[j, :len(cont) - 1]])
                scores.append(score_from_logprobs(lp, cont, top_k, full))
            return scores

    @torch.inference_mode()
    def score_many(self, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
        """Teacher-forced scores of several (prompt, continuation) pairs in one forward pass.

        Same numerics as `score` (a fresh cache of the engine's KV dtype, so an FP8 KV cache is applied to what
        attention reads), but left-padded and batched, and with logits only for the continuation positions."""
        if not items or any(not p or not c for p, c in items):
            raise InputError("Scoring needs a non-empty prompt and continuation.")
        dev = self.device.kind
        pad = self.tokenizer.pad_token_id or 0
        seqs = [list(p) + list(c) for p, c in items]
        width = max(len(s) for s in seqs)
        keep = max(len(c) for _, c in items) + 1  # the last column predicts past the sequence; kept for simple slicing
        with self.lock, self._run_peak():
            self._ensure_loaded()
            check_stop()
            ids, mask = left_padded(seqs, pad, dev)
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=make_cache(self.config, self.kv_dtype), cache_position=torch.arange(width, device=dev),
                use_cache=True, logits_to_keep=keep,
            )
            return [score_from_logprobs(torch.log_softmax(out.logits[b, keep - 1 - len(c): keep - 1].float(), dim=-1),
                                        c, top_k, full=True) for b, (_, c) in enumerate(items)]

    @torch.inference_mode()
    def window_logprobs(self, ids: list[int], keep: int) -> tuple[torch.Tensor, float]:
        """Log-softmax over the vocabulary (float32, [keep - 1, V]) at the last keep - 1 positions of one cache-less
        pass over `ids` (position i predicts ids[i + 1]), and the seconds the forward pass took (synchronized)."""
        with self.lock:
            self._ensure_loaded()
            check_stop()
            t0 = time.perf_counter()
            logits = self.model(input_ids=torch.tensor([ids], device=self.device.kind), use_cache=False,
                                logits_to_keep=keep).logits[0, :-1]
            if self.device.kind == "cuda":
                torch.cuda.synchronize()
            forward_s = time.perf_counter() - t0
            return torch.log_softmax(logits.float(), dim=-1), forward_s

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # ---- the torch numerics, for the Quality page ----
    def linear_kernels(self) -> list[str]:
        """Which kernel each kind of quantized linear runs (core/engines/torch/quant.py's kernels())."""
        self._ensure_loaded()
        return quant.kernels(self.model)

    def calibrate_static_fp8(self, ids: list[int]) -> None:
        """Fix static per-tensor FP8 activation scales from a calibration pass over `ids` (FP8 W8A8 only)."""
        with self.lock:
            self._ensure_loaded()
            fp8.calibrate_static(self.model, ids)

    def layer_errors(self, ids: list[int]) -> list[dict]:
        """Per linear: each quantizer's relative output error against this (unquantized) model on `ids`."""
        with self.lock:
            self._ensure_loaded()
            return quant.layer_errors(self.model, ids)

    # ---- memory ----
    @contextlib.contextmanager
    def _run_peak(self):
        """Record this run's own peak memory: on CUDA the allocator's peak, reset here; on the CPU sampled RSS."""
        if self.device.kind == "cuda":
            torch.cuda.reset_peak_memory_stats()
            yield
            return
        with RunPeakRss() as peak:
            yield
        self.last_run_peak_bytes = peak.bytes

    def memory_report(self) -> MemoryReport:
        """Weights as the precision stores them, by dtype (a linear packed for oneDNN in place of its plain weight
        counts there: same dtype, same bytes); the fast path's extra copies apart (cpu_fast.runtime_copies)."""
        self._ensure_loaded()
        by_dtype: dict[str, int] = defaultdict(int)
        runtime: dict[str, int] = defaultdict(int)
        copies = cpu_fast.runtime_copies(self.model)
        seen: set[int] = set()
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN-packed weights have no storage pointer
            if key in seen:
                continue  # tied embeddings / lm_head count once
            seen.add(key)
            size = t.numel() * t.element_size()
            if id(t) in copies:
                runtime[copies[id(t)]] += size
            else:
                by_dtype[cpu_fast.dtype_name(t)] += size
        if self.device.kind == "cuda":
            peak, source = torch.cuda.max_memory_allocated(), "CUDA allocator (torch.cuda.max_memory_allocated)"
        elif self.last_run_peak_bytes is None:
            peak, source = None, "no generation on this model yet"
        else:
            peak, source = self.last_run_peak_bytes, run_peak.SOURCE
        return MemoryReport(dict(by_dtype), self.last_kv_bytes, peak, source, self.device.name, dict(runtime))

    def _ensure_loaded(self) -> None:
        # The pool unloads under self.lock, so a check made holding the lock stays true for the whole call.
        if self.model is None:
            raise EngineUnloaded(f"{self.spec.label} at {self.precision.label}")

    def unload(self) -> None:
        self.model = None
        if self.device.kind == "cuda":
            torch.cuda.empty_cache()
        else:  # glibc keeps freed weights mapped in its arenas: hand them back so the process's RSS falls
            import gc

            gc.collect()
            run_peak.trim_heap()
