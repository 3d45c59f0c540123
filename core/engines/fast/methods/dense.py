"""The BF16 and FP8 linear methods: a bf16 weight, or an E4M3 weight with per-output-channel float32 scales
(weight-only, or W8A8 with per-token E4M3 activations), multiplied by kernels/linears.py. The eager numerics are
core/engines/torch/fp8.py's FP8Linear (or F.linear for bf16). Launches: "dot" (the Triton skinny GEMM, split-K
included), "gemv" (one row, FMAs) and "torch" (cuBLAS / torch._scaled_mm, for BF16 and W8A8)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from core.engines.fast.methods.base import Launch, LinearMethod
from core.engines.torch import fp8
from core.precision import Precision

# Candidate launches, (BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT_K]); BLOCK_M follows from the batch size.
DOT_SMALL = [(16, 256, 4, 4), (16, 512, 4, 3), (32, 256, 4, 4), (32, 128, 4, 5), (64, 128, 4, 4), (64, 256, 4, 3),
             (128, 128, 8, 3), (32, 512, 4, 3), (64, 512, 8, 3)]
DOT_LARGE = [(64, 128, 4, 4), (64, 64, 4, 5), (128, 128, 8, 3), (32, 128, 4, 4), (64, 256, 4, 3), (128, 256, 8, 3),
             (32, 256, 4, 4), (64, 128, 4, 3)]
GEMV = [(8, 1024, 4, 1), (16, 512, 4, 1), (4, 2048, 4, 1), (16, 1024, 8, 1), (8, 2048, 8, 1), (2, 4096, 4, 1),
        (8, 1024, 4, 3), (4, 2048, 4, 3), (32, 256, 4, 3)]
# K cut into slices, for outputs too narrow to give every SM a program with enough bytes in flight (4096 columns in
# 64-wide tiles are 64 programs on 132 SMs)
SPLIT_SMALL = [(32, 256, 4, 4, 2), (64, 256, 4, 3, 2), (64, 256, 4, 3, 4), (64, 512, 8, 3, 2)]
SPLIT_LARGE = [(32, 128, 4, 4, 2), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (128, 128, 8, 3, 2), (128, 128, 8, 3, 4),
               (64, 256, 4, 3, 2), (128, 256, 8, 3, 2)]


def _launch_params(row) -> dict:
    cfg = dict(BLOCK_N=row[0], BLOCK_K=row[1], num_warps=row[2], num_stages=row[3])
    return cfg if len(row) == 4 else {**cfg, "SPLIT_K": row[4]}


def _dot_configs(rows: int, n: int, k: int) -> list[dict]:
    large = rows > 32  # the tile kernels' BLOCK_M of 64
    return [_launch_params(r) for r in (DOT_LARGE if large else DOT_SMALL)] + (
        [_launch_params(r) for r in (SPLIT_LARGE if large else SPLIT_SMALL)] if rows > 1 else [])


@dataclass
class DenseWeight:
    """A bf16 weight [N, K] (scale None) or E4M3 codes with per-output-channel float32 scales [N]."""
    w: torch.Tensor
    scale: torch.Tensor | None

    @property
    def n(self) -> int:
        return self.w.shape[0]

    @property
    def k(self) -> int:
        return self.w.shape[1]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.w, self.scale) if t is not None]


class _DenseMethod(LinearMethod):
    """Shared by the three: kernels/linears.py's launches at the kernel mode KERNEL_MODE."""

    KERNEL_MODE = 0  # kernels.MODE_BF16, MODE_WO, MODE_W8A8
    prologue = True
    has_torch_launch = False  # cuBLAS / torch._scaled_mm among the candidates

    def quantize(self, weight, calibration=None) -> DenseWeight:
        q, s = fp8.quantize_rows(weight)
        return DenseWeight(q, s.reshape(-1).contiguous())

    def launches(self) -> dict[str, Launch]:
        from core.engines.fast import kernels as K

        mode = self.KERNEL_MODE

        def triton_run(w, x, out, cfg, silu_x, x_scale=None, x16=None):
            return K.linear_triton(x, w.w, w.scale, x_scale, out, mode, silu_x, cfg, x16)

        def torch_run(w, x, out, cfg, silu_x, x_scale=None, x16=None):
            return K.linear_torch(x, w.w, w.scale, x_scale, out, mode, silu_x)

        out = {"dot": Launch("dot", triton_run, _dot_configs),
               "gemv": Launch("gemv", triton_run, lambda r, n, k: [_launch_params(g) for g in GEMV] if r == 1 else [],
                              takes=lambda w, r: r == 1)}
        if self.has_torch_launch:
            out["torch"] = Launch("torch", torch_run, lambda r, n, k: [{}])
        return out

    def default_config(self, rows: int, n: int, k: int) -> dict:
        from core.engines.fast import kernels as K

        return K.default_config(self.KERNEL_MODE, rows, n, k)

    def decode(self, weights, x, out, silu_x: bool = False, x_scale=None, x16=None):
        """kernels.linear: the configured launch, falling back to torch (same numerics) if its Triton kernel does
        not compile here."""
        from core.engines.fast import kernels as K

        cfg = self.config(x.shape[0], weights.n, weights.k)
        return K.linear(x, weights.w, weights.scale, x_scale, out, self.KERNEL_MODE, silu_x=silu_x, cfg=cfg, x16=x16)

    def decode_prologue(self, weights, x, out, delta, x_out, norm_weight, eps, silu_out):
        from core.engines.fast import kernels as K

        return K.gemv_prologue(x, weights.w, weights.scale, out, self.KERNEL_MODE, delta, x_out, norm_weight, eps,
                               silu_out=silu_out)

    def timing_weights(self, n, k, segments, copies, device="cuda") -> list[DenseWeight]:
        return [self.quantize((torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)) for _ in range(copies)]


