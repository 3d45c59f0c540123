"""Figures for a finding's evidence. Pure: Chart in, figure (or SVG text) out.

`figure` builds the Plotly figure the pages draw. `svg` draws the same chart as a small inline SVG for the HTML
report: no charting library in the file, so a report is a few kB per chart and opens offline anywhere.

Time axes read as a 24-hour clock (HH:MM:SS) wherever the start of the window is known, else as seconds since it
started: a screenshot or a report is then read the same way in every locale.
"""
from __future__ import annotations

import datetime as dt
import html
import math

from diagnostics.findings import Chart

CLOCK = "%H:%M:%S"


def window_start(started_at: str | None) -> dt.datetime | None:
    """The wall-clock start of a run from its ISO 8601 started_at, in the recording host's own time (its offset kept
    in the axis title); None when the text is not a timestamp (an old or hand-made payload)."""
    try:
        return dt.datetime.fromisoformat(str(started_at))
    except (TypeError, ValueError):
        return None


def axis_title(t0: dt.datetime | None) -> str:
    if t0 is None:
        return "seconds since the window started"
    offset = t0.strftime("%z")
    zone = f" (UTC{offset[:3]}:{offset[3:]})" if offset else ""
    return f"time{zone}"


def figure(chart: Chart, height: int = 260, template: str | None = None, t0: dt.datetime | None = None):
    """`template` None leaves the look to the host (Streamlit applies its theme). `t0`, the window's wall-clock
    start, turns the x axis into a 24-hour clock."""
    import plotly.graph_objects as go  # lazy: the checks and the CLI's JSON output need no plotly

    from core.charts import LINE_COLOURS  # the console's colours, so a series looks the same on every page

    fig = go.Figure()
    # Plotly renders a few HTML tags in text, so names that may come from outside (GPU names) are escaped.
    for i, s in enumerate(chart.series):
        dashed = s.source == "least squares"
        x = list(s.t) if t0 is None else [t0.replace(tzinfo=None) + dt.timedelta(seconds=t) for t in s.t]
        fig.add_trace(go.Scatter(
            x=x, y=list(s.v), name=html.escape(f"{s.name} ({s.source})"), mode="lines",
            connectgaps=False,
            line={"color": LINE_COLOURS[i % len(LINE_COLOURS)], "dash": "dash" if dashed else "solid"}))
    for i, (y, label) in enumerate(chart.thresholds):
        # Alternate sides: thresholds a few percent apart (89% copy, 85% bound) would print over each other.
        fig.add_hline(y=y, line={"color": "#d62728", "dash": "dot", "width": 1},
                      annotation_text=html.escape(label), annotation_position=("top left", "top right")[i % 2])
    fig.update_layout(title=html.escape(chart.title), height=height, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.38})  # below the x axis title
    if template:
        fig.update_layout(template=template)
    fig.update_xaxes(title=axis_title(t0))
    if t0 is not None:
        # Ticks closer than a second apart (a 5 s window) carry milliseconds, or neighbours would read the same.
        fig.update_xaxes(type="date", hoverformat=CLOCK + ".%L",
                         tickformatstops=[{"dtickrange": [None, 1000], "value": CLOCK + ".%L"},
                                          {"dtickrange": [1000, None], "value": CLOCK}])
    fig.update_yaxes(title=html.escape(chart.y_title), range=list(chart.y_range) if chart.y_range else None)
    return fig


# --- inline SVG for the HTML report ----------------------------------------------------------------------------------

W, H = 760, 250
PAD_L, PAD_R, PAD_T, PAD_B = 78, 16, 30, 58


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round numbers spanning [lo, hi] (1, 2, 2.5, 5 x 10^k steps)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float, step: float = 1.0) -> str:
    """A tick label with as many decimals as the tick step needs (124.25 and 124.30 stay apart)."""
    a = abs(v)
    if a >= 1e6 or (0 < a < 1e-3):
        return f"{v:.3g}"
    decimals = 0
    while decimals < 6 and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:  # 0.25 needs 2
        decimals += 1
    return f"{v:,.{decimals}f}"


def _decimate(points: list[tuple[float, float]], px: float = 2.0) -> list[tuple[float, float]]:
    """At most the lowest and highest point (in time order) per `px` of width: what the eye sees at this size, spikes
    kept, so 8 GPUs x 180 s x 10 Hz stays a small file."""
    out: list[tuple[float, float]] = []
    bucket: list[tuple[float, float]] = []
    col = None
    for p in points + [(math.inf, 0.0)]:
        c = math.floor(p[0] / px) if math.isfinite(p[0]) else None
        if bucket and c != col:
            lo, hi = min(bucket, key=lambda q: q[1]), max(bucket, key=lambda q: q[1])
            out += sorted({bucket[0], lo, hi, bucket[-1]} if len(bucket) > 2 else set(bucket), key=bucket.index)
            bucket = []
        col = c
        bucket.append(p)
    return out


