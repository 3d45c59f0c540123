"""Fleet: every vLLM replica a Prometheus knows, ranked against the fleet median, with the fleet checklist.

Widgets -> diagnostics.fleet.run (one refresh, saved to History) -> render (views/common/fleet_view.py, which also
draws a recorded refresh under its banner when the "Recorded" switch is on). Credentials are never typed here: they
come from the console's environment (TRIAGE_PROM_TOKEN, or TRIAGE_PROM_USER/TRIAGE_PROM_PASSWORD). Label values and
other server text are escaped before Streamlit renders them as Markdown.
"""
import datetime as dt
import time

import pandas as pd
import streamlit as st

from core.errors import TriageError
from core.fleet import series as fs
from core.fleet import table
from core.fleet.prom import Prometheus
from core.fleet.promql import REPLICA_LABELS, parse_instant
from core.fmt import markdown_literal
from diagnostics import fleet
from diagnostics.charts import figure
from diagnostics.context import Series
from diagnostics.findings import Chart
from views.common import fleet_view, recorded
from core.settings import settings

WINDOWS = ("1m", "5m", "15m", "1h")
ss = st.session_state

st.title("Fleet")
st.caption("Every vLLM replica your Prometheus (or Thanos, Mimir, VictoriaMetrics) already scrapes: which one is "
           "slow, and why. The console only queries Prometheus; it never scrapes the fleet itself.")
rec = recorded.pick("fleet", "fleet_data")
if rec is not None:  # a real refresh captured elsewhere, drawn alone: it never queries this console's Prometheus
    recorded.banner(rec)
    fleet_view.show(rec.payload, f"rec-{rec.name}")
    st.stop()

with st.form("fleet_connect"):
    c = st.columns([4, 3, 2, 1.2, 1.4], vertical_alignment="bottom")
    url = c[0].text_input("Prometheus URL", ss.get("fleet_url", settings().prometheus_url),
                          placeholder="http://prometheus:9090")
    selector = c[1].text_input("Label selector (optional)", ss.get("fleet_sel", ""), placeholder='{namespace="prod"}',
                               help="Label matchers only (=, !=, =~, !~ with quoted values).")
    label = c[2].selectbox("Replica label", REPLICA_LABELS, help="The label that tells replicas apart.")
    window = c[3].selectbox("Window", WINDOWS, index=1, help="Rates and latency quantiles are over this window.")
    go = c[4].form_submit_button("Connect", type="primary")
    p = st.columns([2.4, 2.0, 1.6, 4.0], vertical_alignment="bottom")
    past = p[0].checkbox("At a past instant", key="fleet_past", help="A post-incident review: the table and the "
                         "checklist as they stood then, the window ending at that instant; History records it. Same "
                         "as `python -m diagnostics fleet --at TIME`.")
    day = p[1].date_input("Date", key="fleet_at_day")
    clock = p[2].time_input("Time", key="fleet_at_time", step=60, help="In this console's time zone.")
if go:
    try:
        prom = Prometheus(url)
        at = parse_instant(dt.datetime.combine(day, clock).isoformat(), time.time()) if past else None
        with st.spinner("Querying Prometheus..."):
            ss.fleet_run = fleet.run(prom, selector, label, window, at=at)
        ss.update(fleet_url=prom.base_url, fleet_sel=selector, fleet_auth=prom.auth_description)
    except TriageError as exc:
        ss.fleet_run = None
        st.error(markdown_literal(exc))

run = ss.get("fleet_run")
if run is None:
    st.info("Enter the base URL of the Prometheus that scrapes your vLLM servers (and, if you have them, "
            "dcgm-exporter or `python -m diagnostics exporter` on the GPU hosts) and connect. Credentials come "
            "from the console's environment: TRIAGE_PROM_TOKEN, or TRIAGE_PROM_USER and TRIAGE_PROM_PASSWORD.")
    st.stop()

snap = run.snapshot
fleet_view.show(run.to_dict(), "fleet")


def draw(chart: fs.Chart, key: str) -> None:
    if not chart.lines:
        st.info(f"No {chart.title} series over that range.")
        return
    start = min(t for pts in chart.lines.values() for t, _ in pts)
    lines = tuple(Series(name, chart.unit, "Prometheus", tuple(t - start for t, _ in pts), tuple(v for _, v in pts))
                  for name, pts in chart.lines.items())
    t0 = dt.datetime.fromtimestamp(start).astimezone()  # the x axis as a 24-hour clock of the console's zone
    st.plotly_chart(figure(Chart(chart.title, lines, f"{chart.title} ({chart.unit})"), t0=t0), key=key,
                    config={"displayModeBar": False})
    st.caption(markdown_literal(f"{len(chart.lines)} of {chart.replicas_total} replicas (highest mean first), from "
                                f"{t0:%Y-%m-%d %H:%M:%S %Z}, step "
                                f"{chart.step_s:g} s: {chart.promql}"))


st.subheader("Over time")
c = st.columns(3)
col = c[0].selectbox("Metric", list(fs.CHARTABLE), format_func=lambda k: fs.CHARTABLE[k][0])
rng = c[1].selectbox("Range", list(fs.RANGES), index=2)
worst = c[2].slider("Worst replicas drawn", 1, 20, 5)
try:
    draw(fs.history(Prometheus(snap.prometheus_url), snap, col, rng, worst), "fleet-over-time")
except TriageError as exc:
    st.warning(markdown_literal(exc))

st.subheader("One replica")
names = [r.name for r in table.worst_first(snap)]
pick = st.selectbox("Replica", names, help="Worst first.")
r = snap.replica(pick)
if r is not None:
    st.caption(markdown_literal(f"{snap.replica_label}={r.name} · targets {', '.join(r.instances) or 'N/A'} · "
                                f"state {table.state(r)}" + (f" · last error: {r.last_error}" if r.last_error else "")))
    st.dataframe(pd.DataFrame([row for row in table.rows(snap) if row[snap.replica_label] == pick]), hide_index=True,
                 width="stretch", column_config=fleet_view.column_help())
    cc = st.columns(2)
    for i, key in enumerate(("ttft_p99_s", "running")):
        with cc[i]:
            try:
                draw(fs.history(Prometheus(snap.prometheus_url), snap, key, rng, 1, replica=r.name), f"fleet-one-{key}")
            except TriageError as exc:
                st.warning(markdown_literal(exc))
