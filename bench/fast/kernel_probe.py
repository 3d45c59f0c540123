"""Probe on one GPU, for choosing kernels: decode attention over an E4M3 KV cache under each launch configuration
(`--parts attention`, `splits`, `cuda`: attn_e4m3's CUDA kernel), weight-only FP8 linears at batch 8 and 64 against
BF16 (`--parts wo`), the batch-1 W8A8 GEMVs against BF16's (`--parts gemv`), a torch-profiler table of where a long
prompt pass spends its kernel time, and `ncu` of the attention kernels. Each part writes its results to --json as
soon as it ends. Results: docs/fast-engine.md and docs/perf-log/fp8-h200.md, "decode attention over the E4M3 cache". The
variants that lost (on the CUDA cores, V transposed, byte planes, E4M3 words) are in git: bench/kernel_variants.py
before #36.

    python -m bench.fast.kernel_probe --json $OUT/probe.json --out $OUT
    python -m bench.fast.kernel_probe --parts attention,prefill --prefill 125000
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch
import triton

from core.engines.fast import kernels as K
from core.engines.fast.methods import method_for, tuner, tuning
from core.precision import Precision

RESULTS: dict = {}

# the kernels' modes as the fast engine's methods launch them
METHOD_OF = {K.MODE_BF16: method_for(Precision.BF16), K.MODE_WO: method_for(Precision.FP8_WEIGHT_ONLY),
             K.MODE_W8A8: method_for(Precision.FP8)}


def save(path):
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def log(*a):
    print(*a, flush=True)


def workspace(batch, hq, hkv, d, max_len, block_t, warps=4, stages=2, per_sm=4, cuda_e4m3=False):
    """The Triton split kernel's workspace for these launch settings (cuda_e4m3: attn_e4m3's kernel's)."""
    return K.AttnWorkspace(batch, hq, hkv, d, max_len, "cuda", fp8=True, config=(block_t, warps, stages, per_sm),
                           cuda_e4m3=cuda_e4m3)