def svg(chart: Chart, t0: dt.datetime | None = None) -> str:
    """The chart as one <svg> element: lines, the thresholds the verdict used (dotted red), axes with round ticks
    (x on a 24-hour clock where `t0` is known) and a legend. Every text in it is escaped (names come from outside)."""
    from core.charts import LINE_COLOURS

    e = lambda text: html.escape(str(text), quote=True)  # noqa: E731
    pts = [[(t, v) for t, v in zip(s.t, s.v) if v is not None and math.isfinite(v)] for s in chart.series]
    xs = [t for p in pts for t, _ in p]
    ys = [v for p in pts for _, v in p] + [y for y, _ in chart.thresholds]
    if not xs:
        return f'<p class="hint">{e(chart.title)}: no readings to draw.</p>'
    x0, x1 = min(xs), max(xs)
    y0, y1 = chart.y_range if chart.y_range else (min(ys), max(ys))
    if y1 <= y0:
        y0, y1 = y0 - 1, y1 + 1
    if not chart.y_range:
        y0, y1 = y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0)
    x1 = x1 if x1 > x0 else x0 + 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    sx = lambda t: PAD_L + (t - x0) / (x1 - x0) * pw  # noqa: E731
    sy = lambda v: PAD_T + (1 - (v - y0) / (y1 - y0)) * ph  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
           f'aria-label="{e(chart.title)}" class="chart" font-family="system-ui,sans-serif" font-size="11">',
           f'<text x="{PAD_L}" y="16" font-size="13" font-weight="600">{e(chart.title)}</text>']
    yticks = _nice_ticks(y0, y1)
    ystep = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    for v in yticks:
        y = sy(v)
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{e(_fmt(v, ystep))}</text>')
    xticks = _nice_ticks(x0, x1, 6)
    sub_second = len(xticks) > 1 and xticks[1] - xticks[0] < 1  # a 5 s window: milliseconds tell the ticks apart
    for t in xticks:
        x = sx(t)
        clock = (t0 + dt.timedelta(seconds=t)) if t0 is not None else None
        label = _fmt(t, xticks[1] - xticks[0] if len(xticks) > 1 else 1.0) if clock is None else clock.strftime(CLOCK) + (f".{clock.microsecond // 1000:03d}"
                                                                       if sub_second else "")
        anchor = "end" if x > W - PAD_R - 30 else "middle"  # the last label must not run off the right edge
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T + ph}" y2="{PAD_T + ph + 4}" stroke="#999"/>'
                   f'<text x="{x:.1f}" y="{PAD_T + ph + 16}" text-anchor="{anchor}" fill="#555">{e(label)}</text>')
    out.append(f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>')
    out.append(f'<text x="{PAD_L + pw / 2:.0f}" y="{H - 26}" text-anchor="middle" fill="#555">{e(axis_title(t0))}'
               "</text>")
    out.append(f'<text transform="translate(12 {PAD_T + ph / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'fill="#555">{e(chart.y_title)}</text>')
    for i, (y, label) in enumerate(chart.thresholds):
        if y0 <= y <= y1:
            x, anchor = (PAD_L + 4, "start") if i % 2 == 0 else (W - PAD_R - 4, "end")  # alternate, as on the page
            out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#d62728" '
                       f'stroke-dasharray="2 3"/><text x="{x}" y="{sy(y) - 3:.1f}" text-anchor="{anchor}" '
                       f'fill="#d62728">{e(label)}</text>')
    legend_x = PAD_L
    for i, (s, p) in enumerate(zip(chart.series, pts)):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        dash = ' stroke-dasharray="6 4"' if s.source == "least squares" else ""
        # A missed reading (None) breaks the line, as connectgaps=False does on the page.
        runs, cur = [], []
        for t, v in zip(s.t, s.v):
            if v is None or not math.isfinite(v):
                if cur:
                    runs.append(cur)
                cur = []
            else:
                cur.append((sx(t), sy(v)))
        if cur:
            runs.append(cur)
        for r in runs:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in _decimate(r))
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash} points="{points}"/>')
        name = f"{s.name} ({s.source})"
        out.append(f'<line x1="{legend_x}" x2="{legend_x + 18}" y1="{H - 8}" y2="{H - 8}" stroke="{colour}" '
                   f'stroke-width="2"{dash}/><text x="{legend_x + 22}" y="{H - 4}" fill="#333">{e(name)}</text>')
        legend_x += 30 + 6.2 * len(name)
    out.append("</svg>")
    return "".join(out)
