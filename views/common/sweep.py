"""A load sweep drawn the same way wherever it is shown: on the vLLM deployment page after it ran, and in History when
a saved sweep is reopened. Input is the saved form (SweepResult.to_dict()), so both show exactly the same thing."""
from __future__ import annotations

import csv
import io
import json
import time

import streamlit as st

from core.deployment import charts as dc
from core.deployment.sweep import MODES, compare_sweeps, parse_steps, sweep
from core.errors import TriageError
from core.throttle import throttled
from core.fmt import markdown_literal
from views.common.wide_table import dataframe_fit

NOBAR = {"displayModeBar": False}
VERDICT_BOX = {"capacity-bound": st.warning, "prefill-bound": st.warning, "decode-bound": st.warning,
               "memory-bound": st.warning, "front-end-bound": st.warning, "saturated": st.warning,
               "not saturated": st.success}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(1000.0 * v, 1)


def step_rows(res: dict, why: dict[str, str] | None = None) -> list[dict]:
    """One flat row per step: the table on the page and the CSV export (None where a step has no number). `why`, when
    given, gets the reason for each column with an empty cell, as the page says it under the table."""
    rows = []
    for s in res.get("steps", []):
        srv = s.get("server") or {}
        phase = (lambda k: _ms(((srv.get("phases") or {}).get(k) or {}).get("mean_s")))
        share = srv.get("queue_share_ttft")
        pct = (lambda v: None if v is None else round(100 * v, 1))
        if why is not None:
            for column, reason in _empty_reasons(res, s).items():
                why.setdefault(column, reason)
        rows.append({
            "load": s["load"], "requests": s["requests"], "errors": s["errors"],
            "achieved req/s": round(s["achieved_rps"], 3), "output tok/s": round(s["output_tok_s"], 1),
            **{f"{k.upper()} {p} ms": _ms(s["client"][k][p]) for k in ("ttft", "itl", "e2e") for p in ("p50", "p99")},
            "queue ms": phase("queue"), "prefill ms": phase("prefill"), "decode ms": phase("decode"),
            "queue % of TTFT": pct(share), "prefill % of TTFT": pct(srv.get("prefill_share_ttft")),
            "before engine % of TTFT": pct(srv.get("before_engine_share_ttft")),
            "requests timed": s["client"]["ttft"].get("n"),
            "max running": (s.get("busiest") or {}).get("running"),
            "max waiting": (s.get("busiest") or {}).get("waiting"),
            "meets SLO": s.get("meets_slo"),
        })
    return rows


_SERVER_COLUMNS = ("queue ms", "prefill ms", "decode ms", "queue % of TTFT", "prefill % of TTFT",
                   "before engine % of TTFT")


def _empty_reasons(res: dict, s: dict) -> dict[str, str]:
    """Why a step's cells hold no number, by column: a table cell says "-", the line under the table says why."""
    srv, client = s.get("server"), (s.get("client") or {}).get("ttft") or {}
    out = {}
    if s.get("meets_slo") is None:
        out["meets SLO"] = ("no SLO was given for this sweep" if not res.get("slo") else
                            "no request of the step finished")
    if not srv:
        out.update(dict.fromkeys(_SERVER_COLUMNS, "the server's /metrics were not read for this step"))
    else:
        missing = ", ".join(srv.get("missing") or ())
        phases = (f"this vLLM does not export {missing}" if missing else
                  "no request finished within the step's /metrics window")
        out.update(dict.fromkeys(_SERVER_COLUMNS, phases))
        if "before_engine_share_ttft" not in srv:
            out["before engine % of TTFT"] = "not in this saved sweep: the version that ran it did not measure it"
    out["requests timed"] = ("not in this saved sweep: the version that ran it did not count it" if "n" not in client
                             else "no request finished")
    out["max running"] = out["max waiting"] = "the server's /metrics were not read during the step"
    return out


def _text(v) -> str:
    return "-" if v is None else ("yes" if v else "no") if isinstance(v, bool) else f"{v:,g}"


