"""One fleet refresh as the Fleet page draws it: header, counts, the replica table, its PromQL, the alerting part and
the fleet checklist.

One rendering for the live page, a recorded refresh and a refresh reopened from History: each hands over the dict the
refresh is saved as (diagnostics.fleet.FleetRun.to_dict()). It draws only what the payload holds (it never queries
Prometheus), so a recorded or old refresh is never mixed with live data; what an older payload lacks reads N/A.
Label values and other server text are escaped before Streamlit renders them as Markdown.
"""
from __future__ import annotations

import streamlit as st

from core.fleet import table
from core.fleet.fleet import FleetSnapshot
from core.fmt import fmt_s, markdown_literal
from diagnostics import fleet_rules
from diagnostics.findings import RunResult, Status
from diagnostics.report import group_skips, SkipGroup, summary_line
from views.common.findings import card, skip_group_card
from views.common.wide_table import dataframe_fit

TABLE_NOTE = ("▲ marks a value far above the fleet median (median and MAD, robust to a few bad replicas), with its ratio "
              "to the median. N/A: no series for that column in this Prometheus (never read as 0). A p50 or p99 is shown as "
              "the histogram bucket it fell in (an interpolated point can stand above every request in it); the TTFT, "
              "e2e, queue, prefill and decode means are exact (_sum / _count), the phases with their share of the "
              "end-to-end latency; queue/TTFT is the share of the time to first token spent waiting.")


def column_help() -> dict:
    return {h: st.column_config.TextColumn(h, help=text) for h, text in table.HELP.items()}


def outlier_count(snap: FleetSnapshot, result: RunResult | None) -> tuple[str, str]:
    """The Outliers tile's value and help. Median/MAD ranks need three replicas; with two, the
    checklist's fleet.slow_replica compares them with each other, and the tile says so instead of a bare 0."""
    if len(snap.replicas) >= 3:
        return (str(sum(bool(r.outliers) for r in snap.replicas)),
                "Replicas with a column far above the fleet median (median and MAD), marked ▲ in the table.")
    slow = [f for f in (result.findings if result else []) if f.check_id == "fleet.slow_replica"]
    if slow and slow[0].status is Status.FAIL:
        return ("1", "Two replicas: no fleet median to rank against, so they are compared with "
                "each other (fleet.slow_replica, below); one is much slower.")
    return ("N/A", "A fleet median needs three or more replicas; fewer are compared with each other "
            "in the checklist below (fleet.slow_replica).")


def snapshot_of(payload: dict) -> FleetSnapshot | None:
    fleet = payload.get("fleet") if isinstance(payload, dict) else None
    return FleetSnapshot.from_dict(fleet) if isinstance(fleet, dict) else None


def show(payload: dict, key: str) -> None:
    """`key` prefixes every widget key (two refreshes side by side need two)."""
    snap = snapshot_of(payload)
    if snap is None:
        st.info("This fleet run holds no snapshot of the fleet (it did not finish, or was saved by another version); "
                "its saved data is in the payload.")
        return
    checklist = payload.get("checklist")
    result = RunResult.from_dict(checklist) if isinstance(checklist, dict) else None
    auth = (result.inputs.get("auth") if result else None) or ""
    st.caption(markdown_literal(f"{table.header_line(snap)} · Prometheus {snap.prometheus_version}"
                                + (f" · {auth}" if auth else "") + f" · GPU series: {snap.gpu_source or 'none'}"))
    m = st.columns(5)
    m[0].metric("Replicas", len(snap.replicas))
    m[1].metric("Down", sum(r.up is False for r in snap.replicas))
    outliers, why = outlier_count(snap, result)
    m[2].metric("Outliers", outliers, help=why)
    m[3].metric("Median TTFT p99", fmt_s(snap.fleet_median.get("ttft_p99_s")))
    m[4].metric("Median ITL p99", fmt_s(snap.fleet_median.get("itl_p99_s")))
    for note in snap.notes:
        (st.warning if str(note).startswith("Warning") else st.caption)(markdown_literal(note))

    st.subheader("Replicas, worst first")
    dataframe_fit(table.rows(snap), keep=[snap.replica_label], key=f"{key}-table", column_config=column_help())
    st.caption(TABLE_NOTE)
    if snap.promql:
        with st.expander("PromQL behind the table"):
            st.code("\n".join(f"# {k}\n{v}" for k, v in snap.promql.items()), language="promql", wrap_lines=True)

    st.subheader("Alerting in Prometheus")
    if "stalled" in snap.promql:
        st.caption(markdown_literal(
            f"The stall query (fleet.stalled, over {snap.stall_window}): a replica whose tokens and finished requests "
            "did not move while it had requests in flight. Pasteable as an alert rule's expr as it stands."))
        st.code(snap.promql["stalled"], language="promql", wrap_lines=True)
    st.download_button("Download alert rules (Prometheus rule file)", lambda: fleet_rules.for_snapshot(snap),
                       file_name="vllm-fleet-alerts.yml", mime="application/yaml", on_click="ignore",
                       key=f"{key}-rules",
                       help="The checks that can run inside Prometheus (stall, target down, KV pressure, saturation, "
                            "slow replica) for this selector, replica label and window. Check it with `promtool check "
                            "rules`, list it under rule_files in prometheus.yml. Same as `python -m diagnostics fleet "
                            "--alert-rules FILE`.")

    st.subheader("Fleet checklist")
    if result is None:
        st.info("No fleet checklist was saved with this refresh.")
        return
    st.markdown(markdown_literal(summary_line(result)))
    for item in group_skips(result.findings):
        if isinstance(item, SkipGroup):
            skip_group_card(item)
        else:
            card(item, key_prefix=f"{key}-finding")
