"""The Live monitor's figures, chosen to be cheap to redraw every second in every open tab. Pure: data in, text or
specs out; no Streamlit.

Gauges are inline SVG, a few hundred bytes each: a Plotly gauge cost ~3 ms to build and serialize per tab per second
on the server and a full chart remount in the browser. Trends are Vega-Lite specs that stay the same from one
refresh to the next, so the browser swaps the data in place; a Plotly figure whose data changes is remounted whole.
"""
from __future__ import annotations

import html
import math
from typing import Sequence

import pandas as pd

from core.charts import LINE_COLOURS

# Band colours, translucent so the gauge's bar stays readable on dark and light themes.
OK = "rgba(118, 185, 0, 0.28)"  # NVIDIA green
WARN = "rgba(255, 176, 32, 0.35)"
BAD = "rgba(230, 70, 60, 0.40)"
NEUTRAL = "rgba(128, 128, 128, 0.15)"
BAR = "#76b900"

Band = tuple[float, float, str]  # (from, to, colour)


def util_bands(idle_below: float) -> tuple[Band, ...]:
    """GPU util: below the checklist's idle threshold is the warning zone (host-side stall if requests run)."""
    return ((0.0, idle_below, WARN), (idle_below, 100.0, OK))


def bandwidth_bands(likely_above: float, bound_above: float) -> tuple[Band, ...]:
    """DRAM BW util: above `likely_above` is "likely memory bound", above `bound_above` memory bound."""
    return ((0.0, likely_above, NEUTRAL), (likely_above, bound_above, WARN), (bound_above, 100.0, BAD))


def bar_colour(value: float | None, bands: Sequence[Band]) -> str:
    """The bar takes the (opaque) colour of the band it ends in, so the zone reads at a glance."""
    if value is None:
        return "transparent"
    for lo, hi, colour in bands:
        if lo <= value <= hi and colour != NEUTRAL:
            return colour.rsplit(",", 1)[0].replace("rgba", "rgb") + ")"
    return BAR


# Half-dial geometry in the SVG's own units: centre, radius, ring width.
_CX, _CY, _R, _RING = 100.0, 100.0, 78.0, 20.0


def _point(fraction: float) -> tuple[float, float]:
    angle = math.pi * (1.0 - fraction)  # 0 at the left end of the dial, 1 at the right
    return _CX + _R * math.cos(angle), _CY - _R * math.sin(angle)


def _arc(lo: float, hi: float, colour: str, width: float) -> str:
    (x0, y0), (x1, y1) = _point(lo), _point(hi)
    return (f'<path d="M{x0:.1f} {y0:.1f} A{_R:.0f} {_R:.0f} 0 0 1 {x1:.1f} {y1:.1f}" fill="none" '
            f'stroke="{colour}" stroke-width="{width:.0f}"/>')


