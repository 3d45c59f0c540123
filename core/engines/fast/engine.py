"""FastLlamaEngine: TorchEngine's public methods over the compact decoder (static KV cache + CUDA-graph decode).

Prompts are prefilled with torch ops (one pass per prompt length), then every further token is one replay of a
captured decode step. Rows keep their own positions, so prompts of different lengths need no padding.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import torch

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
    report_prefill,
    stop_if_asked,
)
from core.engines.hf_side import HFSide, pick_next, score_from_logprobs
from core.engines.device import available_bytes, count_weight_bytes, current_device
from core.engines.fast import fa3
from core.errors import InputError
from core.engines.fast.graph import DecodeGraph
from core.engines.fast.methods import method_for, tuner, tuning
from core.engines.fast.model import Dims, FastLlama, fp8_fast_accum
from core.fmt import GIB
from core.models import ModelError, ModelSpec, load_config, synthetic_config, trust_remote_code
from core.precision import KVDtype, Precision, unsupported_reasons

GRAPH_TOP_K = 20  # GenerationParams allows at most 20 alternatives; one graph serves every request
LEN_BUCKET = 256  # caches (and graphs) are sized in steps of this many tokens so similar requests reuse them


class FastLlamaEngine(HFSide):
    name = "torch-fast"

    def __init__(self, spec: ModelSpec, precision: Precision, kv_dtype: KVDtype = KVDtype.AUTO,
                 device: str | None = None, progress: Callable[[float, str], None] | None = None, seed: int = 0,
                 tune: bool = False, calibration: str | None = None):
        """calibration: INT4 AWQ's calibration text (None: the shipped sample prose), as for TorchEngine."""
        from core.engines.fast.support import fast_decode_unavailable_reasons

        self.spec, self.precision, self.kv_dtype = spec, precision, kv_dtype
        self.device = current_device(device)
        self.dtype = torch.bfloat16
        self.lock = threading.Lock()
        self.last_kv_bytes = 0
        progress = progress or (lambda f, m: None)
        if spec.kind not in ("synthetic", "hf_dir"):
            raise UnsupportedCombination([f"The fast decode engine loads synthetic Llama shapes and Hugging Face "
                                          f"Llama directories; {spec.label} is neither. Use the torch engine."])
        config = synthetic_config(spec.path) if spec.kind == "synthetic" else load_config(spec)
        reasons = self.unsupported_reasons(precision, kv_dtype) + fast_decode_unavailable_reasons(
            self.device, precision, kv_dtype, config)
        if reasons:
            raise UnsupportedCombination(list(dict.fromkeys(reasons)))
        need = count_weight_bytes(config, precision)
        free = available_bytes(self.device)
        if need > 0.85 * free:
            raise EngineError(
                f"{spec.label} at {precision.label} needs about {need / GIB:.1f} GiB for its weights; only "
                f"{free / GIB:.1f} GiB is free on {self.device.name}. Pick a smaller model or a lower precision.")
        torch.cuda.reset_peak_memory_stats()
        dims = Dims.from_config(config)
        method = method_for(precision)
        progress(0.1, f"Loading weights at {precision.label}")
        awq = method.needs_calibration
        if spec.kind == "synthetic":
            weights = FastLlama.random_weights(dims, "cuda", seed=seed)
            self.tokenizer = ByteTokenizer()
            self.eos_ids: set[int] = set()
            if awq:  # the search on this model's own activations, as the torch engine searches on its model's
                from core.engines.torch import quant

                progress(0.5, "Searching AWQ scales on the calibration text")
                weights |= FastLlama.awq_scales(dims, weights, quant.calibration_ids(self.tokenizer, calibration),
                                                rotary=config)
        else:
            weights, self.tokenizer, self.eos_ids = self._load_hf(spec, dims, progress, awq, calibration)
        progress(0.8, "Quantizing Linear weights to FP8 E4M3" if precision.is_fp8 else
                 f"Quantizing Linear weights to {precision.label}" if precision.is_int else "Preparing")
        self.model = FastLlama(dims, weights, precision, rotary=config)
        if tune:  # time the candidates on this GPU for this model's shapes (~10 s per precision)
            progress(0.9, "Tuning the decode kernels on this GPU")
            tuner.tune_model(dims, [method], [1, 8, 64], log=lambda *a: None)
        else:  # this GPU's shipped winners, or those of one with the same SM; other shapes use the defaults
            tuning.load_for(self.device)
        del weights
        self.config = config
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self._runner: tuple[tuple[int, int], DecodeGraph] | None = None
        progress(1.0, "Loaded")

    @staticmethod
    def _load_hf(spec: ModelSpec, dims: Dims, progress, awq: bool = False, calibration: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            trust = trust_remote_code()
            hf = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.bfloat16, trust_remote_code=trust)
            tokenizer = AutoTokenizer.from_pretrained(spec.path, trust_remote_code=trust)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"Could not load {spec.label}: {exc}") from exc
        progress(0.5, "Moving weights to the GPU")
        awq_scales = {}
        if awq:
            # the torch engine's own search (quant.quantize_model's): the HF model's activations on the calibration
            # text, on the GPU, so the scales, hence the INT4 codes, are the torch engine's
            from core.engines.torch import quant

            progress(0.4, "Searching AWQ scales on the calibration text")
            hf.to("cuda")
            awq_scales = FastLlama.hf_awq_scales(hf, quant.calibration_ids(tokenizer, calibration), dims)
        weights = FastLlama.fuse_hf_state_dict(hf.state_dict(), dims, "cuda") | awq_scales
        eos = getattr(hf.generation_config, "eos_token_id", None)
        del hf
        return weights, tokenizer, set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    @property
    def ran(self) -> str:
        from core.engines.fast import kernels as K

        d = self.model.dims
        at_batch_1 = (["programmatic dependent launch"] if K.pdl_available() else []) + (
            ["norms folded into the linears"] if DecodeGraph.default_folds(self.model, 1) else [])
        extra = f", {' and '.join(at_batch_1)} at batch 1" if at_batch_1 else ""
        if self.model.method.e4m3_inputs and fp8_fast_accum():
            extra += ", prompt GEMMs with FP8 fast accumulation"
        if self.model.method.label():
            extra += f", {self.model.method.label()}"
        if self.kv_dtype is KVDtype.FP8:
            from core.engines.fast.kernels import attn_e4m3

            why = attn_e4m3.why_not(self.device.kind, d.heads, d.kv_heads, d.head_dim)
            extra += (", decode attention over the E4M3 cache in CUDA C++ (NVRTC)" if why is None else
                      f", decode attention over the E4M3 cache in Triton (the CUDA C++ kernel: {why})")
        why = fa3.why_not(self.model.device, d.heads, d.kv_heads, d.head_dim)
        extra += (", prompt attention through FlashAttention-3 (BF16)" if why is None else
                  f", prompt attention through SDPA (cuDNN where it runs; FlashAttention-3: {why})")
        return f"torch fast path (CUDA graphs, Triton kernels{extra}) on {self.device.name}"

    @property
    def ran_short(self) -> str:
        return f"fast path · {self.device.name}"

    def unsupported_reasons(self, precision: Precision, kv_dtype: KVDtype) -> list[str]:
        return unsupported_reasons(precision, kv_dtype, self.device, engine="torch")


    # ---- generation ----
    def stream(self, prompt, params: GenerationParams) -> Iterator[StreamEvent]:
        ids = self.encode(prompt)
        yield from self._decode([ids], params.validated(), [Generation(ids)], None)

    def generate(self, prompts, params: GenerationParams, on_step=None, should_stop=None) -> list[Generation]:
        params = params.validated()
        if not prompts:
            raise InputError("Give at least one prompt.")
        ids = [self.encode(p) for p in prompts]
        gens = [Generation(i) for i in ids]
        for event in self._decode(ids, params, gens, should_stop):
            if on_step:
                on_step(event)
        for g in gens:
            g.text = self.decode(g.token_ids)
        return gens

    def _runner_for(self, batch: int, need: int) -> DecodeGraph:
        max_len = -(-need // LEN_BUCKET) * LEN_BUCKET
        if self.max_positions:
            max_len = min(max_len, self.max_positions)
        if self._runner and self._runner[0][0] == batch and self._runner[0][1] >= need:
            return self._runner[1]
        self._runner = None  # free the old cache and graph first
        torch.cuda.empty_cache()
        cache = self.model.new_cache(batch, max_len, self.kv_dtype is KVDtype.FP8)
        self._runner = ((batch, max_len), DecodeGraph(self.model, cache, top_k=GRAPH_TOP_K))
        return self._runner[1]

    @torch.inference_mode()
    def _decode(self, ids: list[list[int]], params: GenerationParams, gens: list[Generation],
                should_stop) -> Iterator[StreamEvent]:
        self.check_lengths(ids, params)
        with self.lock:
            self._ensure_loaded()
            B = len(ids)
            lens = [len(i) for i in ids]
            runner = self._runner_for(B, max(lens) + params.max_new_tokens)
            cache = runner.cache
            gen = torch.Generator(device="cuda")
            if params.seed is not None:
                gen.manual_seed(params.seed)
            k = params.top_logprobs
            done = [False] * B
            t0 = time.perf_counter()
            # A stop is checked before each prompt pass; one pass runs whole (on a GPU, well under a second at the
            # context lengths this engine serves).
            check_stop(should_stop)
            if len(set(lens)) == 1:
                logits = self.model.prefill(torch.tensor(ids, device="cuda"), cache, rows=slice(0, B))
            else:
                parts = []
                for b, row in enumerate(ids):
                    check_stop(should_stop)
                    parts.append(self.model.prefill(torch.tensor([row], device="cuda"), cache, rows=slice(b, b + 1)))
                    report_prefill(sum(lens[:b + 1]), sum(lens))
                logits = torch.cat(parts)
            report_prefill(sum(lens), sum(lens))
            lp = torch.log_softmax(logits.float(), dim=-1)
            pos = torch.tensor(lens, device="cuda")
            for step in range(params.max_new_tokens):
                stop_if_asked(should_stop, gens, done)
                if step > 0:
                    out = runner.step()
                    lp = out["logprobs"]
                if params.temperature == 0:
                    nxt = lp.argmax(dim=-1) if step == 0 else out["next"]
                else:
                    nxt = pick_next(lp, params, gen)
                if step == 0:
                    runner.set_state(nxt, pos)
                elif params.temperature != 0:
                    runner.tokens.copy_(nxt)  # the replay advanced with argmax; overwrite with the sample
                top = None
                if k:
                    top = lp.topk(k, dim=-1) if step == 0 else (out["top_values"][:, :k], out["top_ids"][:, :k])
                emitted, now = append_step(gens, done, nxt, lp.gather(1, nxt[:, None])[:, 0], top, t0, self.eos_ids,
                                           params.stop_at_eos)
                yield StreamEvent(step, emitted, [self.decode(g.token_ids) for g in gens], now)
                if all(done):
                    break
            # tokens in the cache: each prompt plus what it generated (the last token was never written back)
            self.last_kv_bytes = cache.bytes_per_token() * sum(len(g.prompt_ids) + max(len(g.token_ids) - 1, 0)
                                                               for g in gens)

    # ---- teacher-forced scoring ----
    @torch.inference_mode()
    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 8, full: bool = False) -> Score:
        """One pass over prompt + continuation; position i scores continuation_ids[i] (as TorchEngine.score)."""
        if not prompt_ids or not continuation_ids:
            raise InputError("Scoring needs a non-empty prompt and continuation.")
        with self.lock:
            self._ensure_loaded()
            ids = list(prompt_ids) + list(continuation_ids)
            cache = self.model.new_cache(1, len(ids), self.kv_dtype is KVDtype.FP8)
            logits = self.model.prefill(torch.tensor([ids], device="cuda"), cache, all_logits=True)[0]
            n = len(continuation_ids)
            lp = torch.log_softmax(logits[len(prompt_ids) - 1: len(prompt_ids) - 1 + n].float(), dim=-1)
            return score_from_logprobs(lp, continuation_ids, top_k, full)

    @torch.inference_mode()
    def window_logprobs(self, ids: list[int], keep: int) -> tuple[torch.Tensor, float]:
        """As TorchEngine.window_logprobs: log-softmax at the last keep - 1 positions of one pass, and its seconds."""
        with self.lock:
            self._ensure_loaded()
            t0 = time.perf_counter()
            cache = self.model.new_cache(1, len(ids), self.kv_dtype is KVDtype.FP8)
            logits = self.model.prefill(torch.tensor([ids], device="cuda"), cache, all_logits=True)[0]
            torch.cuda.synchronize()
            forward_s = time.perf_counter() - t0
            return torch.log_softmax(logits[len(ids) - keep: len(ids) - 1].float(), dim=-1), forward_s

    @property
    def vocab_size(self) -> int:
        return self.model.dims.vocab

    # ---- memory ----
    def memory_report(self) -> MemoryReport:
        self._ensure_loaded()
        return MemoryReport(self.model.weight_bytes_by_dtype(), self.last_kv_bytes, torch.cuda.max_memory_allocated(),
                            "CUDA allocator (torch.cuda.max_memory_allocated)", self.device.name)

    def _ensure_loaded(self) -> None:
        # The pool unloads under self.lock, so a check made holding the lock stays true for the whole call.
        if self.model is None:
            raise EngineUnloaded(f"{self.spec.label} at {self.precision.label}")

    def unload(self) -> None:
        self._runner = None
        self.model = None
        torch.cuda.empty_cache()
