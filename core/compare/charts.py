"""Plotly figures for the Precision compare page. Pure: a CompareResult in, go.Figure out.

Hover text is HTML-escaped: plotly interprets a few tags in hover labels, and token text is arbitrary.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from core.compare import agreement as ag
from core.compare.result import CompareResult

KL_COLOUR = "#4aa3ff"
OVERLAP_COLOUR = "#76b900"
MISS_COLOUR = "#ffb020"
# Fainter than the Live monitor's band colours (core/monitor/charts.py): here the bands sit behind bars that must stay readable.
BAND_OK, BAND_WARN, BAND_BAD = "rgba(118,185,0,0.10)", "rgba(255,176,32,0.16)", "rgba(230,70,60,0.12)"


def _tok(res: CompareResult, tok: int | None) -> str:
    return html.escape(repr(res.text_of(tok))[1:-1]) if tok is not None else ""


def position_chart(res: CompareResult, index: int, height: int = 340) -> go.Figure:
    """Per position of the reference continuation: KL(ref || cand) as bars, top-k overlap as a line, positions where
    the candidate's top token differs marked, and the free-running first divergence as a dashed line."""
    p = res.prompts[index]
    x = list(range(len(p.tf.kl)))
    hover = []
    for i in x:
        cand_top = ag.top1(p.cand_tf_topk[i]) if i < len(p.cand_tf_topk) else None
        hover.append(f"position {i}<br>reference token '{_tok(res, p.ref_ids[i])}'<br>"
                     f"candidate top-1 '{_tok(res, cand_top)}'<br>KL {p.tf.kl[i]:.4g} nats<br>"
                     f"top-{res.top_k} overlap {p.tf.topk_overlap[i]:.2f}")
    fig = go.Figure()
    fig.add_bar(x=x, y=p.tf.kl, name="KL(ref || cand), nats", marker_color=KL_COLOUR, hovertext=hover,
                hoverinfo="text")
    fig.add_scatter(x=x, y=p.tf.topk_overlap, name=f"top-{res.top_k} overlap (0-1)", yaxis="y2", mode="lines+markers",
                    line={"color": OVERLAP_COLOUR}, hovertext=hover, hoverinfo="text")
    miss = [i for i in x if not p.tf.top1_agree[i]]
    if miss:
        fig.add_scatter(x=miss, y=[1.08] * len(miss), yaxis="y2", mode="markers", name="different top token",
                        marker={"symbol": "x", "color": MISS_COLOUR, "size": 10}, hovertext=[hover[i] for i in miss],
                        hoverinfo="text")
    div = p.free.first_divergence
    if div is not None and x:
        fig.add_vline(x=div - 0.5, line_dash="dash", line_color="#e63c3c",
                      annotation_text=f"free-running outputs diverge at {div}", annotation_position="top right")
    source = ag.KL_SOURCE_TEXT[p.tf.kl_source].split(" (")[0]
    fig.update_layout(
        title={"text": f"{html.escape(p.name)}: teacher-forced on the reference continuation"
                       f"<br><span style='font-size:0.75em;color:gray'>{source}; measured here</span>"},
        height=height, margin={"l": 50, "r": 50, "t": 70, "b": 40}, bargap=0.15,
        xaxis={"title": "position in the continuation (token)", "tickmode": "linear", "dtick": max(1, len(x) // 16),
               "range": [-0.6, max(len(x), 1) - 0.4]},
        yaxis={"title": "KL (nats)", "rangemode": "tozero"},
        yaxis2={"title": f"top-{res.top_k} overlap", "overlaying": "y", "side": "right", "range": [0, 1.25],
                "tickvals": [0, 0.25, 0.5, 0.75, 1.0], "showgrid": False},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def prompts_chart(res: CompareResult, height: int = 300) -> go.Figure:
    """Same-top-token share per prompt against the seed's bands (which the bands were written for, per the label)."""
    names = [html.escape(p.name) for p in res.prompts]
    same = [100 * sum(p.tf.top1_agree) / len(p.tf.kl) if p.tf.kl else None for p in res.prompts]
    top3 = [100 * p.free.top3_match for p in res.prompts]
    fig = go.Figure()
    for lo, hi, colour in ((0, 100 * ag.BAND_FAILED, BAND_BAD), (100 * ag.BAND_FAILED, 100 * ag.BAND_FINE, BAND_WARN),
                           (100 * ag.BAND_FINE, 101, BAND_OK)):
        fig.add_hrect(y0=lo, y1=hi, fillcolor=colour, line_width=0, layer="below")
    fig.add_bar(x=names, y=same, name="same top token % (teacher-forced)", marker_color=OVERLAP_COLOUR)
    fig.add_bar(x=names, y=top3, name="top-3 token match % (seed)", marker_color=KL_COLOUR)
    fig.update_layout(
        title={"text": "Agreement per prompt<br><span style='font-size:0.75em;color:gray'>bands: the seed's "
                       f"{ag.BAND_FINE:.2f} / {ag.BAND_FAILED:.2f} thresholds for these two metrics</span>"},
        barmode="group", height=height, margin={"l": 50, "r": 20, "t": 70, "b": 40},
        yaxis={"title": "%", "range": [0, 101]}, legend={"orientation": "h", "y": -0.25},
    )
    return fig
