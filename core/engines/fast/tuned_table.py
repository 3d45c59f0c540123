"""Saved tuning tables of the fast path's linears, read without torch or triton (the bench and the engine both
load them, and the format is checked in tests on machines without a GPU).

Two layouts exist: the shipped table (tuned_h200.json: metadata plus "configs") and the bare list of rows that
`python -m bench.fast.fp8_speed --out D` writes to D/tuned_linears.json; its full result JSON keeps the rows under
"tuned_linears". Each row is {"key": [mode, batch bucket, N, K], "cfg": {...}}.
"""
from __future__ import annotations

import json
from pathlib import Path

SHIPPED_H200 = Path(__file__).with_name("tuned_h200.json")


def read_tuned_table(path=None) -> dict[tuple[int, int, int, int], dict]:
    """The launch configurations saved at `path` (default: the H200 table shipped here), keyed like kernels.TUNED."""
    path = Path(path or SHIPPED_H200)
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        rows = data.get("configs", data.get("tuned_linears"))
    else:
        rows = data
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "key" in r and "cfg" in r for r in rows):
        raise ValueError(f"{path} is not a tuning table: expected a list of {{'key', 'cfg'}} rows, bare or under "
                         "'configs' (the shipped table) or 'tuned_linears' (a bench result)")
    return {tuple(r["key"]): r["cfg"] for r in rows}
