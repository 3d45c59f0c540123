"""The tuning table in force: the winning launch of each (precision, batch bucket, N, K), for every linear method.
methods/tuner.py fills it on this GPU; `load_for` loads this device's section of a saved table (tuned_table.py);
without an entry a method uses its default_config."""
from __future__ import annotations

from core.engines.fast.tuned_table import SHIPPED, Key, read_tuned_table, write_device_section
from core.precision import Device, Precision

TUNED: dict[Key, dict] = {}


def bucket(rows: int) -> int:
    """Tuning bucket of a batch size: one row on its own (it may use a GEMV), then by the tile kernels' BLOCK_M."""
    return 1 if rows == 1 else 16 if rows <= 16 else 32 if rows <= 32 else 64


def key(precision: Precision, rows: int, n: int, k: int) -> Key:
    return (precision.value, bucket(rows), n, k)


def winner(precision: Precision, rows: int, n: int, k: int) -> dict | None:
    return TUNED.get(key(precision, rows, n, k))


def record(precision: Precision, rows: int, n: int, k: int, cfg: dict) -> None:
    TUNED[key(precision, rows, n, k)] = cfg


def load(path=None, device: str | None = None, capability: tuple[int, int] | None = None) -> int:
    """Add a saved table's rows (default: the shipped one; its section for this device) without replacing what
    is already in force; returns how many rows it had."""
    table = read_tuned_table(path or SHIPPED, device, capability)
    for k, cfg in table.items():
        TUNED.setdefault(k, cfg)
    return len(table)


def load_for(device: Device) -> int:
    """The shipped winners for this GPU: its own section, else one measured on the same SM."""
    return load(SHIPPED, device.name, device.capability)


def save(path, device: str, meta: dict) -> None:
    """Write the table in force as `device`'s section of the shipped-layout table at `path`."""
    write_device_section(path, device, meta, TUNED)
