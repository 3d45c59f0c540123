"""Plotly figures for the Quality page. Pure: a quality result in, go.Figure out."""
from __future__ import annotations

import plotly.graph_objects as go

FLOOR = 1e-6  # KLD of exactly 0 (the identity) drawn at this floor on the log axis


def kld_distribution(result: dict, height: int = 360) -> go.Figure:
    """Per candidate, the distribution of per-position KL(reference || candidate) as a box with every point, on a
    log axis (the tail is what breaks a model: p99.9 and max sit far above the median)."""
    fig = go.Figure()
    for r in result["rows"]:
        vals = r.get("kld_values")
        if not vals:
            continue
        fig.add_box(y=[max(v, FLOOR) for v in vals], name=r["name"], boxpoints="suspectedoutliers",
                    hovertemplate="%{y:.4g} nats<extra>" + r["name"] + "</extra>")
    fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": 30, "b": 10}, showlegend=False,
                      title={"text": "KL(reference || candidate) per position, nats (log scale)", "font": {"size": 14}})
    fig.update_yaxes(type="log", title="KLD (nats)")
    return fig
