"""Scratch tensors of the linear kernels (split-K partial sums and tile counters, W8A8's quantized rows), and the
split-K reduction every linear family's kernels end with (`split_k_total`).

A launch writes and reads its scratch within itself, so two launches may share one only if they cannot overlap:
eager calls share the process's table and run on the default stream, one after another; a graph may replay on
another stream while a second graph replays, so each DecodeGraph makes its scratch inside its own
`split_scratch_scope` (the table then lives as long as the graph).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import triton
import triton.language as tl

_SPLIT_SCRATCH = contextvars.ContextVar("split_scratch", default=None)
_EAGER_SCRATCH: dict[tuple, tuple] = {}


@contextlib.contextmanager
def split_scratch_scope(table: dict):
    """Linears launched inside keep their scratch in `table` (a graph's own)."""
    token = _SPLIT_SCRATCH.set(table)
    try:
        yield
    finally:
        _SPLIT_SCRATCH.reset(token)


def scratch(device, key: tuple, make):
    """A launch's scratch under `key` in the table in force, made on the warm-up run, never inside a capture (the
    counters' zero-fill would only be recorded into the graph, never run before an eager call)."""
    table = _SPLIT_SCRATCH.get()
    table = _EAGER_SCRATCH if table is None else table
    key = (device, *key)
    if key not in table:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear scratch must be made before graph capture: run the step once first")
        table[key] = make()
    return table[key]


def split_parts(device, key: tuple, split: int, m: int, n: int, tiles: int):
    """Split-K's float32 partial sums [split, m, n] and one int32 counter per output tile (zero between calls: the
    last program of a tile resets it); `key` names the kernel family, whose launches share them."""
    return scratch(device, (*key, split, m, n, tiles), lambda: (
        torch.empty(split, m, n, dtype=torch.float32, device=device),
        torch.zeros(tiles, dtype=torch.int32, device=device)))


@triton.jit
def split_k_total(acc, part_ptr, counter, slice_id, offs_m, offs_n, M, N, mask, SPLIT_K: tl.constexpr):
    """One K slice's partial sums into `part_ptr` ([SPLIT_K, M, N], float32 or int32: split_parts), then, in the
    tile's last program to finish (a counter per tile, set back to 0 for the next call), the slices added in slice
    order, so the result does not depend on which finished first. Returns (whether this program is that last one,
    the total there)."""
    part = part_ptr + offs_m[None, :] * N + offs_n[:, None]
    tl.store(part + slice_id * M * N, acc, mask=mask)
    tl.debug_barrier()  # every thread's slice is written before the counter says so (release below)
    last = tl.atomic_add(counter, 1, sem="acq_rel") == SPLIT_K - 1
    total = tl.zeros_like(acc)
    if last:
        for sl in range(SPLIT_K):
            total += tl.load(part + sl * M * N, mask=mask, other=0, cache_modifier=".cg")  # from L2, not L1
        tl.atomic_xchg(counter, 0)
    return last, total
