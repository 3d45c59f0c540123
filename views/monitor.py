"""Live monitor: GPU and host gauges and time series, read from the process-wide telemetry sampler.

The page never polls NVML or psutil itself: one sampler thread per process does (core/telemetry/sampler.py). What a
refresh draws is built once per moment and shared by every open tab (core/monitor/frames.py), and the refresh slows
down, saying so, when the tabs together would cost the server more than its budget (core/monitor/pacing.py).
"""
import time
import uuid

import streamlit as st

from core.monitor import charts
from core.monitor.frames import Frame, live_frame, recorded_frame
from core.monitor.pacing import get_pacer
from core.monitor.replay import RecordingFormatError, Replay
from core.fmt import fmt_field as fmt, markdown_literal
from core.telemetry.export import to_csv_bytes, to_parquet_bytes
from core.telemetry.sampler import get_sampler
from views.common import recorded


def draw(frame: Frame, gpu, n_gpus: int, *, bands=(), marker=None, elapsed=False) -> None:
    """One frame as the page shows it: all-GPU table, gauges, readings, host, trends, GPU processes. Shared by the
    live refresh and a recording's replay, so both look the same."""
    snap = frame.snapshot
    v = snap.values
    extra = {"bands": bands, "marker": marker, "elapsed": elapsed}

    def metric(col, label, key, source):
        value = v.get(key)
        col.metric(label, fmt(key, value), help=f"N/A: {snap.reason(key)}" if value is None else source)

    if frame.gpu_table_html:  # more than one GPU: all of them at once, then the chosen one in detail
        st.subheader(f"All {n_gpus} GPUs", anchor=False)
        st.markdown(frame.gpu_table_html, unsafe_allow_html=True)
        a, b = st.columns(2)
        a.vega_lite_chart(frame.util_by_gpu, charts.trend_spec("GPU util by GPU (NVML)", frame.gpu_labels,
                                                               y_title="%", y_range=(0, 105), **extra),
                          key="t_util_by_gpu", width="stretch")
        b.vega_lite_chart(frame.bw_by_gpu, charts.trend_spec("DRAM BW util by GPU (GPM)", frame.gpu_labels,
                                                             y_title="% of peak", y_range=(0, 105), **extra),
                          key="t_bw_by_gpu", width="stretch")
        st.subheader(f"GPU {gpu.index} in detail", anchor=False)
    # Gauges are inline SVG through st.markdown: st.html's sanitizer drops SVG.
    st.markdown(frame.gauges_html, unsafe_allow_html=True)
    p = f"gpu{gpu.index}." if gpu is not None else None
    if p:
        rows = [st.columns(4), st.columns(4), st.columns(4)]  # five in a row cut "1980 MHz" to "1980 …"
        for col, (label, field, source) in zip(rows[0] + rows[1] + rows[2], [
            ("Memory busy", "mem_busy_pct", "NVML utilization.memory: share of time memory was read or written. "
                                            "Not bandwidth."),
            ("SM util", "sm_util_pct", "NVML GPM SM_UTIL: share of SMs busy"),
            ("Power", "power_w", "NVML power usage"), ("Power limit", "power_limit_w", "NVML enforced limit"),
            ("Temperature", "temp_c", "NVML GPU die"),
            ("SM clock", "sm_clock_mhz", "NVML"), ("Mem clock", "mem_clock_mhz", "NVML"),
            ("PCIe TX", "pcie_tx_bytes_s", "GPU to host; NVML GPM, else NVML 20 ms counter"),
            ("PCIe RX", "pcie_rx_bytes_s", "host to GPU; NVML GPM, else NVML 20 ms counter")]):
            metric(col, label, p + field, source)
        key = p + "throttle_reasons"
        rows[2][1].caption(f"Clock throttle reasons (NVML): **{fmt(key, v.get(key))}**",
                           help=f"N/A: {snap.reason(key)}" if v.get(key) is None else None)
    h = st.columns(4) + st.columns(4)  # one row of eight cut values like "63 kB/s" to "63 k…"
    for col, (label, key) in zip(h, [("Host CPU", "host.cpu_pct"), ("Load 1 min", "host.load1"),
                                     ("Swap used", "host.swap_used_bytes"), ("Disk read", "host.disk_read_bytes_s"),
                                     ("Disk write", "host.disk_write_bytes_s"), ("Net RX", "host.net_rx_bytes_s"),
                                     ("Net TX", "host.net_tx_bytes_s")]):
        metric(col, label, key, "psutil")
    rss = sorted(k.split(".")[1] for k in v if k.startswith("proc.") and k.endswith(".rss_bytes"))
    for col, name in zip(st.columns(len(rss)) if rss else [], rss):
        metric(col, f"RSS {name} ({v.get(f'proc.{name}.count', 0)} proc)", f"proc.{name}.rss_bytes", "psutil, summed")

    t = st.columns(2)
    # Same spec every refresh (only the data changes), so the browser updates the charts in place.
    if p:
        t[0].vega_lite_chart(frame.util_trend, charts.trend_spec("GPU utilization", frame.util_labels, y_title="%",
                                                                 y_range=(0, 105), hlines=frame.util_hlines, **extra),
                             key="t_util", width="stretch")
    else:
        t[0].vega_lite_chart(frame.util_trend, charts.trend_spec("Host CPU", frame.util_labels, y_title="%",
                                                                 y_range=(0, 105), **extra), key="t_util",
                             width="stretch")
    t[1].vega_lite_chart(frame.mem_trend, charts.trend_spec("Memory (a leak is a steady fall in MemAvailable)",
                                                            frame.mem_labels, y_title="GiB", **extra),
                         key="t_mem", width="stretch")

    if p:
        procs = snap.tables.get(p + "processes") or []
        st.caption(f"Processes on GPU {gpu.index}: " + (", ".join(
            f"{x['name']} (PID {x['pid']}, {fmt('gpu_mem_bytes', x['gpu_mem_bytes'])})" for x in procs) or
            snap.reasons.get(p + "processes", "none")))


