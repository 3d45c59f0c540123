"""Diagnostics: the three-minute checklist, run automatically, with evidence, remedies and reports. A "Recorded"
switch (when recordings ship with the console) shows a real run captured on a GPU host instead, under its banner.

The run lives in a background job (diagnostics/job.py) so the progress bar moves and Cancel works while the window
runs; this page only reads widgets, starts the job and renders what it found. All logic is in diagnostics/.
"""
import streamlit as st

from core.errors import TriageError
from core.recordings import available
from core.telemetry.sampler import get_sampler
from diagnostics import job as jobs
from diagnostics.registry import all_checks
from diagnostics.runner import DEFAULT_S, MAX_S
from views.common import checklist_view, recorded

POLL_S = 0.5

st.session_state.setdefault("diag_job", None)
job = st.session_state["diag_job"]
running = job is not None and not job.done

st.title("Diagnostics")
st.caption(f"The three-minute checklist: samples GPU (NVML, GPM), host memory (psutil) and optionally a vLLM "
           f"server's /metrics for a window, then runs {len(all_checks())} checks. Each finding says what it saw, "
           "what it means and what to do; checks without their input are skipped and say which input is missing.")

rec = recorded.pick("checklist", "diag_data")
if rec is not None:  # a real run captured elsewhere, drawn alone: no form, no live job beside it
    recorded.banner(rec)
    checklist_view.show(rec.payload, f"rec-{rec.name}")
    st.stop()

nvml = get_sampler().availability("nvml")
if not nvml.ok:
    checklist_view.what_this_host_can_check(nvml.reason, recorded=bool(available("checklist")))

with st.form("diag_inputs", border=True):
    cols = st.columns([1, 2])
    duration = cols[0].slider("Window (seconds)", 5, int(MAX_S), int(DEFAULT_S), step=5,
                              help="How long to sample. Run it while the server is under its usual load.")
    url = cols[1].text_input("vLLM URL (optional)", placeholder="http://127.0.0.1:8000",
                             help="The server's base URL; its /metrics is scraped once a second.")
    launch = st.text_area("Launch command (optional)", height=80, placeholder="vllm serve MODEL --flag value ...",
                          help="Checked against vLLM's own argument parser; also read for FP8 and --enforce-eager.")
    golden = st.text_input("Golden set file (optional, with a vLLM URL)", placeholder="golden.json",
                           help="A golden set `python -m diagnostics golden record` wrote, or the deployment page's "
                                "Quality watch kept: replayed on the server after the window (golden.agreement).")
    submitted = st.form_submit_button("Run the checklist", type="primary", icon=":material/play_arrow:",
                                      disabled=running)

if submitted and not running:
    try:
        st.session_state["diag_job"] = job = jobs.start(duration, url or None, launch or None,
                                                           golden=golden.strip() or None)
        running = True
    except TriageError as exc:
        st.error(f"Cannot start: {exc}")


@st.fragment(run_every=POLL_S)
def progress_panel():
    j = st.session_state["diag_job"]
    if j is None:
        return
    if j.done:
        st.rerun()  # the whole page, so the results render below the form
    st.progress(min(max(j.fraction, 0.0), 1.0), text=j.message)
    if st.button("Cancel", icon=":material/stop:", help="End the window now; the checks run on what was sampled."):
        j.cancel.set()


if running:
    progress_panel()
elif job is not None and job.error:
    st.error(f"The checklist failed to run: {job.error}")
elif job is not None and job.result is not None:
    checklist_view.show(job.result.to_dict(), "diag", reports=job.reports)
