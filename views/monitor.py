"""Live monitor: GPU and host gauges and time series, read from the process-wide telemetry sampler.

The page never polls NVML or psutil itself: one sampler thread per process does (core/telemetry/sampler.py). What a
refresh draws is built once per moment and shared by every open tab (core/monitor/frames.py), and the refresh slows
down, saying so, when the tabs together would cost the server more than its budget (core/monitor/pacing.py).
"""
import time
import uuid

import streamlit as st

from core.monitor.frames import live_frame
from core.monitor.pacing import get_pacer
from core.telemetry.export import to_csv_bytes, to_parquet_bytes
from core.telemetry.sampler import get_sampler
from views.common import recorded
from views.common.monitor_view import draw, gpu_caption, show_recording

st.title("Live monitor")
rec = recorded.pick("monitor", "monitor_source")
if rec is not None:  # a recording, never mixed with this machine's live readings: the sampler is not even started
    show_recording(rec)
    st.stop()

sampler = get_sampler()
nvml_ok = sampler.availability("nvml")
nvml = sampler.source("nvml")
gpus = {g.index: g for g in nvml.gpus} if nvml_ok.ok and nvml is not None else {}

top = st.columns([1, 1, 1, 3])
paused = top[0].toggle("Pause", key="monitor_paused", help="Freezes this page. The sampler keeps recording.")
window_s = top[1].selectbox("Window", [60, 300, 600], index=1, key="monitor_window",
                            format_func=lambda s: f"last {s // 60} min")
refresh_s = top[2].selectbox("Refresh", [1, 2, 5], key="monitor_refresh", format_func=lambda s: f"every {s} s")
gpu = gpus[top[3].selectbox("GPU in detail", list(gpus), key="monitor_gpu",
                            format_func=lambda i: f"GPU {i}: {gpus[i].name}")] if gpus else None

if not nvml_ok.ok:
    st.info(f"No GPU telemetry on this machine. {nvml_ok.reason} The host side below is live.")
elif gpu is not None:
    gpu_caption(gpu, nvml.driver_version, nvml.cuda_driver_version)
    if gpu.lost:
        st.error(gpu.lost_reason)


pacer = get_pacer()
viewer = st.session_state.setdefault("monitor_viewer", uuid.uuid4().hex)
if paused:
    pacer.forget(viewer)
pace = pacer.pace(refresh_s)


@st.fragment(run_every=None if paused else pace.interval_s)
def live():
    started, started_wall = time.thread_time(), time.perf_counter()
    frame = live_frame(sampler, None if gpu is None else gpu.index, window_s, tuple(gpus))
    draw(frame, gpu, len(gpus))
    st.caption("Sampler: {0.rate_hz:.0f} Hz asked, {0.achieved_hz:.1f} Hz achieved, {0.cpu_pct_of_core:.2f}% of one "
               "core ({0.cpu_ms_per_tick:.2f} ms CPU per tick), {0.buffered}/{0.capacity} rows buffered."
               .format(sampler.stats()))
    if paused:
        return
    pacer.record(viewer, time.thread_time() - started, time.perf_counter() - started_wall)
    now = pacer.pace(refresh_s)
    if now.slowed:
        st.warning(now.describe(), icon=":material/speed:")
    else:
        st.caption(now.describe())
    if now.interval_s != pace.interval_s:  # the interval is fixed when the fragment is declared: declare it again
        st.rerun()


live()

left, right = st.columns(2)
# The file is made on click (a callable), not on every rerun. Enabled only while paused: each live refresh ends
# with Streamlit deleting generated files that no element references, which cancels a download still in flight.
with left.container(horizontal=True):
    for label, make, name in (("CSV", to_csv_bytes, "telemetry.csv"),
                              ("Parquet", to_parquet_bytes, "telemetry.parquet")):
        st.download_button(f"Download buffer ({label})", lambda make=make: make(sampler.rows()), name,
                           on_click="ignore", icon=":material/download:", disabled=not paused,
                           help="Every buffered reading (up to the last 10 minutes), units in the column names. "
                                + ("" if paused else "Pause the page to download."))
with right.expander("Sampler settings (shared by every session)"):
    rates = [1, 2, 5, 10, 20]
    rate = st.select_slider("Sample rate (Hz)", rates, value=min(rates, key=lambda r: abs(r - sampler.stats().rate_hz)))
    if rate != sampler.stats().rate_hz:
        sampler.set_rate(rate)
    host = sampler.source("host")
    if host is not None:
        watch = st.text_input("Watch RSS of (PIDs or names, comma-separated; 'self' is this console)",
                              ", ".join(host.watch_specs))
        if [w.strip() for w in watch.split(",") if w.strip()] != host.watch_specs:
            host.watch(w for w in watch.split(",") if w.strip())
