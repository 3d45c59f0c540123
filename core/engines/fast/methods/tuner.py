"""Pick the fastest launch of each decode-time linear on this GPU, for any linear method, by timing CUDA-graph
replays.

Each candidate (a named kernel launch and its parameters, `LinearMethod.candidates`) runs over enough rotated copies
of its weight that they cannot stay in L2, back to back inside one graph, as they run in a decode step; time per
call = replay time / calls. A candidate further from the expected product than the method's tolerance is broken,
not timed. The winner of each (precision, batch bucket, N, K) goes into methods/tuning.py's table, which the
methods read when DecodeGraph captures. cuBLAS and torch._scaled_mm are candidates too, so a Triton kernel is used
only where it measures faster.
"""
from __future__ import annotations

import functools
import math

import torch

from core.engines.fast.methods import tuning
from core.engines.fast.methods.base import LinearMethod

L2_BYTES = 60 * 2**20


def rotated_copies(wbytes: int, most: int = 32) -> int:
    """How many copies of a weight of wbytes to rotate through when timing it, so that together they are four times
    L2 and every call reads its weight from HBM, as in a real step (at least 2, at most `most`)."""
    return max(2, min(most, math.ceil(4 * L2_BYTES / wbytes)))


def graph_time_us(calls, replays: int = 5) -> float:
    """Median-free but steady: one graph of all calls, replayed `replays` times after a warm replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * len(calls))


def model_shapes(dims) -> list[tuple[str, int, int, list[int]]]:
    """(name, N, K, rows of each projection fused in it) of one layer's linears."""
    hd = dims.head_dim
    return [("qkv", dims.qkv_out, dims.hidden, [dims.heads * hd, dims.kv_heads * hd, dims.kv_heads * hd]),
            ("o", dims.hidden, dims.heads * hd, [dims.hidden]),
            ("gate_up", 2 * dims.inter, dims.hidden, [dims.inter, dims.inter]),
            ("down", dims.hidden, dims.inter, [dims.hidden])]


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


@torch.inference_mode()
def tune_shape(method: LinearMethod, rows: int, n: int, k: int, segments: list[int] | None = None, log=print,
               kernels: set[str] | None = None, device="cuda") -> list[dict]:
    """Time each candidate of one linear; store the fastest in the tuning table; return every timing. kernels: only
    those launches' candidates, against the winner the table already holds (a loaded table's)."""
    cands = method.candidates(rows, n, k, kernels)
    held = tuning.winner(method.precision, rows, n, k)
    if kernels is not None and held:
        cands = [held] + [c for c in cands if c != held]
    ws = method.timing_weights(n, k, segments or [n], 2, device)
    wbytes = sum(t.numel() * t.element_size() for t in ws[0].tensors())
    ws += method.timing_weights(n, k, segments or [n], rotated_copies(wbytes) - 2, device)
    x, inputs = method.timing_inputs(rows, k, device)
    out = torch.empty(rows, n, device=device, dtype=torch.bfloat16)
    expected = method.expected(ws[0], x, inputs)
    results = []
    for cfg in cands:
        try:
            calls = [functools.partial(method.launch, w, x, out, cfg, False, **inputs) for w in ws]
            calls[0]()
            got = out.float()
            expected = got.clone() if expected is None else expected
            err = float((got - expected.float()).norm() / expected.float().norm().clamp(min=1e-12))
            if not err <= method.tune_tolerance:
                log(f"  skip {cfg}: off the expected product by {err:.3g}")
                continue
            us = graph_time_us(calls)
        except Exception as exc:  # a config that does not compile or fit is just not a candidate
            log(f"  skip {cfg}: {_failure(exc)}")
            continue
        moved = wbytes + rows * k * x.element_size() + rows * n * 2  # weight and scales, activations, result
        results.append(dict(precision=method.precision.value, m=rows, n=n, k=k, cfg=cfg, us=us,
                            gbs=moved / us / 1e3, rel_err=err))
    if results:
        tuning.record(method.precision, rows, n, k, min(results, key=lambda r: r["us"])["cfg"])
    del ws
    torch.cuda.empty_cache()
    return results


def tune_model(dims, methods: list[LinearMethod], batches: list[int], log=print, kernels: set[str] | None = None,
               lm_head: bool = True) -> list[dict]:
    """Tune every projection of `dims` for each method and batch bucket (and the BF16 lm_head, which every
    precision keeps at BF16, for a BF16 method when lm_head); returns every timing, each named by its shape."""
    rows = []
    for b in sorted({tuning.bucket(b): b for b in batches}.values()):
        for method in methods:
            shapes = model_shapes(dims)
            if lm_head and not method.precision.is_fp8 and not method.precision.is_int:
                shapes.append(("lm_head", dims.vocab, dims.hidden, [dims.vocab]))
            for name, n, k, segments in shapes:
                r = tune_shape(method, b, n, k, segments, log, kernels)
                for x in r:
                    x["shape"] = name
                rows += r
                if r:
                    best = min(r, key=lambda x: x["us"])
                    log(f"tuned {method.precision.value:8s} {name:8s} M={b:<3d} {n}x{k}: {best['us']:.1f} us "
                        f"({best['gbs']:.0f} GB/s) {best['cfg']}")
    return rows
