"""Plotly builders for the Long context page. Pure: result dicts in (RunResult.to_dict(), NeedleResult.to_dict()),
go.Figure out. Section titles come from user documents, so they are escaped before plotly renders them as HTML."""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go

COLOURS = ("#76b900", "#4aa3ff", "#ffb020", "#c678dd", "#e6463c")


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, source: str, height: int) -> go.Figure:
    sub = f"<br><span style='font-size:0.75em;color:gray'>{html.escape(source)}</span>" if source else ""
    fig.update_layout(title={"text": html.escape(title) + sub, "font": {"size": 15}}, height=height,
                      margin={"l": 55, "r": 10, "t": 60, "b": 45}, xaxis_title=x_title, yaxis_title=y_title,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def section_tokens(sections: Sequence, top: int = 40, height: int = 300) -> go.Figure:
    """Tokens per section (longdoc.Section), in document order; only the first `top` when there are many."""
    shown = list(sections)[:top]
    # a title cut without a mark reads as whole ("Sample long document (about 25"): cut ones end at a word and "…",
    # and the hover shows the whole title
    labels = [f"{i + 1}. {html.escape(s.title if len(s.title) <= 30 else s.title[:29].rsplit(' ', 1)[0] + '…')}"
              for i, s in enumerate(shown)]
    fig = go.Figure(go.Bar(x=labels, y=[s.tokens for s in shown], marker_color=COLOURS[0],
                           customdata=[f"{i + 1}. {html.escape(s.title)}" for i, s in enumerate(shown)],
                           hovertemplate="%{customdata}<br>%{y} tokens<extra></extra>"))
    more = f"; first {top} of {len(sections)} shown" if len(sections) > top else ""
    fig.update_xaxes(showticklabels=len(shown) <= 20)
    return _layout(fig, "Tokens per section", "section", "tokens", f"the loaded model's tokenizer{more}", height)


def itl_histogram(run: dict, height: int = 300) -> go.Figure:
    """Inter-token latencies of one run in ms, with p50/p90/p99 marked."""
    itl = [1000 * x for x in run["itl_s"]]
    fig = go.Figure(go.Histogram(x=itl, nbinsx=min(40, max(5, len(itl) // 2)), marker_color=COLOURS[1],
                                 name="ITL"))
    # labels alternate sides and heights: p90 and p99 are often a few ms apart and would print over each other
    places = {"p50": ("top left", 1.0), "p90": ("top right", 1.0), "p99": ("top right", 0.88)}
    for i, q in enumerate(("p50", "p90", "p99")):
        v = run.get(f"itl_{q}_ms")
        if v is not None:
            where, y = places[q]
            fig.add_vline(x=v, line_dash="dash", line_color=COLOURS[2 + i], annotation_text=f"{q} {v:,.0f}",
                          annotation_position=where, annotation_y=y)
    return _layout(fig, f"Inter-token latency, {run['prompt_tokens']} prompt tokens", "ms", "tokens",
                   f"{len(itl)} gaps between {run['new_tokens']} new tokens, measured here", height)


def ramp_chart(runs: Sequence[dict], height: int = 320) -> go.Figure:
    """TTFT (left axis) and ITL p50/p90 (right axis) against prompt length."""
    x = [r["prompt_tokens"] for r in runs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[r["ttft_ms"] for r in runs], name="TTFT (ms, left)", mode="lines+markers",
                             line={"color": COLOURS[0]}))
    for i, q in enumerate(("p50", "p90")):
        fig.add_trace(go.Scatter(x=x, y=[r[f"itl_{q}_ms"] for r in runs], name=f"ITL {q} (ms, right)",
                                 mode="lines+markers", yaxis="y2", line={"color": COLOURS[1 + i], "dash": "dot"}))
    # Own ticks and no grid on the right axis: ticks synced to the left one fell on values like 21, 42.1, 63.1.
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "ITL (ms)", "rangemode": "tozero",
                              "tickmode": "auto", "showgrid": False},
                      yaxis={"rangemode": "tozero"})
    return _layout(fig, "TTFT and ITL against prompt length", "prompt tokens", "TTFT (ms)",
                   "one run per length, measured here", height)


def needle_chart(results: Sequence, height: int = 300) -> go.Figure:
    """Mean log-probability per answer token at each needle depth, beside the control without the needle."""
    names = [("no needle (control)" if r["depth"] == "none" else f"needle at {r['depth']}") for r in results]
    means = [r["mean_logprob"] for r in results]
    fig = go.Figure(go.Bar(x=names, y=means, text=[f"{m:.2f}" for m in means],
                           marker_color=[COLOURS[4] if r["depth"] == "none" else COLOURS[0] for r in results]))
    return _layout(fig, "Needle: log-probability of the answer", "", "mean logprob per answer token",
                   "teacher-forced (engine.score); higher is better, 0 is certain", height)


def batch_chart(runs: Sequence[dict], height: int = 300) -> go.Figure:
    x = [str(r["batch"]) for r in runs]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=[r["decode_tok_s"] for r in runs], name="decode tokens/s (after the first token)",
                         marker_color=COLOURS[0]))
    fig.add_trace(go.Bar(x=x, y=[r["throughput_tok_s"] for r in runs], name="new tokens/s incl. prefill",
                         marker_color=COLOURS[1]))
    fig.update_layout(barmode="group")
    fig.update_xaxes(type="category")  # batch sizes are labels: "1", "4", "8", not a numeric scale
    return _layout(fig, "Throughput by batch size", "batch size", "tokens/s (whole batch)", "measured here", height)
