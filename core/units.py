"""Formatting of numbers for display: one place, so every page shows units the same way."""
from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "N/A"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def fmt_s(s: float | None) -> str:
    if s is None:
        return "N/A"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"
