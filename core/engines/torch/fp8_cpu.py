"""FP8 E4M3 linears on the CPU: a small C kernel that multiplies with E4M3 weights without materializing them.

torch 2.13 converts float8_e4m3fn to bf16/float on the CPU one element at a time (about 4 ns each here), so
`(q.float() * scale).to(bf16)` costs ~30x the BF16 matmul it feeds. This kernel reads the weight bytes once:

- E4M3 -> float exactly, in registers: the byte's bits moved into an IEEE half (sign to bit 15, exponent and mantissa
  to bits 13..7) is the E4M3 value times 2^-8, subnormals included (E4M3 subnormals become half subnormals, which
  `vcvtph2ps` widens exactly); the 2^8 goes into the per-channel scale, which is applied to the output:
  x @ (q * s)^T == (x @ q^T) * s^T.
- decode (few rows: one token per sequence): out[m, n] = sum_k x[m, k] * e4m3(q[n, k]) * s[n], accumulated in float.
- prefill (many rows): the E4M3 values as exact bf16 (no scale), for a BF16 matmul whose output is scaled.
- decode with bf16 activations (FP8's base dtype): W8A8's per-token quantization, the output scales and the rounding
  to bf16 done here too, as the same float operations in the same order as the torch ops they replace (bit for bit):
  as ten small torch ops a Linear they took about as long as the products. (On a prompt the same passes in C, single
  threaded, were slower than torch's.)

Built once per machine with the system C compiler (`cc -O3 -march=native`, cbuild.py) into the cache folder;
where there is no compiler or no x86 vector unit it is not used and FP8Linear falls back to its eager path
(`available()` says why). Single-threaded on purpose: the work is ~1 byte a parameter and one core keeps up with it,
and a second OpenMP runtime next to torch's would fight it for the same 2 cores.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from core.engines.torch import cbuild

_SOURCE = Path(__file__).with_name("fp8_cpu.c").read_text()  # built by cbuild, keyed by its text

def _declare(lib: ctypes.CDLL) -> str | None:
    lib.triage_fp8_isa.restype = ctypes.c_int
    lib.triage_fp8_gemv.restype = None
    lib.triage_fp8_gemv.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                    ctypes.c_void_p, ctypes.c_void_p]
    lib.triage_fp8_decode_bf16.restype = None
    lib.triage_fp8_decode_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.triage_fp8_to_f32.restype = None
    lib.triage_fp8_to_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.triage_fp8_to_bf16.restype = None
    lib.triage_fp8_to_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return None if lib.triage_fp8_isa() else "this CPU has neither AVX-512 nor AVX2 with F16C and FMA"


_LIBRARY = cbuild.Library("triage_fp8", _SOURCE, _declare, "TRIAGE_FP8_CPU_KERNEL", "the FP8 CPU kernel")
library = _LIBRARY.get
# Within this block (this thread only) FP8Linear takes its eager path: for benchmarks and tests that compare.
turned_off = _LIBRARY.turned_off
available = _LIBRARY.available
why_not = _LIBRARY.why_not


def isa() -> str:
    lib = library()
    return {512: "AVX-512", 256: "AVX2"}.get(lib.triage_fp8_isa(), "scalar") if lib else "none"


def gemv(x, q, scale):
    """float32 out[M, N] = (x[M, K] @ e4m3(q[N, K])^T) * scale[N]; x float32 contiguous, q E4M3 contiguous."""
    import torch

    lib = library()
    m, k = x.shape
    n = q.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    with torch.profiler.record_function("fp8_cpu::gemv"):  # so profiler tables show the kernel's time
        lib.triage_fp8_gemv(x.data_ptr(), m, k, q.data_ptr(), n, scale.data_ptr(), out.data_ptr())
    return out


def decode_bf16(x, q, scale, w8a8: bool):
    """FP8Linear's few-row path in one call, for bf16 activations: bf16 out[M, N], bit for bit what its torch ops give
    (quantize_rows and to_float for W8A8, gemv, the activation scales, .to(bfloat16)). Those ten small ops took about
    as long as the product itself at decode (~0.13 ms a Linear, 126 Linears a step on the embedded model)."""
    import torch

    lib = library()
    m, k = x.shape
    n = q.shape[0]
    work = torch.empty(m * k + m, dtype=torch.float32)
    out = torch.empty((m, n), dtype=torch.bfloat16)
    with torch.profiler.record_function("fp8_cpu::decode_bf16"):
        lib.triage_fp8_decode_bf16(x.data_ptr(), m, k, int(w8a8), q.data_ptr(), n, scale.data_ptr(), work.data_ptr(),
                                   out.data_ptr())
    return out


def to_bf16(q):
    """The exact E4M3 values of `q` (no scale) as a bf16 tensor of the same shape."""
    import torch

    out = torch.empty(q.shape, dtype=torch.bfloat16)
    with torch.profiler.record_function("fp8_cpu::to_bf16"):
        library().triage_fp8_to_bf16(q.data_ptr(), q.numel(), out.data_ptr())
    return out


def to_float(q):
    """The exact E4M3 values of `q` (no scale) as a float32 tensor of the same shape."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32)
    with torch.profiler.record_function("fp8_cpu::to_float"):
        library().triage_fp8_to_f32(q.data_ptr(), q.numel(), out.data_ptr())
    return out
