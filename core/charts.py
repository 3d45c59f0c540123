"""Plotly figure builders. Pure: data in, go.Figure out; no Streamlit, no I/O. One small function per chart kind,
so other pages add their own builders beside these."""
from __future__ import annotations

import textwrap
from datetime import datetime
from typing import Sequence

import plotly.graph_objects as go

# Band colours, translucent so the gauge's bar stays readable on dark and light themes.
OK = "rgba(118, 185, 0, 0.28)"  # NVIDIA green
WARN = "rgba(255, 176, 32, 0.35)"
BAD = "rgba(230, 70, 60, 0.40)"
NEUTRAL = "rgba(128, 128, 128, 0.15)"
BAR = "#76b900"
LINE_COLOURS = ("#76b900", "#4aa3ff", "#ffb020", "#c678dd", "#e6463c", "#56d4c8")

Band = tuple[float, float, str]  # (from, to, colour)


def util_bands(idle_below: float) -> tuple[Band, ...]:
    """GPU util: below the checklist's idle threshold is the warning zone (host-side stall if requests run)."""
    return ((0.0, idle_below, WARN), (idle_below, 100.0, OK))


def bandwidth_bands(likely_above: float, bound_above: float) -> tuple[Band, ...]:
    """DRAM BW util: above `likely_above` is "likely memory bound", above `bound_above` memory bound."""
    return ((0.0, likely_above, NEUTRAL), (likely_above, bound_above, WARN), (bound_above, 100.0, BAD))


def gauge(value: float | None, title: str, *, source: str = "", max_value: float = 100.0, suffix: str = "%",
          bands: Sequence[Band] = (), na_reason: str = "", height: int = 210) -> go.Figure:
    """A half-dial gauge. `source` is named under the title (every number says where it came from). A None value
    draws an empty dial with "N/A"; hovering "N/A" shows `na_reason`."""
    subtitle = f"<br><span style='font-size:0.72em;color:gray'>{source}</span>" if source else ""
    # Figures are built from plain dicts in one call: the page rebuilds them every second per open tab, and
    # add_annotation/update_layout validate again on every call (measured 10.7 ms a gauge that way).
    indicator = {
        "type": "indicator",
        "mode": "gauge+number" if value is not None else "gauge",
        "value": value if value is not None else 0.0,
        "number": {"suffix": suffix, "valueformat": ".0f" if suffix == "%" else ".1f"},
        "title": {"text": title + subtitle, "font": {"size": 15}},
        "gauge": {
            "axis": {"range": [0, max_value], "tickwidth": 1},
            "bar": {"color": _bar_colour(value, bands), "thickness": 0.35},
            "steps": [{"range": [lo, hi], "color": colour} for lo, hi, colour in bands],
            "borderwidth": 0,
        },
    }
    layout: dict = {"height": height, "margin": {"l": 28, "r": 28, "t": 62, "b": 8}}
    if value is None:
        # Plotly does not wrap hover text; a long reason would run off the figure.
        reason = "<br>".join(textwrap.wrap(na_reason or "not available", 46))
        layout["annotations"] = [{"text": "N/A", "hovertext": reason, "x": 0.5, "y": 0.12, "xref": "paper",
                                  "yref": "paper", "showarrow": False, "font": {"size": 30, "color": "gray"}}]
    return go.Figure(data=[indicator], layout=layout)


def _bar_colour(value: float | None, bands: Sequence[Band]) -> str:
    """The bar takes the (opaque) colour of the band it ends in, so the zone reads at a glance."""
    if value is None:
        return "rgba(0,0,0,0)"
    for lo, hi, colour in bands:
        if lo <= value <= hi and colour != NEUTRAL:
            return colour.rsplit(",", 1)[0].replace("rgba", "rgb") + ")"
    return BAR


def timeseries(t: Sequence[float], series: dict[str, Sequence[float | None]], *, title: str, y_title: str,
               y_range: tuple[float, float] | None = None, hlines: Sequence[tuple[float, str]] = (),
               height: int = 260) -> go.Figure:
    """Lines over time. `t` is Unix seconds (shown in the server's local time); `series` maps a legend label to
    values (None = gap); `hlines` are (y, label) threshold lines, drawn dotted."""
    # ISO strings, not datetime objects: plotly validates and serialises datetimes ~6x slower (78 vs 13 ms for
    # four 600-point lines), and this runs every second for every open tab.
    x = [datetime.fromtimestamp(v).isoformat(timespec="milliseconds") for v in t]
    data = [{"type": "scatter", "x": x, "y": list(ys), "name": label, "mode": "lines", "connectgaps": False,
             "line": {"width": 1.6, "color": LINE_COLOURS[i % len(LINE_COLOURS)]}}
            for i, (label, ys) in enumerate(series.items())]
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
               "line": {"dash": "dot", "width": 1, "color": "gray"}} for y, _ in hlines]
    notes = [{"xref": "paper", "x": 0, "yref": "y", "y": y, "text": label, "showarrow": False, "xanchor": "left",
              "yanchor": "bottom", "font": {"size": 10, "color": "gray"}} for y, label in hlines]
    layout = {"title": {"text": title, "font": {"size": 14}}, "height": height, "hovermode": "x unified",
              "margin": {"l": 8, "r": 8, "t": 40, "b": 8}, "shapes": shapes, "annotations": notes,
              "legend": {"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
              "xaxis": {"type": "date"}, "yaxis": {"title": {"text": y_title}}}
    if y_range:
        layout["yaxis"]["range"] = list(y_range)
    return go.Figure(data=data, layout=layout)
