"""Integer linears: the kernels torch and its ecosystem ship (core/engines/fast/kernels/library.py) beside the project's
own Triton kernels, on one CUDA GPU, against BF16 in the same run.

    python -m bench.fast.int_library_bench --out $OUT --json core/data/fp8_speed_h100.json
    python -m bench.fast.int_library_bench --table-from $OUT/int_library.json --json core/data/fp8_speed_h100.json

1. Linears: per Llama-3-8B shape (q|k|v, o, gate|up, down), 32 layers of distinct weights, one CUDA graph over the
   32 calls, batch 1 and 8: microseconds per call for cuBLAS BF16 and every integer candidate, the output error
   against the torch engine's layer (core/engines/torch/quant.py via intlinears.reference_linear) and whether it is
   bit for bit. Each (precision, batch, shape)'s fastest candidate whose weights are the torch engine's is the winner.
2. Decode step: the fast engine's whole CUDA-graph step (prompt 512) per precision, its integer linears on the
   project's kernels and on each library candidate in turn (the candidate put in place of Lin.fast), against BF16.
   The result JSON has the layout of core/data/fp8_speed_h200.json (bench/fast/fp8_speed.py), each row naming the
   engine and kernel that ran; the integer rows of the recorded table are the winners that the engine can take.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch
from torch.nn import functional as F

SHAPES = {"qkv": (6144, 4096, [4096, 1024, 1024]), "o": (4096, 4096, [4096]),
          "gate_up": (28672, 4096, [14336, 14336]), "down": (4096, 14336, [4096])}
INT_MODES = ("int4", "int4-awq", "int8-wo", "int8")
ENGINE = "torch fast path (CUDA graphs)"


def log(*a):
    print(*a, flush=True)


def graph_us(calls, x, rounds: int = 5, replays: int = 20) -> float:
    """Microseconds per call: the calls captured back to back in one CUDA graph, replays timed with events (median
    of `rounds`). Each call is run twice first (Triton compiles and autotunes outside the capture)."""
    for c in calls:
        c(x)
        c(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [c(x) for c in calls]
    g.replay()
    times = []
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(replays):
            g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / replays / len(calls))
    del g, outs
    return statistics.median(times)


def int_weights(mode: str, n: int, k: int, rows: list[int], layers: int, seed: int) -> list:
    from core.engines.fast.methods import method_for
    from core.precision import Precision

    method = method_for(Precision(mode))
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(layers):
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        awq = None
        if mode == "int4-awq":
            s = [torch.exp(0.3 * torch.randn(k, device="cuda", generator=g)) for _ in rows]
            awq = ([v / (v.max() * v.min()).sqrt() for v in s], rows)
        out.append(method.quantize(w, awq))
        del w
    return out


def accuracy(kern, iw, x) -> dict:
    """A candidate's output on layer 0 against the torch engine's: relative error and the share of equal values."""
    from core.engines.fast.int_weight import reference_linear

    ref = reference_linear(x, iw)
    out = kern(x)
    torch.cuda.synchronize()
    rel = float((out.float() - ref.float()).norm() / ref.float().norm())
    return {"rel_err": rel, "equal_share": float((out.view(torch.int16) == ref.view(torch.int16)).float().mean())}


def bf16_row(shape: str, layers: int, batches: list[int]) -> list[dict]:
    n, k, _ = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(11)
    ws = [(torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16) for _ in range(layers)]
    rows = []
    for b in batches:
        x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)
        us = graph_us([lambda x, w=w: F.linear(x, w) for w in ws], x)
        rows.append(dict(shape=shape, n=n, k=k, batch=b, precision="bf16", kernel="cuBLAS (F.linear)", us=us,
                         exact=True))
        log(f"bf16     {shape:8s} b={b}: {us:8.1f} us  cuBLAS")
    del ws
    return rows


def candidate_rows(mode: str, shape: str, layers: int, batches: list[int]) -> list[dict]:
    """Every candidate of one (precision, shape), each timed at every batch on the same 32 weights."""
    from bench.fast.int_library_step import all_candidates

    n, k, rows_of = SHAPES[shape]
    ws = int_weights(mode, n, k, rows_of, layers, seed=zlib.crc32(f"{mode} {shape}".encode()) % 1000)
    rows = []
    for name, build in all_candidates(ws[0]).items():
        try:
            kerns = [build(w) for w in ws]
        except Exception as exc:  # a library that refuses a shape is just not a candidate there
            log(f"{mode:8s} {shape:8s} {name}: build failed: {exc!r}"[:300])
            continue
        for b in batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16)
            try:
                acc = accuracy(kerns[0], ws[0], x)
                us = graph_us(kerns, x)
            except Exception as exc:
                log(f"{mode:8s} {shape:8s} {name} b={b}: failed: {exc!r}"[:300])
                continue
            rows.append(dict(shape=shape, n=n, k=k, batch=b, precision=mode, kernel=name, label=kerns[0].label,
                             us=us, exact=kerns[0].exact, **acc))
            log(f"{mode:8s} {shape:8s} b={b}: {us:8.1f} us  {name:14s} rel err {acc['rel_err']:.2e}, "
                f"{100 * acc['equal_share']:.1f}% equal")
        del kerns
        torch.cuda.empty_cache()
    del ws
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def linear_table(modes, batches, layers: int) -> list[dict]:
    rows = []
    for shape in SHAPES:
        rows += bf16_row(shape, layers, batches)
        torch.cuda.empty_cache()
        for mode in modes:
            rows += candidate_rows(mode, shape, layers, batches)
    bf = {(r["shape"], r["batch"]): r["us"] for r in rows if r["precision"] == "bf16"}
    for r in rows:
        r["speedup_vs_bf16"] = bf[(r["shape"], r["batch"])] / r["us"]
    for key in measured_exact(rows):  # W8A8 whose every output equalled torch._int_mm's
        for r in rows:
            if (r["precision"], r["kernel"]) == key:
                r["exact"] = True
    return rows


def measured_exact(rows: list[dict]) -> set:
    """(precision, kernel) of the W8A8 candidates whose outputs equalled torch._int_mm's everywhere they ran: for
    W8A8 the result itself is the check (its weights are int8 codes, read as they are)."""
    seen: dict = {}
    for r in rows:
        if r["precision"] == "int8":
            key = (r["precision"], r["kernel"])
            seen[key] = seen.get(key, True) and r.get("equal_share") == 1.0
    return {k for k, ok in seen.items() if ok}


def step_sums(rows: list[dict]) -> list[dict]:
    """Per (precision, kernel, batch): the four shapes' times summed (one layer's linears) and x BF16's sum."""
    out = {}
    for r in rows:
        key = (r["precision"], r["kernel"], r["batch"])
        o = out.setdefault(key, dict(precision=r["precision"], kernel=r["kernel"], batch=r["batch"], us=0.0,
                                     shapes=0, exact=r["exact"]))
        o["us"] += r["us"]
        o["shapes"] += 1
    bf = {o["batch"]: o["us"] for o in out.values() if o["precision"] == "bf16"}
    full = [o for o in out.values() if o["shapes"] == len(SHAPES)]
    for o in full:
        o["speedup_vs_bf16"] = bf[o["batch"]] / o["us"]
    return full


