"""What a monitor refresh draws, built once and shared by every session that refreshes within the same moment.

Every open tab refreshes on its own clock; left alone, eight tabs rebuild the same gauges and trend data eight times
a second. A frame built from a sampler tick is reused by any session that asks within FRESH_S of the newest tick,
so the work grows with the refresh rate, not with the number of viewers.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import pandas as pd

from core.monitor import charts
from core.fmt import GIB, fmt_field as fmt
from core.telemetry.base import GPU_IDLE_UTIL_PCT, bandwidth_thresholds
from core.telemetry.nvml import GpuInfo
from core.telemetry.sampler import Sampler, Snapshot

FRESH_S = 0.5  # a frame this much older than the newest tick is still shown: half of the fastest refresh
TREND_POINTS = 300  # per line: one per second over the default 5-minute window, wider than a chart has pixels

GPU_TREND = {"util_pct": "GPU util (NVML)", "dram_bw_util_pct": "DRAM BW util (GPM)",
             "sm_util_pct": "SM util (GPM)", "mem_busy_pct": "memory busy (NVML, not BW)"}


def gpu_trend_hlines(gpu_name: str) -> tuple[tuple[float, str], ...]:
    """The checklist's thresholds as lines on the GPU utilization trend (bandwidth ones are per GPU model)."""
    likely, bound = bandwidth_thresholds(gpu_name)
    return ((GPU_IDLE_UTIL_PCT, f"GPU idle < {GPU_IDLE_UTIL_PCT:.0f}%"),
            (likely, f"BW likely bound > {likely:.0f}%"), (bound, f"BW bound > {bound:.0f}%"))


@dataclass(frozen=True)
class Frame:
    """One moment of the monitor for one GPU choice and time window."""

    snapshot: Snapshot
    gauges_html: str
    util_trend: pd.DataFrame  # GPU utilization lines, or host CPU without a GPU
    util_labels: tuple[str, ...]
    util_hlines: tuple[tuple[float, str], ...]  # threshold lines for util_trend
    mem_trend: pd.DataFrame  # GiB
    mem_labels: tuple[str, ...]
    # With more than one GPU: every GPU in a row, and one line per GPU for util and DRAM bandwidth util.
    gpu_table_html: str = ""
    util_by_gpu: pd.DataFrame | None = None
    bw_by_gpu: pd.DataFrame | None = None
    gpu_labels: tuple[str, ...] = ()


class SharedCache:
    """Values keyed by what they show, each tagged with the tick it was built from; a value is reused while its tick
    is at most FRESH_S older than the newest. Builds run outside the lock (two sessions may rarely build the same
    frame; both results are correct)."""

    def __init__(self, keep: int = 16):
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._keep = keep
        self.builds = self.hits = 0

    def get(self, key: Hashable, newest_t: float | None, build: Callable[[], tuple[float | None, Any]]) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is not None and newest_t is not None and newest_t - item[0] <= FRESH_S:
                self.hits += 1
                return item[1]
        built_t, value = build()
        with self._lock:
            self.builds += 1
            if built_t is not None:
                self._items[key] = (built_t, value)
                self._items.move_to_end(key)
                while len(self._items) > self._keep:
                    self._items.popitem(last=False)
        return value


_CACHE = SharedCache()


def live_frame(sampler: Sampler, gpu_index: int | None, window_s: float, all_gpus: tuple[int, ...] = ()) -> Frame:
    """The frame to draw now for this GPU (None: host only) over the last `window_s` seconds; `all_gpus` (the
    indices of every GPU) adds the all-GPU table and per-GPU lines when there is more than one."""
    newest = sampler.latest().t
    # The sampler itself, not id(sampler), is in the key: an id can be reused by a new sampler (tests make many).
    return _CACHE.get((sampler, gpu_index, window_s, all_gpus), newest,
                      lambda: _build(sampler, gpu_index, window_s, all_gpus))


def recorded_frame(replay, gpu_index: int | None, window_s: float) -> Frame:
    """The frame of a recording (core/monitor/replay.Replay) at its current moment, built exactly as a live one,
    with the trends' time in seconds into the recording (charts.trend_spec(elapsed=True)); not cached (a replay is
    drawn once per rerun, for one session)."""
    all_gpus = tuple(g.index for g in replay.source("nvml").gpus)
    frame = _build(replay, gpu_index, window_s, all_gpus)[1]
    trends = {name: charts.elapsed_frame(getattr(frame, name), replay.start)
              for name in ("util_trend", "mem_trend", "util_by_gpu", "bw_by_gpu") if getattr(frame, name) is not None}
    return dataclasses.replace(frame, **trends)


