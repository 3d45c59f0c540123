"""A Model page generation drawn the same way wherever it is shown: on the Model page after it ran, and in History
when a saved run is reopened. Input is the generation's timing summary (core.engines.base.Generation.timing_summary)
and, for History, the saved payload (views/common/session.py record_generation: prompt, text, timing, setup)."""
from __future__ import annotations

import streamlit as st

from core.fmt import fmt_per_s, fmt_s, markdown_literal


def timing(t: dict) -> None:
    """TTFT, median ITL, decode speed and token counts, with a note when single long gaps skew the speed."""
    cols = st.columns(4)
    cols[0].metric("TTFT", fmt_s(t.get("ttft_s")), help="Request start to first token, measured here (prefill).")
    cols[1].metric("ITL median", fmt_s(t.get("itl_median_s")), help="Median gap between consecutive tokens.")
    cols[2].metric("Decode", fmt_per_s(t.get("decode_tok_s"), "tok"),
                   help="Tokens after the first, divided by their time.")
    cols[3].metric("Tokens", f"{t.get('prompt_tokens', '?')} in / {t.get('new_tokens', '?')} out")
    if t.get("itl_max_s") and t.get("itl_median_s") and t["itl_max_s"] > 2 * t["itl_median_s"]:
        st.caption(f"Decode tok/s counts every gap, the median ITL does not: 10% of the gaps were over "
                   f"{fmt_s(t['itl_p90_s'])} and the longest {fmt_s(t['itl_max_s'])}. Single long gaps are "
                   "usually the host (other work on its CPU), not the model.")


def show(payload: dict, key: str) -> None:
    """A saved generation (History): the setup, the prompt, the text as the page streamed it, its timing."""
    if setup := payload.get("setup_short") or payload.get("setup"):
        st.markdown(f"**{markdown_literal(setup)}**", help=payload.get("engine") or None)
    temp = payload.get("temperature")
    st.caption(f"{payload.get('max_new_tokens', '?')} new tokens asked, temperature "
               f"{'greedy (0)' if not temp else temp}; ended by {payload.get('finish_reason', 'length')}.")
    st.text_area("Prompt", payload.get("prompt", ""), height=100, disabled=True, key=f"{key}_prompt")
    st.code(payload.get("text", ""), language=None, wrap_lines=True)
    if payload.get("finish_reason") == "cancelled":
        st.warning("Stopped before the end: the text is what was generated until the stop.")
    timing(payload.get("timing") or {})
