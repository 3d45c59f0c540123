"""Export of the buffered window (CSV, Parquet), the chart builders, and unit formatting."""
from __future__ import annotations

import io

import pandas as pd

from core.fmt import fmt_field as fmt
from core.telemetry.export import to_csv_bytes, to_frame, to_parquet_bytes
from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler
from tests.fakes.nvml import A100, FakeNvml

ROWS = [  # the second row has a process watched later: a new column, empty before
    {"t": 1_700_000_000.0, "gpu0.util_pct": 97.0, "gpu0.dram_bw_util_pct": None, "gpu0.throttle_reasons": ""},
    {"t": 1_700_000_000.1, "gpu0.util_pct": 96.0, "gpu0.dram_bw_util_pct": 88.6,
     "gpu0.throttle_reasons": "SW power cap", "proc.vllm.rss_bytes": 123},
]


def test_frame_has_a_utc_time_column_first_and_keeps_gaps():
    df = to_frame(ROWS)
    assert list(df.columns)[0] == "time_utc" and str(df["time_utc"].dt.tz) == "UTC"
    assert pd.isna(df.loc[0, "gpu0.dram_bw_util_pct"]) and pd.isna(df.loc[0, "proc.vllm.rss_bytes"])


def test_csv_round_trip():
    df = pd.read_csv(io.BytesIO(to_csv_bytes(ROWS)))
    assert df["gpu0.util_pct"].tolist() == [97.0, 96.0]
    assert pd.isna(df.loc[0, "gpu0.dram_bw_util_pct"])  # missing is empty, never 0


def test_parquet_round_trip():
    df = pd.read_parquet(io.BytesIO(to_parquet_bytes(ROWS)))
    assert df["gpu0.dram_bw_util_pct"].tolist()[1] == 88.6
    assert df["gpu0.throttle_reasons"].tolist()[1] == "SW power cap"


def test_export_of_an_empty_and_of_a_real_window():
    assert to_frame([]).columns.tolist() == ["time_utc"]
    assert to_parquet_bytes([]) and to_csv_bytes([])
    s = Sampler([NvmlSource(nvml=FakeNvml(table=A100))])
    for _ in range(5):
        s.tick()
    df = pd.read_parquet(io.BytesIO(to_parquet_bytes(s.rows())))
    assert len(df) == 5 and df["gpu0.dram_bw_util_pct"].isna().all()  # A100: no GPM, so no DRAM BW at all


def test_fmt_reads_the_unit_from_the_key():
    assert fmt("gpu0.util_pct", 97.4) == "97%"
    assert fmt("gpu0.mem_used_bytes", 80 * 2**30) == "80.0 GiB"
    assert fmt("host.net_rx_bytes_s", 2.5e6) == "2.5 MB/s"
    assert fmt("host.disk_read_bytes_s", 295_012.0) == "295 kB/s"
    assert fmt("host.disk_read_bytes_s", 0.0) == "0 B/s"
    assert fmt("gpu0.power_w", 650.2) == "650 W"
    assert fmt("gpu0.temp_c", 61) == "61 °C"
    assert fmt("gpu0.sm_clock_mhz", 1980) == "1980 MHz"
    assert fmt("gpu0.throttle_reasons", "") == "none"
    assert fmt("gpu0.power_w", None) == "N/A"
