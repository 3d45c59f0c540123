"""History: every saved run (checklists, comparisons, benchmarks, long-document runs, generations, probes) from the
SQLite history in core/store.py. Reopen one in the view of the page that made it (VIEWS; the raw JSON stays one click
away), compare two side by side, export or delete. All logic is in core/store.py.
"""
import json

import streamlit as st

from core import store
from core.compare.result import title_from_summary
from core.fmt import markdown_literal, short_path
from core.quality import history as quality_history
from diagnostics.report import markdown_safe
from views.common import (checklist_view, compare_view, fleet_view, generate_view, golden_view, long_context_view,
                          probe_view, quality_view, remedy_view)
from views.common import sweep as sweep_view

# Each kind that has a page drawing its result: the same view, fed the stored payload.
VIEWS = {"checklist": checklist_view.show, "compare": compare_view.show, "fleet": fleet_view.show,
         "quality": quality_view.show, "sweep": sweep_view.show,
         "remedy": remedy_view.show, "generate": generate_view.show, "longdoc": long_context_view.show,
         "probe": probe_view.show, "golden-record": golden_view.show_record, "golden-watch": golden_view.show_watch}

ss = st.session_state
st.title("History")

try:
    db = store.get_store()
    schema = db.schema_version()
except store.StoreError as exc:
    st.error(f"The history is not available: {exc}")
    st.stop()
st.caption(f"Saved runs live in `{short_path(db.path)}` (SQLite, schema {schema}); set the TRIAGE_DB environment "
           "variable before starting the console to keep them elsewhere. Runs whose process ended before they "
           "finished are marked interrupted.")

if ss.get("hist_deleted"):
    st.success(f"Deleted {ss.pop('hist_deleted')} run(s).")
c = st.columns([1, 1, 4])
kind = c[0].selectbox("Kind", ["all", *store.KINDS], key="hist_kind")
limit = c[1].number_input("Show at most", 1, 10_000, 200, step=50, key="hist_limit")
mine = c[2].toggle("Only this app's runs", key="hist_mine", help="Hide runs made by the CLI or another console "
                   "process on this database (the 'by' column says which host and pid made each).")
try:
    runs = [r for r in db.list_runs(None if kind == "all" else kind, int(limit)) if r.made_here or not mine]
except store.StoreError as exc:
    st.error(str(exc))
    st.stop()
if not runs:
    st.info("No saved runs yet" + ("" if kind == "all" else f" of kind {kind}") + (" by this app" if mine else "")
            + ". Pages save their runs here as "
            "they finish (for example each generation on the Model page).")
    st.stop()

n_status = {s: sum(r.status == s for r in runs) for s in store.STATUSES}
c[2].caption(f"{len(runs)} run(s), newest first; {n_status['interrupted']} interrupted, {n_status['failed']} failed, "
             f"{n_status['cancelled']} cancelled, {n_status['running']} running.")


def title(run) -> str:
    """The title to list: compare and quality runs saved by older versions named every kernel or the model; the
    short form is rebuilt from what was saved."""
    if run.kind == "compare" and not run.title.startswith("Compare "):
        return title_from_summary(run.summary) or run.title
    if run.kind == "quality":
        return quality_history.short_title(run.title)
    return run.title


def duration(run) -> float | None:
    """Seconds the run took; compare runs saved by older versions stored no start, but their own timings."""
    if run.duration_s is not None:
        return round(run.duration_s, 1)
    s = run.summary or {}
    if run.kind == "compare" and isinstance(s.get("total_s"), (int, float)):
        return round(s["total_s"] + (s.get("load_s") or 0.0), 1)
    return None


# The title gets the room: ids, kinds, statuses and times are short.
st.dataframe([{"id": r.id, "kind": r.kind, "title": title(r), "status": r.status,
               "started": r.created_iso[:16].replace("T", " "), "took (s)": duration(r), "by": r.made_by}
              for r in runs],
             hide_index=True, width="stretch", key="hist_table", placeholder="–", column_config={
                 "id": st.column_config.NumberColumn(width=50), "kind": st.column_config.TextColumn(width=75),
                 "title": st.column_config.TextColumn(width="large"),
                 "status": st.column_config.TextColumn(width=80), "started": st.column_config.TextColumn(width=125),
                 "took (s)": st.column_config.NumberColumn(width=70, format="%.1f",
                                                           help="Seconds from the run's start to its end"),
                 "by": st.column_config.TextColumn(width=110, help="this app, or the host and pid of the console "
                                                                    "or command that made it")})

by_id = {r.id: r for r in runs}
ss["hist_sel"] = [i for i in ss.get("hist_sel", []) if i in by_id]  # drop runs deleted or filtered away
chosen = st.multiselect("Runs (one to reopen, two to compare)", list(by_id), key="hist_sel",
                        format_func=lambda i: f"#{i} · {by_id[i].kind} · {title(by_id[i])} · {by_id[i].status}",
                        placeholder="Choose runs")
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
def details(run, col) -> None:
    """Everything about the run that is not its result: full title, times, summary. One click away."""
    with col.popover("Details", icon=":material/info:"):
        st.text(run.title)
        took = duration(run)
        st.caption(f"Started {run.created_iso[:19].replace('T', ' ')}"
                   + ("" if took is None else f", took {took:,.1f} s") + f"; status {run.status}.")
        st.json(run.summary or {}, expanded=True)


def raw_json(run, col, opened: bool) -> None:
    text = json.dumps(run.payload, indent=1, ensure_ascii=False)
    with col.expander(f"Raw JSON of the run ({len(text) / 1024:,.1f} KiB)", expanded=opened):
        st.caption("Summary")
        st.json(run.summary or {}, expanded=True)
        st.caption("Payload")
        if len(text) <= 500_000:
            st.json(run.payload, expanded=2 if opened else 1)
        else:
            st.caption("Large payload: the first 500 KB are shown as text; export the run for all of it.")
            st.code(text[:500_000], language="json")


def show(run, col, single: bool) -> None:
    took = duration(run)
    col.markdown(f"**#{run.id} · {run.kind}** · {run.status} · {run.created_iso[:19].replace('T', ' ')}"
                 + ("" if took is None else f" · took {took:,.1f} s"))
    col.text(title(run))
    if run.error:
        col.warning(markdown_safe(run.error))
    view = VIEWS.get(run.kind) if single and isinstance(run.payload, dict) and run.payload else None
    details(run, col)
    if view is not None:  # reopened in the view of the page that made it
        with col.container():
            try:
                view(run.payload, f"hist_{run.kind}_{run.id}")
            except Exception as exc:  # noqa: BLE001 - a payload no view can draw must not take the page down
                st.warning(markdown_literal(f"This run cannot be drawn in its page's view ({type(exc).__name__}: "
                                            f"{exc}); its saved JSON is below."))
                view = None
    raw_json(run, col, opened=view is None and single)


try:
    full = [r for r in (db.get_run(i) for i in chosen[:2]) if r is not None]
except store.StoreError as exc:  # a locked or damaged database: say so, keep the page
    st.error(str(exc))
    st.stop()
if len(chosen) == 1 and full:
    show(full[0], st.container(), single=True)
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
        show(run, col, single=False)
    if len(chosen) > 2:
        st.caption(f"Comparing the first two of {len(chosen)} chosen runs.")