def gpu_rows(snap: Snapshot, gpus: list[GpuInfo]) -> list[dict]:
    """The all-GPU table's rows from one snapshot (see charts.gpu_table). A field NVML did not give is "N/A" with
    its reason on hover; a lost GPU is one row that says so."""
    v = snap.values
    rows = []
    for g in gpus:
        i, p = g.index, f"gpu{g.index}."

        def cell(field, frac=None, text=None):
            value = v.get(p + field)
            if value is None:
                return "N/A", None, f"N/A: {snap.reason(p + field)}"
            return text or fmt(p + field, value), frac, ""

        used, total = v.get(p + "mem_used_bytes"), v.get(p + "mem_total_bytes")
        power, limit = v.get(p + "power_w"), v.get(p + "power_limit_w")
        procs = snap.tables.get(p + "processes") or []
        util, bw = v.get(p + "util_pct"), v.get(p + "dram_bw_util_pct")
        cells = [
            cell("util_pct", None if util is None else util / 100),
            cell("dram_bw_util_pct", None if bw is None else bw / 100),
            cell("mem_used_bytes", used / total if used is not None and total else None,
                 f"{used / GIB:.1f} / {total / GIB:.0f} GiB" if used is not None and total else None),
            cell("power_w", None, f"{power:.0f} / {limit:.0f} W" if power is not None and limit else None),
            cell("sm_clock_mhz"), cell("temp_c"), cell("throttle_reasons"),
            (", ".join(f"{x['name']} ({x['pid']})" for x in procs) or "none", None,
             snap.reasons.get(p + "processes", "")),
        ]
        rows.append({"gpu": f"{i}: {g.name}", "lost": g.lost_reason if g.lost else "", "cells": cells})
    return rows


def _build(sampler: Sampler, gpu_index: int | None, window_s: float,
           all_gpus: tuple[int, ...]) -> tuple[float | None, Frame]:
    snap = sampler.latest()
    v = snap.values
    p = None if gpu_index is None else f"gpu{gpu_index}."
    avail, total = v.get("host.mem_available_bytes"), v.get("host.mem_total_bytes")
    gauges = [charts.gauge(None if avail is None else avail / GIB, "Host MemAvailable", source="psutil /proc/meminfo",
                           max_value=(total or GIB) / GIB, suffix=" GiB",
                           na_reason=snap.reason("host.mem_available_bytes"))]
    name = next((g.name for g in sampler.source("nvml").gpus if g.index == gpu_index), "") if p else ""
    if p:
        used, total = v.get(p + "mem_used_bytes"), v.get(p + "mem_total_bytes")
        gauges[:0] = [
            charts.gauge(v.get(p + "util_pct"), "GPU util", source="NVML utilization.gpu",
                         bands=charts.util_bands(GPU_IDLE_UTIL_PCT), na_reason=snap.reason(p + "util_pct")),
            charts.gauge(v.get(p + "dram_bw_util_pct"), "DRAM BW util", source="NVML GPM DRAM_BW_UTIL",
                         bands=charts.bandwidth_bands(*bandwidth_thresholds(name)),
                         na_reason=snap.reason(p + "dram_bw_util_pct")),
            charts.gauge(None if used is None else used / GIB, "GPU memory used", source="NVML",
                         max_value=(total or GIB) / GIB, suffix=" GiB", na_reason=snap.reason(p + "mem_used_bytes"))]
        util_keys = {p + k: label for k, label in GPU_TREND.items()}
    else:
        gauges.insert(0, charts.gauge(v.get("host.cpu_pct"), "Host CPU", source="psutil, all cores",
                                      na_reason=snap.reason("host.cpu_pct")))
        util_keys = {"host.cpu_pct": "host CPU (psutil)"}
    mem_keys = {"host.mem_available_bytes": "host MemAvailable"}
    if p:
        mem_keys[p + "mem_used_bytes"] = f"GPU {gpu_index} memory used"
    many = len(all_gpus) > 1
    by_gpu = [f"gpu{i}.{f}" for f in ("util_pct", "dram_bw_util_pct") for i in all_gpus] if many else []
    s = sampler.series(list(util_keys) + list(mem_keys) + by_gpu, window_s, max_points=TREND_POINTS)
    gpu_labels = tuple(f"GPU {i}" for i in all_gpus)
    extra = {} if not many else {
        "gpu_table_html": charts.gpu_table(gpu_rows(snap, [g for g in sampler.source("nvml").gpus
                                                           if g.index in all_gpus])),
        "util_by_gpu": charts.trend_frame(s["t"], {lab: s[f"gpu{i}.util_pct"] for i, lab in zip(all_gpus, gpu_labels)}),
        "bw_by_gpu": charts.trend_frame(s["t"], {lab: s[f"gpu{i}.dram_bw_util_pct"]
                                                 for i, lab in zip(all_gpus, gpu_labels)}),
        "gpu_labels": gpu_labels}
    frame = Frame(
        snapshot=snap, gauges_html=charts.gauge_row(gauges),
        util_trend=charts.trend_frame(s["t"], {label: s[k] for k, label in util_keys.items()}),
        util_labels=tuple(util_keys.values()), util_hlines=gpu_trend_hlines(name) if p else (),
        mem_trend=charts.trend_frame(s["t"], {label: s[k] for k, label in mem_keys.items()}, scale=GIB),
        mem_labels=tuple(mem_keys.values()), **extra)
    return snap.t, frame
