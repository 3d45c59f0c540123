"""A golden set and a quality-watch round, drawn from what History saved (core.compare.golden): the set's source and
noise floor with its prompts, or each replica's verdict in the round with its numbers and any drift."""
from __future__ import annotations

import time

import streamlit as st

from core.compare.golden.golden import source_line
from core.compare.golden.replay import ReplicaRound
from core.compare.golden.watch import noise_floor_line, replica_line, threshold_line
from core.fmt import markdown_literal


def _utc(ts) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "unknown time"


def show_record(doc: dict, key: str) -> None:
    """A golden set: what produced it, its noise floor, and per prompt the lengths it holds."""
    st.markdown(markdown_literal(f"Golden set recorded {_utc(doc.get('recorded_at'))}: {source_line(doc)}."))
    st.caption(markdown_literal("Noise floor (the reference replayed on itself right after recording): "
                                + noise_floor_line(doc.get("noise_floor"))))
    rows = [{"prompt": p.get("name", ""), "prompt tokens": len(p.get("prompt_ids") or []),
             "golden tokens": len(p.get("ids") or []), "text": (p.get("text") or "")[:120]}
            for p in doc.get("prompts") or []]
    st.dataframe(rows, hide_index=True, width="stretch", key=f"{key}_prompts")
    st.caption("Watch replicas against it: `python -m diagnostics golden watch --golden FILE --url URL` "
               "(the file the record wrote; History keeps this copy for reading).")


def show_watch(doc: dict, key: str) -> None:
    """One round: each replica's verdict (worst first as the watch saved them), its drift, the round's cost."""
    replicas = [ReplicaRound(**r) for r in doc.get("replicas") or []]
    fine = sum(r.status == "fine" for r in replicas)
    st.markdown(markdown_literal(f"Round {doc.get('round')} at {_utc(doc.get('started_at'))}: {fine} of "
                                 f"{len(replicas)} replicas fine."))
    rows = []
    for r in replicas:
        s = r.summary or {}
        rows.append({"replica": r.url, "status": r.status,
                     "same top token": None if s.get("same_top") is None else 100 * s["same_top"],
                     "mean KLD (nats)": s.get("mean_kld"), "p99 KLD (nats)": s.get("p99_kld"),
                     "tokens": (r.tokens or {}).get("total", 0), "seconds": r.seconds,
                     "drift": "yes" if r.drift else ""})
    st.dataframe(rows, hide_index=True, width="stretch", key=f"{key}_replicas", column_config={
        "same top token": st.column_config.NumberColumn(format="%.1f%%"),
        "mean KLD (nats)": st.column_config.NumberColumn(format="%.3g"),
        "p99 KLD (nats)": st.column_config.NumberColumn(format="%.3g"),
        "seconds": st.column_config.NumberColumn(format="%.1f")})
    for r in replicas:
        if r.drift:
            st.warning(markdown_literal(f"{r.url}: {r.drift}"))
    for r in replicas:
        st.text(replica_line(r))
    st.caption(markdown_literal(f"Cost: {doc.get('tokens', 0):,} tokens this round, {doc.get('seconds', 0.0):.1f} s; "
                                + threshold_line(doc.get("noise") or {}) + "."))