class Bf16(_DenseMethod):
    precisions = (Precision.BF16,)
    KERNEL_MODE = 0
    folds = frozenset({"norm", "o"})
    has_torch_launch = True

    def quantize(self, weight, calibration=None) -> DenseWeight:
        return DenseWeight(weight, None)  # used as given, not copied

    def ref(self, weights, x):
        return F.linear(x, weights.w)


class Fp8WeightOnly(_DenseMethod):
    """E4M3 weights upcast for the product; the decode kernels' dot in f16 (E4M3 -> f16 is exact), reading f16 copies
    of their inputs at several rows (docs/fast-engine.md#f16-activations)."""
    precisions = (Precision.FP8_WEIGHT_ONLY,)
    KERNEL_MODE = 1
    folds = frozenset({"norm", "o", "silu"})
    f16_inputs = True

    def ref(self, weights, x):
        return F.linear(x, fp8.dequantize(weights.w, weights.scale[:, None], x.dtype))

    def timing_inputs(self, rows, k, device="cuda"):
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        return x, {"x16": x.to(torch.float16) if rows > 1 else None}  # as DecodeGraph runs it


class Fp8W8A8(_DenseMethod):
    """E4M3 weights and per-token E4M3 activations, quantized by the kernels that produce them; W8A8 keeps silu_mul
    at batch 1 (its row's E4M3 scale needs the whole row)."""
    precisions = (Precision.FP8,)
    KERNEL_MODE = 2
    folds = frozenset({"norm", "o"})
    e4m3_inputs = True
    has_torch_launch = True

    def ref(self, weights, x):
        shape = x.shape
        xq, xs = fp8.quantize_rows(x.reshape(-1, shape[-1]))
        out = torch._scaled_mm(xq, weights.w.t(), scale_a=xs, scale_b=weights.scale[None, :], out_dtype=x.dtype)
        return out.reshape(*shape[:-1], weights.n)

    def prompt_quantized(self, weights, xq, x_scale, dtype, fast_accum: bool) -> torch.Tensor:
        """The prompt pass on activations already quantized by the fused norm pass (E4M3 rows, their scales)."""
        return torch._scaled_mm(xq, weights.w.t(), scale_a=x_scale[:, None], scale_b=weights.scale[None, :],
                                out_dtype=dtype, use_fast_accum=fast_accum)

    def timing_inputs(self, rows, k, device="cuda"):
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        xq, xs = fp8.quantize_rows(x)
        return xq, {"x_scale": xs.reshape(-1)}
