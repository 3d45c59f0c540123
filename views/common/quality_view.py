"""A quality run drawn the same way wherever it is shown: on the Quality page after it ran, and in History when a
saved run is reopened. Input is the run's result dict (core.quality.run.run) or its saved payload
(core.quality.history: the same keys, plus params); a run cut short or saved by an older version shows what it has."""
from __future__ import annotations

import streamlit as st

from core.fmt import markdown_literal
from core.quality import charts, render
from core.quality.verdict import THRESHOLDS_TEXT

NOBAR = {"displayModeBar": False}
_num = st.column_config.NumberColumn
# Fixed widths for the numbers, the rest of the row to the precision name: the eleven columns fit a laptop's width.
COLUMNS = {
    "precision": st.column_config.TextColumn(width=105, pinned=True),
    "verdict": st.column_config.TextColumn(width=80, help="Against the reference: " + THRESHOLDS_TEXT),
    "PPL": _num(format="%.3f", width=65, help="Perplexity over the scored positions"),
    "KLD mean": _num(format="%.4f", width=75, help="Mean KL(reference || candidate), nats"),
    "KLD p99": _num(format="%.3f", width=70, help="99th percentile of the per-position KLD, nats"),
    "KLD max": _num(format="%.3f", width=70, help="Largest per-position KLD, nats"),
    "same top %": _num(format="%.2f", width=85, help="Share of positions where both pick the same top token; the "
                                                     "95% interval is in the full table below"),
    "RMS Δp %": _num(format="%.3f", width=80, help="Root mean square change of the correct token's probability"),
    "weights": st.column_config.TextColumn(width=85, help="The weights as this precision stores them"),
}
TIMING_COLUMNS = {
    "peak memory": st.column_config.TextColumn(help="On a GPU the CUDA allocator's peak, on the CPU what the "
                                                    "process's resident memory grew by during this precision"),
    "prefill tok/s": _num(format="%,.0f", help="Tokens per second through the windows (prompt pass), one pass"),
    "decode tok/s": _num(format="%,.1f", help="Greedy decode speed after the document's start, one run"),
    "forward (s)": _num(format="%.1f", help="Seconds in the model's forward passes over the windows"),
}
VERDICT = {"fine": ":green-badge[fine]", "degraded": ":orange-badge[degraded]", "broken": ":red-badge[broken]"}


def verdicts(result: dict) -> None:
    """One line per candidate: fine / degraded / broken, and the numbers and thresholds behind it."""
    rows = render.verdict_rows(result)
    if not rows:
        return
    st.markdown("**Verdict**  \n" + "  \n".join(
        f"{VERDICT.get(r['verdict'], r['verdict'])} **{markdown_literal(r['precision'])}**: "
        f"{markdown_literal(r['why'])}" for r in rows), help=render.VERDICT_HELP)


def show(result: dict, key: str) -> None:
    """The quality table, what it rests on, the full columns and what ran, the KLD distribution and the positions
    where candidates differ most. `key` prefixes every widget key."""
    rows = result.get("rows") or []
    if not rows:
        st.info("No precision finished in this run, so there is no table to show.")
        return
    verdicts(result)
    st.dataframe(render.compact_rows(result), hide_index=True, key=f"{key}_table", column_config=COLUMNS,
                 placeholder="n/a")
    st.caption(markdown_literal(" · ".join(render.notes(result))))
    with st.expander("Host timings and peak memory: not comparable across rows"):
        st.caption(render.TIMINGS_CAPTION)
        st.dataframe(render.timing_rows(result), hide_index=True, key=f"{key}_timings", column_config=TIMING_COLUMNS,
                     placeholder="n/a")
    with st.expander("All columns and what ran: median and p99.9 KLD, 95% intervals, kernels"):
        st.dataframe(render.table_rows(result), hide_index=True, key=f"{key}_full")
        ran = [f"**{markdown_literal(r['name'])}**: {markdown_literal(r['ran'])}" for r in rows if r.get("ran")]
        if ran:
            st.markdown("  \n".join(ran))
    if any(r.get("kld_values") for r in rows):
        st.plotly_chart(charts.kld_distribution(result), key=f"{key}_kld_chart", config=NOBAR)
    worst = render.worst_rows(result)
    if worst:
        st.subheader("Where the candidates differ most")
        st.caption("Positions with the largest KLD per candidate: the text before it, the document's token, and each "
                   "side's top token. Tokens are shown as text (\\n is a newline).")
        st.dataframe(worst, hide_index=True, key=f"{key}_worst")
