"""The FP8/BF16 decode speedups measured on the H200 by bench/fp8_speed.py, for pages to show beside a setup."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "fp8_speed_h200.json"


@lru_cache(maxsize=1)
def _results() -> dict:
    try:
        return json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}


def measured_speedups(kv_dtype: str = "auto", prompt: int = 512) -> list[dict]:
    """Rows of {precision, batch, tok_s, speedup_vs_bf16, floor_frac} for one KV dtype and prompt length."""
    rows = _results().get("rows", [])
    return [
        {k: r[k] for k in ("precision", "batch", "tok_s", "speedup_vs_bf16", "floor_frac")}
        for r in rows
        if r.get("status") == "ok" and r["kv"] == kv_dtype and r["prompt"] == prompt
    ]


def source_line() -> str:
    d = _results()
    if not d:
        return ""
    return (f"Measured by bench/fp8_speed.py on {d.get('device')} ({d.get('date')}, torch {d.get('torch')}), "
            f"{d.get('model')}, fast CUDA-graph decode path; tok/s at decode.")
