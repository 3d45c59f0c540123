"""One finding as a card, and one card for checks skipped for the same reason: shared by Diagnostics and Fleet."""
from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from diagnostics.charts import figure
from diagnostics.findings import Status
from diagnostics.report import STATUS_ICONS, SkipGroup, evidence_rows, markdown_safe, remedy_markdown

BADGE_COLOURS = {Status.FAIL: "red", Status.ERROR: "violet", Status.WARN: "orange", Status.PASS: "green",
                 Status.SKIP: "gray"}


def card(f, key_prefix: str = "chart", t0: dt.datetime | None = None) -> None:
    """`t0`: the window's wall-clock start, so the charts' time axis reads as a 24-hour clock."""
    with st.container(border=True):
        head = st.columns([5, 1])
        head[0].markdown(f"**{markdown_safe(f.title)}** · `{f.check_id}`")
        head[1].badge(f"{STATUS_ICONS[f.status]} {f.status.value}", color=BADGE_COLOURS[f.status])
        st.markdown(markdown_safe(f.verdict))
        if f.remedy:
            st.markdown(remedy_markdown(f.remedy))
        if f.status is Status.SKIP:
            return
        for i, chart in enumerate(f.charts):
            st.plotly_chart(figure(chart, t0=t0), key=f"{key_prefix}-{f.check_id}-{i}",
                            config={"displayModeBar": False})
        rows = evidence_rows(f)
        if rows:
            with st.expander(f"Evidence ({len(rows)})"):  # a static table: long values wrap instead of being cut
                what = pd.Index([k for k, _ in rows], name="what")
                st.table(pd.DataFrame({"value": [v for _, v in rows]}, index=what))
        st.caption(f"Looks at: {markdown_safe(f.hint)} · severity {f.severity.label}")


def skip_group_card(g: SkipGroup) -> None:
    """Several checks skipped for one reason, in one line ("7 GPU checks skipped: no NVIDIA driver here"); the rest
    of the reason, its remedy and which checks they were open under it, so a CPU host's page is not a wall of SKIPs."""
    with st.container(border=True):
        head = st.columns([5, 1], vertical_alignment="center")
        head[0].markdown(f"**{markdown_safe(g.title)}**")
        head[1].badge(f"{STATUS_ICONS[Status.SKIP]} {len(g.findings)} SKIP", color=BADGE_COLOURS[Status.SKIP])
        with st.expander("Why, what to do, and which checks"):
            st.markdown(markdown_safe(g.detail))
            if g.remedy:
                st.markdown(remedy_markdown(g.remedy))
            st.caption("Not decided: " + " · ".join(f"{markdown_safe(f.title)} (`{f.check_id}`)" for f in g.findings))
