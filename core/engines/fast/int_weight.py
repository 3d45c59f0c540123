"""The integer weight format of the fast engine's integer linears: the torch engine's own storage
(core/engines/torch/quant.py) for one fused projection, its quantization and the reference numerics the kernels
(kernels/int_tile.py, int_gemv.py, int_prompt.py) must reproduce. Needs torch only.

Kernel modes (the MODE constexpr every integer kernel takes): 3 INT4 g128, 4 INT4 g128 with AWQ input scales, 5 INT8
weight-only, 6 INT8 W8A8. Only core/engines/fast/methods/integer.py maps precisions to them.
"""
from __future__ import annotations

import torch

MODE_INT4, MODE_INT4_AWQ, MODE_INT8_WO, MODE_INT8 = 3, 4, 5, 6
GROUP = 128  # core.engines.torch.quant.GROUP: one INT4 tile along K
INT4_MODES = (MODE_INT4, MODE_INT4_AWQ)


class IntWeight:
    """One fused projection's integer storage, in the reference's layout (core/engines/torch/quant.py).

    INT4: `w` packed codes uint8 [N, Kp / 2] (input 2j in the low nibble, 2j + 1 in the high one), `scale` float16
    [N, groups], `zero` uint8 [N, groups]; AWQ adds `in_scale` float32 [segments, Kp] (each projection's float16
    input scale, the divisor), `in_recip` (its correctly rounded reciprocal) and `row_seg` int32 [N] (which
    projection a row belongs to). INT8: `w` int8 [N, K], `scale` float32 [N]."""

    def __init__(self, mode: int, n: int, k: int, w, scale, zero=None, in_scale=None, in_recip=None, row_seg=None):
        self.mode, self.n, self.k = mode, n, k
        self.w, self.scale, self.zero = w, scale, zero
        self.in_scale, self.in_recip, self.row_seg = in_scale, in_recip, row_seg
        # the widest output tile that never straddles two projections' AWQ scales
        self.max_block_n = _largest_pow2_dividing(_segment_sizes(row_seg)) if row_seg is not None else 256

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.w, self.scale, self.zero, self.in_scale, self.in_recip, self.row_seg)
                if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _segment_sizes(row_seg: torch.Tensor) -> list[int]:
    _, counts = torch.unique_consecutive(row_seg.cpu(), return_counts=True)
    return [int(c) for c in counts]


def _largest_pow2_dividing(sizes: list[int]) -> int:
    b = 256
    while b > 1 and any(s % b for s in sizes):
        b //= 2
    return b


def quantize(weight: torch.Tensor, mode: int, awq_scales: list[torch.Tensor] | None = None,
             awq_rows: list[int] | None = None) -> IntWeight:
    """A fused bf16 weight [N, K] quantized as the torch engine quantizes each of its projections: every scale is per
    output row (INT8) or per row and group (INT4), so the fused matrix gets exactly the per-projection codes. AWQ:
    `awq_scales[i]` (float32 [K], the searched s) applies to the next `awq_rows[i]` rows, as Int4Linear(linear, s)."""
    from core.engines.torch import quant

    n, k = weight.shape
    if mode in (MODE_INT8, MODE_INT8_WO):
        q, s = quant.int8_rows(weight)
        return IntWeight(mode, n, k, q.contiguous(), s.reshape(-1).contiguous())
    if mode == MODE_INT4:
        packed, scale, zero = quant.quantize_int4(weight.float())
        return IntWeight(MODE_INT4, n, k, packed, scale.contiguous(), zero.contiguous())
    if mode != MODE_INT4_AWQ:
        raise ValueError(f"Unknown integer kernel mode {mode!r}")
    assert awq_scales is not None and awq_rows is not None and sum(awq_rows) == n
    parts, divisors = [], []
    start = 0
    for s, rows in zip(awq_scales, awq_rows):
        s = s.float().to(weight.device)
        parts.append(quant.quantize_int4(weight[start:start + rows].float() * s[None, :]))
        divisors.append(s.half().float())  # Int4Linear stores input_scale in float16 and divides by that
        start += rows
    packed = torch.cat([p[0] for p in parts])
    scale = torch.cat([p[1] for p in parts]).contiguous()
    zero = torch.cat([p[2] for p in parts]).contiguous()
    kp = packed.shape[1] * 2
    isc = torch.ones(len(divisors), kp, dtype=torch.float32, device=weight.device)
    isc[:, :k] = torch.stack(divisors)
    irc = (1.0 / isc.double()).float()  # correctly rounded reciprocals
    row_seg = torch.repeat_interleave(torch.arange(len(awq_rows), dtype=torch.int32),
                                      torch.tensor(awq_rows)).to(weight.device)
    return IntWeight(MODE_INT4_AWQ, n, k, packed, scale, zero, isc.contiguous(), irc.contiguous(), row_seg)


def reference_dequantized(iw: IntWeight, dtype=torch.bfloat16) -> torch.Tensor:
    """The torch engine's own dequantization of this storage (quant.py's ops): what the kernels must reproduce."""
    from core.engines.torch import quant

    if iw.mode in (MODE_INT8, MODE_INT8_WO):
        return (iw.w.float() * iw.scale[:, None]).to(dtype)
    w = quant.dequantize_int4(iw.w, iw.scale, iw.zero, iw.k)
    if iw.mode == MODE_INT4_AWQ:
        w = w / iw.in_scale[iw.row_seg.long(), :iw.k]
    return w.to(dtype)




def reference_linear(x: torch.Tensor, iw: IntWeight) -> torch.Tensor:
    """The torch engine's forward for this storage (Int4Linear / Int8Linear.forward on CUDA), for tests and the
    prompt pass of W8A8."""
    from core.engines.torch import quant

    if iw.mode != MODE_INT8:
        return torch.nn.functional.linear(x, reference_dequantized(iw, x.dtype))
    shape = x.shape
    xq, xs = quant.int8_rows(x.reshape(-1, shape[-1]))
    acc, _ = quant.int_mm(xq, iw.w.t())
    out = (acc.float() * xs * iw.scale[None, :]).to(x.dtype)
    return out.reshape(*shape[:-1], iw.n)


def scale_args(iw: IntWeight) -> tuple:
    """The weight's scale, zero point, AWQ input scales and their reciprocals, and row segments, as the kernels take
    them: a mode without one gets the scale in its place (never read)."""
    return tuple(t if t is not None else iw.scale for t in (iw.scale, iw.zero, iw.in_scale, iw.in_recip, iw.row_seg))


def fit_config(iw: IntWeight, cfg: dict) -> dict:
    """A launch configuration fitted to this weight (a copy): INT4 tiles are one group along K, and no output tile
    straddles two projections' AWQ input scales."""
    cfg = dict(cfg)
    if iw.mode in INT4_MODES and "BLOCK_N" in cfg:  # a library launch (kernels/library.py) has no tile
        cfg["BLOCK_K"] = GROUP
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], iw.max_block_n)
    return cfg
