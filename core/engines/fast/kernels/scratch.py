"""Scratch tensors of the linear kernels (split-K partial sums and tile counters, W8A8's quantized rows).

A launch writes and reads its scratch within itself, so two launches may share one only if they cannot overlap:
eager calls share the process's table and run on the default stream, one after another; a graph may replay on
another stream while a second graph replays, so each DecodeGraph makes its scratch inside its own
`split_scratch_scope` (the table then lives as long as the graph).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

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
