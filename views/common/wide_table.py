"""A table with more columns than the page is wide, drawn as stacked tables that each fit (the fleet's 21 columns,
a sweep's steps): the key columns (which replica, which load) start every part, so no part needs scrolling sideways
to be read. Column widths are estimated from the text, as the grid sizes them: about 7.5 px a character at the
default font, plus the cell's padding and the header's help icon.
"""
from __future__ import annotations

from typing import Sequence

import streamlit as st

CHAR_PX = 7.5
CELL_PAD_PX = 30
FIT_PX = 900  # the main column of a 1400 px window beside the sidebar (938 px), less the grid's border and scrollbar


def column_width_px(name: str, rows: Sequence[dict]) -> float:
    longest = max([len(str(name))] + [len(str(r.get(name, ""))) for r in rows])
    return CELL_PAD_PX + CHAR_PX * longest


def _pack(widths: dict[str, float], keep: list[str], base: float, limit: float) -> list[list[str]]:
    groups, current, used = [], [], base
    for c, width in widths.items():
        if current and used + width > limit:
            groups.append(keep + current)
            current, used = [], base
        current.append(c)
        used += width
    if current or not groups:
        groups.append(keep + current)
    return groups


def column_groups(rows: Sequence[dict], keep: Sequence[str], fit_px: float = FIT_PX) -> list[list[str]]:
    """The columns of `rows` in their order, cut into as few groups as fit `fit_px` with `keep` in front, and as
    even as that allows (no last part holding one column)."""
    columns = list(rows[0]) if rows else list(keep)
    keep = [c for c in keep if c in columns]
    base = sum(column_width_px(c, rows) for c in keep)
    widths = {c: column_width_px(c, rows) for c in columns if c not in keep}
    fewest = len(_pack(widths, keep, base, fit_px))
    lo, hi = base + max(widths.values(), default=0.0), max(fit_px, base + max(widths.values(), default=0.0))
    for _ in range(20):  # the narrowest limit that still needs no more parts: the most even cut
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if len(_pack(widths, keep, base, mid)) <= fewest else (mid, hi)
    return _pack(widths, keep, base, hi)


def dataframe_fit(rows: Sequence[dict], *, keep: Sequence[str], key: str, column_config: dict | None = None,
                  fit_px: float = FIT_PX) -> None:
    """st.dataframe of `rows`, split into parts that fit; the first part keeps `key` (a selection stays put)."""
    import pandas as pd  # a second of import on 2 cores: paid by the first table shown, not by a page's first open

    for i, cols in enumerate(column_groups(rows, keep, fit_px)):
        config = {c: v for c, v in (column_config or {}).items() if c in cols}
        st.dataframe(pd.DataFrame(list(rows), columns=cols), hide_index=True, width="stretch", column_config=config,
                     key=key if i == 0 else f"{key}-{i}")
