"""Decode tokens/s of the fast path (static KV cache + CUDA-graph decode step) per precision, against the HBM floor.

    python -m bench.fast.fp8_speed                       # Llama-3-8B shape, random weights, on one CUDA GPU
    python -m bench.fast.fp8_speed --json core/data/fp8_speed_h200.json --out $OUT
    python -m bench.fast.fp8_speed --tuned core/engines/fast/tuned_linears.json   # skip tuning: the shipped table

For bf16, fp8 W8A8 and fp8 weight-only, each with the auto (bf16) and the FP8 KV cache, at batch 1, 8, 64 and
prompt 512 and 32K: ms per decode step (CUDA-graph replays back to back, timed with events), tokens/s
(batch / step time), and the HBM floor: the bytes a step must read (every weight it multiplies with, the batch's
embedding rows, the K/V of every valid position) over the device-to-device copy bandwidth measured in the same run.
All precisions run in one process; the batch-1/512 headline is measured again at the end, interleaved, three times.

Each prompt is prefilled for real (torch ops) in row 0, then copied to the other rows: the step reads the same
bytes whatever the rows hold. Weights are random (N(0, 0.02)): speed only, the text means nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path


import torch

from core.engines.fast import kernels as K
from core.engines.fast.graph import DecodeGraph
from core.engines.fast.kernels import linears
from core.engines.fast.methods import method_for, tuner, tuning
from core.engines.fast.model import Dims, FastLlama
from core.engines.fast.options import overridden
from core.engines.fast.tuned_table import read_tuned_table, rows as table_rows
from core.precision import Precision
from core.models import synthetic_config

PREC_LABEL = {"bf16": "BF16", "fp8": "FP8 W8A8", "fp8-wo": "FP8 weight-only", "int4": "INT4 g128",
              "int4-awq": "INT4 AWQ g128", "int8-wo": "INT8 weight-only", "int8": "INT8 W8A8"}
INT_PRECISIONS = ("int4", "int4-awq", "int8-wo", "int8")


def random_awq_scales(dims: Dims, seed: int = 1) -> dict:
    """AWQ-shaped input scales for every projection (speed only: the search's values do not change the kernels' work;
    the engine searches them on a calibration text)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for i in range(dims.layers):
        for name, _, k, rows in tuner.model_shapes(dims):
            name = {"gate_up": "gu"}.get(name, name)
            out[f"{i}.{name}.calibration"] = (
                [torch.exp(0.3 * torch.randn(k, device="cuda", generator=g)) for _ in rows], rows)
    return out


def dense_copies(p: str, n: int, k: int, copies: int) -> list[tuple]:
    """(weight, scale) pairs of `copies` random [n, k] weights at a BF16 or FP8 precision, to rotate through."""
    return [(w.w, w.scale) for w in method_for(Precision(p)).timing_weights(n, k, [n], copies)]


def kernel_of(p: str) -> str:
    """Which kernels ran for a precision's linears, for the pages' "which kernel" column."""
    if p in INT_PRECISIONS:
        return method_for(Precision(p)).label()
    return {"bf16": "Triton GEMV/GEMM (bf16), cuBLAS where tuned faster",
            "fp8": "Triton FP8 W8A8 dots (E4M3 tensor cores), torch._scaled_mm where tuned faster",
            "fp8-wo": "Triton FP8 weight-only (E4M3 -> f16 dots)"}[p]


