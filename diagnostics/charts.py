"""Plotly figures for a finding's evidence. Pure: Chart in, go.Figure out; the page and the HTML report share them."""
from __future__ import annotations

import html

from diagnostics.findings import Chart


def figure(chart: Chart, height: int = 260, template: str | None = None):
    """`template` None leaves the look to the host (Streamlit applies its theme); the HTML report passes one."""
    import plotly.graph_objects as go  # lazy: the checks and the CLI's JSON output need no plotly

    from core.charts import LINE_COLOURS  # the console's colours, so a series looks the same on every page

    fig = go.Figure()
    # Plotly renders a few HTML tags in text, so names that may come from outside (GPU names) are escaped.
    for i, s in enumerate(chart.series):
        dashed = s.source == "least squares"
        fig.add_trace(go.Scatter(
            x=list(s.t), y=list(s.v), name=html.escape(f"{s.name} ({s.source})"), mode="lines",
            connectgaps=False,
            line={"color": LINE_COLOURS[i % len(LINE_COLOURS)], "dash": "dash" if dashed else "solid"}))
    for y, label in chart.thresholds:
        fig.add_hline(y=y, line={"color": "#d62728", "dash": "dot", "width": 1},
                      annotation_text=html.escape(label), annotation_position="top left")
    fig.update_layout(title=html.escape(chart.title), height=height, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.3})
    if template:
        fig.update_layout(template=template)
    fig.update_xaxes(title="seconds since the window started")
    fig.update_yaxes(title=html.escape(chart.y_title), range=list(chart.y_range) if chart.y_range else None)
    return fig
