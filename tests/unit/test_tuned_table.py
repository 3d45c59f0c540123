"""The fast path's saved tuning tables load in every layout the project writes (no GPU: parsing only)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from core.engines.fast.tuned_table import SHIPPED, read_tuned_table, write_device_section
from core.precision import Precision

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_table_holds_every_family_for_the_h200():
    shipped = json.loads(SHIPPED.read_text())
    section = shipped["devices"]["NVIDIA H200"]
    table = read_tuned_table(device="NVIDIA H200")
    assert len(table) == len(section["configs"]) > 0
    for key, cfg in table.items():
        assert len(key) == 4 and Precision(key[0]) and all(isinstance(x, int) for x in key[1:])
        assert isinstance(cfg, dict) and "kernel" in cfg
    families = {k[0] for k in table}
    assert {"bf16", "fp8", "fp8-wo", "int4", "int4-awq", "int8-wo"} <= families
    first = section["configs"][0]
    assert table[tuple(first["key"])] == first["cfg"]


def test_the_shipped_table_keeps_the_winners_of_both_former_tables():
    # one from the BF16/FP8 table and one GEMV winner from the integer table, as they were tuned on the H200
    table = read_tuned_table(device="NVIDIA H200")
    assert table[("bf16", 1, 6144, 4096)] == {"kernel": "gemv", "BLOCK_N": 4, "BLOCK_K": 2048, "num_warps": 4,
                                              "num_stages": 3}
    assert table[("int4", 1, 4096, 4096)]["kernel"] in ("gemv", "tile")


def test_a_device_without_its_own_section_takes_one_of_the_same_sm_or_none():
    # the H100 SXM has its own section (integer linears' library winners); a Hopper card without one takes the first
    assert read_tuned_table(device="NVIDIA H100 PCIe", capability=(9, 0)) == read_tuned_table(device="NVIDIA H200")
    assert read_tuned_table(device="NVIDIA H100 80GB HBM3", capability=(9, 0))[("int4", 1, 4096, 4096)] == {
        "kernel": "gemlite"}
    assert read_tuned_table(device="NVIDIA A100-SXM4-80GB", capability=(8, 0)) == {}


def test_an_h100_section_sits_beside_the_h200_one(tmp_path):
    p = tmp_path / "tuned.json"
    p.write_text(SHIPPED.read_text())
    write_device_section(p, "NVIDIA H100 80GB HBM3", {"capability": [9, 0]},
                         {("int4", 1, 64, 32): {"kernel": "tile", "BLOCK_N": 32}})
    assert read_tuned_table(p, "NVIDIA H100 80GB HBM3") == {("int4", 1, 64, 32): {"kernel": "tile", "BLOCK_N": 32}}
    assert read_tuned_table(p, "NVIDIA H200") == read_tuned_table(device="NVIDIA H200")


def test_the_bench_usage_names_a_table_that_loads():
    # The bench's own usage line must point at a real file in a layout its --tuned reader accepts.
    doc = ast.get_docstring(ast.parse((ROOT / "bench" / "fast" / "fp8_speed.py").read_text()))
    paths = re.findall(r"--tuned (\S+)", doc)
    assert paths, "bench/fast/fp8_speed.py's docstring shows no --tuned usage"
    for p in paths:
        assert read_tuned_table(ROOT / p, device="NVIDIA H200")


def test_the_layouts_a_bench_run_writes_load(tmp_path):
    rows = [{"key": ["bf16", 1, 64, 32], "cfg": {"kernel": "gemv", "BLOCK_N": 4}}]
    bare = tmp_path / "tuned_linears.json"
    bare.write_text(json.dumps(rows))
    result = tmp_path / "fp8_speed.json"
    result.write_text(json.dumps({"device": "x", "tuned_linears": rows}))
    for p in (bare, result):
        assert read_tuned_table(p) == {("bf16", 1, 64, 32): {"kernel": "gemv", "BLOCK_N": 4}}


def test_a_file_that_is_not_a_table_says_so(tmp_path):
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"device": "x"}))
    with pytest.raises(ValueError, match="not a tuning table"):
        read_tuned_table(p)


def test_rows_keyed_by_kernel_mode_numbers_say_what_to_do(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps([{"key": [3, 1, 64, 32], "cfg": {}}]))
    with pytest.raises(ValueError, match="precision's name"):
        read_tuned_table(p)
