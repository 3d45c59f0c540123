"""Saved tuning tables of the fast path's linears, read without torch or triton (the bench and the engine both load
them, and the format is checked in tests on machines without a GPU).

One format for every linear family. A row is {"key": [precision, batch bucket, N, K], "cfg": {"kernel": ..., ...}}:
the precision's value ("bf16", "int4", ...), the batch bucket (methods/tuning.py `bucket`), the linear's output and
input widths, and the winning candidate (a named kernel launch and its launch parameters). The shipped table
(tuned_linears.json) keeps one section per device name, so an H100's and an H200's winners sit side by side:

    {"format": "triage-tuned-linears/1",
     "devices": {"NVIDIA H200": {"capability": [9, 0], "date": ..., "sources": [...], "configs": [rows]}}}

A bench run writes one device's rows bare (D/tuned_linears.json) or under "tuned_linears" in its result JSON; both
load too.
"""
from __future__ import annotations

import json
from pathlib import Path

FORMAT = "triage-tuned-linears/1"
SHIPPED = Path(__file__).with_name("tuned_linears.json")

Key = tuple[str, int, int, int]


def _rows_to_table(rows, path) -> dict[Key, dict]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "key" in r and "cfg" in r for r in rows):
        raise ValueError(f"{path} is not a tuning table: expected a list of {{'key', 'cfg'}} rows, bare, under "
                         "'tuned_linears' (a bench result) or per device under 'devices' (the shipped table)")
    table = {}
    for r in rows:
        key = tuple(r["key"])
        if len(key) != 4 or not isinstance(key[0], str):
            raise ValueError(f"{path} has a row keyed {r['key']!r}; rows are keyed [precision, batch bucket, N, K] "
                             "with the precision's name (e.g. \"int4\"): tune again with python -m bench.fast.fp8_speed")
        table[key] = r["cfg"]
    return table


def device_section(data: dict, name: str | None, capability: tuple[int, int] | None = None) -> dict | None:
    """The section of a shipped table for this device: its own name first, else a device of the same compute
    capability (same SM: an H100 uses the H200's winners until it has its own), else None. With no name given, the
    only section."""
    devices = data.get("devices", {})
    if name in devices:
        return devices[name]
    if name is None and len(devices) == 1:
        return next(iter(devices.values()))
    if capability is not None:
        for section in devices.values():
            if tuple(section.get("capability") or ()) == tuple(capability):
                return section
    return None


def read_tuned_table(path=None, device: str | None = None,
                     capability: tuple[int, int] | None = None) -> dict[Key, dict]:
    """The launch configurations saved at `path` (default: the table shipped here) for `device` (by name, or by
    compute capability; a bench file holds one device's rows and is read whole); {} for a device it has none for."""
    path = Path(path or SHIPPED)
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "devices" in data:
        section = device_section(data, device, capability)
        return {} if section is None else _rows_to_table(section.get("configs"), path)
    rows = data.get("configs", data.get("tuned_linears")) if isinstance(data, dict) else data
    return _rows_to_table(rows, path)


def rows(table: dict[Key, dict]) -> list[dict]:
    """A table as the rows a file holds, in key order."""
    return [{"key": list(k), "cfg": v} for k, v in sorted(table.items())]


def write_device_section(path, device: str, meta: dict, table: dict[Key, dict]) -> None:
    """Put `device`'s rows (and its metadata: capability, date, versions, source) into the shipped-layout table at
    `path`, keeping every other device's section."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {"format": FORMAT, "devices": {}}
    data.setdefault("devices", {})[device] = {**meta, "configs": rows(table)}
    path.write_text(json.dumps(data, indent=1) + "\n")
