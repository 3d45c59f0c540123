"""Formatting for display: the one home of byte sizes, durations, telemetry fields and Markdown escaping, so every
page, report and CLI line writes a unit the same way."""
from __future__ import annotations

import re
import time
from typing import Any

KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40
_BINARY_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fmt_bytes(n: float | None, largest: str = "TiB") -> str:
    """Binary units, as GPU memory is quoted in tools: "1.50 GiB", "512 B"; `largest` caps the unit."""
    if n is None:
        return "N/A"
    units = _BINARY_UNITS[[u for u, _ in _BINARY_UNITS].index(largest):]
    for unit, size in units:
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def fmt_cache_bytes(n: float | None) -> str:
    """KV cache sizes stay in GiB however large, so they compare at a glance with a GPU's memory."""
    return fmt_bytes(n, largest="GiB")


def fmt_s(s: float | None) -> str:
    if s is None:
        return "N/A"
    if 0 < s < 0.001:  # a 30 µs queue time printed as "0.0 ms" reads as none at all
        return f"{s * 1e6:.0f} µs"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_utc(t: float | None, ms: bool = False, unknown: str = "unknown") -> str:
    """A unix time as "2026-12-07 08:01:02 UTC" (with milliseconds when two instants share a second)."""
    if t is None:
        return unknown
    frac = f".{int(1000 * (t % 1)):03d}" if ms else ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + frac + " UTC"


def fmt_change(pct: float, only: bool = False) -> str:
    """A relative change in words: 'grew 12%' ('grew only 12%' with `only`), 'fell 11%', 'held level' within half a
    percent; never 'grew -11%'."""
    if abs(pct) < 0.5:
        return "held level"
    return f"fell {-pct:.0f}%" if pct < 0 else f"grew {'only ' if only else ''}{pct:.0f}%"


def fmt_share(fraction: float) -> str:
    """A share of something nearly empty in words that never read 0% when it is not zero: "42%", "0.4%", "under
    0.1%" (a KV cache holding two short sequences of a 55K-token pool is 0.2% used, not 0%)."""
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 0.95 else f"{pct:.1f}%" if pct >= 0.05 else "under 0.1%"


def fmt_liveness(state: str, kind: str = "") -> str:
    """A liveness verdict's state as a user reads it: 'STALLED (deadlock)', 'SERVING'; a dead engine is 'DEAD (the
    engine process exited)', not a stall: nothing resumes it, the server must be restarted."""
    if kind == "engine_dead":
        return "DEAD (the engine process exited)"
    return state.upper() + (f" ({kind})" if kind else "")


RATIO_CAP = 1000.0  # a ratio this large says "against next to nothing", not "that many times slower"


def fmt_times(a: float | None, b: float | None, floor: float) -> str | None:
    """'7.9x' for `a` against `b`, or None where either is missing, `b` is under `floor` (16 s against a 23 µs queue
    is a ratio against noise) or the ratio reaches RATIO_CAP: the caller then says both values instead."""
    if a is None or b is None or b < floor or b <= 0 or a / b >= RATIO_CAP:
        return None
    return f"{a / b:.1f}x"


def fmt_ms_cell(s: float | None, decimals: int = 1) -> str:
    """Seconds as a bare number of milliseconds, for a table column whose header names the unit."""
    return "N/A" if s is None else f"{1000 * s:.{decimals}f}"


# --- telemetry fields: the unit is in the key's suffix, so one function formats every field -----------------------

def fmt_field(key: str, value: Any) -> str:
    """Human text for a value, by the unit named in its key. None -> "N/A" (the caller shows the reason)."""
    if value is None:
        return "N/A"
    if isinstance(value, str):
        return value or "none"
    if key.endswith("_pct"):
        return f"{value:.0f}%"
    if key.endswith("_bytes_s"):
        return fmt_rate(value)
    if key.endswith("_bytes"):
        return f"{value / GIB:.1f} GiB"  # one decimal, always GiB: these sit in narrow metric columns
    if key.endswith("_w"):
        return f"{value:.0f} W"
    if key.endswith("_mhz"):
        return f"{value:.0f} MHz"
    if key.endswith("_c"):
        return f"{value:.0f} °C"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def fmt_rate(bytes_s: float) -> str:
    # Three significant digits at most: these sit in narrow metric columns.
    unit, scale = next(((u, k) for u, k in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)) if bytes_s >= k),
                       ("B/s", 1.0))
    x = bytes_s / scale
    return f"{x:.1f} {unit}" if x < 10 and scale > 1 else f"{x:.0f} {unit}"


def fmt_per_s(per_s: float | None, unit: str) -> str:
    """A speed with its unit, never rounded to zero: "0.38 tokens/s", "4.2 tokens/s", "1,234 prompt tokens/s". Two
    significant digits below 10, whole numbers above: 0.4 tokens/s printed as "0" reads as a hung run."""
    if per_s is None or per_s != per_s:
        return "N/A"
    if per_s == 0 or abs(per_s) >= 10:
        return f"{per_s:,.0f} {unit}/s"
    return f"{float(f'{per_s:.2g}'):g} {unit}/s"


# --- Markdown -----------------------------------------------------------------------------------------------------

# Only what changes the rendering: emphasis (* _ ~), links and images ([ ] -- without them "(" and "!" are plain
# text), raw HTML and autolinks (< >), table cells (|), backslash escapes (\), and $ for Streamlit's $...$ LaTeX.
# A "#" turns into a heading only at the start of a line; it is escaped there alone.
_MD_SPECIAL = re.compile(r"([\\*_\[\]<>|~$])")
_MD_HEADING = re.compile(r"^([ ]{0,3})#", re.MULTILINE)
_MD_ALL = re.compile(r"([\\`*_{}\[\]()#+\-.!<>|~$:])")


def markdown_safe(text: Any) -> str:
    """Text for Markdown with its special characters escaped, except inside `code spans` (kept as code).
    Verdicts quote launch commands and URLs from outside; they must not turn into links, images or tables."""
    parts = re.split(r"(`[^`\n]+`)", str(text))
    return "".join(p if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else _MD_HEADING.sub(r"\1\\#", _MD_SPECIAL.sub(r"\\\1", p)) for p in parts)


def markdown_literal(text: Any) -> str:
    """Text shown exactly as written: every Markdown character escaped, backticks too (for text from a server or a
    model, where a code span is no more trusted than a link). `:` too: Streamlit turns :name: into an icon."""
    return _MD_ALL.sub(r"\\\1", str(text))


def visible_token(text: Any) -> str:
    """A token's text with whitespace and control characters made visible (newline as \\n, tab as \\t, others as
    \\xNN), for tables of tokens in context; it is still plain text, never markup: show it as text."""
    out = []
    for ch in str(text):
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


# --- paths --------------------------------------------------------------------------------------------------------

def short_path(path: Any, root: Any = None) -> str:
    """A path for a caption: relative to the repository (or `root`) when inside it, else with the home directory
    written as ~, so a screen shared in a demo shows no user's home and stays short. Other paths are kept whole."""
    from pathlib import Path

    p = Path(str(path)).expanduser()
    base = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    for anchor, prefix in ((base, ""), (Path.home(), "~/")):
        try:
            rel = p.resolve().relative_to(anchor.resolve()) if p.is_absolute() else None
        except (ValueError, OSError):
            continue
        if rel is not None:
            return prefix + str(rel) if str(rel) != "." else (prefix.rstrip("/") or ".")
    return str(p)