def gauge(value: float | None, title: str, *, source: str = "", max_value: float = 100.0, suffix: str = "%",
          bands: Sequence[Band] = (), na_reason: str = "") -> str:
    """A half-dial gauge as an HTML block. `source` is named under the title (every number says where it came
    from). A None value draws an empty dial with "N/A"; hovering it shows `na_reason`."""
    scale = max_value if max_value > 0 else 1.0
    frac = None if value is None else min(1.0, max(0.0, value / scale))
    parts = [_arc(0.0, 1.0, NEUTRAL, _RING)]
    parts += [_arc(lo / scale, min(hi, scale) / scale, colour, _RING) for lo, hi, colour in bands if lo < scale]
    if frac:
        parts.append(_arc(0.0, frac, bar_colour(value, bands), _RING * 0.45))
    if value is None:
        text = "N/A"
        tip = f"<title>{html.escape(na_reason or 'not available')}</title>"
    else:
        text = f"{value:.0f}{suffix}" if suffix == "%" else f"{value:.1f}{suffix}"
        tip = ""
    colour = "gray" if value is None else "currentColor"
    parts.append(f'<text x="{_CX:.0f}" y="{_CY - 6:.0f}" text-anchor="middle" font-size="26" fill="{colour}">'
                 f"{tip}{html.escape(text)}</text>")
    parts.append(f'<text x="{_CX - _R:.0f}" y="{_CY + 16:.0f}" text-anchor="middle" font-size="11" '
                 f'fill="gray">0</text><text x="{_CX + _R:.0f}" y="{_CY + 16:.0f}" text-anchor="middle" '
                 f'font-size="11" fill="gray">{max_value:.0f}</text>')
    svg = (f'<svg viewBox="0 0 200 120" width="100%" style="max-width:260px;display:block;margin:auto" role="img" '
           f'aria-label="{html.escape(title)}: {html.escape(text)}">{"".join(parts)}</svg>')
    head = f'<div style="text-align:center;font-size:15px">{html.escape(title)}</div>'
    if source:
        head += f'<div style="text-align:center;font-size:11px;color:gray">{html.escape(source)}</div>'
    return f'<div data-gauge="{html.escape(title)}" style="flex:1;min-width:150px">{head}{svg}</div>'


def gauge_row(gauges: Sequence[str]) -> str:
    """Gauges side by side, wrapping on narrow screens."""
    return f'<div style="display:flex;flex-wrap:wrap;gap:12px">{"".join(gauges)}</div>'


TIME_FORMAT = "%H:%M:%S"  # 24-hour: Vega-Lite's default ticks are 12-hour without AM/PM ("03:15" for 15:15)


def trend_spec(title: str, labels: Sequence[str], *, y_title: str, y_range: tuple[float, float] | None = None,
               hlines: Sequence[tuple[float, str]] = (), height: int = 260,
               bands: Sequence[tuple[float, float, str]] = (), marker: float | None = None,
               elapsed: bool = False) -> dict:
    """Vega-Lite spec for lines over time, drawn from a frame with columns time, series, value (see trend_frame).
    The spec depends only on what is drawn, never on the data, so the browser keeps the chart between refreshes.
    `hlines` are (y, label) threshold lines, dotted. For a recording, `elapsed`: time is seconds into the recording
    (see elapsed_frame; a clock time would be read as the viewer's own), `bands` (start, end, label) in those seconds
    shade what ran when, and `marker` is the moment the gauges show."""
    y = {"field": "value", "type": "quantitative", "title": y_title}
    if y_range:
        y["scale"] = {"domain": list(y_range)}
    colours = [LINE_COLOURS[i % len(LINE_COLOURS)] for i in range(len(labels))]
    if elapsed:
        x = {"field": "time", "type": "quantitative", "title": "seconds into the recording",
             "scale": {"nice": False, "zero": False}}
        when = {"field": "time", "type": "quantitative", "title": "s", "format": ".0f"}
    else:
        x = {"field": "time", "type": "temporal", "title": None, "axis": {"format": TIME_FORMAT}}
        when = {"field": "time", "type": "temporal", "format": TIME_FORMAT}
    layers: list[dict] = []
    if bands:  # every layer's x is the line's: the layers share one axis, which takes the first layer's settings
        shaded = [{"time": a, "end": b, "label": label} for a, b, label in bands]
        layers.append({"data": {"values": shaded}, "mark": {"type": "rect", "color": "#76b900", "opacity": 0.10},
                       "encoding": {"x": x, "x2": {"field": "end"}}})
        layers.append({"data": {"values": shaded},
                       "mark": {"type": "text", "align": "left", "baseline": "top", "dx": 3, "dy": 3,
                                "color": "gray", "fontSize": 10},
                       "encoding": {"x": x, "y": {"value": 0}, "text": {"field": "label"}}})
    layers.append({
        # invalid: null breaks a line at a missing reading instead of joining across the gap.
        "mark": {"type": "line", "strokeWidth": 1.6, "invalid": None},
        "encoding": {"x": x,
                     "y": y,
                     "color": {"field": "series", "type": "nominal", "title": None,
                               "scale": {"domain": list(labels), "range": colours},
                               "legend": {"orient": "top", "labelLimit": 260,
                                          "columns": min(4, max(1, len(labels)))}},
                     "tooltip": [{"field": "series", "type": "nominal"},
                                 {"field": "value", "type": "quantitative", "format": ".1f"}, when]}})
    if marker is not None:
        layers.append({"data": {"values": [{"time": marker}]}, "mark": {"type": "rule", "color": "#e6463c"},
                       "encoding": {"x": x}})
    if hlines:
        rules = [{"y": v, "label": label} for v, label in hlines]
        layers.append({"data": {"values": rules}, "mark": {"type": "rule", "strokeDash": [2, 3], "color": "gray"},
                       "encoding": {"y": {"field": "y", "type": "quantitative"}}})
        layers.append({"data": {"values": rules},
                       "mark": {"type": "text", "align": "left", "baseline": "bottom", "dx": 3, "dy": -2,
                                "color": "gray", "fontSize": 10},
                       "encoding": {"y": {"field": "y", "type": "quantitative"}, "x": {"value": 0},
                                    "text": {"field": "label"}}})
    return {"title": title, "height": height, "layer": layers}