def dashed(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """`rows` for a table with no None in it (a grid prints None, pandas nan): a column with an empty cell, or with
    yes/no values, becomes text with "-" in the empty cells; other columns stay numbers. Also the columns that had an
    empty cell, for the line that says why."""
    empty = [c for c in (rows[0] if rows else {}) if any(r[c] is None for r in rows)]
    text = set(empty) | {c for c in (rows[0] if rows else {}) if any(isinstance(r[c], bool) for r in rows)}
    return [{c: _text(v) if c in text else v for c, v in r.items()} for r in rows], empty


def shown_rows(res: dict) -> tuple[list[dict], str]:
    """The steps as the page shows them (dashed) and the line that says why each column with a "-" has one."""
    why: dict[str, str] = {}
    shown, empty = dashed(step_rows(res, why))
    return shown, "; ".join(f"{c}: {why.get(c, 'no request of the step finished')}" for c in empty)


def show(res: dict, key: str) -> None:
    """The verdict, the three charts, the steps and the exports of one sweep."""
    verdict = res.get("verdict") or {}
    unit = "clients" if res.get("mode") == "concurrency" else "req/s"
    box = VERDICT_BOX.get(verdict.get("kind"), st.info)
    box(markdown_literal(verdict.get("headline", "No verdict.")))
    if verdict.get("remedies"):
        lines = []
        for r in verdict["remedies"]:
            flags = " ".join(f"{k} {v}".strip() for k, v in r["flags"].items())
            lines.append("- " + markdown_literal(r["text"]) + (f" `{flags}`" if flags else ""))
        st.caption("What would help:\n" + "\n".join(lines))
    elif verdict.get("remedy"):  # a sweep saved before remedies had flags
        st.caption("What would help: " + markdown_literal(verdict["remedy"]))
    if res.get("status") in ("failed", "cancelled"):
        st.warning(markdown_literal(f"Sweep {res['status']}: {res.get('stopped', '')}"))
    knee, good = res.get("knee"), res.get("goodput")
    best = max((s["achieved_rps"] for s in res.get("steps", [])), default=None)
    m = st.columns(4)
    m[0].metric("Knee", "not reached" if not knee else f"{knee['load']:g} {unit}",
                help=knee["how"] if knee else "Throughput kept growing with the load over the steps run.")
    m[1].metric("Goodput", "no SLO given" if not res.get("slo") else "none met" if not good else
                f"{good['rps']:.2f} req/s", help="Requests/s at the best step whose TTFT and ITL p99 meet every SLO")
    m[2].metric("Peak throughput", "N/A" if best is None else f"{best:.2f} req/s")
    m[3].metric("Steps", f"{len(res.get('steps', []))} in {res.get('wall_s', 0):.0f} s",
                help=markdown_literal(res.get("stopped", "")))
    steps = res.get("steps", [])
    if not steps:
        return
    c = st.columns(3)
    c[0].plotly_chart(dc.sweep_latency(steps, res.get("slo"), knee), key=f"{key}_lat", config=NOBAR)
    c[1].plotly_chart(dc.sweep_anatomy(steps), key=f"{key}_anat", config=NOBAR)
    c[2].plotly_chart(dc.sweep_throughput(steps, knee), key=f"{key}_tput", config=NOBAR)
    rows = step_rows(res)
    shown, empty = shown_rows(res)
    dataframe_fit(shown, keep=[next(iter(shown[0]))], key=f"{key}_table")  # the load column starts every part
    if empty:
        st.caption(markdown_literal(f'A "-" in the steps is a number the step does not have. {empty}.'))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    d = st.columns([1, 1, 4])
    d[0].download_button("Steps as CSV", buf.getvalue(), "sweep-steps.csv", "text/csv", on_click="ignore",
                         key=f"{key}_csv", icon=":material/download:")
    d[1].download_button("Sweep as JSON", json.dumps(res, indent=1, default=str), "sweep.json", "application/json",
                         on_click="ignore", key=f"{key}_json", icon=":material/download:")
    workload = (f"dataset {res['dataset']}" if res.get("dataset") else f"{res.get('prompt_tokens')} prompt tokens")
    d[2].caption(markdown_literal(f"{res.get('model')} at {res.get('base_url')} · {res.get('mode')} sweep · "
                                  f"{workload} -> {res.get('max_new_tokens')} new tokens per request"))


def summary_cell(v: float | None, row: str = "", sweep: dict | None = None, nd: int = 3) -> str:
    """A cell of the goodput / peak throughput / knee summary of a sweep (`row` names it): the number, or what its
    absence means ("none in the sweep" for a knee it never reached, "no SLO given" or "none met the SLO" for goodput,
    "-" for a change with a side missing), never None."""
    if v is not None:
        return f"{round(v, nd):g}"
    if row == "goodput_rps":
        return "no SLO given" if sweep is not None and not sweep.get("slo") else "none met the SLO"
    return {"knee_load": "none in the sweep"}.get(row, "-")


def show_comparison(before: dict, after: dict, labels: tuple[str, str]) -> None:
    """Goodput, peak throughput and knee of two sweeps, with the change in percent."""
    cmp = compare_sweeps(before, after)
    names = {"goodput_rps": "goodput (req/s)", "max_rps": "peak throughput (req/s)", "knee_load": "knee (load)"}
    st.dataframe([{"": names[k], labels[0]: summary_cell(r["before"], k, before),
                   labels[1]: summary_cell(r["after"], k, after), "change %": summary_cell(r["change_pct"], nd=1)}
                  for k, r in cmp["rows"].items()], hide_index=True, key="sweep_cmp")
    v = cmp["verdicts"]
    st.caption(markdown_literal(f"Verdict: {v['before']} -> {v['after']}."))
    if not cmp["same_workload"]:
        st.warning("The two sweeps did not use the same workload (mode, prompt length, new tokens or SLO): the "
                   "change is not only the server's.")


def compare_picker(current: dict, key: str) -> None:
    """A choice of the saved sweeps other than `current`, and the comparison with the one picked (before/after a
    configuration change)."""
    from core import store

    try:
        runs = [r for r in store.list_runs("sweep", limit=50) if r.id != current.get("history_id")]
    except store.StoreError as exc:
        st.caption(f"History is not available for a comparison: {exc}")
        return
    if not runs:
        return
    pick = st.selectbox("Compare with an earlier sweep", [None, *runs], key=key,
                        format_func=lambda r: "(none)" if r is None else r.label)
    if pick is None:
        return
    run = store.get_run(pick.id)
    if run is None or not run.payload:
        st.warning(f"Run #{pick.id} is no longer in History.")
        return
    show_comparison(run.payload, current, (f"#{run.id}", "this sweep"))


def section(base_url: str, api_key: str | None, engine=None) -> None:
    """The deployment page's Load sweep: the form, the run with progress and Cancel, the result and a comparison."""
    ss = st.session_state
    st.subheader("Load sweep")
    st.caption("Raises the load step by step (1, 2, 4, ... clients at once, or Poisson arrivals at growing requests/s) "
               "until an SLO breaks or throughput stops growing, and reads the server's queue, prefill and decode "
               "times over each step: at what load it breaks, what it serves within the SLO, and why. Bounded by the "
               "time budget; saved to History. Live panels keep running; pause them for the cleanest numbers.")
    if ss.pop("dep_sweep_running", None):  # the last sweep did not reach its end: Cancel, or a widget changed
        partial = ss.get("dep_sweep_partial")
        st.warning("The last sweep was stopped; the steps it finished are shown"
                   + (" and saved in History." if partial else "."))
        if partial and not partial.get("recorded"):
            partial["recorded"] = True
            partial["result"].status, partial["result"].stopped = "cancelled", "Cancelled on the page."
            ss.dep_sweep = {**partial["result"].to_dict(),
                            "history_id": partial["result"].record(started_at=partial["started"])}
    with st.form("dep_sweep_form"):
        c = st.columns(4)
        mode = c[0].selectbox("Load", MODES, format_func={"concurrency": "clients at once",
                                                          "rate": "requests/s (Poisson)"}.get)
        steps_text = c[1].text_input("Steps", "auto",
                                     help="'auto', or a list such as 1,2,4,8 (clients) or 0.5,1,2 (req/s)")
        sweep_prompt = c[2].number_input("Prompt length (tokens)", 1, 8192, 128, key="dep_sweep_prompt")
        sweep_new = c[3].number_input("Tokens to generate", 1, 512, 32, key="dep_sweep_new")
        c = st.columns(4)
        slo_ttft = c[0].number_input("SLO: TTFT p99 (s, 0 = none)", 0.0, 600.0, 0.0, step=0.5)
        slo_itl = c[1].number_input("SLO: ITL p99 (s, 0 = none)", 0.0, 60.0, 0.0, step=0.05)
        budget = c[2].number_input("Time budget (s)", 10, 1800, 120, step=10)
        run_sweep = c[3].form_submit_button("Run sweep", type="primary")
    if run_sweep:
        bar, cancel = st.progress(0.0, "Starting the sweep"), st.empty()
        cancel.button("Cancel", key="dep_sweep_cancel")
        started = time.time()
        ss.dep_sweep_running, ss.dep_sweep_partial = True, None

        def keep(partial_result) -> None:  # what a Cancel leaves behind
            ss.dep_sweep_partial = {"result": partial_result, "started": started}

        try:
            result = sweep(base_url, mode, parse_steps(steps_text, mode), prompt_tokens=int(sweep_prompt),
                           max_new_tokens=int(sweep_new), slo_ttft_p99=slo_ttft or None, slo_itl_p99=slo_itl or None,
                           max_seconds=float(budget), api_key=api_key, engine=engine,
                           progress=throttled(lambda f, m: bar.progress(min(max(f, 0.0), 1.0), m)), on_step=keep)
            ss.dep_sweep = {**result.to_dict(), "history_id": result.record(started_at=started)}
            st.toast(f"Sweep finished: {result.verdict.get('kind')}")
        except TriageError as exc:
            st.error(markdown_literal(exc))
        ss.dep_sweep_running = False
        bar.empty()
        cancel.empty()

    if ss.get("dep_sweep"):
        show(ss.dep_sweep, "dep_sweep")
        compare_picker(ss.dep_sweep, "dep_sweep_cmp")