def attn_setup(batch=8, length=32768, hq=32, hkv=8, d=128):
    max_len = length + 64
    g = torch.Generator(device="cuda").manual_seed(0)
    kb = torch.randn(batch, hkv, max_len, d, device="cuda", generator=g).to(torch.bfloat16)
    vb = torch.randn(batch, hkv, max_len, d, device="cuda", generator=g).to(torch.bfloat16)
    ks = kb.float().abs().amax(-1).clamp(min=1e-12) / 448.0
    vs = vb.float().abs().amax(-1).clamp(min=1e-12) / 448.0
    k8 = (kb.float() / ks[..., None]).to(torch.float8_e4m3fn)
    v8 = (vb.float() / vs[..., None]).to(torch.float8_e4m3fn)
    q = torch.randn(batch, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    pos = torch.full((batch,), length - 1, device="cuda", dtype=torch.long)
    return dict(kb=kb, vb=vb, k8=k8, v8=v8, ks=ks, vs=vs, q=q, pos=pos, hq=hq, hkv=hkv, d=d, max_len=max_len,
                batch=batch, length=length)


def attn_calls(S):
    """name -> (callable, KV bytes read)."""
    hq, hkv, d, B = S["hq"], S["hkv"], S["d"], S["batch"]
    out = torch.empty(B, hq * d, device="cuda", dtype=torch.bfloat16)
    tok = B * hkv * S["length"]
    calls = {}
    ws64 = workspace(B, hq, hkv, d, S["max_len"], 64)
    calls["bf16 current"] = (lambda: K.decode_attention(S["q"], S["kb"], S["vb"], None, None, S["pos"], out, ws64,
                                                        hq, hkv, d, 1 / math.sqrt(d)), tok * d * 4)
    calls["fp8 before"] = (functools.partial(K.decode_attention, S["q"], S["k8"], S["v8"], S["ks"], S["vs"], S["pos"],
                                             out, workspace(B, hq, hkv, d, S["max_len"], 64, 4, 2, 4), hq, hkv, d,
                                             1 / math.sqrt(d)), tok * (d * 2 + 8))
    for bt in (32, 64, 128):
        for warps in (1, 2, 4):
            for stages in (2, 3, 4):
                ws = workspace(B, hq, hkv, d, S["max_len"], bt, warps, stages, 4)
                calls[f"fp8 T{bt} w{warps} s{stages}"] = (
                    functools.partial(K.decode_attention, S["q"], S["k8"], S["v8"], S["ks"], S["vs"], S["pos"],
                                      out, ws, hq, hkv, d, 1 / math.sqrt(d)), tok * (d * 2 + 8))
    return calls, out


def float32_attention(S, shape):
    """Attention in float32 over the dequantized E4M3 cache: how far each kernel is from the exact function."""
    L, g = S["length"], S["hq"] // S["hkv"]
    kf = (S["k8"][:, :, :L].float() * S["ks"][:, :, :L, None]).repeat_interleave(g, 1)
    vf = (S["v8"][:, :, :L].float() * S["vs"][:, :, :L, None]).repeat_interleave(g, 1)
    w = torch.softmax(torch.einsum("bhd,bhtd->bht", S["q"].float(), kf) / math.sqrt(S["d"]), dim=-1)
    return torch.einsum("bht,bhtd->bhd", w, vf).reshape(shape)


def measure_each(calls: dict, out, ref, exact) -> dict:
    """name -> (callable writing `out`, bytes it reads; ref/exact None to skip the comparisons): median time,
    bandwidth, whether out equals ref and by how much it differs, and its error against exact."""
    res = {}
    for name, (fn, nbytes, compared) in calls.items():
        try:
            fn()
            same = bool(torch.equal(out, ref)) if compared else None
            diff = float((out.float() - ref.float()).abs().max()) if compared else None
            err = float((out.float() - exact).norm() / exact.norm()) if compared else None
            ms = triton.testing.do_bench(fn, warmup=20, rep=200, return_mode="median")
            res[name] = dict(us=ms * 1000, gbs=nbytes / (ms / 1000) / 1e9, identical=same, max_diff=diff,
                             rel_err_vs_float32=err)
            log(f"  {name}: {ms * 1000:.1f} us, {nbytes / (ms / 1000) / 1e9:.0f} GB/s, identical {same}, "
                f"max diff {diff}, error vs float32 {err}")
        except Exception as exc:
            res[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            log(f"  {name}: {res[name]}")
    return res


def part_attention():
    S = attn_setup()
    calls, out = attn_calls(S)
    calls["fp8 before"][0]()
    ref = out.clone()
    exact = float32_attention(S, out.shape)
    return measure_each({name: (fn, nbytes, name.startswith("fp8")) for name, (fn, nbytes) in calls.items()},
                        out, ref, exact)


def part_splits():
    """Decode attention with more or fewer KV splits (AttnWorkspace's programs per SM at the longest length), for
    the E4M3 and the bf16 cache at 32K tokens, batch 8 and 1: time, and error against float32 attention over the
    same E4M3 values (the split count changes the order in which tiles are summed, not the function)."""
    res = {}
    for batch in (8, 1):
        S = attn_setup(batch=batch)
        hq, hkv, d, B = S["hq"], S["hkv"], S["d"], S["batch"]
        out = torch.empty(B, hq * d, device="cuda", dtype=torch.bfloat16)
        tok = B * hkv * S["length"]
        exact = float32_attention(S, out.shape)
        calls = {}
        for kv, launches in (("fp8", [(64, 2, 3), (128, 4, 3), (32, 2, 3)]), ("bf16", [(64, 4, 2)])):
            fp8 = kv == "fp8"
            for bt, warps, stages in launches:
                for per_sm in (2, 4, 8, 16, 32):
                    ws = workspace(B, hq, hkv, d, S["max_len"], bt, warps, stages, per_sm)
                    fn = functools.partial(K.decode_attention, S["q"], S["k8" if fp8 else "kb"],
                                           S["v8" if fp8 else "vb"], S["ks"] if fp8 else None,
                                           S["vs"] if fp8 else None, S["pos"], out, ws, hq, hkv, d, 1 / math.sqrt(d))
                    name = f"b{batch} {kv} T{bt} w{warps} s{stages} x{per_sm} ({ws.splits} splits)"
                    calls[name] = (fn, tok * (d * 2 + 8) if fp8 else tok * d * 4, fp8)
        first = next(iter(calls.values()))[0]
        first()
        res.update(measure_each(calls, out, out.clone(), exact))
        del S
        torch.cuda.empty_cache()
    return res


def in_use(S):
    """The Triton E4M3 decode attention (the kernel in use before attn_e4m3) on setup S: (out, its call, its result,
    float32 attention over the same E4M3 values, the K/V bytes it reads)."""
    hq, hkv, d, B = S["hq"], S["hkv"], S["d"], S["batch"]
    out = torch.empty(B, hq * d, device="cuda", dtype=torch.bfloat16)
    bt, warps, stages, per_sm = K.AttnWorkspace.CONFIG[True]
    now = functools.partial(K.decode_attention, S["q"], S["k8"], S["v8"], S["ks"], S["vs"], S["pos"], out,
                            workspace(B, hq, hkv, d, S["max_len"], bt, warps, stages, per_sm), hq, hkv, d,
                            1 / math.sqrt(d))
    now()
    return out, now, out.clone(), float32_attention(S, out.shape), B * hkv * S["length"] * (d * 2 + 8)


def bf16_cache_call(S, out):
    """The same attention over setup S's bf16 cache, for measure_each: (its call, the K/V bytes it reads, not
    compared)."""
    hq, hkv, d, B = S["hq"], S["hkv"], S["d"], S["batch"]
    return (functools.partial(K.decode_attention, S["q"], S["kb"], S["vb"], None, None, S["pos"], out,
                              K.AttnWorkspace(B, hq, hkv, d, S["max_len"], "cuda", fp8=False), hq, hkv, d,
                              1 / math.sqrt(d)), B * hkv * S["length"] * d * 4, False)


def part_cuda():
    """Decode attention over the E4M3 cache through attn_e4m3's CUDA kernel (16-byte loads turned into f16 MMA
    operands in registers) at several programs per SM, against the Triton split kernel and the bf16 cache's kernel;
    32K tokens at batch 8 and 1, and 4K tokens at batch 1."""
    from core.engines.fast.kernels import attn_e4m3
    res = {"why_not": attn_e4m3.why_not("cuda", 32, 8, 128)}
    for batch, length in ((8, 32768), (1, 32768), (1, 4096)):
        S = attn_setup(batch=batch, length=length)
        hq, hkv, d, B = S["hq"], S["hkv"], S["d"], S["batch"]
        out, triton_now, ref, exact, nbytes = in_use(S)
        tag = f"b{batch} {length // 1024}K"
        calls = {f"{tag} triton": (triton_now, nbytes, True), f"{tag} bf16 cache": bf16_cache_call(S, out)}
        for warps, per_sm in ((4, 1), (4, 2), (4, 3), (4, 4), (4, 8), (2, 2), (2, 4), (2, 8), (8, 1), (8, 2)):
            ws = workspace(B, hq, hkv, d, S["max_len"], 64, warps, 1, per_sm, cuda_e4m3=True)
            calls[f"{tag} cuda w{warps} x{per_sm}"] = (
                functools.partial(K.decode_attention, S["q"], S["k8"], S["v8"], S["ks"], S["vs"], S["pos"], out, ws,
                                  hq, hkv, d, 1 / math.sqrt(d)), nbytes, True)
        res.update(measure_each(calls, out, ref, exact))
        del S
        torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def part_wo():
    tuning.load(device=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability())
    res = []
    for m in (8, 64):
        for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
            row = dict(m=m, n=n, k=k)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            for mode in (K.MODE_BF16, K.MODE_WO):
                copies = tuner.rotated_copies(n * k * (2 if mode == 0 else 1))
                ws = [(w.w, w.scale) for w in METHOD_OF[mode].timing_weights(n, k, [n], copies)]
                cfg = METHOD_OF[mode].config(m, n, k)
                x16 = x.to(torch.float16) if mode == K.MODE_WO else None  # as DecodeGraph gives it at several rows
                calls = [functools.partial(K.linear, x, w, s, None, out, mode, False, cfg, x16) for w, s in ws]
                calls[0]()
                row["bf16 tuned" if mode == 0 else "wo tuned"] = dict(cfg=cfg, us=tuner.graph_time_us(calls))
                del ws
                torch.cuda.empty_cache()
            log(f"  WO m={m} {n}x{k}: bf16 {row['bf16 tuned']['us']:.1f} us, wo tuned {row['wo tuned']['us']:.1f} us")
            res.append(row)
    return res


@torch.inference_mode()
def part_gemv():
    """Batch-1 W8A8 linears of the Llama-3-8B shape through the kernels in use, against BF16's; graphs of rotated
    weight copies, programmatic dependent launch on, as in the decode step."""
    tuning.load(device=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability())
    res = []
    with K.pdl_scope(True):
        for name, n, k in (("qkv", 6144, 4096), ("o", 4096, 4096), ("gu", 28672, 4096), ("down", 4096, 14336)):
            row = dict(name=name, n=n, k=k)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            xs = x.float().abs().amax(dim=1).clamp(min=1e-12) / K.E4M3_MAX
            xq = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
            out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            prologue = k <= K.PROLOGUE_MAX_K
            for mode in (K.MODE_BF16, K.MODE_W8A8):
                copies = tuner.rotated_copies(n * k * (2 if mode == 0 else 1))
                ws = [(w.w, w.scale) for w in METHOD_OF[mode].timing_weights(n, k, [n], copies)]
                gb = n * k * (2 if mode == 0 else 1) / 1e9
                label = "bf16" if mode == 0 else "w8a8"
                if prologue:
                    calls = [functools.partial(K.gemv_prologue, x, w, s, out, mode) for w, s in ws]
                else:
                    calls = [functools.partial(K.linear, xq if mode else x, w, s, xs, out, mode) for w, s in ws]
                calls[0]()
                us = tuner.graph_time_us(calls)
                row[f"{label} in use"] = dict(us=us, TBps=gb / us * 1e3)
                if mode == K.MODE_BF16:
                    del ws
                    torch.cuda.empty_cache()
                    continue
                if prologue:
                    dot = [functools.partial(K.linear, xq, w, s, xs, out, mode) for w, s in ws]
                    us = tuner.graph_time_us(dot)
                    row["w8a8 tuned linear on E4M3 x"] = dict(us=us, TBps=gb / us * 1e3,
                                                              cfg=METHOD_OF[mode].config(1, n, k))
                del ws
                torch.cuda.empty_cache()
            log(f"  {name} {n}x{k}: " + ", ".join(
                f"{kk} {v['us']:.1f} us {v['TBps']:.2f} TB/s" + ("" if v.get("identical", True) else " (DIFFERS)")
                if isinstance(v, dict) else f"{kk} {v}" for kk, v in row.items() if kk not in ("name", "n", "k")))
            res.append(row)
    return res


def part_ncu(out_dir):
    cmd = ["ncu", "--clock-control", "none", "--kernel-name", "regex:attn_split", "--launch-count", "3",
           "--section", "SpeedOfLight", "--section", "WarpStateStats", "--section", "MemoryWorkloadAnalysis",
           "--section", "Occupancy", "--section", "SchedulerStats",
           sys.executable, "-m", "bench.fast.kernel_probe", "--ncu-target"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        text = p.stdout + "\n" + p.stderr[-3000:]
    except Exception as exc:
        text = f"ncu failed: {exc}"
    if out_dir:
        with open(os.path.join(out_dir, "ncu_attention.txt"), "w") as f:
            f.write(text)
    return text[-2000:]


def ncu_target():
    S = attn_setup()
    calls, _ = attn_calls(S)
    for name in ("bf16 current", "fp8 before", "fp8 T64 w2 s3"):
        log("ncu target:", name)
        calls[name][0]()
    torch.cuda.synchronize()


def kernel_table(prof, top=18):
    rows = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows[e.key] = rows.get(e.key, 0) + t / 1000
    items = sorted(rows.items(), key=lambda kv: -kv[1])
    return [(k[:110], round(v, 2)) for k, v in items[:top]], round(sum(rows.values()), 1)


@torch.inference_mode()
def part_prefill(lengths):
    from torch.nn import functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from core.engines.fast.model import Dims, FastLlama
    from core.models import synthetic_config

    config = synthetic_config("llama-3-8b")
    dims = Dims.from_config(config)
    master = FastLlama.random_weights(dims, "cuda", seed=0)
    models = {mode: FastLlama(dims, master, mode, rotary=config) for mode in ("bf16", "fp8")}
    res = {}
    for mode, model in models.items():
        ids = torch.randint(0, dims.vocab, (1, 1024), device="cuda")
        model.prefill(ids, model.new_cache(1, 1100, False), rows=slice(0, 1))
    torch.cuda.synchronize()
    for T in lengths:
        for mode, model in models.items():
            ids = torch.randint(0, dims.vocab, (1, T), device="cuda")
            cache = model.new_cache(1, T + 8, False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.prefill(ids, cache, rows=slice(0, 1))
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                model.prefill(ids, cache, rows=slice(0, 1))
                torch.cuda.synchronize()
            table, total = kernel_table(prof)
            res[f"{mode} {T}"] = dict(wall_s=wall, kernels_ms=total, top=table)
            log(f"  prefill {mode} {T}: {wall:.3f} s, kernels {total:.0f} ms")
            for k, v in table:
                log(f"     {v:10.1f} ms  {k}")
            del cache
            torch.cuda.empty_cache()
        # one layer's attention: what runs now against grouped K/V without the copies
        g = dims.heads // dims.kv_heads
        qkv = torch.randn(1, T, dims.heads + 2 * dims.kv_heads, dims.head_dim, device="cuda", dtype=torch.bfloat16)
        q = qkv[:, :, :dims.heads].transpose(1, 2)
        k = qkv[:, :, dims.heads:dims.heads + dims.kv_heads].transpose(1, 2).contiguous()
        v = qkv[:, :, dims.heads + dims.kv_heads:].transpose(1, 2).contiguous()
        att = {}

        def t_(fn):
            return triton.testing.do_bench(fn, warmup=2, rep=5 if T > 40000 else 20, return_mode="median")
        att["repeat_interleave + default"] = t_(lambda: F.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True))
        for be in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            name = f"enable_gqa {be.name if be else 'default'}"
            try:
                if be is None:
                    att[name] = t_(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                else:
                    with sdpa_kernel(be):
                        att[name] = t_(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                             enable_gqa=True))
            except Exception as exc:
                att[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
        try:
            qc = q.contiguous()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                att["cudnn repeat, q contiguous"] = t_(lambda: F.scaled_dot_product_attention(
                    qc, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True))
        except Exception as exc:
            att["cudnn repeat, q contiguous"] = f"{type(exc).__name__}: {str(exc)[:150]}"
        res[f"attention one layer {T}"] = att
        log(f"  one layer's attention at {T}: " + ", ".join(
            f"{kk} {vv:.2f} ms" if isinstance(vv, float) else f"{kk} {vv}" for kk, vv in att.items()))
        del qkv, q, k, v
        torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--out")
    ap.add_argument("--parts", default="attention,wo,prefill,ncu")
    ap.add_argument("--prefill", default="32768,125000")
    ap.add_argument("--ncu-target", action="store_true")
    args = ap.parse_args()
    if args.ncu_target:
        return ncu_target()
    RESULTS["device"] = torch.cuda.get_device_name(0)
    RESULTS["torch"], RESULTS["triton"] = torch.__version__, triton.__version__
    for part in args.parts.split(","):
        log(f"== {part}")
        t0 = time.time()
        try:
            if part == "attention":
                RESULTS[part] = part_attention()
            elif part == "cuda":
                RESULTS[part] = part_cuda()
            elif part == "splits":
                RESULTS[part] = part_splits()
            elif part == "wo":
                RESULTS[part] = part_wo()
            elif part == "gemv":
                RESULTS[part] = part_gemv()
            elif part == "ncu":
                RESULTS[part] = part_ncu(args.out)
                log(RESULTS[part])
            elif part == "prefill":
                RESULTS[part] = part_prefill([int(x) for x in args.prefill.split(",")])
        except Exception:
            RESULTS[part] = traceback.format_exc()
            log(RESULTS[part])
        log(f"== {part} took {time.time() - t0:.0f} s")
        torch.cuda.empty_cache()
        save(args.json)


if __name__ == "__main__":
    main()
