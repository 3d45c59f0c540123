"""Pick the fastest launch configuration of each decode-time linear on this GPU, by timing CUDA-graph replays.

Each candidate runs over enough rotated copies of its weight that they cannot stay in L2, back to back inside one
graph, as they run in a decode step; time per call = replay time / calls. The winners go into kernels.TUNED, which
DecodeGraph reads when it captures. cuBLAS (bf16) and torch._scaled_mm (W8A8) are candidates too, so a Triton
kernel is used only where it measures faster.
"""
from __future__ import annotations

import functools
import math

import torch

from core.engines.fast import kernels as K

L2_BYTES = 60 * 2**20


def rotated_copies(wbytes: int, most: int = 32) -> int:
    """How many copies of a weight of wbytes to rotate through when timing it, so that together they are four times
    L2 and every call reads its weight from HBM, as in a real step (at least 2, at most `most`)."""
    return max(2, min(most, math.ceil(4 * L2_BYTES / wbytes)))

# (kernel, BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_M follows from the batch size.
SMALL_M = [
    ("dot", 16, 256, 4, 4), ("dot", 16, 512, 4, 3), ("dot", 32, 256, 4, 4), ("dot", 32, 128, 4, 5),
    ("dot", 64, 128, 4, 4), ("dot", 64, 256, 4, 3), ("dot", 128, 128, 8, 3), ("dot", 32, 512, 4, 3),
    ("dot", 64, 512, 8, 3),
]
GEMV = [("gemv", 8, 1024, 4, 1), ("gemv", 16, 512, 4, 1), ("gemv", 4, 2048, 4, 1), ("gemv", 16, 1024, 8, 1),
        ("gemv", 8, 2048, 8, 1), ("gemv", 2, 4096, 4, 1), ("gemv", 8, 1024, 4, 3), ("gemv", 4, 2048, 4, 3),
        ("gemv", 32, 256, 4, 3)]
LARGE_M = [("dot", 64, 128, 4, 4), ("dot", 64, 64, 4, 5), ("dot", 128, 128, 8, 3), ("dot", 32, 128, 4, 4),
           ("dot", 64, 256, 4, 3), ("dot", 128, 256, 8, 3), ("dot", 32, 256, 4, 4), ("dot", 64, 128, 4, 3)]
# (kernel, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K): K cut into slices, for outputs too narrow to give
# every SM a program with enough bytes in flight (4096 columns in 64-wide tiles are 64 programs on 132 SMs)
SPLIT = {
    "small": [("dot", 32, 256, 4, 4, 2), ("dot", 64, 256, 4, 3, 2), ("dot", 64, 256, 4, 3, 4),
              ("dot", 64, 512, 8, 3, 2)],
    "large": [("dot", 32, 128, 4, 4, 2), ("dot", 64, 128, 4, 4, 2), ("dot", 64, 128, 4, 4, 4),
              ("dot", 128, 128, 8, 3, 2), ("dot", 128, 128, 8, 3, 4), ("dot", 64, 256, 4, 3, 2),
              ("dot", 128, 256, 8, 3, 2)],
}


def candidates(mode: int, m: int) -> list[dict]:
    large = K.block_m_for(m) >= 64
    rows = LARGE_M if large else SMALL_M + (GEMV if m == 1 else [])
    out = [dict(kernel=k, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s) for k, bn, bk, w, s in rows]
    if m > 1:
        out += [dict(kernel=k, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s, SPLIT_K=sk)
                for k, bn, bk, w, s, sk in SPLIT["large" if large else "small"]]
    if mode in (K.MODE_BF16, K.MODE_W8A8):
        out.append(dict(kernel="torch"))
    return out


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


def rotated_weights(mode: int, n: int, k: int, copies: int, device):
    """`copies` random weights of an [n, k] linear in `mode` (bf16, or E4M3 with per-channel scales), as (w, scale)
    pairs, to rotate through when timing (`rotated_copies`)."""
    out = []
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        if mode == K.MODE_BF16:
            out.append((w, None))
        else:
            s = w.float().abs().amax(dim=1).clamp(min=1e-12) / K.E4M3_MAX
            out.append(((w.float() / s[:, None]).to(torch.float8_e4m3fn), s))
    return out


