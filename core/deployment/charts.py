"""Plotly builders for the vLLM deployment page, after vLLM's own Grafana dashboard. Pure: rows in, go.Figure out.

Rows are `core.telemetry.vllm_metrics.dashboard_row` dicts. Plotly renders a little HTML in titles and hover text,
so nothing a server sent (model names, labels) is put into a figure unescaped.
"""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go

COLOURS = ("#76b900", "#4aa3ff", "#ffb020", "#c678dd", "#e6463c", "#56d4c8")
PERCENTILES = ("p50", "p90", "p99")
LATENCY_LABELS = {"ttft": "TTFT", "itl": "ITL", "e2e": "end-to-end"}


def _layout(fig: go.Figure, title: str, y_title: str, source: str, height: int, legend_y: float = -0.2) -> go.Figure:
    sub = f"<br><span style='font-size:0.75em;color:gray'>{html.escape(source)}</span>" if source else ""
    fig.update_layout(title={"text": html.escape(title) + sub, "font": {"size": 15}}, height=height,
                      margin={"l": 50, "r": 10, "t": 60, "b": 40}, yaxis_title=y_title,
                      legend={"orientation": "h", "y": legend_y, "yanchor": "top"}, hovermode="x unified")
    fig.update_yaxes(rangemode="tozero")
    return fig


def timeseries(rows: Sequence[dict], series: dict[str, str], title: str, y_title: str, *, source: str = "",
               y_range: tuple[float, float] | None = None, height: int = 260) -> go.Figure:
    """Lines over time. `series` maps row keys to legend labels; None values stay gaps. x is seconds since
    connecting, said in the subtitle because an axis title would crowd the legend."""
    fig = go.Figure()
    x = [r.get("t_s") for r in rows]
    for i, (key, label) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=x, y=[r.get(key) for r in rows], name=html.escape(label), mode="lines+markers",
                                 marker={"size": 4}, line={"color": COLOURS[i % len(COLOURS)]}, connectgaps=False))
    if y_range:
        fig.update_yaxes(range=list(y_range))
    return _layout(fig, title, y_title, f"{source} · x: seconds since connecting" if source else "", height)


def latency_percentiles(row: dict, key: str, *, source: str = "", height: int = 260) -> go.Figure:
    """p50/p90/p99 in ms of one server histogram ("ttft", "itl", "e2e"): since start and since the last scrape."""
    fig = go.Figure()
    for i, (suffix, label) in enumerate((("", "since server start"), ("_recent", "last interval"))):
        ys = [row.get(f"{key}_{p}_ms{suffix}") for p in PERCENTILES]
        fig.add_trace(go.Bar(x=list(PERCENTILES), y=ys, name=label, marker_color=COLOURS[i],
                             text=[f"{y:.0f}" if y is not None else "N/A" for y in ys], textposition="outside"))
    fig.update_layout(barmode="group")
    return _layout(fig, f"{LATENCY_LABELS.get(key, key)} percentiles", "ms", source, height)


def probe_comparison(client: dict, server: dict | None, *, height: int = 300) -> go.Figure:
    """Client-measured vs server-reported percentiles (ms) for TTFT, ITL and end-to-end latency."""
    fig = go.Figure()
    keys = ("ttft", "itl", "e2e")
    x = [[LATENCY_LABELS[k] for k in keys for _ in PERCENTILES], [p for _ in keys for p in PERCENTILES]]
    sides = [("client (measured here)", client)] + ([("server (vLLM /metrics)", server)] if server else [])
    for i, (label, data) in enumerate(sides):
        ys = [None if data.get(k, {}).get(p) is None else 1000.0 * data[k][p]
              for k in keys for p in PERCENTILES]
        fig.add_trace(go.Bar(x=x, y=ys, name=label, marker_color=COLOURS[i]))
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log", dtick=1, tickformat=",d")  # labels at 1, 10, 100, 1000 ms: no bare "2" minor labels
    return _layout(fig, "Probe latency: client vs server", "ms (log scale)",
                   "server side interpolated from histogram buckets", height, legend_y=-0.3)
