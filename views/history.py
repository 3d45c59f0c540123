"""History: every saved run (checklists, comparisons, benchmarks, long-document runs, generations, probes) from the
SQLite history in core/store.py. Reopen one, compare two side by side, export or delete. All logic is in core/store.py.
"""
import json

import streamlit as st

from core import store
from diagnostics.report import markdown_safe
from views.common import sweep as sweep_view

ss = st.session_state
st.title("History")

try:
    db = store.get_store()
    schema = db.schema_version()
except store.StoreError as exc:
    st.error(f"The history is not available: {exc}")
    st.stop()
st.caption(f"Saved runs live in `{db.path}` (SQLite, schema {schema}); set the TRIAGE_DB environment "
           "variable before starting the console to keep them elsewhere. Runs whose process ended before they "
           "finished are marked interrupted.")

if ss.get("hist_deleted"):
    st.success(f"Deleted {ss.pop('hist_deleted')} run(s).")
c = st.columns([1, 1, 4])
kind = c[0].selectbox("Kind", ["all", *store.KINDS], key="hist_kind")
limit = c[1].number_input("Show at most", 1, 10_000, 200, step=50, key="hist_limit")
try:
    runs = db.list_runs(None if kind == "all" else kind, int(limit))
except store.StoreError as exc:
    st.error(str(exc))
    st.stop()
if not runs:
    st.info("No saved runs yet" + ("" if kind == "all" else f" of kind {kind}") + ". Pages save their runs here as "
            "they finish (for example each generation on the Model page).")
    st.stop()

n_status = {s: sum(r.status == s for r in runs) for s in store.STATUSES}
c[2].caption(f"{len(runs)} run(s), newest first; {n_status['interrupted']} interrupted, {n_status['failed']} failed, "
             f"{n_status['cancelled']} cancelled, {n_status['running']} running.")
st.dataframe([{"id": r.id, "kind": r.kind, "title": r.title, "status": r.status,
               "started": r.created_iso[:19].replace("T", " "),
               "duration (s)": None if r.duration_s is None else round(r.duration_s, 2)} for r in runs],
             hide_index=True, width="stretch", key="hist_table")

by_id = {r.id: r for r in runs}
ss["hist_sel"] = [i for i in ss.get("hist_sel", []) if i in by_id]  # drop runs deleted or filtered away
chosen = st.multiselect("Runs (one to reopen, two to compare)", list(by_id), key="hist_sel",
                        format_func=lambda i: by_id[i].label, placeholder="Choose runs")
if not chosen:
    st.caption("Choose one run to reopen it, two to compare them; any number to export or delete.")
    st.stop()

# ---- export and delete -------------------------------------------------------------------------------------------
a = st.columns([1, 1, 3])
a[0].download_button(f"Export {len(chosen)} as JSON", lambda: db.export_runs(chosen),
                     f"triage-history-{'-'.join(map(str, chosen[:5]))}.json", "application/json", on_click="ignore",
                     icon=":material/download:", key="hist_export")
if a[1].button(f"Delete {len(chosen)}", icon=":material/delete:", key="hist_delete"):
    ss["hist_confirm"] = list(chosen)
pending = ss.get("hist_confirm")
if pending and pending == list(chosen):
    with st.container(border=True):
        st.warning(f"Delete {len(pending)} run(s) ({', '.join(f'#{i}' for i in pending)}) for good? This cannot "
                   "be undone; export them first if unsure.")
        b = st.columns([1, 1, 4])
        if b[0].button("Yes, delete", type="primary", key="hist_confirm_yes"):
            try:
                gone = sum(db.delete_run(i) for i in pending)
            except store.StoreError as exc:
                st.error(str(exc))
            else:
                ss["hist_confirm"], ss["hist_deleted"] = None, gone
                del ss["hist_sel"]
                st.rerun()
        if b[1].button("Cancel", key="hist_confirm_no"):
            ss["hist_confirm"] = None
            st.rerun()
elif pending:
    ss["hist_confirm"] = None  # the selection changed: ask again


# ---- reopen one, compare two -------------------------------------------------------------------------------------
def show(run, col):
    col.markdown(f"**#{run.id} · {run.kind}** · {run.status} · {run.created_iso[:19].replace('T', ' ')}")
    col.text(run.title)
    if run.error:
        col.warning(markdown_safe(run.error))
    if run.kind == "sweep" and run.payload and len(chosen) == 1:  # reopened in the view that drew it
        with col.container():
            sweep_view.show(run.payload, f"hist_sweep_{run.id}")
    col.caption("Summary")
    col.json(run.summary or {}, expanded=True)
    text = json.dumps(run.payload, indent=1, ensure_ascii=False)
    opened = len(chosen) == 1 and run.kind != "sweep"  # a sweep is shown in its own view above
    with col.expander(f"Payload ({len(text) / 1024:,.1f} KiB of JSON)", expanded=opened):
        if len(text) <= 500_000:
            st.json(run.payload, expanded=2)
        else:
            st.caption("Large payload: the first 500 KB are shown as text; export the run for all of it.")
            st.code(text[:500_000], language="json")


try:
    full = [r for r in (db.get_run(i) for i in chosen[:2]) if r is not None]
except store.StoreError as exc:  # a locked or damaged database: say so, keep the page
    st.error(str(exc))
    st.stop()
if len(chosen) == 1 and full:
    show(full[0], st.container())
elif len(full) == 2:
    st.subheader(f"#{full[0].id} (A) against #{full[1].id} (B)")
    rows = store.numeric_diff(full[0].summary, full[1].summary)
    if rows:
        st.dataframe(rows, hide_index=True, width="stretch", key="hist_diff",
                     column_config={k: st.column_config.NumberColumn(format="%.4g") for k in ("A", "B", "B - A")}
                     | {"change %": st.column_config.NumberColumn(format="%+.1f %%")})
    else:
        st.caption("The two summaries share no numeric fields.")
    if all(r.kind == "sweep" and r.payload for r in full):
        sweep_view.show_comparison(full[0].payload, full[1].payload, (f"#{full[0].id} (A)", f"#{full[1].id} (B)"))
    cols = st.columns(2)
    for run, col in zip(full, cols):
        show(run, col)
    if len(chosen) > 2:
        st.caption(f"Comparing the first two of {len(chosen)} chosen runs.")
