"""DecodeGraph: one decode step of the compact decoder from the Triton kernels, captured whole in a CUDA graph.

A step is a fixed list of ~10 kernels per layer over preallocated buffers, so it is captured once and replayed
with one launch (a decode step of HF `generate` on an H200 is 95% host overhead). Each linear is its method's
decode product (methods/); what the method reads (E4M3 or f16 copies of its inputs) and which kernels fold into
it (`folds`) come from the method too.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from core.engines.fast.cache import E4M3, StaticKVCache
from core.engines.fast.model import FastLlama
from core.engines.fast.options import options


class DecodeGraph:
    """One decode step over a static cache, built from the Triton kernels and captured in a CUDA graph.

    Static inputs: `tokens` [B] and `pos` [B] (position of each row's token). A replay writes the token into the
    cache, computes logprobs, picks the greedy next token and advances `tokens` and `pos` in place, so replays can
    run back to back with no host work; to sample instead, overwrite `tokens` after a replay.
    """

    def __init__(self, model: FastLlama, cache: StaticKVCache, top_k: int = 0, use_graph: bool = True,
                 folds: frozenset | None = None):
        from core.engines.fast import kernels as K

        self.model, self.cache, self.top_k = model, cache, top_k
        d, B, dev = model.dims, cache.batch, model.device
        # Kernels folded into the linear that reads their output (kernels.gemv_prologue), one row only: "norm" (the
        # add + RMSNorm (+ W8A8 quantization) before q|k|v, gate|up and lm_head), "o" (W8A8's quantization of the
        # attention output, and for the other modes the o-projection's weight loads started before the attention
        # ends), "silu" (with "norm", not W8A8: SiLU(gate) * up written by the gate|up kernel, no SiLU computed again
        # in every program of the down projection's GEMV; W8A8 keeps silu_mul). Which of them a batch-1 step uses is the
        # method's `folds`: those measured faster on the H200 (docs/fast-engine.md#folds); TRIAGE_FOLD=0 turns them
        # all off, and a method without a prologue (the integer ones) folds nothing.
        self.folds = self.default_folds(model, B) if folds is None else frozenset(folds)
        self.tokens = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.cos, self.sin = model.rope_tables(cache.max_len)  # held so a later, longer table cannot free them
        bf = model.embed.dtype
        self.h = torch.empty(B, d.hidden, dtype=bf, device=dev)
        self.x_alt = torch.empty(B, d.hidden, dtype=bf, device=dev)  # the residual's other buffer when norms fold
        self.delta = torch.empty(B, d.hidden, dtype=bf, device=dev)
        self.qkv = torch.empty(B, d.qkv_out, dtype=bf, device=dev)
        self.q = torch.empty(B, d.heads, d.head_dim, dtype=bf, device=dev)
        self.attn = torch.empty(B, d.heads * d.head_dim, dtype=bf, device=dev)
        self.gu = torch.empty(B, 2 * d.inter, dtype=bf, device=dev)
        self.act = torch.empty(B, d.inter, dtype=bf, device=dev)
        self.logits = torch.empty(B, d.vocab, dtype=bf, device=dev)
        w8a8 = model.method.e4m3_inputs
        self.xs = torch.empty(B, dtype=torch.float32, device=dev) if w8a8 else None
        if w8a8:  # E4M3 copies of the linears' inputs, written by the kernels that produce them
            self.hq = torch.empty(B, d.hidden, dtype=E4M3, device=dev)
            self.attnq = torch.empty(B, d.heads * d.head_dim, dtype=E4M3, device=dev)
            self.actq = torch.empty(B, d.inter, dtype=E4M3, device=dev)
        # Weight-only at several rows: the producers also write their rows in f16, which the linears' f16 dots read
        # instead of each program converting the same bf16 activations (docs/fast-engine.md#f16-activations)
        f16 = model.method.f16_inputs and B > 1
        self.h16 = torch.empty(B, d.hidden, dtype=torch.float16, device=dev) if f16 else None
        self.attn16 = torch.empty(B, d.heads * d.head_dim, dtype=torch.float16, device=dev) if f16 else None
        self.act16 = torch.empty(B, d.inter, dtype=torch.float16, device=dev) if f16 else None
        # INT4 AWQ through a library launch: its input divided by each fused projection's scales, written by the
        # kernel producing the input (kernels/norm.py's `div`), up to 3 row blocks (q, k, v)
        awq = model.method.needs_calibration
        self.hdiv = torch.empty(3 * B, d.hidden, dtype=bf, device=dev) if awq else None
        self.adiv = torch.empty(B, d.inter, dtype=bf, device=dev) if awq else None
        self.library_outputs: dict = {}  # the library kernels' output rings this graph writes (library.graph_outputs)
        self.ws = K.AttnWorkspace(B, d.heads, d.kv_heads, d.head_dim, cache.max_len, dev, fp8=cache.fp8)
        self.sm_scale = 1.0 / math.sqrt(d.head_dim)
        self.graph = None
        self.out = None
        self.split_scratch: dict = {}  # the split-K linears' scratch, this graph's own (kernels.split_scratch_scope)
        if use_graph:
            self._capture()

    @staticmethod
    def default_folds(model: FastLlama, batch: int) -> frozenset:
        from core.engines.fast import kernels as K

        d = model.dims
        widest = max(d.hidden, d.heads * d.head_dim)
        # measured with programmatic dependent launch (Hopper and later) only, which lets the weight loads go early
        if (batch != 1 or not options().fold or widest > K.PROLOGUE_MAX_K
                or not K.pdl_available()):
            return frozenset()
        return model.method.folds

    def _divided(self, lin, buf):
        """(the linear's input scales, the rows they fill in `buf`) where its launch reads divided input, else
        (None, None)."""
        div = lin.input_divisors(self.cache.batch)
        if div is None:
            return None, None
        return div, buf[:div.shape[0] * self.cache.batch]

    def _body(self):
        from core.engines.fast import kernels as K

        m, d, c = self.model, self.model.dims, self.cache
        B = c.batch
        xs = self.xs
        x = F.embedding(self.tokens, m.embed)
        delta = None
        w8a8 = xs is not None
        h = None if w8a8 else self.h  # W8A8 linears read only the E4M3 copy
        fold_norm, fold_o = "norm" in self.folds, "o" in self.folds
        fold_silu = fold_norm and "silu" in self.folds and not w8a8
        x_alt = self.x_alt
        # A linear's product is what `fast` returns: the step's buffer, or a library kernel's own output (float32,
        # maybe in row blocks) that the next kernel reads directly (kernels/library.py); folds are the methods'
        # own kernels, which write the buffers.
        for i, L in enumerate(m.layers):
            if fold_norm:
                L["qkv"].fast_prologue(x, self.qkv, delta, x_alt, L["ln1"], d.eps)
                if delta is not None:  # the kernel wrote x + delta to x_alt: that is the residual now
                    x, x_alt = x_alt, x
                qkv = self.qkv
            else:
                div, x_div = self._divided(L["qkv"], self.hdiv)
                K.add_rmsnorm(x, delta, L["ln1"], d.eps, h, xs, self.hq if w8a8 else None, self.h16, div, x_div)
                qkv = L["qkv"].fast(self.hq if w8a8 else self.h, xs, self.qkv, x16=self.h16, x_div=x_div)
            ks, vs = (c.k_scale[i], c.v_scale[i]) if c.fp8 else (None, None)
            K.rope_store(qkv, self.pos, self.cos, self.sin, self.q, c.k[i], c.v[i], ks, vs,
                         d.heads, d.kv_heads, d.head_dim)
            K.decode_attention(self.q, c.k[i], c.v[i], ks, vs, self.pos, self.attn, self.ws,
                               d.heads, d.kv_heads, d.head_dim, self.sm_scale, self.attn16)
            if fold_o:
                L["o"].fast_prologue(self.attn, self.delta)
                delta = self.delta
            else:
                if w8a8:
                    K.row_quant(self.attn, xs, self.attnq)
                delta = L["o"].fast(self.attnq if w8a8 else self.attn, xs, self.delta, x16=self.attn16)
            if fold_silu:
                L["gu"].fast_prologue(x, self.act, delta, x_alt, L["ln2"], d.eps, silu_out=True)
                x, x_alt = x_alt, x
                delta = L["down"].fast(self.act, None, self.delta)
                continue
            if fold_norm:
                L["gu"].fast_prologue(x, self.gu, delta, x_alt, L["ln2"], d.eps)
                x, x_alt = x_alt, x
                gu = self.gu
            else:
                div, x_div = self._divided(L["gu"], self.hdiv)
                K.add_rmsnorm(x, delta, L["ln2"], d.eps, h, xs, self.hq if w8a8 else None, self.h16, div, x_div)
                gu = L["gu"].fast(self.hq if w8a8 else self.h, xs, self.gu, x16=self.h16, x_div=x_div)
            div, x_div = (None, None) if w8a8 else self._divided(L["down"], self.adiv)
            if w8a8:
                # the row amax of SiLU(gate) * up must be known before the down projection's input is quantized
                K.silu_mul(gu, None, xs, self.actq)
                delta = L["down"].fast(self.actq, xs, self.delta)
            elif B == 1 and gu is self.gu and div is None:
                # one row: the down projection computes SiLU(gate) * up as it loads it (one launch fewer)
                delta = L["down"].fast(self.gu, None, self.delta, silu_x=True)
            else:
                # several rows: a computed (not loaded) dot operand stalls the tensor-core pipeline, so the
                # activation gets its own kernel (docs/fast-engine.md#silu-several-rows); also where gate|up is a
                # library's output (read as it is) or the down projection reads AWQ-divided rows
                K.silu_mul(gu, self.act, a16_out=self.act16, div=div, div_out=x_div)
                delta = L["down"].fast(self.act, None, self.delta, x16=self.act16, x_div=x_div)
        if fold_norm:
            m.lm.fast_prologue(x, self.logits, delta, x_alt, m.norm, d.eps)
        else:
            K.add_rmsnorm(x, delta, m.norm, d.eps, self.h)
            m.lm.fast(self.h, None, self.logits)
        lp = torch.log_softmax(self.logits.float(), dim=-1)
        nxt = lp.argmax(dim=-1)
        chosen = lp.gather(1, nxt[:, None])[:, 0]
        top = lp.topk(self.top_k, dim=-1) if self.top_k else None
        self.tokens.copy_(nxt)
        self.pos.add_(1)
        return dict(logprobs=lp, next=nxt, chosen=chosen, top_values=top.values if top else None,
                    top_ids=top.indices if top else None)

    @torch.inference_mode()
    def _capture(self):
        from core.engines.fast import kernels as K
        from core.engines.fast.kernels import library

        # Warm up (Triton compiles, cuBLAS picks kernels) at the last cache slots: any slot past a row's length is
        # written before it is read, so this scribbling never reaches a later step.
        self.pos.fill_(self.cache.max_len - 3)
        one_row = self.cache.batch == 1  # programmatic dependent launch measured faster there only (kernels.pdl_scope)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), K.pdl_scope(one_row), K.split_scratch_scope(self.split_scratch):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), K.pdl_scope(one_row), K.split_scratch_scope(self.split_scratch), \
                library.graph_outputs(self.library_outputs, len(self.model.layers)):
            self.out = self._body()

    @torch.inference_mode()
    def set_state(self, tokens: torch.Tensor, pos: torch.Tensor) -> None:
        self.tokens.copy_(tokens)
        self.pos.copy_(pos)

    @torch.inference_mode()
    def step(self) -> dict:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return self._body()
