"""A latency probe of a vLLM server drawn the same way wherever it is shown: on the vLLM deployment page after it
ran, and in History when a saved probe is reopened. Input is core.deployment.probe.ProbeResult.to_dict() (the saved
payload): client and server percentiles, the request shape, and where the server says the time went."""
from __future__ import annotations

import streamlit as st

from core.deployment import charts as dc
from core.fmt import markdown_literal

NOBAR = {"displayModeBar": False}


def _ms(value) -> str:
    return "N/A" if value is None else f"{1000 * value:.1f}"


def show(res: dict, key: str) -> None:
    client, server = res["client"], res.get("server")
    table = [{"latency": f"{dc.LATENCY_LABELS[k]} {p}",
              "client (ms)": None if client[k][p] is None else 1000 * client[k][p],
              "server (ms)": None if not server or server[k][p] is None else 1000 * server[k][p]}
             for k in ("ttft", "itl", "e2e") for p in dc.PERCENTILES]
    c = st.columns([2, 3])
    c[0].dataframe(table, hide_index=True, width="stretch", column_config={
        "client (ms)": st.column_config.NumberColumn(format="%.1f", help="Measured here, from the streamed chunks"),
        "server (ms)": st.column_config.NumberColumn(format="%.1f", help="vLLM /metrics histograms, same window")})
    c[1].plotly_chart(dc.probe_comparison(client, server), key=f"{key}_chart", config=NOBAR)
    st.caption(markdown_literal(
        f"{res['n']} requests x {res['prompt_tokens']} prompt tokens -> {res['max_new_tokens']} new tokens, "
        f"{res['concurrency']} at a time, {res['wall_s']:.1f} s wall. Client decode time per output token "
        f"{_ms(res.get('tpot_s'))} ms; {res['tokens']} tokens arrived in {res['chunks']} chunks (a chunk carrying k "
        "tokens counts as k gaps of 1/k). ") + markdown_literal(res.get("metrics_note") or ""))
    anatomy = res.get("anatomy")
    if anatomy and anatomy.get("phases"):
        st.plotly_chart(dc.anatomy_bar(anatomy), key=f"{key}_anatomy", config=NOBAR)
        share = anatomy.get("queue_share_ttft")
        st.caption(markdown_literal(("" if share is None else f"Queueing was {100 * share:.0f}% of the mean time to "
                                     "first token in this window. ") + " ".join(anatomy.get("notes") or [])))
