"""FlashAttention-3's Hopper forward kernel for the fast engine's prompt pass: causal attention in BF16.

FA3 (Dao-AILab/flash-attention, hopper/) is what vLLM attends with on Hopper. On the H200 its BF16 kernel took 8-17%
less time than cuDNN's (SDPA's fastest there) for the same error against float32 (docs/perf-log/fp8-h200.md), which took
the 125K-token prompt pass under 10 s in BF16 and under 8 s in FP8 W8A8. torch does not ship it, so
scripts/build_fa3.sh builds it from FA3's sources into a small C library (fa3_shim.cu: one causal head-dim-128
configuration per element type, no torch inside, so no torch version to match) that this module loads with ctypes.
The library's E4M3 kernel (what vLLM's FP8 KV cache runs) is measured by bench/fa3_probe.py and not used by the
engine: 7% RMS error against float32 for 1.3x BF16 FA3's speed. Without the library, off Hopper, or with another
head_dim, `why_not` says why and the prompt pass attends through SDPA (cuDNN). TRIAGE_FA3=0 turns it off;
TRIAGE_FA3_LIB names the library file (default: build/libtriage_fa3.so beside this file).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from core.engines.fast.options import options


HEAD_DIM = 128
DEFAULT_LIB = Path(__file__).parent / "build" / "libtriage_fa3.so"
DTYPE_BF16, DTYPE_E4M3 = 0, 1  # the library's codes for its element types


def lib_path() -> Path:
    return Path(options().fa3_lib or DEFAULT_LIB)


_LOADED: dict[str, object] = {}  # path -> entry point; failures are not kept, so a library built later is found


def _entry(path: str):
    """The library's entry point, or the reason it cannot be loaded (a string)."""
    if path in _LOADED:
        return _LOADED[path]
    if not Path(path).is_file():
        return f"FlashAttention-3 is not built here ({path} is missing; scripts/build_fa3.sh builds it)"
    try:
        f = ctypes.CDLL(path).triage_fa3_fwd_causal
    except (OSError, AttributeError) as exc:
        return f"FlashAttention-3's library at {path} does not load: {exc}"
    i, ll, p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    f.restype = i
    f.argtypes = [i, p, p, p, p, p, p, p, p, p, i, i, i, i, i] + [ll] * 12 + [ctypes.c_float, i, i, p]
    _LOADED[path] = f
    return f


def why_not(device, hq: int, hkv: int, d: int) -> str | None:
    """None if FA3 can run the prompt's attention of this shape on this device; else why not."""
    if not options().fa3:
        return "turned off (TRIAGE_FA3=0)"
    device = torch.device(device)
    if device.type != "cuda":
        return "not on a CUDA device"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"built for Hopper (compute capability 9.0); this GPU is {cap[0]}.{cap[1]}"
    if d != HEAD_DIM:
        return f"built for head_dim {HEAD_DIM} only (this model: {d})"
    if hq % hkv:
        return f"query heads ({hq}) are not a multiple of KV heads ({hkv})"
    entry = _entry(str(lib_path()))
    return entry if isinstance(entry, str) else None


def fwd_causal(dtype: int, q, k, v, descales, out) -> torch.Tensor:
    """out [b, T, heads, d] bf16 = causal attention of q [b, T, heads, d] over k, v [b, T, kv_heads, d] (any strides
    with the last dim contiguous); dtype DTYPE_BF16 (bf16 q/k/v) or DTYPE_E4M3 (E4M3 q/k/v, descales = the q, k and
    v descales, [b, kv_heads] float32 each)."""
    b, T, h, d = q.shape
    hkv = k.shape[2]
    want = torch.bfloat16 if dtype == DTYPE_BF16 else torch.float8_e4m3fn
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(-1) != 1:
            raise ValueError(f"FA3 needs {name}'s last dim contiguous")
        if t.dtype != (torch.bfloat16 if name == "out" else want) or t.device != q.device:
            raise ValueError(f"FA3 got {name} as {t.dtype} on {t.device}")
    if k.shape != v.shape or k.shape[:2] != (b, T) or out.shape != q.shape:
        raise ValueError(f"FA3 got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out {tuple(out.shape)}")
    if dtype == DTYPE_E4M3 and (not descales or any(s.shape != (b, hkv) or s.dtype != torch.float32
                                                    for s in descales)):
        raise ValueError(f"FA3's E4M3 kernel needs q, k and v descales of shape ({b}, {hkv}), float32")
    entry = _entry(str(lib_path()))
    if isinstance(entry, str):
        raise RuntimeError(entry)
    lse = torch.empty(b, h, T, device=q.device, dtype=torch.float32)
    semaphore = torch.empty(1, device=q.device, dtype=torch.int32)
    qd, kd, vd = (s.contiguous() for s in descales) if descales else (None, None, None)
    props = torch.cuda.get_device_properties(q.device)
    # the library sets its CUDA device to q's; torch's current device is made the same for the call and put back
    with torch.cuda.device(q.device):
        err = entry(
            dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), semaphore.data_ptr(),
            qd.data_ptr() if qd is not None else None, kd.data_ptr() if kd is not None else None,
            vd.data_ptr() if vd is not None else None, b, T, h, hkv, d,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            1.0 / d ** 0.5, q.device.index, props.multi_processor_count,
            torch.cuda.current_stream(q.device).cuda_stream)
    if err:
        raise RuntimeError(f"FlashAttention-3 failed to launch (CUDA error {err})")
    return out


def causal_attention_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [b, T, heads, d], k/v [b, T, kv_heads, d] bf16 (any strides with the last dim contiguous: a cache's
    [b, kv_heads, max_len, d] rows transposed) -> [b, T, heads, d] bf16."""
    return fwd_causal(DTYPE_BF16, q, k, v, None, torch.empty(q.shape, device=q.device, dtype=torch.bfloat16))
