"""The speedups over BF16 recorded on GPUs, for pages to show beside a setup: decode (bench/fast/fp8_speed.py, and
for the integer precisions' library kernels bench/fast/int_library_bench.py) and the prompt pass, i.e. time to first
token (bench/fast/prefill_speed.py).

One decode table per GPU kind, core/data/fp8_speed_<kind>.json (h200, h100): pages show the table of the kind of GPU
present when one was recorded (`recorded_here`), else the H200 one, under a banner saying where it was measured."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).with_name("data")
RESULTS = DATA / "fp8_speed_h200.json"  # written by python -m bench.fast.fp8_speed --json; the default table
PREFILL = DATA / "prefill_h200.json"  # python -m bench.fast.prefill_speed --json


@lru_cache(maxsize=None)
def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@lru_cache(maxsize=1)
def present_gpu() -> str | None:
    """The name of this machine's first CUDA GPU, or None (no torch build with CUDA, or no GPU)."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver reads as no GPU here; the pages then show the default table
        return None


def table_path(gpu: str | None = None) -> Path:
    """The recorded decode table for a GPU name ('NVIDIA H100 80GB HBM3' -> fp8_speed_h100.json), else RESULTS."""
    name = (gpu or "").lower().replace(" ", "")
    for path in sorted(DATA.glob("fp8_speed_*.json")):
        kind = path.stem.removeprefix("fp8_speed_")
        if kind and kind in name:
            return path
    return RESULTS


def recorded_here() -> bool:
    """Whether the table the pages show was recorded on the kind of GPU this machine has."""
    gpu = present_gpu()
    return gpu is not None and table_path(gpu).stem.removeprefix("fp8_speed_") in gpu.lower().replace(" ", "")


def _results() -> dict:
    return _read(table_path(present_gpu()))


def measured_speedups(kv_dtype: str = "auto", prompt: int = 512) -> list[dict]:
    """Rows of {precision, batch, tok_s, speedup_vs_bf16, floor_frac, engine, kernel} for one KV dtype and prompt
    length: engine and kernel say what ran (every row is the fast CUDA-graph path; kernel names the linears)."""
    d = _results()
    rows = d.get("rows", [])
    kernels = d.get("kernels", {})
    return [
        {**{k: r[k] for k in ("precision", "batch", "tok_s", "speedup_vs_bf16", "floor_frac")},
         "engine": r.get("engine", "torch fast path (CUDA graphs)"),
         "kernel": r.get("kernel", kernels.get(r["precision"], ""))}
        for r in rows
        if r.get("status") == "ok" and r["kv"] == kv_dtype and r["prompt"] == prompt
    ]


def recorded_on() -> tuple[str, str]:
    """(device, date) of the recorded decode-speed run."""
    d = _results()
    return d.get("device") or "NVIDIA H200", d.get("date") or "date not recorded"


_DISPLAY = {"tok_s": ("tok/s", lambda v: round(v, 1)), "speedup_vs_bf16": ("x BF16", lambda v: round(v, 2)),
            "floor_frac": ("share of HBM floor", lambda v: f"{v:.0%}")}


def display_row(r: dict) -> dict:
    """One `measured_speedups` row for a table: the numbers formatted, the rest (engine, kernel) as they come."""
    out = {}
    for k, v in r.items():
        name, fmt = _DISPLAY.get(k, (k, None))
        out[name] = fmt(v) if fmt and isinstance(v, (int, float)) else v
    return out


def source_line(context: bool = False) -> str:
    """Where the shown decode table was measured; context: the long-context one (`by_context`, the H200 table)."""
    d = _read(RESULTS) if context else _results()
    if not d:
        return ""
    if d.get("command"):
        return (f"Measured by {d['command']} on {d.get('device')} ({d.get('date')}, torch {d.get('torch')}, "
                f"triton {d.get('triton')}, gemlite {d.get('gemlite')}), {d.get('model')}, prompt 512, fast "
                "CUDA-graph decode path; tok/s at decode; the kernel column names the linears that ran.")
    pdl = d.get("programmatic_dependent_launch")
    launch = f", programmatic dependent launch at {pdl}" if pdl and pdl != "off" else ""
    if any(d.get("batch1_folds", {}).values()):
        launch += ", norms folded into the linears at batch 1"
    return (f"Measured by bench/fast/fp8_speed.py on {d.get('device')} ({d.get('date')}, torch {d.get('torch')}), "
            f"{d.get('model')}, fast CUDA-graph decode path{launch}; tok/s at decode.")


def by_context(kv_dtype: str = "auto") -> tuple[int, int, list[dict], list[str]] | None:
    """Decode speed after the shortest and after the longest prompt measured: (short, long, one display row per
    (precision, batch) measured at both, one note per batch that did not fit at the long prompt). None when fewer
    than two prompt lengths were measured."""
    rows = [r for r in _read(RESULTS).get("rows", []) if r.get("kv") == kv_dtype]
    prompts = sorted({r["prompt"] for r in rows})
    if len(prompts) < 2:
        return None
    short, long = prompts[0], prompts[-1]
    at = {(r["precision"], r["batch"], r["prompt"]): r for r in rows if r.get("status") == "ok"}
    out = [{"precision": p, "batch": b,
            f"tok/s at {short:,}": round(s["tok_s"], 1), f"x BF16 at {short:,}": round(s["speedup_vs_bf16"], 2),
            f"tok/s at {long:,}": round(r["tok_s"], 1), f"x BF16 at {long:,}": round(r["speedup_vs_bf16"], 2)}
           for (p, b, n), r in at.items() if n == long and (s := at.get((p, b, short)))]
    notes = sorted({f"batch {r['batch']} at {long:,} tokens: {r['status']}" for r in rows
                    if r["prompt"] == long and r.get("status", "ok") != "ok"})
    return short, long, sorted(out, key=lambda d: (d["batch"], d["precision"] != "bf16", d["precision"])), notes


def prefill_rows() -> list[dict]:
    """One display row per prompt length: seconds to the first token in BF16 and FP8 W8A8 (what the fast engine runs:
    fused kernels, FP8 fast accumulation), their ratio, and the same through cuDNN's attention where measured."""
    out = []
    for r in _read(PREFILL).get("prefill", []):
        row = {"prompt tokens": f"{r['prompt']:,}", "BF16 s": round(r["bf16_s"], 3),
               "FP8 W8A8 s": round(r["fp8_fast_accum_s"], 3), "x BF16": round(r["fp8_fast_accum_speedup"], 2)}
        if "bf16_cudnn_s" in r:
            row |= {"BF16 s, cuDNN attention": round(r["bf16_cudnn_s"], 3),
                    "FP8 W8A8 s, cuDNN attention": round(r["fp8_fast_accum_cudnn_s"], 3)}
        out.append(row)
    return out


def prefill_source_line() -> str:
    d = _read(PREFILL)
    if not d:
        return ""
    return (f"Measured by bench/fast/prefill_speed.py on {d.get('device')} ({d.get('date')}, torch {d.get('torch')}), "
            f"{d.get('model')}, one prompt into a fresh cache, prompt attention through "
            f"{d.get('prompt_attention', 'SDPA')}; seconds from the first kernel to the logits.")
