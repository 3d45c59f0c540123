"""Decode attention over an E4M3 KV cache in CUDA C++ (attn_e4m3.cu), compiled at run time with NVRTC
(torch.cuda._compile_kernel).

Why not Triton: Triton feeds E4M3 tiles to the tensor cores through shared memory one byte at a time, so its split
kernel read the FP8 cache at ~2.7 TB/s on the H200 against ~4.1 TB/s for the bf16 cache, and the FP8 cache saved
far less than half of attention's time (docs/perf-log/fp8-h200.md). Here each thread loads 16-byte vectors of K and V
and turns them into the tensor cores' f16 operands in registers (one cvt per two values), never through shared memory:

- Q·Kᵀ: mma m16n8k16 with the G query heads of one KV head as rows (padded to 16) and 8 tokens as columns. The
  contraction runs over head dims in an order of our choosing (a sum does not care), picked so that thread c of a
  quad holds dims 32c..32c+31 of its token: two 16-byte loads, no byte shuffling. Q is permuted the same way once.
- P·V: the score fragments are the A operand as they stand (FlashAttention-2's register reuse); V's B fragment
  needs two tokens' bytes per register, built with one byte permute per two head dims.
- Scales, folded instead of dequantized: each token's K scale multiplies its score, its V scale its probability.
  Q enters the f16 MMA scaled by a power of two per head (exact) so any bf16 query fits f16's range; P·vs enters it
  divided by the largest V scale seen so far (so it stays in [0, 1]), and the accumulator is rescaled as that
  reference grows, as it is for the running max. The result is closer to float32 attention than the Triton
  kernel's, which rounds each dequantized K/V value to bf16 as the eager cache read does.

The kernel writes the split kernel's partials (m in the log2 domain, l, unnormalized acc) so the Triton combine
kernel finishes it. It serves head_dim 128 and up to 16 query heads per KV head; `why_not` says when it cannot serve,
and decode attention then keeps the Triton kernel. TRIAGE_ATTN_E4M3_CUDA=0 turns it off.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from core.engines.fast.options import options

HEAD_DIM = 128
WARPS = 4
MAX_GROUP = 16

SOURCE = Path(__file__).with_name("attn_e4m3.cu")  # the kernel, read and compiled by NVRTC at first use


def turned_off() -> bool:
    return not options().attn_e4m3_cuda


@functools.lru_cache(maxsize=None)
def _compiled(device_index: int, warps: int = WARPS):
    """(kernel, None) or (None, why it cannot run), once per device and warps per program."""
    major, minor = torch.cuda.get_device_capability(device_index)
    if (major, minor) < (8, 9):
        return None, f"E4M3 conversions need compute capability 8.9 or newer; this GPU is {major}.{minor}"
    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is None:
        return None, f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC)"
    try:
        with torch.cuda.device(device_index):
            kernel = compile_kernel(SOURCE.read_text().replace("WARPS_PER_PROGRAM", str(warps)), "attn_split_e4m3",
                                    compute_capability=f"{major}{minor}")
    except Exception as exc:  # no NVRTC library, or it refused the source
        return None, f"NVRTC could not build it: {type(exc).__name__}: {str(exc).strip()[:300]}"
    return kernel, None


def why_not(device, hq: int, hkv: int, d: int) -> str | None:
    """Why the CUDA kernel cannot serve this model on this device (None: it can)."""
    device = torch.device(device)
    if turned_off():
        return "turned off (TRIAGE_ATTN_E4M3_CUDA=0)"
    if device.type != "cuda":
        return "not a CUDA device"
    if d != HEAD_DIM:
        return f"it serves head_dim {HEAD_DIM}; this model has {d}"
    if hq % hkv or hq // hkv > MAX_GROUP:
        return f"it serves up to {MAX_GROUP} query heads per KV head; this model has {hq} for {hkv}"
    return _compiled(device.index if device.index is not None else torch.cuda.current_device())[1]


def split_partials(q, k_cache, v_cache, k_scale, v_scale, pos, ws, hq, hkv, d, sm_scale) -> None:
    """The split kernel's partials (ws.m, ws.l, ws.acc) over the E4M3 cache, ws.num_warps warps per program; callers
    check why_not() first.
    q [B, hq, d] bf16 contiguous; caches [B, hkv, T, d] E4M3 (one layer; rows contiguous); scales [B, hkv, T]
    float32; pos [B] int64."""
    if k_cache.stride(-1) != 1 or k_cache.stride(-2) != d or v_cache.stride() != k_cache.stride() \
            or k_scale.stride(-1) != 1 or v_scale.stride() != k_scale.stride() or not q.is_contiguous() \
            or pos.dtype != torch.int64:
        raise ValueError("attn_e4m3 takes contiguous cache rows, like-strided K and V, and int64 positions")
    kernel = _compiled(q.device.index, ws.num_warps)[0]
    B = q.shape[0]
    g = hq // hkv
    kernel(grid=(B * hkv, ws.splits, 1), block=(ws.num_warps * 32, 1, 1), shared_mem=ws.num_warps * g * d * 4,
           args=[q, k_cache, v_cache, k_scale, v_scale, pos, ws.m, ws.l, ws.acc, float(sm_scale * 1.4426950408889634),
                 int(ws.split_len), int(ws.splits), int(k_cache.stride(0)), int(k_cache.stride(1)),
                 int(k_scale.stride(0)), int(k_scale.stride(1)), int(hq), int(hkv), int(g)])
