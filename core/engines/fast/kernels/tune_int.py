"""Pick the fastest launch configuration of each integer linear (intlinears.py) on this GPU, as tune.py does for
the BF16/FP8 ones: CUDA-graph replays over rotated copies of the weight (together four times L2, so every call reads
HBM, as in a decode step). The winners go into intlinears.INT_TUNED; `save` writes them in the tuning-table layout
(tuned_table.py), keys (mode, batch bucket, N, K) with modes 3-6."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import triton

from core.engines.fast.kernels import intlinears as IL
from core.engines.fast.kernels.tune import graph_time_us, model_shapes, rotated_copies
from core.engines.fast.tuned_table import read_tuned_table

SHIPPED_INT_H200 = Path(__file__).resolve().parent.parent / "tuned_int_h200.json"

# (BLOCK_N, SPLIT_K, num_warps, num_stages); INT4 tiles are one group (BLOCK_K 128), INT8 tiles BLOCK_K below
SMALL_M = [(32, 1, 4, 4), (32, 2, 4, 4), (32, 4, 4, 4), (64, 1, 4, 4), (64, 2, 4, 4), (64, 4, 4, 4),
           (64, 8, 4, 4), (128, 1, 4, 4), (128, 2, 4, 4), (128, 4, 8, 3)]
LARGE_M = [(64, 1, 4, 3), (128, 1, 8, 3), (64, 2, 4, 3), (128, 2, 8, 3)]
# the one-row FMA GEMV (_int_gemv_kernel): (BLOCK_N, SPLIT_K, num_warps, num_stages, DECODE), one INT4 group or 128
# INT8 codes a step; none spills registers on sm_90 (python -m bench.fast.int_gemv_compile). DECODE 0 and 2 are the A/B
# of its code paths (for INT8 weight-only 1 means 2).
GEMV = [(32, 4, 4, 3, 1), (64, 2, 4, 3, 1), (64, 4, 4, 3, 1), (64, 8, 4, 3, 1), (64, 4, 2, 3, 1), (128, 2, 4, 3, 1),
        (128, 4, 4, 3, 1), (128, 8, 4, 3, 1), (256, 4, 8, 3, 1), (256, 8, 8, 3, 1),
        (64, 4, 4, 3, 0), (128, 4, 4, 3, 0), (64, 4, 4, 3, 2), (128, 4, 4, 3, 2)]
# the same kernel over 2-8 rows (each weight dequantized once for all): the accumulators take registers, so 32 rows
# of weights a program at 4 warps, 64 at 8 (64 at 4 warps spills at 8 rows for INT8 and AWQ)
GEMV_ROWS = [(32, 2, 4, 3, 1), (32, 4, 4, 3, 1), (32, 8, 4, 3, 1), (64, 2, 8, 3, 1), (64, 4, 8, 3, 1),
             (32, 4, 4, 3, 2), (64, 4, 8, 3, 2)]


def candidates(mode: int, m: int, k: int, gemv_only: bool = False) -> list[dict]:
    large = IL.block_m_for(m) >= 64
    bk = IL.GROUP if mode in (IL.MODE_INT4, IL.MODE_INT4_AWQ) else (128 if large else 256)
    tiles = [] if gemv_only else [
        dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=s)
        for bn, sk, w, s in (LARGE_M if large else SMALL_M) if triton.cdiv(triton.cdiv(k, bk), sk) >= 2]
    gemv = [dict(kernel="gemv", BLOCK_N=bn, BLOCK_K=IL.GROUP, SPLIT_K=sk, num_warps=w, num_stages=s, DECODE=d)
            for bn, sk, w, s, d in (GEMV if m == 1 else GEMV_ROWS) if triton.cdiv(triton.cdiv(k, IL.GROUP), sk) >= 2]
    return tiles + (gemv if m <= IL.GEMV_MAX_ROWS and mode != IL.MODE_INT8 else [])


def _awq_rows(name: str, n: int, dims) -> list[int]:
    if name == "qkv":
        return [dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.kv_heads * dims.head_dim]
    if name == "gate_up":
        return [n // 2, n // 2]
    return [n]


def rotated_int_weights(mode_name: str, n: int, k: int, copies: int, rows: list[int], device="cuda"):
    out = []
    for _ in range(copies):
        w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
        awq = None
        if mode_name == "int4-awq":
            awq = ([torch.exp(torch.randn(k, device=device) * 0.3) for _ in rows], rows)
        out.append(IL.quantize(w, mode_name, *(awq or (None, None))))
    return out


@torch.inference_mode()
def tune_shape(mode_name: str, m: int, n: int, k: int, rows: list[int], log=print, gemv_only: bool = False
               ) -> list[dict]:
    """Time each candidate launch of one linear; the fastest goes into INT_TUNED. gemv_only: the one-row GEMV's
    candidates against the configuration INT_TUNED already holds (a loaded table's winner), not the whole grid."""
    mode = IL.INT_MODES[mode_name]
    cands = candidates(mode, m, k, gemv_only)
    if gemv_only and (held := IL.INT_TUNED.get((mode, IL.int_m_key(m), n, k))):
        cands = [held] + [c for c in cands if c != held]
    wbytes = n * k // (2 if mode in (IL.MODE_INT4, IL.MODE_INT4_AWQ) else 1)
    ws = rotated_int_weights(mode_name, n, k, rotated_copies(wbytes, most=48), rows)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    xq = torch.empty(m, k, device="cuda", dtype=torch.int8)
    xs = torch.empty(m, device="cuda", dtype=torch.float32)
    ref = IL.reference_linear(x, ws[0]).float()
    results = []
    for cfg in cands:
        try:
            calls = [functools.partial(IL.int_linear, x, w, out, False, cfg, xq, xs) for w in ws]
            calls[0]()
            err = float((out.float() - ref).norm() / ref.norm())
            if not err < 1e-2:
                log(f"  skip {cfg}: off the reference by {err:.3g}")
                continue
            us = graph_time_us(calls)
        except Exception as exc:  # a config that does not compile or fit is just not a candidate
            log(f"  skip {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
            continue
        moved = ws[0].nbytes + m * k * 2 + m * n * 2
        results.append(dict(mode=mode_name, m=m, n=n, k=k, cfg=cfg, us=us, gbs=moved / us / 1e3))
    if results:
        IL.INT_TUNED[(mode, IL.int_m_key(m), n, k)] = min(results, key=lambda r: r["us"])["cfg"]
    del ws
    torch.cuda.empty_cache()
    return results


def tune_model(dims, modes: list[str], batches: list[int], log=print, gemv_only: bool = False) -> list[dict]:
    rows = []
    for b in sorted({IL.int_m_key(b): b for b in batches}.values()):
        for name, n, k in model_shapes(dims):
            for mode_name in modes:
                r = tune_shape(mode_name, b, n, k, _awq_rows(name, n, dims), log, gemv_only)
                for x in r:
                    x["shape"] = name
                rows += r
                if r:
                    best = min(r, key=lambda x: x["us"])
                    log(f"tuned {mode_name:8s} {name:8s} M={b:<3d} {n}x{k}: {best['us']:.1f} us "
                        f"({best['gbs']:.0f} GB/s) {best['cfg']}")
    return rows


def save(path, meta: dict) -> None:
    Path(path).write_text(json.dumps({**meta, "configs": [{"key": list(k), "cfg": v}
                                                          for k, v in sorted(IL.INT_TUNED.items())]}, indent=1))


def load_int_tuned(path=None) -> int:
    """Add a saved integer tuning table (default: the H200 one shipped here, if present) to INT_TUNED."""
    path = Path(path or SHIPPED_INT_H200)
    if not path.exists():
        return 0
    table = read_tuned_table(path)
    for key, cfg in table.items():
        IL.INT_TUNED.setdefault(key, cfg)
    return len(table)