def winners(rows: list[dict]) -> dict:
    """(precision, batch, shape) -> the fastest candidate whose weights are the torch engine's ('exact'), and the
    fastest of all where that differs."""
    best = {}
    for r in rows:
        if r["precision"] == "bf16":
            continue
        key = f"{r['precision']}|{r['batch']}|{r['shape']}"
        b = best.setdefault(key, {})
        if r["exact"] and ("exact" not in b or r["us"] < b["exact"]["us"]):
            b["exact"] = {k: r[k] for k in ("kernel", "us", "speedup_vs_bf16")}
        if "any" not in b or r["us"] < b["any"]["us"]:
            b["any"] = {k: r[k] for k in ("kernel", "us", "speedup_vs_bf16")}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=",".join(INT_MODES))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--decode", default="bf16,fp8,fp8-wo,int4,int4-awq,int8-wo,int8",
                    help="precisions whose whole decode step is timed ('' to skip)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--json", help="the recorded table to write (core/data/fp8_speed_<device>.json)")
    ap.add_argument("--table-from", help="no GPU run: write --json (and with --tuned, the run's device section of "
                    "the shipped tuning table) from a run's int_library.json")
    ap.add_argument("--tuned", help="with --table-from: the shipped tuning table to add the device's section to "
                    "(core/engines/fast/tuned_linears.json)")
    ap.add_argument("--only", default="", help="decode candidates beside the engine's own (default: all)")
    ap.add_argument("--gemlite-autotune", choices=("fast", "max", "default"), default="fast",
                    help="gemlite's autotune lists for its kernels (gemlite.set_autotune): 'fast' is its default; "
                    "'max' tries 150 launch configurations a shape for its one-row GEMV against 13 (a longer first "
                    "call; gemlite 0.6.0.post2)")
    ap.add_argument("--table-device", help="the shipped tuning table's section to run the engine with (default: "
                    "this GPU's), e.g. another card's library winners on a card that has none yet")
    args = ap.parse_args()
    if args.table_from:
        from bench.fast import int_library_step as step
        from core.engines.fast.tuned_table import write_device_section

        result = json.loads(Path(args.table_from).read_text())
        if args.json:
            Path(args.json).write_text(json.dumps(step.table_from(result), indent=1))
        if args.tuned:
            write_device_section(args.tuned, result["device"], *step.tuned_section(result))
        return
    if not torch.cuda.is_available():
        sys.exit("bench/fast/int_library_bench.py needs a CUDA GPU.")
    from bench.fast import int_library_step as step

    t0 = time.perf_counter()
    if args.gemlite_autotune != "fast":
        import gemlite

        gemlite.set_autotune(args.gemlite_autotune)  # reloads gemlite's kernel modules: before any layer is built
    meta = step.run_meta() | {"gemlite_autotune": args.gemlite_autotune}
    log(f"{meta['device']}: torch {meta['torch']}, triton {meta['triton']}, gemlite {meta['gemlite']}")
    log(f"tuning table: {step.load_project_tables(args.table_device)}'s section")
    batches = [int(b) for b in args.batches.split(",")]
    lin = linear_table([m for m in args.modes.split(",") if m], batches, args.layers)
    sums = step_sums(lin)
    win = winners(lin)
    result = {**meta, "linears": lin, "linear_step_sums": sums, "winners": win}
    if args.out:
        Path(args.out, "int_linears.json").write_text(json.dumps(result, indent=1))
    decode = [p for p in args.decode.split(",") if p]
    if decode:
        only = {"only": set(args.only.split(","))} if args.only else {}
        result |= step.decode_table(decode, batches, args.prompt, args.steps, win, measured_exact(lin), log, **only)
    result["wall_s"] = time.perf_counter() - t0
    if args.out:
        Path(args.out, "int_library.json").write_text(json.dumps(result, indent=1))
    if args.json and decode:
        Path(args.json).write_text(json.dumps(step.table_from(result), indent=1))
        log(f"wrote {args.json}")
    step.print_tables(result, log)


if __name__ == "__main__":
    main()