def trend_frame(t: Sequence[float], series: dict[str, Sequence[float | None]], scale: float = 1.0) -> pd.DataFrame:
    """Long-form data for trend_spec: one row per (time, series). `t` is Unix seconds; None values stay missing;
    `scale` divides every value (bytes to GiB, say)."""
    time = pd.to_datetime(pd.Series(t, dtype="float64"), unit="s")
    frames = [pd.DataFrame({"time": time, "series": label,
                            "value": pd.Series(values, dtype="float64") / scale})
              for label, values in series.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["time", "series", "value"])


def elapsed_frame(frame: pd.DataFrame, start: float) -> pd.DataFrame:
    """A trend_frame with its time as seconds since `start` (Unix seconds), for trend_spec(elapsed=True)."""
    out = frame.copy()
    out["time"] = (out["time"] - pd.Timestamp(start, unit="s")).dt.total_seconds()
    return out


def gpu_table(rows: Sequence[dict]) -> str:
    """Every GPU in a compact row, nvitop-style. Each row: "gpu" (its label), "lost" (a reason or ""), and "cells":
    (text, fraction for a bar or None, hover text) per column of GPU_TABLE_COLUMNS. Escapes everything it is given."""
    head = "".join(f'<th style="text-align:left;padding:2px 8px;font-weight:600">{html.escape(c)}</th>'
                   for c in ("GPU",) + GPU_TABLE_COLUMNS)
    body = []
    for row in rows:
        cells = [f'<td style="padding:2px 8px;white-space:nowrap">{html.escape(row["gpu"])}</td>']
        if row["lost"]:
            cells.append(f'<td colspan="{len(GPU_TABLE_COLUMNS)}" style="padding:2px 8px;color:rgb(230,70,60)">'
                         f'{html.escape(row["lost"])}</td>')
        for text, frac, tip in ([] if row["lost"] else row["cells"]):
            bar = ("" if frac is None else
                   f'<div style="height:3px;width:{100 * min(1.0, max(0.0, frac)):.0f}%;background:{BAR}"></div>')
            title = f' title="{html.escape(tip)}"' if tip else ""
            colour = "color:gray;" if text == "N/A" else ""
            cells.append(f'<td style="padding:2px 8px;white-space:nowrap;{colour}"{title}>{html.escape(text)}{bar}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<table data-gpu-table style="border-collapse:collapse;font-size:14px;width:100%">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


GPU_TABLE_COLUMNS = ("util", "DRAM BW", "memory", "power", "SM clock", "temp", "throttle reasons", "processes")
