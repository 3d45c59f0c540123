"""The integer weight-only layers on the CPU (quant.py's INT4 and INT8 weight-only linears) through a small C
library: their weights are the very bf16 values their torch ops give, only computed without torch ops.

Those layers dequantized every weight on every call: as torch ops (unpack the nibbles, stack, subtract the zero
point, scale, round to bf16, into a fresh tensor) about 7 ms for one 2048 x 640 INT4 layer on a 2-core AMD EPYC,
126 layers a decode step on the embedded model. Here:
- up to GEMV_ROWS rows (decode steps): a GEMV from the codes (`int4_gemv`, `int8_gemv`): each weight row is
  dequantized once into a buffer that stays in L1, or, for INT4 without AWQ, looked up by code from the group's 16
  possible bf16 weights held in two AVX2 registers, and multiplied with every input row; no weight tensor is written.
  The products are F.linear's on the same bf16 weights, summed in another order;
- more rows (a prompt): the weights themselves (`int4_weights`, `int8_weights`), bit for bit what `dequantized(bf16)`
  gives, into a buffer reused per thread and shape, for a GEMM.
Plain C the compiler vectorizes for this CPU (`-march=native`), AVX2 intrinsics for the lookup (plain C without
AVX2); built once per machine (cbuild.py). Single-threaded, as fp8_cpu.py's kernel is.
TRIAGE_INT_CPU_KERNEL=0 turns it off.
Measured: docs/perf-log/fp8-cpu.md, "INT4 and INT8 weight-only on the CPU"; tests/engines/test_int_cpu.py.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from core.engines.torch import cbuild

_SOURCE = Path(__file__).with_name("int_cpu.c").read_text()  # built by cbuild, keyed by its text


def _declare(lib: ctypes.CDLL) -> str | None:
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.triage_int4_dequant.restype = None
    lib.triage_int4_dequant.argtypes = [p, p, p, p, i, i, i, i, i, p, p]
    lib.triage_int8_dequant.restype = None
    lib.triage_int8_dequant.argtypes = [p, p, i, i, i, p, p]
    lib.triage_int4_gemv_bf16.restype = None
    lib.triage_int4_gemv_bf16.argtypes = [p, i, i, p, p, p, p, i, i, i, p, p]
    lib.triage_int8_gemv_bf16.restype = None
    lib.triage_int8_gemv_bf16.argtypes = [p, i, i, p, p, i, p, p]
    return None


_LIBRARY = cbuild.Library("triage_int", _SOURCE, _declare, "TRIAGE_INT_CPU_KERNEL", "the INT CPU kernel")
# Within this block (this thread only) the integer layers dequantize with torch ops: for benchmarks and tests.
turned_off = _LIBRARY.turned_off
available = _LIBRARY.available
why_not = _LIBRARY.why_not


_scratch = threading.local()


SCRATCH_MAX_BYTES = 64 << 20  # larger weights (big models' MLPs) get a fresh tensor: no hidden copy kept per thread


def _out(n: int, k: int, as_float32: bool) -> torch.Tensor:
    """This thread's weight buffer of that shape, reused call after call: a fresh 2.6 MB tensor costs more in page
    faults (~1.5 ms) than dequantizing into it (~0.45 ms for 2048 x 640 INT4). The weight is read by the matmul that
    follows and by nothing after the next call of the same shape on this thread."""
    dtype = torch.float32 if as_float32 else torch.bfloat16
    if n * k * dtype.itemsize > SCRATCH_MAX_BYTES:
        return torch.empty((n, k), dtype=dtype)
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    key = (n, k, as_float32)
    if key not in buffers:
        buffers[key] = torch.empty((n, k), dtype=dtype)
    return buffers[key]


def int4_weights(packed, scales, zeros, input_scale, n_in: int, as_float32: bool = False) -> torch.Tensor:
    """An Int4Linear's weight as `dequantized(torch.bfloat16)` gives it: bf16 [out, n_in], or (as_float32) those
    same bf16 values as float32, for a float32 GEMM."""
    n, kp = packed.shape[0], packed.shape[1] * 2
    out = _out(n, n_in, as_float32)
    work = torch.empty(kp + n_in, dtype=torch.float32)
    with torch.profiler.record_function("int_cpu::int4_weights"):  # so profiler tables show the kernel's time
        _LIBRARY.get().triage_int4_dequant(packed.data_ptr(), scales.data_ptr(), zeros.data_ptr(),
                                           None if input_scale is None else input_scale.data_ptr(), n, n_in, kp,
                                           kp // scales.shape[1], int(as_float32), work.data_ptr(), out.data_ptr())
    return out


def int8_weights(q, scale, as_float32: bool = False) -> torch.Tensor:
    """An Int8Linear's weight as `dequantized(torch.bfloat16)` gives it (or those bf16 values as float32)."""
    n, k = q.shape
    out = _out(n, k, as_float32)
    work = torch.empty(k, dtype=torch.float32)
    with torch.profiler.record_function("int_cpu::int8_weights"):
        _LIBRARY.get().triage_int8_dequant(q.data_ptr(), scale.data_ptr(), n, k, int(as_float32), work.data_ptr(),
                                           out.data_ptr())
    return out


GEMV_ROWS = 8  # up to this many rows (decode steps) multiply from the codes; more dequantize once for a GEMM


def int4_gemv(x, packed, scales, zeros, input_scale, n_in: int) -> torch.Tensor:
    """bf16 x [M, n_in] (M <= GEMV_ROWS, contiguous) @ an Int4Linear's bf16 weights^T -> bf16 [M, out], each weight row
    dequantized once, in L1, for all M rows: no weight tensor is written. The same products as F.linear on
    `int4_weights`, summed in another order."""
    m, n, kp = x.shape[0], packed.shape[0], packed.shape[1] * 2
    work = torch.empty(m * kp + kp + n_in, dtype=torch.float32)
    out = torch.empty((m, n), dtype=torch.bfloat16)
    with torch.profiler.record_function("int_cpu::int4_gemv"):
        _LIBRARY.get().triage_int4_gemv_bf16(x.data_ptr(), m, n_in, packed.data_ptr(), scales.data_ptr(),
                                             zeros.data_ptr(), None if input_scale is None else input_scale.data_ptr(),
                                             n, kp, kp // scales.shape[1], work.data_ptr(), out.data_ptr())
    return out


def int8_gemv(x, q, scale) -> torch.Tensor:
    """bf16 x [M, K] (M <= GEMV_ROWS, K a multiple of 16, contiguous) @ an Int8Linear's bf16 weights^T, as int4_gemv."""
    m, (n, k) = x.shape[0], q.shape
    work = torch.empty(m * k + k, dtype=torch.float32)
    out = torch.empty((m, n), dtype=torch.bfloat16)
    with torch.profiler.record_function("int_cpu::int8_gemv"):
        _LIBRARY.get().triage_int8_gemv_bf16(x.data_ptr(), m, k, q.data_ptr(), scale.data_ptr(), n, work.data_ptr(),
                                             out.data_ptr())
    return out