def time_prefill(model: FastLlama, prompt: int, repeats: int = 2) -> float:
    """Seconds of one prompt pass into a fresh cache (the engine's prefill), median of `repeats` after a warm one."""
    ids = torch.randint(0, model.dims.vocab, (1, prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(7))
    cache = model.new_cache(1, prompt + 16, False)
    times = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.prefill(ids, cache, rows=slice(0, 1))
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    del cache
    torch.cuda.empty_cache()
    return statistics.median(times)


def log(*a):
    print(*a, flush=True)


def copy_bandwidth(nbytes: int = 4 * 2**30, reps: int = 10) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written (median of reps)."""
    a = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1000)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


@torch.inference_mode()
def time_decode(model: FastLlama, cache, batch: int, prompt: int, steps: int, folds=None) -> dict:
    g = DecodeGraph(model, cache.rows(batch), top_k=0, folds=folds)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    tokens = torch.randint(0, model.dims.vocab, (batch,), device="cuda", generator=gen)
    pos = torch.full((batch,), prompt, device="cuda", dtype=torch.long)
    g.set_state(tokens, pos)
    for _ in range(3):
        g.step()
    g.set_state(tokens, pos)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(steps):
        g.graph.replay()
    e.record()
    e.synchronize()
    ms = s.elapsed_time(e) / steps
    finite = bool(torch.isfinite(g.out["chosen"]).all())
    del g
    return {"ms_per_step": ms, "finite": finite}


@torch.inference_mode()
def profiled_replays(model: FastLlama, cache, prompt: int, steps: int) -> tuple[float, list[tuple[str, float, float]]]:
    """`steps` replays of one batch-1 CUDA-graph decode step under the torch profiler: the step's wall time (ms) and
    each profiled event's (name, device ms per step, launches per step)."""
    from torch.profiler import ProfilerActivity, profile

    g = DecodeGraph(model, cache.rows(1), top_k=0)
    g.set_state(torch.zeros(1, dtype=torch.long, device="cuda"), torch.full((1,), prompt, device="cuda"))
    for _ in range(3):
        g.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(steps):
            g.graph.replay()
        e.record()
        torch.cuda.synchronize()
    del g
    events = []
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if t > 0:
            events.append((ev.key, t / 1000 / steps, ev.count / steps))
    return s.elapsed_time(e) / steps, events


def profile_step(model: FastLlama, cache, prompt: int, steps: int = 5) -> dict:
    """Kernel time inside one batch-1 decode step, grouped by kernel, from the profiler: what the step is made of,
    and how much of the step no kernel runs at all (launch gaps between the ~300 dependent kernels)."""
    wall, events = profiled_replays(model, cache, prompt, steps)
    groups: dict[str, float] = {}
    for key, ms, _ in events:
        if "Memcpy" in key or "Memset" in key:
            continue
        name = key.split("(")[0][:60]
        groups[name] = groups.get(name, 0.0) + ms  # ms per step
    busy = sum(groups.values())
    return {"ms_per_step": wall, "kernel_ms_per_step": busy, "idle_ms_per_step": max(wall - busy, 0.0),
            "kernels": dict(sorted(groups.items(), key=lambda kv: -kv[1])[:12])}


# name -> (DecodeGraph folds, kernels.linears.GEMV_PREFETCH)
FOLD_VARIANTS = {"none": (frozenset(), False), "prefetch": (frozenset(), True),
                 "norm+o": (frozenset({"norm", "o"}), False), "norm+o+prefetch": (frozenset({"norm", "o"}), True),
                 "norm+o+silu+prefetch": (frozenset({"norm", "o", "silu"}), True)}
PROLOGUE_CANDIDATES = [(1, 4), (2, 4), (4, 4), (2, 8), (4, 8), (8, 8), (8, 4), (16, 8)]


def sweep_prologue_launches(row: dict, candidates, calls_for) -> tuple[int, int] | None:
    """Time calls_for(bn, warps) (a list of calls, one graph) for each gemv_prologue launch into row["fold BNxW"]
    (a failed compile is kept as its message); the fastest (BLOCK_N, warps), or None if none ran."""
    for bn, warps in candidates:
        try:
            row[f"fold {bn}x{warps}"] = tuner.graph_time_us(calls_for(bn, warps))
        except Exception as exc:
            row[f"fold {bn}x{warps}"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    folds = {kk: v for kk, v in row.items() if kk.startswith("fold") and isinstance(v, float)}
    if not folds:
        return None
    bn, warps = (int(v) for v in min(folds, key=folds.get).split()[1].split("x"))
    return bn, warps


def row_text(row: dict) -> str:
    return ", ".join(f"{kk} {v:.1f} us" if isinstance(v, float) else f"{kk} {v}" for kk, v in row.items())


@torch.inference_mode()
def silu_sweep(dims: Dims, precisions) -> dict:
    """Fold "silu" for BF16 and weight-only (W8A8 keeps silu_mul: DecodeGraph): the gate|up kernel and the down
    projection computing SiLU(gate) * up as it loads, as the step runs them unfolded, against the gate|up kernel
    writing SiLU(gate) * up then the down projection, over gemv_prologue's even (BLOCK_N, warps); timed in graphs of
    rotated weight copies under programmatic dependent launch. The winners go into kernels.PROLOGUE_CFG."""
    hid, inter = dims.hidden, dims.inter
    x = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    delta = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    lnw = torch.ones(hid, device="cuda", dtype=torch.bfloat16)
    xo = torch.empty_like(x)
    gu = torch.empty(1, 2 * inter, device="cuda", dtype=torch.bfloat16)
    act = torch.empty(1, inter, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, hid, device="cuda", dtype=torch.bfloat16)
    res = {}
    for p in precisions:
        mode = K.MODES[p]
        if mode == K.MODE_W8A8:
            continue
        copies = tuner.rotated_copies(3 * inter * hid * (2 if mode == 0 else 1), most=16)
        wg = dense_copies(p, 2 * inter, hid, copies)
        wd = dense_copies(p, hid, inter, copies)
        row = {}
        with K.pdl_scope(True):
            def separate(c):
                K.gemv_prologue(x, *wg[c], gu, mode, delta, xo, lnw, 1e-5)
                K.linear(gu, *wd[c], None, out, mode, silu_x=True)

            def folded(c, bn, warps):
                K.gemv_prologue(x, *wg[c], act, mode, delta, xo, lnw, 1e-5, cfg=(bn, warps), silu_out=True)
                K.linear(act, *wd[c], None, out, mode)
            row["separate kernels"] = tuner.graph_time_us([lambda c=c: separate(c) for c in range(copies)])
            best = sweep_prologue_launches(
                row, [(bn, w) for bn, w in PROLOGUE_CANDIDATES if bn % 2 == 0],
                lambda bn, warps: [lambda c=c: folded(c, bn, warps) for c in range(copies)])
        if best:
            K.PROLOGUE_CFG[(mode, 2 * inter, hid, True)] = best
        res[p] = row
        log(f"  silu fold {p}: " + row_text(row))
        wg = wd = None  # free the copies before the next mode
        torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def prologue_sweep(dims: Dims, precisions) -> dict:
    """gemv_prologue's (BLOCK_N, warps) per mode and batch-1 linear it folds into, timed in graphs of rotated
    weight copies with programmatic dependent launch on (as in the step); the winners go into kernels.PROLOGUE_CFG.
    Also times what the fold replaces: add_rmsnorm (or W8A8's row_quant) then the tuned linear."""
    hid, width = dims.hidden, dims.heads * dims.head_dim
    shapes = {"qkv": (dims.qkv_out, hid, True), "o": (hid, width, False), "gu": (2 * dims.inter, hid, True),
              "lm_head": (dims.vocab, hid, True)}
    x = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    delta = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    lnw = torch.ones(hid, device="cuda", dtype=torch.bfloat16)
    res = {}
    for p in precisions:
        for name, (n, k, norm) in shapes.items():
            mode = K.MODE_BF16 if name == "lm_head" else K.MODES[p]  # lm_head stays BF16 in every mode
            if name == "lm_head" and p != precisions[0]:
                continue
            copies = tuner.rotated_copies(n * k * (2 if mode == 0 else 1))
            ws = dense_copies("bf16" if name == "lm_head" else p, n, k, copies)
            out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            xo, h = torch.empty_like(x), torch.empty_like(x)
            xs = torch.empty(1, device="cuda", dtype=torch.float32)
            xq = torch.empty(1, k, device="cuda", dtype=torch.float8_e4m3fn)
            row = {}
            with K.pdl_scope(True):
                def before(w, s):
                    if norm:
                        K.add_rmsnorm(xo, delta, lnw, 1e-5, None if mode == 2 else h, xs if mode == 2 else None,
                                      xq if mode == 2 else None)
                    elif mode == 2:
                        K.row_quant(x, xs, xq)
                    K.linear(xq if mode == 2 else (h if norm else x), w, s, xs, out, mode)
                row["separate kernels"] = tuner.graph_time_us([lambda w=w, s=s: before(w, s) for w, s in ws])
                best = sweep_prologue_launches(row, PROLOGUE_CANDIDATES, lambda bn, warps: [
                    lambda w=w, s=s: K.gemv_prologue(x, w, s, out, mode, delta if norm else None,
                                                     xo if norm else None, lnw if norm else None, 1e-5,
                                                     cfg=(bn, warps)) for w, s in ws])
            if best:
                K.PROLOGUE_CFG[(mode, n, k, False)] = best
            res[f"{p} {name}"] = row
            log(f"  prologue {p} {name} {n}x{k}: " + row_text(row))
            ws = None  # free the copies before the next shape
            torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def fold_ab(models: dict, prompts, steps: int) -> dict:
    """Batch-1 step time with each set of folds (DecodeGraph `folds`) with and without the GEMV's weight prefetch,
    interleaved three times, median; and each variant's first-step logprobs against the torch-op step's (KL) and
    the unfolded graph's."""
    res = {}
    for prompt in prompts:
        m0 = next(iter(models.values()))
        cache = m0.new_cache(1, prompt + steps + 16, False)
        ids = torch.randint(0, m0.dims.vocab, (1, prompt), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(prompt))
        times = {(p, v): [] for p in models for v in FOLD_VARIANTS}
        for rep in range(3):
            for p, m in models.items():
                if rep == 0:
                    m.prefill(ids, cache, rows=slice(0, 1))
                for v, (folds, prefetch) in FOLD_VARIANTS.items():
                    linears.GEMV_PREFETCH = prefetch
                    times[(p, v)].append(time_decode(m, cache, 1, prompt, steps, folds)["ms_per_step"])
        linears.GEMV_PREFETCH = True
        last, pos = ids[0, -1:], torch.full((1,), prompt - 1, device="cuda")
        for p, m in models.items():
            m.prefill(ids, cache, rows=slice(0, 1))
            lp_ref = torch.log_softmax(m.decode_ref(last, pos, cache.rows(1)).float(), dim=-1)
            lps = {}
            for v, (folds, _) in FOLD_VARIANTS.items():
                g = DecodeGraph(m, cache.rows(1), top_k=0, folds=folds)
                g.set_state(last, pos)
                lps[v] = g.step()["logprobs"].float().clone()
                del g
            for v in FOLD_VARIANTS:
                ms = statistics.median(times[(p, v)])
                kl = float((lp_ref.exp() * (lp_ref - lps[v])).sum())
                diff = float((lps[v] - lps["none"]).abs().max())
                res[f"{p} {prompt} {v}"] = dict(ms_per_step=ms, runs=times[(p, v)], kl_vs_torch_ops=kl,
                                                max_logprob_diff_vs_none=diff,
                                                same_argmax_as_torch_ops=bool(lps[v].argmax() == lp_ref.argmax()))
                log(f"  fold {p} prompt {prompt} {v:16s}: {ms:.3f} ms/step ({1000 / ms:.1f} tok/s), KL vs torch "
                    f"ops {kl:.2e}, max |dlogprob| vs none {diff:.4f}")
        del cache
        torch.cuda.empty_cache()
    return res


def floor_ms(model: FastLlama, cache, batch: int, prompt: int, steps: int, bw: float) -> float:
    kv = batch * (prompt + steps / 2) * cache.bytes_per_token()
    return 1000 * (model.step_weight_bytes(batch) + kv) / bw


def tune_linears(args, dims: Dims, precisions: list[str], batches: list[int], device: tuple, meta: dict) -> list:
    """The tuning table for this run: --tuned's (this GPU's section, or one of the same SM), then --retune's and
    --int-gemv's precisions timed again, or every precision timed (one tuner for every family); the table and every
    timing go to --out."""
    methods = lambda names: [method_for(Precision(p)) for p in names]  # noqa: E731
    timed = []
    if args.tuned:
        tuning.TUNED.update(read_tuned_table(args.tuned, *device))
        if args.retune:
            timed += tuner.tune_model(dims, methods(args.retune.split(",")), batches, log=log, lm_head=False)
        if args.int_gemv:  # the GEMV is integer weight-only and takes up to 8 rows
            weight_only = [p for p in precisions if p in INT_PRECISIONS and p != "int8"]
            timed += tuner.tune_model(dims, methods(weight_only), [b for b in batches if b <= 8], log=log,
                                      kernels={"gemv"}, lm_head=False)
    elif not args.no_tune:
        t0 = time.perf_counter()
        timed = tuner.tune_model(dims, methods(precisions), batches, log=log)
        log(f"tuning took {time.perf_counter() - t0:.0f} s")
    if args.out and timed:
        tuning.save(Path(args.out, "tuned_linears.json"), device[0], {
            "capability": list(device[1]), **{k: meta[k] for k in ("date", "torch", "triton")},
            "sources": [f"python -m bench.fast.fp8_speed {' '.join(sys.argv[1:])}"]})
        Path(args.out, "tuning_all.json").write_text(json.dumps(timed, indent=1))
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--precisions", default="bf16,fp8,fp8-wo")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompts", default="512,32768")
    ap.add_argument("--kv", default="auto,fp8")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--fp8-kv-attention", default="cuda",
                    help="cuda,triton: time the E4M3 cache's decode attention through attn_e4m3's CUDA kernel (as "
                    "the engine runs it where it serves) and through the Triton kernel")
    ap.add_argument("--no-tune", action="store_true", help="use kernels.default_config instead of timing candidates")
    ap.add_argument("--tuned", help="a tuning table (skips tuning; this GPU's section, or one of the same SM): the "
                    "shipped core/engines/fast/tuned_linears.json, or tuned_linears.json / the result JSON of an "
                    "earlier run")
    ap.add_argument("--json", help="write the results here (core/data/fp8_speed_h200.json)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the tuning table and logs")
    ap.add_argument("--retune", help="with --tuned: tune these precisions again (e.g. fp8-wo) for --batches")
    ap.add_argument("--int-gemv", action="store_true", help="with --tuned: time the integer weight-only GEMV's "
                    "candidates against the table's winners for batches of 1-8 and keep the faster (the table goes "
                    "to --out)")
    ap.add_argument("--prefill", default="", help="prompt lengths whose prompt pass is timed per precision (8192)")
    ap.add_argument("--fold-ab", action="store_true", help="only: sweep gemv_prologue's launch configurations, "
                    "then time the batch-1 step with each set of folds (DecodeGraph folds) and stop")
    args = ap.parse_args()
    if args.int_gemv and not args.tuned:
        ap.error("--int-gemv times the GEMV against a table's winners: give the table with --tuned")
    if not torch.cuda.is_available():
        sys.exit("bench/fast/fp8_speed.py needs a CUDA GPU.")

    precisions = args.precisions.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [int(p) for p in args.prompts.split(",")]
    kvs = args.kv.split(",")
    props = torch.cuda.get_device_properties(0)
    import triton

    meta = {"device": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "triton": triton.__version__,
            "model": f"{args.model} shape, random weights", "steps": args.steps}
    t_start = time.perf_counter()
    bw = copy_bandwidth()
    meta["copy_bandwidth_GBps"] = bw / 1e9
    meta["programmatic_dependent_launch"] = "batch 1" if K.pdl_available() else "off"
    log(f"{props.name}: device-to-device copy {bw / 1e9:.0f} GB/s (read + write)")

    config = synthetic_config(args.model)
    dims = Dims.from_config(config)
    master = FastLlama.random_weights(dims, "cuda", seed=0)
    tune_linears(args, dims, precisions, batches, (props.name, (props.major, props.minor)), meta)
    calibrated = [p for p in precisions if method_for(Precision(p)).needs_calibration]
    awq = random_awq_scales(dims) if calibrated else {}
    models = {p: FastLlama(dims, master | awq if p in calibrated else master, p, rotary=config) for p in precisions}
    meta["kernels"] = {p: kernel_of(p) for p in precisions}
    meta["batch1_folds"] = {p: sorted(DecodeGraph.default_folds(m, 1)) for p, m in models.items()}
    meta["gemv_prefetch"] = linears.GEMV_PREFETCH
    if args.fold_ab:
        result = {**meta, "prologue_sweep": prologue_sweep(dims, precisions),
                  "silu_sweep": silu_sweep(dims, precisions),
                  "prologue_cfg": [[list(k), list(v)] for k, v in K.PROLOGUE_CFG.items()],
                  "fold_ab": fold_ab(models, prompts, args.steps)}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return
    log(f"models ready ({time.perf_counter() - t_start:.0f} s): " + ", ".join(
        f"{p} {models[p].step_weight_bytes(1) / 1e9:.2f} GB/step" for p in precisions))

    rows = []
    for prompt in prompts:
        for kv in kvs:
            max_len = prompt + args.steps + 16
            per_row = models[precisions[0]].new_cache(1, 1, kv == "fp8").bytes_per_token() * max_len
            free = torch.cuda.mem_get_info()[0]
            fits = [b for b in batches if b * per_row < free - 8 * 2**30]
            for b in sorted(set(batches) - set(fits)):
                for p in precisions:
                    rows.append(dict(precision=p, kv=kv, prompt=prompt, batch=b, status=(
                        f"does not fit: KV cache {b * per_row / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free")))
            if not fits:
                continue
            cache = models[precisions[0]].new_cache(max(fits), max_len, kv == "fp8")
            for p in precisions:
                m = models[p]
                try:
                    t0 = time.perf_counter()
                    ids = torch.randint(0, dims.vocab, (1, prompt), device="cuda",
                                        generator=torch.Generator(device="cuda").manual_seed(prompt))
                    m.prefill(ids, cache, rows=slice(0, 1))
                    torch.cuda.synchronize()
                    prefill_s = time.perf_counter() - t0
                    cache.replicate_row0()
                except Exception as exc:
                    log(f"prefill {p} kv={kv} prompt={prompt} failed: {exc!r}")
                    traceback.print_exc()
                    for b in fits:
                        rows.append(dict(precision=p, kv=kv, prompt=prompt, batch=b, status=f"error: {exc!r}"[:200]))
                    continue
                # with --fp8-kv-attention cuda,triton the E4M3 cache's decode attention is timed both ways,
                # one after the other per batch: "fp8" rows as the engine runs it, "fp8-triton" rows on Triton
                runs = [(kv, {})] if kv != "fp8" else [
                    ("fp8" if a == "cuda" else "fp8-triton", {"attn_e4m3_cuda": a == "cuda"})
                    for a in args.fp8_kv_attention.split(",")]
                for b, (kv_label, attn_env) in ((b, r) for b in fits for r in runs):
                    try:
                        with overridden(**attn_env):
                            r = time_decode(m, cache, b, prompt, args.steps)
                    except Exception as exc:
                        log(f"decode {p} kv={kv_label} prompt={prompt} batch={b} failed: {exc!r}")
                        traceback.print_exc()
                        rows.append(dict(precision=p, kv=kv_label, prompt=prompt, batch=b,
                                         status=f"error: {exc!r}"[:200]))
                        continue
                    fl = floor_ms(m, cache, b, prompt, args.steps, bw)
                    row = dict(precision=p, kv=kv_label, prompt=prompt, batch=b,
                               status="ok" if r["finite"] else "non-finite",
                               ms_per_step=r["ms_per_step"], tok_s=1000 * b / r["ms_per_step"], floor_ms=fl,
                               floor_frac=fl / r["ms_per_step"], prefill_s=prefill_s)
                    rows.append(row)
                    log(f"{p:6s} kv={kv_label:4s} prompt={prompt:5d} batch={b:2d}: {r['ms_per_step']:7.3f} ms/step "
                        f"{row['tok_s']:8.1f} tok/s  floor {fl:6.3f} ms ({100 * row['floor_frac']:.0f}%)")
            del cache
            torch.cuda.empty_cache()

    # the headline again, the precisions interleaved, so clock or thermal drift hits them alike
    head = {p: [] for p in precisions}
    hp, hb = prompts[0], 1
    cache = models[precisions[0]].new_cache(1, hp + args.steps + 16, False)
    for rep in range(3):
        for p in precisions:
            try:
                head[p].append(time_decode(models[p], cache, hb, hp, args.steps)["ms_per_step"])
            except Exception as exc:
                log(f"headline {p} failed: {exc!r}")
    profiles = {}
    for p in precisions:
        try:
            profiles[p] = profile_step(models[p], cache, hp)
            pr = profiles[p]
            log(f"profile {p}: step {pr['ms_per_step']:.3f} ms, kernels busy {pr['kernel_ms_per_step']:.3f} ms, "
                f"no kernel running {pr['idle_ms_per_step']:.3f} ms")
            for k, v in pr["kernels"].items():
                log(f"    {v * 1000:8.1f} us  {k}")
        except Exception as exc:  # the profile explains the numbers; never let it lose them
            log(f"profile {p} failed: {exc!r}")
    del cache
    prefill = []
    for n in [int(x) for x in args.prefill.split(",") if x]:
        row = {"prompt": n}
        for p in precisions:
            try:
                row[p] = time_prefill(models[p], n)
            except Exception as exc:
                log(f"prefill {p} at {n} failed: {exc!r}")
        if "bf16" in row:
            row["vs_bf16"] = {p: row["bf16"] / row[p] for p in precisions if p in row}
        prefill.append(row)
        log(f"prefill {n} tokens: " + ", ".join(f"{p} {row[p] * 1000:.0f} ms" for p in precisions if p in row))
    ms = {p: statistics.median(v) for p, v in head.items() if v}
    headline = {"batch": hb, "prompt": hp, "kv": "auto", "repeats": 3, "ms_per_step": ms,
                "tok_s": {p: 1000 * hb / v for p, v in ms.items()}}
    if "bf16" in ms:
        headline["speedup_vs_bf16"] = {p: ms["bf16"] / v for p, v in ms.items()}
        fl = 1000 * (models["bf16"].step_weight_bytes(hb) +
                     hb * (hp + args.steps / 2) * 2 * dims.layers * dims.kv_heads * dims.head_dim * 2) / bw
        headline["bf16_floor_frac"] = fl / ms["bf16"]
        headline["floor_frac"] = {p: 1000 * (models[p].step_weight_bytes(hb) + hb * (hp + args.steps / 2) * 2 *
                                             dims.layers * dims.kv_heads * dims.head_dim * 2) / bw / v
                                  for p, v in ms.items()}

    bf = {(r["kv"], r["prompt"], r["batch"]): r.get("tok_s") for r in rows if r["precision"] == "bf16"}
    for r in rows:
        base = bf.get((r["kv"], r["prompt"], r["batch"]))
        if r.get("tok_s") and base:
            r["speedup_vs_bf16"] = r["tok_s"] / base

    log(f"\n{meta['device']} (cc {meta['capability']}), {meta['date']}, torch {meta['torch']}, triton "
        f"{meta['triton']}; {meta['model']}; copy bandwidth {bw / 1e9:.0f} GB/s; {args.steps} decode steps, "
        f"programmatic dependent launch: {meta['programmatic_dependent_launch']}, batch-1 folds: "
        f"{meta['batch1_folds']}, "
        f"CUDA graph per step; floor = bytes a step must read / copy bandwidth")
    log("| precision | KV cache | prompt | batch | ms/step | tok/s | floor ms | % of floor | x BF16 (same KV) |")
    log("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            log(f"| {PREC_LABEL[r['precision']]} | {r['kv']} | {r['prompt']} | {r['batch']} | {r['status']} |||||")
            continue
        log(f"| {PREC_LABEL[r['precision']]} | {r['kv']} | {r['prompt']} | {r['batch']} | {r['ms_per_step']:.2f} | "
            f"{r['tok_s']:.1f} | {r['floor_ms']:.2f} | {100 * r['floor_frac']:.0f}% | "
            f"{r.get('speedup_vs_bf16', float('nan')):.2f} |")
    log(f"\nheadline (batch {hb}, prompt {hp}, KV auto, median of 3 interleaved repeats): " + ", ".join(
        f"{p} {headline['tok_s'][p]:.1f} tok/s" for p in ms))
    if "speedup_vs_bf16" in headline:
        log("  FP8/BF16: " + ", ".join(f"{p} {v:.2f}x" for p, v in headline["speedup_vs_bf16"].items()
                                        if p != "bf16") + f"; BF16 at {100 * headline['bf16_floor_frac']:.0f}% "
            "of its HBM floor")
    meta["wall_s"] = time.perf_counter() - t_start
    result = {**meta, "headline": headline, "rows": rows, "profile_batch1": profiles, "prefill": prefill,
              "tuned_linears": table_rows(tuning.TUNED)}
    for path in filter(None, [args.json, args.out and str(Path(args.out, "fp8_speed.json"))]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1))
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
