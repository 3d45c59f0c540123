"""FP8 E4M3 numerics: scales, FP8 Linear layers (W8A8 through torch._scaled_mm, or weight-only) and FP8 KV storage.

Weights are really stored as torch.float8_e4m3fn. lm_head and embeddings are left at the base dtype, as vLLM's
online FP8 does. torch._scaled_mm runs on CUDA (compute capability >= 8.9) and on the CPU (torch >= 2.13).
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import nn
from torch.nn import functional as F

from core.engines.torch import fp8_cpu

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448.0
_EPS = 1e-12
# Up to this many rows (tokens in one forward pass) the CPU kernel multiplies straight from E4M3; more rows go
# through an exact copy of the weight and oneDNN's matmul. Measured on a 2-core EPYC (2026-12-01, idle, the
# embedded model's three linear shapes): the kernel is 1.1-3x faster up to 16 rows, dequantize + matmul from 32.
CPU_GEMV_MAX_ROWS = 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 with one float32 scale per row (per output channel for weights, per token for activations)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_EPS)
    scale = amax / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


class FP8Linear(nn.Module):
    """A Linear whose weight lives in E4M3 with per-output-channel scales.

    w8a8=True: activations are quantized per token on the fly and multiplied with torch._scaled_mm.
    w8a8=False: weight-only; the weight is upcast to the activation dtype for each matmul.
    """

    def __init__(self, linear: nn.Linear, w8a8: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.w8a8 = w8a8
        self.out_dtype = linear.weight.dtype
        q, scale = quantize_rows(linear.weight.data)
        self.register_buffer("weight_fp8", q)  # [out, in], row-major, so .t() is the column-major mat2 _scaled_mm wants
        self.register_buffer("weight_scale", scale)  # [out, 1] float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and fp8_cpu.available():
            return self._forward_cpu(x)
        return self._forward_eager(x)

    def _forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """The same E4M3 values and scales through fp8_cpu.py: the per-channel weight scale is applied to the
        output (x @ (q * s)^T == (x @ q^T) * s^T) and E4M3 -> bf16 is exact, so only rounding order differs from
        `_forward_eager` (tests/engines/test_fp8_cpu.py holds both to the same tokens)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] <= CPU_GEMV_MAX_ROWS and x.dtype == self.out_dtype == torch.bfloat16:
            # decode with bf16 activations (FP8's base dtype): _forward_cpu_ops in one C call, bit for bit
            # (tests/engines/test_fp8_cpu.py). As ten small torch ops a Linear they took as long as the product.
            out = fp8_cpu.decode_bf16(x2.contiguous(), self.weight_fp8, self.weight_scale, self.w8a8)
        else:
            out = self._forward_cpu_ops(x2)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def _forward_cpu_ops(self, x2: torch.Tensor) -> torch.Tensor:
        """The CPU path as torch ops, for 2-D activations of any dtype; the output before the bias."""
        dtype = x2.dtype
        if self.w8a8:
            xq, xs = quantize_rows(x2)
            x2 = fp8_cpu.to_float(xq.contiguous())  # the activations' exact E4M3 values; their per-token scale goes on the output
        if x2.shape[0] <= CPU_GEMV_MAX_ROWS:  # decode: read each weight byte once, accumulate in float32
            out = fp8_cpu.gemv(x2.float().contiguous(), self.weight_fp8, self.weight_scale)
        elif self.w8a8:  # prefill and scoring, W8A8: exact products, float32 accumulation, as _scaled_mm promises
            out = F.linear(x2, fp8_cpu.to_float(self.weight_fp8)) * self.weight_scale.t()
        else:  # prefill and scoring, weight-only: exact bf16 weights for oneDNN's BF16 matmul, then the scale
            out = F.linear(x2.to(torch.bfloat16), fp8_cpu.to_bf16(self.weight_fp8)).float() * self.weight_scale.t()
        if self.w8a8:
            out = out * xs
        return out.to(self.out_dtype if self.w8a8 else dtype)

    def _forward_eager(self, x: torch.Tensor) -> torch.Tensor:
        """The reference: dequantize the weight (weight-only) or torch._scaled_mm (W8A8)."""
        if not self.w8a8:
            w = dequantize(self.weight_fp8, self.weight_scale, x.dtype)
            return F.linear(x, w, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq, xs = quantize_rows(x2)
        out = torch._scaled_mm(
            xq,
            self.weight_fp8.t(),
            scale_a=xs,
            scale_b=self.weight_scale.t(),
            out_dtype=self.out_dtype,
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        mode = "W8A8 per-token/per-channel" if self.w8a8 else "weight-only"
        return f"in={self.in_features}, out={self.out_features}, e4m3 {mode}"


def quantize_linears(model: nn.Module, w8a8: bool, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every nn.Linear (except names in `skip`) with an FP8Linear; returns how many were replaced."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not any(s in full for s in skip):
                setattr(module, child_name, FP8Linear(child, w8a8))
                count += 1
    return count


class FP8KV:
    """One layer's K or V stored as E4M3 with a scale per (batch, head, token); dequantized when read.

    Storage is what matters for memory (half of BF16); attention still computes in the activation dtype.
    """

    def __init__(self, t: torch.Tensor):
        self.dtype = t.dtype
        self.q, self.scale = quantize_rows(t)

    @classmethod
    def stored(cls, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> "FP8KV":
        """One made from values already in E4M3 and their scales (caches joined row by row)."""
        kv = cls.__new__(cls)
        kv.q, kv.scale, kv.dtype = q, scale, dtype
        return kv

    def append(self, t: torch.Tensor) -> None:
        q, s = quantize_rows(t)
        self.q = torch.cat([self.q, q], dim=-2)
        self.scale = torch.cat([self.scale, s], dim=-2)

    def keep_last(self, n: int) -> None:
        self.q, self.scale = self.q[..., -n:, :], self.scale[..., -n:, :]

    def read(self) -> torch.Tensor:
        return dequantize(self.q, self.scale, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()


class FP8StaticLinear(FP8Linear):
    """FP8Linear (W8A8) with a static per-tensor activation scale calibrated beforehand (`calibrate_static`) instead
    of dynamic per-token scales: activations beyond the calibrated max|x| are clipped to E4M3's 448."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq = (x2.float() / self.input_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        out = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=self.input_scale.expand(x2.shape[0], 1).contiguous(),
                               scale_b=self.weight_scale.t(), out_dtype=self.out_dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, e4m3 W8A8 static per-tensor activation scale"


def forward_with_input_hooks(model: nn.Module, ids: list[int], layers: dict[Hashable, nn.Module],
                             see: Callable[[Hashable, torch.Tensor], None]) -> None:
    """One forward pass of the token ids `ids` (no KV cache) that calls see(key, x) with the input x of each layer in
    `layers` ({key: module}) as it runs; the hooks are removed afterwards, also when the pass fails. Calibration reads
    activations this way: calibrate_static here, AWQ and the per-layer errors in core/engines/torch/quant.py."""
    hooks = [m.register_forward_pre_hook(lambda _m, args, key=key: see(key, args[0])) for key, m in layers.items()]
    try:
        dev = next(model.parameters()).device
        model(input_ids=torch.tensor([ids], device=dev), use_cache=False)
    finally:
        for h in hooks:
            h.remove()


@torch.inference_mode()
def calibrate_static(model: nn.Module, ids: list[int]) -> int:
    """Turn every W8A8 FP8Linear into an FP8StaticLinear whose activation scale is max|x| / 448 over one forward pass
    of `ids` (the calibration tokens); returns how many layers were calibrated."""
    layers = [m for m in model.modules() if isinstance(m, FP8Linear) and m.w8a8]
    amax = {id(m): torch.zeros((), dtype=torch.float32) for m in layers}

    def see(key: int, x: torch.Tensor) -> None:
        amax[key] = torch.maximum(amax[key], x.detach().abs().amax().float().cpu())

    forward_with_input_hooks(model, ids, {id(m): m for m in layers}, see)
    for m in layers:
        scale = (amax[id(m)].clamp(min=_EPS) / E4M3_MAX).reshape(1, 1).to(m.weight_scale.device)
        m.register_buffer("input_scale", scale)
        m.__class__ = FP8StaticLinear
    return len(layers)
