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


# --- the anatomy and the load sweep (rows are Anatomy.to_dict() / Step dicts from core.deployment.sweep) -----------
PHASE_COLOURS = {"queue": "#e6463c", "prefill": "#ffb020", "decode": "#4aa3ff"}
PHASE_LABELS = {"queue": "queue", "prefill": "prefill", "decode": "decode"}


def _phase_ms(anatomy: dict | None, phase: str) -> float | None:
    p = ((anatomy or {}).get("phases") or {}).get(phase)
    return None if not p or p.get("mean_s") is None else 1000.0 * p["mean_s"]


def anatomy_bar(anatomy: dict, *, title: str = "Where a request's time went (server means)",
                height: int = 200) -> go.Figure:
    """One stacked horizontal bar: mean queue, prefill and decode time per request in the window (ms)."""
    fig = go.Figure()
    for phase in PHASE_LABELS:
        ms = _phase_ms(anatomy, phase)
        share = (anatomy.get("share_e2e") or {}).get(phase)
        fig.add_trace(go.Bar(y=["request"], x=[ms], name=PHASE_LABELS[phase], orientation="h",
                             marker_color=PHASE_COLOURS[phase],
                             text=[None if ms is None else f"{ms:.0f} ms" + ("" if share is None else
                                                                            f" ({100 * share:.0f}%)")],
                             textposition="inside"))
    fig.update_layout(barmode="stack", xaxis_title="ms (mean per request)")
    fig.update_yaxes(showticklabels=False)
    return _layout(fig, title, "", "vllm:request_queue/prefill/decode_time_seconds: _sum / _count over the window",
                   height, legend_y=-0.45)


def _step_x(steps: Sequence[dict]) -> tuple[list[float], str]:
    mode = steps[0]["mode"] if steps else "concurrency"
    return [s["load"] for s in steps], ("concurrent clients" if mode == "concurrency" else "target requests/s")


def _knee_line(fig: go.Figure, knee: dict | None) -> None:
    if knee:
        fig.add_vline(x=knee["load"], line_dash="dot", line_color="gray",
                      annotation_text=f"knee {knee['load']:g}", annotation_position="top left")


def sweep_latency(steps: Sequence[dict], slo: dict | None = None, knee: dict | None = None,
                  *, height: int = 300) -> go.Figure:
    """Client TTFT and ITL p50/p99 (ms) against the load, the SLOs as lines and the knee marked."""
    x, x_title = _step_x(steps)
    fig = go.Figure()
    series = (("ttft", "p50", "TTFT p50", "solid"), ("ttft", "p99", "TTFT p99", "dash"),
              ("itl", "p50", "ITL p50", "solid"), ("itl", "p99", "ITL p99", "dash"))
    for i, (key, p, label, dash) in enumerate(series):
        ys = [None if s["client"][key][p] is None else 1000.0 * s["client"][key][p] for s in steps]
        fig.add_trace(go.Scatter(x=x, y=ys, name=label, mode="lines+markers",
                                 line={"color": COLOURS[0 if key == "ttft" else 1], "dash": dash}))
    top = max((1000.0 * s["client"][k][p] for s in steps for k, p, _, _ in series
               if s["client"][k][p] is not None), default=0.0)
    off_chart = []
    for key, label in (("ttft_p99", "TTFT p99 SLO"), ("itl_p99", "ITL p99 SLO")):
        if slo and slo.get(key):
            ms = 1000.0 * slo[key]
            if ms > 3 * top:  # drawn, it would flatten every measured line against the axis
                off_chart.append(f"{label} {ms:,.0f} ms")
                continue
            fig.add_hline(y=ms, line_color=COLOURS[4], line_dash="dash",
                          annotation_text=f"{label} {ms:,.0f} ms", annotation_position="top right")
    _knee_line(fig, knee)
    source = "measured here, nearest rank over each step's requests"
    if off_chart:
        source += "; above the chart: " + ", ".join(off_chart)
    fig.update_layout(xaxis_title=x_title)
    return _layout(fig, "Latency against load", "ms (client)", source, height, legend_y=-0.3)


def sweep_anatomy(steps: Sequence[dict], *, height: int = 300) -> go.Figure:
    """Per step, the server's mean queue, prefill and decode time per request, stacked (ms)."""
    x, x_title = _step_x(steps)
    labels = [f"{v:g}" for v in x]
    fig = go.Figure()
    for phase in PHASE_LABELS:
        fig.add_trace(go.Bar(x=labels, y=[_phase_ms(s.get("server"), phase) for s in steps], name=PHASE_LABELS[phase],
                             marker_color=PHASE_COLOURS[phase]))
    fig.update_layout(barmode="stack", xaxis_title=x_title)
    return _layout(fig, "Where the time goes, per step", "ms (server mean per request)",
                   "vLLM's queue, prefill and decode histograms, per step", height,  # fits a third of 1400 px
                   legend_y=-0.3)


def sweep_throughput(steps: Sequence[dict], knee: dict | None = None, *, height: int = 300) -> go.Figure:
    """Achieved requests/s and output tokens/s against the load."""
    x, x_title = _step_x(steps)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[s["achieved_rps"] for s in steps], name="requests/s", mode="lines+markers",
                             line={"color": COLOURS[0]}))
    fig.add_trace(go.Scatter(x=x, y=[s["output_tok_s"] for s in steps], name="output tokens/s", mode="lines+markers",
                             line={"color": COLOURS[1]}, yaxis="y2"))
    fig.update_layout(xaxis_title=x_title, yaxis2={"title": "tokens/s", "overlaying": "y", "side": "right",
                                                   "rangemode": "tozero"})
    _knee_line(fig, knee)
    return _layout(fig, "Throughput against load", "requests/s", "finished requests and tokens over each step's wall "
                   "time", height, legend_y=-0.3)
