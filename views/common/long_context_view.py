"""A long-context run drawn the same way wherever it is shown: on the Long context page as its results arrive, and
in History when a saved run is reopened. Input is the test ("single", "ramp", "needle", "batch") and its result
dicts (core.long_context.runs: RunResult.to_dict(), NeedleResult.to_dict()), or the saved payload
(core.long_context.history: test, model, params, results)."""
from __future__ import annotations

import streamlit as st

from core.fmt import fmt_cache_bytes
from core.long_context import charts as lc
from core.long_context import history as hist
from core.long_context import runs as longrun
from views.common.runs import NOBAR, metrics

# test -> (chart of all its results, one table row per result); the single run has its own layout
CHARTS = {"ramp": (lc.ramp_chart, longrun.table_row), "needle": (lc.needle_chart, longrun.needle_row),
          "batch": (lc.batch_chart, longrun.table_row)}


def draw(test: str, results: list[dict], key: str) -> None:
    """A test's results: the single run's metrics, gap histogram and cache; the others' chart and table."""
    if test == "single":
        for i, r in enumerate(results):
            metrics(longrun.headline(r))
            st.plotly_chart(lc.itl_histogram(r), key=f"{key}_itl_{i}", config=NOBAR)
            st.caption(f"KV cache held by the engine after the run: {fmt_cache_bytes(r['kv_bytes'])} (measured).")
        return
    chart, row = CHARTS[test]
    st.plotly_chart(chart(results), key=f"{key}_chart", config=NOBAR)
    st.table([row(r) for r in results])


def show(payload: dict, key: str) -> None:
    """A saved run (History): what ran on which document, then its results as the page drew them."""
    test, params = payload["test"], payload.get("params") or {}
    st.markdown(f"**{hist.TESTS[test]}** on {payload.get('model', 'the loaded model')}")
    doc = [f"document of {params['document_tokens']:,} tokens" if params.get("document_tokens") else None,
           f"truncated ({params['truncation']})" if params.get("truncation") else None,
           f"{params['new_tokens']} new tokens per run" if params.get("new_tokens") else None,
           f"on {params['device']}" if params.get("device") else None]
    st.caption("; ".join(d for d in doc if d) + (f". What ran: {params['engine']}" if params.get("engine") else ""))
    results = payload.get("results") or []
    if payload.get("cancelled"):
        st.warning(f"Stopped before the end; {len(results)} result(s) finished before the stop.")
    if results:
        draw(test, results, key)
    else:
        st.info("No result finished before the run ended.")
