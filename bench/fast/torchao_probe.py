"""torchao's weight-only INT8 and INT4 linears as candidates beside the project's (bench/fast/int_library_bench.py):
the same Llama-3-8B linear shapes, 32 layers of distinct random weights, one CUDA graph over the 32 calls, batch 1
and 8, against cuBLAS BF16 (`nn.Linear`) in the same run. Each torchao configuration that quantizes and runs is
timed eager (its tensor subclass dispatch in the graph) and, with --compile, through torch.compile; one that fails
says why. The output's relative error against the BF16 layer is printed beside each time (weight-only INT4 g128 on
random weights: about 0.1; INT8: about 0.005), so a fast wrong kernel cannot pass for a result.

    python -m bench.fast.torchao_probe [--batches 1,8] [--compile] [--out DIR]

torchao is not a dependency: it comes as a wheel for the GPU machine (its README says which torch each release
pairs with; the version and whether its C++ extensions loaded are printed).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from bench.fast.int_library_bench import SHAPES, graph_us

LAYERS = 32


def configs():
    """(name, config factory) for each torchao weight-only configuration tried, across torchao's API versions."""
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig

    out = [("int8-wo per channel", lambda: Int8WeightOnlyConfig())]
    out.append(("int4-wo g128 (default packing)", lambda: Int4WeightOnlyConfig(group_size=128)))
    out.append(("int4-wo g128 tile_packed_to_4d (tinygemm)",
                lambda: Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")))
    return out


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--compile", action="store_true", help="also time each quantized layer through torch.compile")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torchao
    from torchao.quantization import quantize_

    batches = [int(b) for b in args.batches.split(",")]
    if args.compile:  # one compiled graph per layer object and batch: past dynamo's default limit of 8, calls run eager
        torch._dynamo.config.recompile_limit = 1024
        torch._dynamo.config.accumulated_recompile_limit = 4096
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; torchao {torchao.__version__}", flush=True)
    rows = []
    for shape, (n, k, _) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        base = []
        for _ in range(LAYERS):
            lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(n, k, device="cuda", generator=g) * 0.02)
            base.append(lin.requires_grad_(False))
        for b in batches:
            x = torch.randn(b, k, device="cuda", dtype=torch.bfloat16, generator=g)
            with torch.inference_mode():
                bf16 = graph_us(base, x)
                ref = base[0](x)
            rows.append({"shape": shape, "batch": b, "kernel": "cuBLAS BF16", "us": round(bf16, 2), "x_bf16": 1.0})
            print(f"{shape:8s} b{b}  cuBLAS BF16: {bf16:8.2f} us", flush=True)
            for name, make in configs():
                for compiled in ((False, True) if args.compile else (False,)):
                    label = name + (" + torch.compile" if compiled else "")
                    try:
                        layers = [copy.deepcopy(m) for m in base]
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            for m in layers:
                                quantize_(m, make())
                        calls = [torch.compile(m) for m in layers] if compiled \
                            else layers
                        with torch.inference_mode():
                            err = rel_err(calls[0](x), ref)
                            us = graph_us(calls, x)
                        row = {"us": round(us, 2), "x_bf16": round(bf16 / us, 3), "rel_err": round(err, 4)}
                        print(f"{shape:8s} b{b}  {label}: {us:8.2f} us ({bf16 / us:.2f}x BF16), rel err {err:.4f}",
                              flush=True)
                    except Exception as exc:  # a configuration this torch/torchao pair cannot run: said, not hidden
                        row = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"}
                        print(f"{shape:8s} b{b}  {label}: FAILED {row['error']}", flush=True)
                    rows.append({"shape": shape, "batch": b, "kernel": "torchao " + label, **row})
                    del layers
                    torch.cuda.empty_cache()
        del base
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out, "torchao_probe.json").write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "torchao": torchao.__version__,
            "layers": LAYERS, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
