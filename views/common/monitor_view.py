"""The Live monitor page's drawing (views/monitor.py): one frame of gauges, readings and trends, drawn the same way
for the live refresh and for a recording's replay, and the replay itself (core/monitor/replay.py)."""
from __future__ import annotations

import time

import streamlit as st

from core.fmt import fmt_field as fmt, markdown_literal
from core.monitor import charts
from core.monitor.frames import Frame, recorded_frame
from core.monitor.replay import RecordingFormatError, Replay
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


def gpu_caption(gpu, driver: str | None, cuda_driver: str | None) -> None:
    """The chosen GPU's identity line, live (from NVML) and replayed (from the recording) alike."""
    st.caption(f"{gpu.name} · compute capability {gpu.compute_capability or 'N/A'} · driver {driver or 'N/A'} · "
               f"CUDA (driver) {cuda_driver or 'N/A'} · DRAM bandwidth from "
               f"{'NVML GPM' if gpu.gpm.ok else 'N/A: ' + gpu.gpm.reason}")


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
        gpu_caption(gpu, payload.get("driver_version"), payload.get("cuda_driver_version"))
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