@torch.inference_mode()
def tune_shape(mode: int, m: int, n: int, k: int, device="cuda", log=print, x16: bool | None = None) -> list[dict]:
    """Time every candidate for one (mode, M, N, K); store the fastest in kernels.TUNED; return all timings.
    x16 (default: weight-only at several rows, as DecodeGraph runs it): the activations are also given in f16."""
    elem = 2 if mode == K.MODE_BF16 else 1
    wbytes = n * k * elem
    copies = rotated_copies(wbytes)
    ws = rotated_weights(mode, n, k, copies, device)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    xs = None
    if mode == K.MODE_W8A8:  # the linear reads activations already in E4M3
        xs = x.float().abs().amax(dim=1).clamp(min=1e-12) / K.E4M3_MAX
        x = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
    if x16 is None:
        x16 = mode == K.MODE_WO and m > 1
    x_f16 = x.to(torch.float16) if x16 else None
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    ref = None
    rows = []
    for cfg in candidates(mode, m):
        try:
            # straight to the implementation: linear()'s fallback would time torch under this config's name
            if cfg["kernel"] == "torch":
                def call(w, s):
                    K.linear_torch(x, w, s, xs, out, mode, False)
            else:
                def call(w, s, cfg=cfg):
                    K.linear_triton(x, w, s, xs, out, mode, False, cfg, x_f16)
            calls = [functools.partial(call, w, s) for w, s in ws]
            calls[0]()
            got = out.float().clone()
            ref = got if ref is None else ref
            err = ((got - ref).norm() / ref.norm().clamp(min=1e-12)).item()
            if err > 2e-2:
                log(f"  skip {cfg}: result differs from the first candidate's by {err:.3g}")
                continue
            us = graph_time_us(calls)
        except Exception as exc:  # a config that does not compile or fit shared memory is just not a candidate
            log(f"  skip {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
            continue
        # bytes a call must move: the weight (+ scales), activations in, result out
        moved = wbytes + (n * 4 if mode != K.MODE_BF16 else 0) + m * k * x.element_size() + m * n * 2
        rows.append(dict(mode=mode, m=m, n=n, k=k, cfg=cfg, us=us, gbs=moved / us / 1e3, rel_err_vs_first=err,
                         x16=bool(x16)))
    if rows:
        best = min(rows, key=lambda r: r["us"])
        K.TUNED[(mode, K.m_key(m), n, k)] = best["cfg"]
    del ws
    torch.cuda.empty_cache()
    return rows


def model_shapes(dims) -> list[tuple[str, int, int]]:
    return [("qkv", dims.qkv_out, dims.hidden), ("o", dims.hidden, dims.heads * dims.head_dim),
            ("gate_up", 2 * dims.inter, dims.hidden), ("down", dims.hidden, dims.inter)]


def tune_model(dims, modes: list[str], batches: list[int], device="cuda", log=print, lm_head: bool = True):
    """Tune every projection of `dims` for each precision and batch; returns rows for a table."""
    rows = []
    shapes = model_shapes(dims) + ([("lm_head", dims.vocab, dims.hidden)] if lm_head else [])
    for b in sorted({K.m_key(b): b for b in batches}.values()):
        for name, n, k in shapes:
            for mode_name in modes:
                mode = K.MODES[mode_name]
                if name == "lm_head" and mode != K.MODE_BF16:
                    continue
                r = tune_shape(mode, b, n, k, device, log)
                for x in r:
                    x["shape"], x["precision"] = name, mode_name
                rows += r
                if r:
                    best = min(r, key=lambda x: x["us"])
                    log(f"tuned {mode_name:6s} {name:8s} M={b:<3d} {n}x{k}: {best['us']:.1f} us "
                        f"({best['gbs']:.0f} GB/s) {best['cfg']}")
    return rows
