"""Live monitor: GPU and host gauges and time series, read from the process-wide telemetry sampler.

The page never polls NVML or psutil itself: one sampler thread per process does (core/telemetry/sampler.py), and
every open tab only reads its ring buffer, so ten tabs cost what one does.
"""
import streamlit as st

from core import charts
from core.telemetry.base import BW_BOUND_PCT, BW_LIKELY_PCT, GPU_IDLE_UTIL_PCT, fmt
from core.telemetry.export import to_csv_bytes, to_parquet_bytes
from core.telemetry.sampler import get_sampler

GIB = 1024**3

sampler = get_sampler()
nvml_ok = sampler.availability("nvml")
nvml = sampler.source("nvml")
gpus = {g.index: g for g in nvml.gpus} if nvml_ok.ok and nvml is not None else {}

st.title("Live monitor")
top = st.columns([1, 1, 1, 3])
paused = top[0].toggle("Pause", key="monitor_paused", help="Freezes this page. The sampler keeps recording.")
window_s = top[1].selectbox("Window", [60, 300, 600], index=1, key="monitor_window",
                            format_func=lambda s: f"last {s // 60} min")
# Streamlit remounts a plotly chart whenever its figure changes, so each refresh redraws every chart: slower
# refresh is kinder to slow browsers and remote links.
refresh_s = top[2].selectbox("Refresh", [1, 2, 5], key="monitor_refresh", format_func=lambda s: f"every {s} s")
gpu = gpus[top[3].selectbox("GPU", list(gpus), key="monitor_gpu",
                            format_func=lambda i: f"GPU {i}: {gpus[i].name}")] if gpus else None

if not nvml_ok.ok:
    st.info(f"No GPU telemetry on this machine. {nvml_ok.reason} The host side below is live.")
elif gpu is not None:
    st.caption(f"{gpu.name} · compute capability {gpu.compute_capability or 'N/A'} · driver "
               f"{nvml.driver_version or 'N/A'} · CUDA (driver) {nvml.cuda_driver_version or 'N/A'} · "
               f"DRAM bandwidth from {'NVML GPM' if gpu.gpm.ok else 'N/A: ' + gpu.gpm.reason}")
    if gpu.lost:
        st.error(gpu.lost_reason)


@st.fragment(run_every=None if paused else refresh_s)
def live():
    snap = sampler.latest()
    v = snap.values

    def metric(col, label, key, source):
        value = v.get(key)
        col.metric(label, fmt(key, value), help=f"N/A: {snap.reason(key)}" if value is None else source)

    def chart(col, fig, key):
        col.plotly_chart(fig, key=key, config={"displayModeBar": False})

    p = f"gpu{gpu.index}." if gpu is not None else None
    avail, total = v.get("host.mem_available_bytes"), v.get("host.mem_total_bytes")
    gauges = [charts.gauge(None if avail is None else avail / GIB, "Host MemAvailable", source="psutil /proc/meminfo",
                           max_value=(total or GIB) / GIB, suffix=" GiB",
                           na_reason=snap.reason("host.mem_available_bytes"))]
    if p:
        used, total = v.get(p + "mem_used_bytes"), v.get(p + "mem_total_bytes")
        gauges[:0] = [
            charts.gauge(v.get(p + "util_pct"), "GPU util", source="NVML utilization.gpu",
                         bands=charts.util_bands(GPU_IDLE_UTIL_PCT), na_reason=snap.reason(p + "util_pct")),
            charts.gauge(v.get(p + "dram_bw_util_pct"), "DRAM BW util", source="NVML GPM DRAM_BW_UTIL",
                         bands=charts.bandwidth_bands(BW_LIKELY_PCT, BW_BOUND_PCT),
                         na_reason=snap.reason(p + "dram_bw_util_pct")),
            charts.gauge(None if used is None else used / GIB, "GPU memory used", source="NVML",
                         max_value=(total or GIB) / GIB, suffix=" GiB", na_reason=snap.reason(p + "mem_used_bytes"))]
    else:
        gauges.insert(0, charts.gauge(v.get("host.cpu_pct"), "Host CPU", source="psutil, all cores",
                                      na_reason=snap.reason("host.cpu_pct")))
    for i, (col, fig) in enumerate(zip(st.columns(4), gauges)):
        chart(col, fig, f"gauge{i}")

    if p:
        rows = [st.columns(5), st.columns(5)]
        for col, (label, field, source) in zip(rows[0] + rows[1], [
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
        rows[1][4].caption(f"Clock throttle reasons (NVML): **{fmt(key, v.get(key))}**",
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
    if p:
        s = sampler.series([p + k for k in ("util_pct", "dram_bw_util_pct", "sm_util_pct", "mem_busy_pct")], window_s)
        chart(t[0], charts.timeseries(s["t"], {"GPU util (NVML)": s[p + "util_pct"],
                                               "DRAM BW util (GPM)": s[p + "dram_bw_util_pct"],
                                               "SM util (GPM)": s[p + "sm_util_pct"],
                                               "memory busy (NVML, not BW)": s[p + "mem_busy_pct"]},
                                      title="GPU utilization", y_title="%", y_range=(0, 105),
                                      hlines=[(GPU_IDLE_UTIL_PCT, f"GPU idle < {GPU_IDLE_UTIL_PCT:.0f}%"),
                                              (BW_LIKELY_PCT, f"BW likely bound > {BW_LIKELY_PCT:.0f}%"),
                                              (BW_BOUND_PCT, f"BW bound > {BW_BOUND_PCT:.0f}%")]),
              "t_gpu")
    else:
        s = sampler.series(["host.cpu_pct"], window_s)
        chart(t[0], charts.timeseries(s["t"], {"host CPU (psutil)": s["host.cpu_pct"]}, title="Host CPU",
                                      y_title="%", y_range=(0, 105)), "t_cpu")
    keys = ["host.mem_available_bytes"] + ([p + "mem_used_bytes"] if p else [])
    s = sampler.series(keys, window_s)
    labels = ["host MemAvailable"] + ([f"GPU {gpu.index} memory used"] if p else [])
    mem = {label: [None if x is None else x / GIB for x in s[k]] for label, k in zip(labels, keys)}
    chart(t[1], charts.timeseries(s["t"], mem, title="Memory (a leak is a steady fall in MemAvailable)",
                                  y_title="GiB"), "t_mem")

    if p:
        procs = snap.tables.get(p + "processes") or []
        st.caption(f"Processes on GPU {gpu.index}: " + (", ".join(
            f"{x['name']} (PID {x['pid']}, {fmt('gpu_mem_bytes', x['gpu_mem_bytes'])})" for x in procs) or
            snap.reasons.get(p + "processes", "none")))
    st.caption("Sampler: {0.rate_hz:.0f} Hz asked, {0.achieved_hz:.1f} Hz achieved, {0.cpu_pct_of_core:.2f}% of one "
               "core ({0.cpu_ms_per_tick:.2f} ms CPU per tick), {0.buffered}/{0.capacity} rows buffered."
               .format(sampler.stats()))


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