def utc_clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def show_recording(rec) -> None:
    """A monitor recording replayed: the same gauges, readings and trends as live, at a moment picked on a slider,
    over the whole recording with what ran when shaded."""
    recorded.banner(rec)
    try:
        first = Replay(rec.payload)
    except RecordingFormatError as exc:
        st.error(f"This recording cannot be replayed: {markdown_literal(exc)}")
        return
    rec_gpus = {g.index: g for g in first.source("nvml").gpus}
    c = st.columns([3, 2])
    length = int(first.end - first.start)
    at = c[0].slider("Moment shown by the gauges (seconds into the recording)", 0, length,
                     int(first.default_moment() - first.start), key=f"monitor_rec_at_{rec.name}")
    gpu = rec_gpus[c[1].selectbox("GPU in detail", list(rec_gpus), key=f"monitor_rec_gpu_{rec.name}",
                                  format_func=lambda i: f"GPU {i}: {rec_gpus[i].name}")] if rec_gpus else None
    replay = Replay(rec.payload, first.start + at)
    payload = rec.payload
    if gpu is not None:
        st.caption(f"{gpu.name} · compute capability {gpu.compute_capability or 'N/A'} · driver "
                   f"{payload.get('driver_version') or 'N/A'} · CUDA (driver) "
                   f"{payload.get('cuda_driver_version') or 'N/A'} · DRAM bandwidth from "
                   f"{'NVML GPM' if gpu.gpm.ok else 'N/A: ' + gpu.gpm.reason}")
    seg = replay.segment_at()
    st.markdown(f"**At {utc_clock(replay.now)} UTC ({at} s in):** " + (
        markdown_literal(seg["label"]) + (f", {seg['tokens_per_s']:,.0f} tokens/s over the phase"
                                          if seg.get("tokens_per_s") else "") if seg else "no load running"))
    segs = payload.get("segments") or []
    bands = [(s["start"] - first.start, s["end"] - first.start, s["label"].split(",")[0]) for s in segs]
    draw(recorded_frame(replay, None if gpu is None else gpu.index, first.end - first.start), gpu, len(rec_gpus),
         bands=bands, marker=replay.now - first.start, elapsed=True)
    phases = "; ".join(f"{s['label']}: {utc_clock(s['start'])}-{utc_clock(s['end'])} UTC"
                       + (f", {s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "") for s in segs)
    window = payload.get("checklist_window")
    st.caption(markdown_literal(
        f"What ran: {phases or 'nothing recorded'}."
        + (f" The checklist sampled {utc_clock(window['start'])}-{utc_clock(window['end'])} UTC (the Diagnostics "
           "page's recorded run)." if window else "")
        + f" Sampled at {payload.get('sampled_hz', 0):g} Hz by the console's sampler, kept at "
          f"{payload.get('replay_hz', 0):g} row/s." + "".join(f" {n}" for n in payload.get("notes") or [])))


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
    st.caption(f"{gpu.name} · compute capability {gpu.compute_capability or 'N/A'} · driver "
               f"{nvml.driver_version or 'N/A'} · CUDA (driver) {nvml.cuda_driver_version or 'N/A'} · "
               f"DRAM bandwidth from {'NVML GPM' if gpu.gpm.ok else 'N/A: ' + gpu.gpm.reason}")
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
