"""The fast path's saved tuning tables load in every layout the project writes (no GPU: parsing only)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from core.engines.fast.tuned_table import SHIPPED_H200, read_tuned_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_table_loads():
    shipped = json.loads(SHIPPED_H200.read_text())
    table = read_tuned_table()
    assert len(table) == len(shipped["configs"]) > 0
    for key, cfg in table.items():
        assert len(key) == 4 and all(isinstance(x, int) for x in key)
        assert isinstance(cfg, dict) and "kernel" in cfg
    first = shipped["configs"][0]
    assert table[tuple(first["key"])] == first["cfg"]


def test_the_bench_usage_names_a_table_that_loads():
    # The bench's own usage line must point at a real file in a layout its --tuned reader accepts.
    doc = ast.get_docstring(ast.parse((ROOT / "bench" / "fast" / "fp8_speed.py").read_text()))
    paths = re.findall(r"--tuned (\S+)", doc)
    assert paths, "bench/fast/fp8_speed.py's docstring shows no --tuned usage"
    for p in paths:
        assert read_tuned_table(ROOT / p)


def test_the_layouts_a_bench_run_writes_load(tmp_path):
    rows = [{"key": [0, 1, 64, 32], "cfg": {"kernel": "gemv", "BLOCK_N": 4}}]
    bare = tmp_path / "tuned_linears.json"
    bare.write_text(json.dumps(rows))
    result = tmp_path / "fp8_speed.json"
    result.write_text(json.dumps({"device": "x", "tuned_linears": rows}))
    for p in (bare, result):
        assert read_tuned_table(p) == {(0, 1, 64, 32): {"kernel": "gemv", "BLOCK_N": 4}}


def test_a_file_that_is_not_a_table_says_so(tmp_path):
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"device": "x"}))
    try:
        read_tuned_table(p)
    except ValueError as e:
        assert "not a tuning table" in str(e)
    else:
        raise AssertionError("a file without rows loaded")
