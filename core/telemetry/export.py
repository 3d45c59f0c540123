"""The buffered window as a table: pandas DataFrame, CSV bytes, Parquet bytes.

Column names are the sampler's keys (gpu0.util_pct, host.mem_available_bytes, ...), so the unit is in every
header. A missing reading is an empty cell (CSV) or null (Parquet), never 0.
"""
from __future__ import annotations

import io
from typing import Any, Iterable

import pandas as pd


def to_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(list(rows))
    if df.empty:
        return pd.DataFrame({"time_utc": pd.Series(dtype="datetime64[ns, UTC]")})
    df.insert(0, "time_utc", pd.to_datetime(df.pop("t"), unit="s", utc=True))
    return df


def to_csv_bytes(rows: Iterable[dict[str, Any]]) -> bytes:
    return to_frame(rows).to_csv(index=False).encode("utf-8")


def to_parquet_bytes(rows: Iterable[dict[str, Any]]) -> bytes:
    buf = io.BytesIO()
    to_frame(rows).to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()
