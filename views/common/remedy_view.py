"""A tried remedy drawn the same way on the vLLM deployment page and when History reopens it: the verdict, the
before/after table (goodput at the SLO, peak throughput, knee), each shared load's latencies and anatomy shares, the
command line to copy, and every trial when several were tried. Input is core.deployment.remedy.result_of's dict."""
from __future__ import annotations

import streamlit as st

from core.deployment.remedy import command_text
from core.fmt import markdown_literal
from views.common.sweep import dashed, summary_cell
from views.common.wide_table import dataframe_fit

VERDICT_BOX = {"helped": st.success, "no change": st.warning, "worse": st.error, "refused": st.error,
               "failed": st.error}
ROWS = {"goodput_rps": "goodput at the SLO (req/s)", "max_rps": "peak throughput (req/s)", "knee_load": "knee (load)"}
PER_LOAD = (("rps", "req/s", 1.0), ("ttft_p50", "TTFT p50 ms", 1000.0), ("ttft_p99", "TTFT p99 ms", 1000.0),
            ("itl_p50", "ITL p50 ms", 1000.0), ("itl_p99", "ITL p99 ms", 1000.0),
            ("queue_share", "queue % of TTFT", 100.0), ("prefill_share", "prefill % of TTFT", 100.0))



def flag_text(flags: dict) -> str:
    return " ".join(f"{k} {v}".strip() for k, v in (flags or {}).items()) or "(no flag change)"


def trial(t: dict, key: str) -> None:
    """One trial: its verdict, the summary rows and the per-load table."""
    v = t.get("verdict") or {}
    VERDICT_BOX.get(v.get("kind"), st.info)(markdown_literal(v.get("headline", "Not tried.")))
    cmp = t.get("comparison") or {}
    if not cmp:
        return
    before, after = t.get("before") or {}, t.get("after") or {}
    st.dataframe([{"": ROWS[k], "before": summary_cell(r["before"], k, before),
                   "after": summary_cell(r["after"], k, after), "change %": summary_cell(r["change_pct"], nd=1)}
                  for k, r in cmp["rows"].items()], hide_index=True, key=f"{key}_rows")
    rows = []
    for row in cmp.get("loads", []):
        out = {"load": row["load"]}
        for name, label, scale in PER_LOAD:
            cell = row[name]
            for side in ("before", "after"):
                out[f"{label} {side}"] = None if cell[side] is None else round(scale * cell[side], 1)
        rows.append(out)
    rows, empty = dashed(rows)
    if rows:
        st.caption("At each load both sweeps ran: client latencies (measured here) and the server's anatomy shares "
                   "(vLLM /metrics histograms over the step)" + ('; "-" where that step has no number (no request '
                   "finished, or the server's /metrics lacked the phase)." if empty else "."))
        dataframe_fit(rows, keep=["load"], key=f"{key}_loads")  # before/after pairs: parts that fit 1400 px
    loads = ", ".join(f"{s['load']:g}" for s in before.get("steps", []))
    kind = (lambda d: (d.get("verdict") or {}).get("kind"))
    st.caption(markdown_literal(
        f"Before: {' '.join(t.get('flags_before') or []) or '(no flags)'} at {before.get('base_url')} "
        f"({kind(before)}); after: {' '.join(t.get('flags_after') or [])} at {after.get('base_url')} ({kind(after)}). "
        f"Same sweep: {before.get('mode')}, loads {loads}, {before.get('prompt_tokens')} prompt tokens -> "
        f"{before.get('max_new_tokens')} new tokens."))


def show(doc: dict, key: str) -> None:
    """The whole result: the best trial first, the command to copy, then every trial."""
    trials = doc.get("trials") or []
    best = doc.get("best")
    if doc.get("stopped"):
        st.warning(markdown_literal(doc["stopped"]))
    shown = trials[best] if best is not None and 0 <= best < len(trials) else trials[0] if trials else {}
    if doc.get("summary") != (shown.get("verdict") or {}).get("headline"):  # the trial's verdict box says it already
        st.markdown(f"**{markdown_literal(doc.get('summary', ''))}**")
    if best is not None and 0 <= best < len(trials):
        trial(trials[best], f"{key}_best")
    elif trials:
        trial(trials[0], f"{key}_first")
    st.caption("The command line that won (the original's when nothing helped), to copy into the real deployment:")
    st.code(command_text(doc), language="bash", wrap_lines=True)  # a long path must not push it past its box
    if len(trials) > 1:
        for i, t in enumerate(trials):
            if t is shown:  # drawn above
                continue
            with st.expander(f"Try {i + 1}: {flag_text(t.get('flags_changed'))}: "
                             f"{(t.get('verdict') or {}).get('kind', '')}"):
                trial(t, f"{key}_t{i}")
