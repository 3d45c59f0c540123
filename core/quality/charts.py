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
    # labels at the decades only: the default also labels 2x and 5x, a row of bare 2s and 5s between them
    fig.update_yaxes(type="log", title="KLD (nats)", dtick=1, exponentformat="power")
    return fig


def layer_heatmap(result: dict, height: int | None = None) -> go.Figure:
    """Layer x quantizer, the relative output error in % (log colour scale: per-tensor INT8 and INT4 sit decades
    above FP8 and per-channel INT8)."""
    import math

    layers = result["layers"]
    qs = result["quantizers"]
    z = [[math.log10(max(100 * r["errors"][q], 1e-4)) for q in qs] for r in layers]
    text = [[f"{100 * r['errors'][q]:.3g}%" for q in qs] for r in layers]
    fig = go.Figure(go.Heatmap(z=z, x=qs, y=[r["layer"] for r in layers], text=text, colorscale="Viridis",
                               hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>",
                               colorbar={"title": "log10 err %"}))
    fig.update_layout(height=height or max(360, 9 * len(layers)), margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title={"text": "Relative output error per linear layer (%, log colour)", "font": {"size": 14}})
    fig.update_yaxes(autorange="reversed", tickfont={"size": 9})
    return fig


def activation_histograms(result: dict, by: str = "int4", worst: int = 3, height: int = 300) -> go.Figure:
    """Histograms of log10|x| of the inputs of the `worst` layers by the `by` quantizer's error."""
    fig = go.Figure()
    for r in sorted(result["layers"], key=lambda r: -r["errors"][by])[:worst]:
        h = r["hist_log10_abs"]
        n = len(h["counts"])
        width = (h["max"] - h["min"]) / n
        fig.add_bar(x=[h["min"] + (i + 0.5) * width for i in range(n)], y=h["counts"], name=r["layer"], opacity=0.6)
    fig.update_layout(barmode="overlay", height=height, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title={"text": f"Input activations of the worst layers by {by} error", "font": {"size": 14}})
    fig.update_xaxes(title="log10 |x|")
    fig.update_yaxes(type="log", title="count")
    return fig
