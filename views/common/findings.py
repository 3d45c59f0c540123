"""One finding as a card: shared by the Diagnostics and Fleet pages."""
import streamlit as st

from diagnostics.charts import figure
from diagnostics.findings import Status
from diagnostics.report import STATUS_ICONS, evidence_rows, markdown_safe, remedy_markdown

BADGE_COLOURS = {Status.FAIL: "red", Status.ERROR: "violet", Status.WARN: "orange", Status.PASS: "green",
                 Status.SKIP: "gray"}


def card(f, key_prefix: str = "chart") -> None:
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
            st.plotly_chart(figure(chart), key=f"{key_prefix}-{f.check_id}-{i}", config={"displayModeBar": False})
        rows = evidence_rows(f)
        if rows:
            with st.expander(f"Evidence ({len(rows)})"):
                st.dataframe({"what": [k for k, _ in rows], "value": [v for _, v in rows]}, hide_index=True)
        st.caption(f"Looks at: {markdown_safe(f.hint)} · severity {f.severity.label}")
