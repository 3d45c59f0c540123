"""A compact Llama-family decoder at one precision, with its torch-op forward passes.

Why its own model rather than transformers': a decode step of HF `generate` on an H200 is 95% host overhead
(82 ms/step against a 3.7 ms bandwidth floor). Here a step is a fixed list of ~10 kernels per layer over
preallocated buffers (cache.py's StaticKVCache), so it can be captured once and replayed with one launch
(graph.py's DecodeGraph).

Two implementations of every op:
- torch ops (`prefill`, `decode_ref`): any device; the prompt pass and the CPU path; same math as HF eager and as
  the torch engine's quantized linears and FP8 KV cache, so tests can compare it with the eager reference directly;
- Triton kernels (`DecodeGraph`, and the fused prompt pass on CUDA).

Each projection is a `Linear`: its precision's method (methods/) plus its tensors. Weights are held fused (q|k|v and
gate|up); every method quantizes each output row on its own (per-channel or per-row-and-group scales), so
quantizing the fused matrix gives exactly the scales of quantizing each projection separately.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from core.engines.fast import fa3
from core.engines.fast.cache import StaticKVCache
from core.engines.fast.methods import Bf16, Linear, method_for
from core.engines.fast.options import options
from core.engines.torch import fp8
from core.precision import Precision


@dataclass(frozen=True)
class Dims:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    max_positions: int
    tie_embeddings: bool

    @classmethod
    def from_config(cls, c) -> "Dims":
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
                   c.num_key_value_heads, head_dim, c.vocab_size, c.rms_norm_eps, c.max_position_embeddings,
                   bool(getattr(c, "tie_word_embeddings", False)))

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def fp8_fast_accum() -> bool:
    """Whether the W8A8 prompt pass's FP8 GEMMs accumulate at the tensor cores' own precision, without promoting
    partial sums to float32, as vLLM's CUTLASS FP8 GEMMs on Hopper do (`...PingpongFP8FastAccum`): on the H200 the
    8K-token prompt pass 4-13% faster, and as far from BF16 as with promotion (docs/perf-log/fp8-h200.md).
    TRIAGE_FP8_FAST_ACCUM=0 promotes, as the torch-op pass does."""
    return options().fp8_fast_accum


def unsupported_config_reasons(config) -> list[str]:
    """Why this transformers config cannot run on the compact decoder; empty when it can."""
    reasons = []
    mt = getattr(config, "model_type", "?")
    if mt != "llama":
        reasons.append(f"The fast decode path implements the Llama architecture only; this model is {mt!r}.")
        return reasons
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        reasons.append("The fast decode path has no bias terms; this Llama config uses attention or MLP biases.")
    if getattr(config, "hidden_act", "silu") != "silu":
        reasons.append(f"The fast decode path implements SiLU MLPs; this model uses {config.hidden_act!r}.")
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if d < 16 or d & (d - 1):
        reasons.append(f"The fast attention kernel needs a power-of-two head_dim >= 16; this model has {d}.")
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("dynamic", "longrope"):
        reasons.append("The fast decode path precomputes RoPE tables; dynamic and longrope scaling are not supported.")
    return reasons


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm, operation for operation."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF apply_rotary_pos_emb on bf16 x with bf16-valued half tables, rounding as HF's bf16 ops round."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _projection_rows(d: Dims) -> dict[str, list[int]]:
    """The output rows of each projection fused into q|k|v, o, gate|up and down, in row order."""
    return {"qkv": [d.heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim], "o": [d.hidden],
            "gu": [d.inter, d.inter], "down": [d.hidden]}


class FastLlama:
    """Weights of a Llama model at one precision, with the torch-op forward passes."""

    def __init__(self, dims: Dims, weights: dict, precision: Precision | str, rotary=None):
        """weights: 'embed', 'norm', 'lm_head' and per layer i 'i.qkv', 'i.o', 'i.gu', 'i.down' (bf16, fused),
        'i.ln1', 'i.ln2' (and what the method's quantize needs as calibration, under 'i.name.calibration').
        The bf16 tensors are used as given (not copied) where the precision keeps them."""
        self.precision = Precision(precision)
        self.method = method_for(self.precision)
        self.dims = dims
        self.embed, self.norm, self.lm_head = weights["embed"], weights["norm"], weights["lm_head"]
        self.device = self.embed.device
        self.layers = []
        for i in range(dims.layers):
            def lin(name):
                # AWQ: weights[f"{i}.{name}.calibration"] = (input scales, rows) of each projection fused in it
                return Linear(self.method, weights[f"{i}.{name}"], weights.get(f"{i}.{name}.calibration"))

            self.layers.append(dict(qkv=lin("qkv"), o=lin("o"), gu=lin("gu"), down=lin("down"),
                                    ln1=weights[f"{i}.ln1"], ln2=weights[f"{i}.ln2"]))
        self.lm = Linear(Bf16(Precision.BF16), self.lm_head)  # lm_head stays at the base dtype, as vLLM's online FP8 leaves it
        self._inv_freq, self._attn_scaling = _rope_params(rotary, dims)
        self._rope_len = 0
        self.cos = self.sin = None

    # ---- construction ----
    @staticmethod
    def fuse_hf_state_dict(sd: dict, dims: Dims, device, dtype=torch.bfloat16) -> dict:
        """HF Llama parameter names -> this model's fused bf16 tensors on `device` (one tensor moved at a time)."""
        def get(name):
            return sd[name].to(device=device, dtype=dtype)

        w = {"embed": get("model.embed_tokens.weight"), "norm": get("model.norm.weight")}
        w["lm_head"] = w["embed"] if dims.tie_embeddings or "lm_head.weight" not in sd else get("lm_head.weight")
        for i in range(dims.layers):
            p = f"model.layers.{i}."
            w[f"{i}.qkv"] = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            w[f"{i}.o"] = get(p + "self_attn.o_proj.weight")
            w[f"{i}.gu"] = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
            w[f"{i}.down"] = get(p + "mlp.down_proj.weight")
            w[f"{i}.ln1"] = get(p + "input_layernorm.weight")
            w[f"{i}.ln2"] = get(p + "post_attention_layernorm.weight")
        return w

    @staticmethod
    def random_weights(dims: Dims, device, seed: int = 0, dtype=torch.bfloat16) -> dict:
        """Random weights N(0, 0.02) (TorchEngine's synthetic scale) generated on the device; norms at 1."""
        g = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

        d = dims
        w = {"embed": rnd(d.vocab, d.hidden), "norm": torch.ones(d.hidden, device=device, dtype=dtype)}
        w["lm_head"] = w["embed"] if d.tie_embeddings else rnd(d.vocab, d.hidden)
        for i in range(d.layers):
            w[f"{i}.qkv"] = rnd(d.qkv_out, d.hidden)
            w[f"{i}.o"] = rnd(d.hidden, d.heads * d.head_dim)
            w[f"{i}.gu"] = rnd(2 * d.inter, d.hidden)
            w[f"{i}.down"] = rnd(d.hidden, d.inter)
            w[f"{i}.ln1"] = torch.ones(d.hidden, device=device, dtype=dtype)
            w[f"{i}.ln2"] = torch.ones(d.hidden, device=device, dtype=dtype)
        return w

    @staticmethod
    @torch.inference_mode()
    def awq_scales(dims: Dims, weights: dict, ids: list[int], rotary=None) -> dict:
        """AWQ's input scales for every projection (quant.awq_search, as quant.quantize_model runs it), on the
        activations of this model's own BF16 torch-op pass over `ids`: {f"{i}.{name}.calibration": (scales, rows)}."""
        from core.engines.torch import quant

        base = FastLlama(dims, weights, Precision.BF16, rotary=rotary)
        acts = base._linear_inputs(torch.tensor([ids], device=base.device))
        out = {}
        for i in range(dims.layers):
            for name, rows in _projection_rows(dims).items():
                w, x = weights[f"{i}.{name}"], acts.pop((i, name))
                starts = [sum(rows[:j]) for j in range(len(rows))]
                out[f"{i}.{name}.calibration"] = ([quant.awq_search(w[a:a + r], x)["scale"] for a, r in zip(starts, rows)],
                                          rows)
        return out

    @staticmethod
    @torch.inference_mode()
    def hf_awq_scales(hf_model, ids: list[int], dims: Dims) -> dict:
        """The same from a Hugging Face Llama: exactly quant.quantize_model's search (its capture_inputs on the HF
        model, awq_search per nn.Linear), grouped as this model fuses the projections."""
        from core.engines.torch import quant

        names = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "o": ["self_attn.o_proj"],
                 "gu": ["mlp.gate_proj", "mlp.up_proj"], "down": ["mlp.down_proj"]}
        modules = dict(hf_model.named_modules())
        full = [f"model.layers.{i}.{n}" for i in range(dims.layers) for ns in names.values() for n in ns]
        acts = quant.capture_inputs(hf_model, full, ids)
        out = {}
        for i in range(dims.layers):
            for name, parts in names.items():
                lins = [modules[f"model.layers.{i}.{n}"] for n in parts]
                out[f"{i}.{name}.calibration"] = (
                    [quant.awq_search(m.weight.data, acts.pop(f"model.layers.{i}.{n}"))["scale"]
                     for m, n in zip(lins, parts)], [m.out_features for m in lins])
        return out

    def _linear_inputs(self, tokens: torch.Tensor) -> dict:
        """Each fused projection's float32 input rows [tokens, in] in one torch-op pass (prefill's, unfused)."""
        d = self.dims
        cache = self.new_cache(tokens.shape[0], tokens.shape[1], False)
        x = F.embedding(tokens, self.embed)
        acts = {}

        def keep(i, name, t):
            acts[(i, name)] = t.reshape(-1, t.shape[-1]).float()
            return t

        for i, L in enumerate(self.layers):
            h = keep(i, "qkv", rmsnorm(x, L["ln1"], d.eps))
            a = keep(i, "o", self._prefill_attention(i, L["qkv"].ref(h), cache, slice(None)))
            x = x + L["o"].ref(a)
            h = keep(i, "gu", rmsnorm(x, L["ln2"], d.eps))
            gate, up = L["gu"].ref(h).chunk(2, dim=-1)
            x = x + L["down"].ref(keep(i, "down", F.silu(gate) * up))
        return acts

    @classmethod
    def from_hf(cls, model, precision: Precision | str, device=None,
                calibration_ids: list[int] | None = None) -> "FastLlama":
        """calibration_ids: the calibration tokens of a method that needs them (AWQ's search runs on `model`, as the
        torch engine's)."""
        dims = Dims.from_config(model.config)
        device = device or next(model.parameters()).device
        weights = cls.fuse_hf_state_dict(model.state_dict(), dims, device)
        if method_for(Precision(precision)).needs_calibration:
            if not calibration_ids:
                raise ValueError(f"{Precision(precision).label} needs calibration token ids")
            weights |= cls.hf_awq_scales(model, calibration_ids, dims)
        return cls(dims, weights, precision, rotary=model.config)

    # ---- sizes ----
    def weight_bytes_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        seen = set()
        tensors = [self.embed, self.norm, self.lm_head]
        for L in self.layers:
            tensors += [L["ln1"], L["ln2"]] + [t for n in ("qkv", "o", "gu", "down") for t in L[n].tensors()]
        for t in tensors:
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            key = str(t.dtype).replace("torch.", "")
            out[key] = out.get(key, 0) + t.numel() * t.element_size()
        return out

    def step_weight_bytes(self, batch: int) -> int:
        """Weight bytes one decode step must read: every Linear, lm_head and norms; `batch` embedding rows."""
        lin = sum(L[n].nbytes for L in self.layers for n in ("qkv", "o", "gu", "down"))
        norms = sum(L["ln1"].numel() + L["ln2"].numel() for L in self.layers) * 2 + self.norm.numel() * 2
        return lin + self.lm.nbytes + norms + batch * self.dims.hidden * self.embed.element_size()

    # ---- RoPE tables ----
    def rope_tables(self, length: int):
        """cos/sin [length, head_dim/2] float32 holding bf16-rounded values, as HF's rotary embedding gives them."""
        if self._rope_len < length:
            n = max(length, 2 * self._rope_len, 256)
            pos = torch.arange(n, dtype=torch.float32, device=self._inv_freq.device)
            freqs = pos[:, None] * self._inv_freq[None, :]
            self.cos = (freqs.cos() * self._attn_scaling).to(torch.bfloat16).float().to(self.device)
            self.sin = (freqs.sin() * self._attn_scaling).to(torch.bfloat16).float().to(self.device)
            self._rope_len = n
        return self.cos, self.sin

    def new_cache(self, batch: int, max_len: int, fp8_kv: bool) -> StaticKVCache:
        return StaticKVCache(self.dims, batch, max_len, fp8_kv, self.device, self.embed.dtype)

    # ---- torch-op forward passes ----
    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: StaticKVCache, rows=slice(None), all_logits: bool = False,
                fused: bool = True):
        """Prompt pass from position 0 for equal-length rows: tokens [b, T] -> logits [b, V] (last position) or
        [b, T, V]. Fills cache rows `rows`; with an FP8 cache, attention reads the quantized K/V back, as the
        eager FP8 cache does."""
        if fused and tokens.is_cuda:
            return self._prefill_fused(tokens, cache, rows, all_logits)
        d = self.dims
        b, T = tokens.shape
        x = F.embedding(tokens, self.embed)
        for i, L in enumerate(self.layers):
            h = rmsnorm(x, L["ln1"], d.eps)
            x = x + L["o"].ref(self._prefill_attention(i, L["qkv"].ref(h), cache, rows))
            h = rmsnorm(x, L["ln2"], d.eps)
            gate, up = L["gu"].ref(h).chunk(2, dim=-1)
            x = x + L["down"].ref(F.silu(gate) * up)
        h = rmsnorm(x if all_logits else x[:, -1], self.norm, d.eps)
        return self.lm.ref(h)

    def _prefill_attention(self, i: int, qkv: torch.Tensor, cache: StaticKVCache, rows) -> torch.Tensor:
        """Layer i's causal attention over the prompt from its fused q|k|v projection [b, T, qkv_out]: RoPE, the
        cache write, SDPA (flash attention on CUDA) -> [b, T, heads * head_dim]."""
        d = self.dims
        b, T = qkv.shape[:2]
        cos, sin = self.rope_tables(T)
        c, s = cos[:T][None, :, None, :], sin[:T][None, :, None, :]
        g = d.heads // d.kv_heads
        q, k, v = qkv.view(b, T, d.heads + 2 * d.kv_heads, d.head_dim).split([d.heads, d.kv_heads, d.kv_heads], 2)
        q, k = rope(q, c, s).transpose(1, 2), rope(k, c, s).transpose(1, 2)
        v = v.transpose(1, 2)
        cache.write(i, rows, 0, k, v)
        if cache.fp8:
            k, v = cache.read(i, rows, T)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a.transpose(1, 2).reshape(b, T, d.heads * d.head_dim)

    def _prefill_attention_fused(self, i: int, qkv: torch.Tensor, cache: StaticKVCache, rows,
                                 flash3: bool) -> torch.Tensor:
        """`_prefill_attention` on CUDA with fewer passes over the prompt: RoPE and the cache write in one Triton
        pass per row (`rope_store_prompt`), then causal attention over the grouped K/V as the cache holds them (no
        repeated copies): FlashAttention-3 when `flash3` (Hopper, where it is built: 8-17% less time than cuDNN's, same
        error against float32 on the H200), else SDPA (`enable_gqa`, cuDNN where it runs). At 125K tokens the
        torch-op RoPE, cat and copies took 0.3 s of the prompt pass."""
        from core.engines.fast import kernels as K

        d = self.dims
        b, T = qkv.shape[:2]
        cos, sin = self.rope_tables(T)
        q = torch.empty(b, T, d.heads, d.head_dim, device=qkv.device, dtype=qkv.dtype)
        for j, r in enumerate(range(*rows.indices(cache.batch))):
            ks, vs = (cache.k_scale[i, r], cache.v_scale[i, r]) if cache.fp8 else (None, None)
            K.rope_store_prompt(qkv[j], cos, sin, q[j], cache.k[i, r], cache.v[i, r], ks, vs,
                                d.heads, d.kv_heads, d.head_dim)
        if cache.fp8:
            k, v = cache.read(i, rows, T)  # attention reads the quantized K/V back, as the eager FP8 cache does
        else:
            k, v = cache.k[i, rows, :, :T], cache.v[i, rows, :, :T]
        if flash3:
            # K/V [b, kv_heads, T, d] (the cache itself, or its dequantized copy for an FP8 cache) passed as
            # [b, T, kv_heads, d] views: FA3 takes any row and head strides
            a = fa3.causal_attention_bf16(q, k.transpose(1, 2), v.transpose(1, 2))
        else:
            a = causal_attention(q.transpose(1, 2), k, v).transpose(1, 2)
        return a.reshape(b, T, d.heads * d.head_dim)

    def _prefill_fused(self, tokens, cache: StaticKVCache, rows, all_logits: bool):
        """The prompt pass with the decode step's fused kernels: the residual add and RMSNorm in one pass
        (add_rmsnorm), SiLU(gate) * up in one (silu_mul), and for W8A8 the per-token E4M3 quantization of each
        linear's input inside the same passes, then torch._scaled_mm on FP8 tensor cores. Same function as the
        torch-op pass (tests/gpu compare the two), whose float32 elementwise passes cost as much as the FP8 GEMMs
        saved: FP8 prefill was no faster than BF16 through it."""
        from core.engines.fast import kernels as K

        d = self.dims
        b, T = tokens.shape
        M = b * T
        w8a8 = self.method.e4m3_inputs
        fast_accum = fp8_fast_accum()
        flash3 = fa3.why_not(tokens.device, d.heads, d.kv_heads, d.head_dim) is None  # decided once per pass
        x = F.embedding(tokens, self.embed).reshape(M, d.hidden)
        h = None if w8a8 else torch.empty_like(x)  # W8A8 linears read only the E4M3 copy
        scale = torch.empty(M, device=x.device, dtype=torch.float32) if w8a8 else None
        xq = torch.empty(M, d.hidden, device=x.device, dtype=fp8.E4M3) if w8a8 else None

        def linear(lin: Linear, inp, q, s):
            if not w8a8:
                return lin.prompt(inp)
            return lin.method.prompt_quantized(lin.weights, q, s, x.dtype, fast_accum)

        def quantized(cols: int):
            """Room for a W8A8 linear's E4M3 input [M, cols] and its per-row scales; (None, None) otherwise."""
            if not w8a8:
                return None, None
            return (torch.empty(M, cols, device=x.device, dtype=fp8.E4M3),
                    torch.empty(M, device=x.device, dtype=torch.float32))

        delta = None  # the previous layer's MLP output, added to the residual by the next add_rmsnorm
        for i, L in enumerate(self.layers):
            K.add_rmsnorm(x, delta, L["ln1"], d.eps, h, scale, xq)
            a = self._prefill_attention_fused(i, linear(L["qkv"], h, xq, scale).view(b, T, -1), cache, rows, flash3)
            a = a.reshape(M, -1)
            aq, a_scale = quantized(a.shape[1])
            if w8a8:
                K.row_quant(a, a_scale, aq)
            K.add_rmsnorm(x, linear(L["o"], a, aq, a_scale), L["ln2"], d.eps, h, scale, xq)
            gu = linear(L["gu"], h, xq, scale)
            act_q, act_scale = quantized(d.inter)
            act = None if w8a8 else torch.empty(M, d.inter, device=x.device, dtype=x.dtype)
            K.silu_mul(gu, act, act_scale, act_q)
            del gu
            delta = linear(L["down"], act, act_q, act_scale)
        x = (x + delta).view(b, T, d.hidden)
        h = rmsnorm(x if all_logits else x[:, -1], self.norm, d.eps)
        return self.lm.ref(h)

    @torch.inference_mode()
    def decode_ref(self, tokens: torch.Tensor, pos: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """One decode step with torch ops: tokens [B] at positions pos [B] (row b attends to 0..pos[b]) -> logits."""
        d = self.dims
        B = tokens.shape[0]
        cos, sin = self.rope_tables(int(pos.max()) + 1)
        c, s = cos[pos][:, None, :], sin[pos][:, None, :]
        g = d.heads // d.kv_heads
        mask = (torch.arange(cache.max_len, device=pos.device)[None, :] <= pos[:, None])[:, None, None, :]
        x = F.embedding(tokens, self.embed)
        for i, L in enumerate(self.layers):
            h = rmsnorm(x, L["ln1"], d.eps)
            qkv = L["qkv"].ref(h).view(B, d.heads + 2 * d.kv_heads, d.head_dim)
            q, k, v = qkv.split([d.heads, d.kv_heads, d.kv_heads], dim=1)
            q, k = rope(q, c, s), rope(k, c, s)
            cache.write_at(i, pos, k, v)
            kc, vc = cache.read(i, slice(None), cache.max_len)
            a = F.scaled_dot_product_attention(q[:, :, None, :], kc.repeat_interleave(g, dim=1),
                                               vc.repeat_interleave(g, dim=1), attn_mask=mask)
            x = x + L["o"].ref(a.reshape(B, d.heads * d.head_dim))
            h = rmsnorm(x, L["ln2"], d.eps)
            gate, up = L["gu"].ref(h).chunk(2, dim=-1)
            x = x + L["down"].ref(F.silu(gate) * up)
        return self.lm.ref(rmsnorm(x, self.norm, d.eps))


_CUDNN_REFUSED: set = set()  # (head_dim, dtype) cuDNN's attention did not take in this process


def causal_attention(q, k, v):
    """Causal SDPA over grouped K/V, through cuDNN's fused attention where it runs (faster than flash on the H200:
    docs/fast-engine.md#cudnn-prompt-attention), SDPA's own choice otherwise. Only the enabled set is narrowed for
    the call: a priority order set through sdpa_kernel outlives it (torch restores the old order as an explicit
    one, and its unset default is what prefers cuDNN on Hopper), which sent later default calls to flash."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    key = (q.shape[-1], q.dtype)
    if key not in _CUDNN_REFUSED:
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:  # "No available kernel": this shape or GPU is not one cuDNN's attention takes
            if k.shape[-2] > 1:  # a one-token prompt is refused for its length alone: not the head_dim's fault
                _CUDNN_REFUSED.add(key)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _rope_params(rotary_config, dims: Dims):
    """inv_freq and attention scaling from HF's own rotary embedding (so every rope_type it knows is honoured)."""
    if rotary_config is None:  # plain RoPE, theta 500000 (the synthetic Llama-3 shapes)
        inv = 1.0 / (500000.0 ** (torch.arange(0, dims.head_dim, 2, dtype=torch.float32) / dims.head_dim))
        return inv, 1.0
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rot = LlamaRotaryEmbedding(rotary_config)
    return rot.inv_freq.float().cpu(), float(getattr(rot, "attention_scaling", 1.0))
