"""vLLM deployment: connect to a running vLLM server, watch its /metrics like vLLM's Grafana dashboard, probe it.

Server-provided text (model names, versions, labels, error messages) is escaped before Streamlit renders it as
Markdown; the figures escape it themselves.
"""

import streamlit as st

from core.deployment import charts as dc
from core.deployment.observe import LivenessWatch
from core.deployment.probe import probe
from core.engines.factory import connect_remote
from core.errors import TriageError
from core.fmt import fmt_liveness, markdown_literal
from core.settings import settings
from core.telemetry.vllm_metrics import dashboard_row, scrape
from views.common import golden_view, local_servers, probe_view, recorded, sweep as sweep_view

REFRESH_S = 2.0
KEEP_ROWS = 300  # 10 minutes at 2 s
ss = st.session_state


def num(value, fmt: str = "{:.1f}", suffix: str = "") -> str:
    return "N/A" if value is None else fmt.format(value) + suffix


st.title("vLLM deployment")
st.caption("A running vLLM OpenAI server as an expert sees it: its own Prometheus metrics (/metrics) and the latency "
           "a client measures.")
rec = recorded.pick("sweep", "dep_source")
if rec is not None:  # a recorded load sweep of a real server, drawn as a sweep run here is; nothing live is contacted
    recorded.banner(rec)
    st.subheader("Load sweep")
    sweep_view.show(rec.payload, f"rec_{rec.name}")
    local_servers.recorded_remedies()
    st.stop()
local_servers.panel()
with st.form("dep_connect"):
    c = st.columns([4, 2, 1], vertical_alignment="bottom")
    url = c[0].text_input("Server base URL", ss.get("dep_url", settings().vllm_url))
    api_key = c[1].text_input("API key (only if started with --api-key)", type="password")
    if c[2].form_submit_button("Connect", type="primary"):
        try:
            engine = connect_remote(url, api_key=api_key or None)  # the probe and the sweep use it too
            info = engine.info
            ss.update(dep_engine=engine, dep_info=info, dep_url=info.base_url, dep_key=api_key or None, dep_rows=[], dep_prev=None,
                      dep_t0=None, dep_probe=None)
        except TriageError as exc:
            ss.dep_info = None
            st.error(markdown_literal(exc))

info = ss.get("dep_info")
if info is None:
    st.info("Enter the base URL of a vLLM OpenAI server (for example one started with `vllm serve MODEL --port 8000`) "
            "and connect. Only that URL is contacted; redirects are not followed.")
    st.stop()

st.caption(f"Connected to {markdown_literal(info.base_url)} · vLLM {markdown_literal(info.version or 'version unknown')} · "
           f"model {markdown_literal(', '.join(info.models))} · max_model_len {num(info.max_model_len, '{:d}')}")
if not info.is_vllm:
    st.warning("This server speaks the OpenAI API but does not say it is vLLM (no owned_by 'vllm', no /version). "
               "The metrics panels and token ids need vLLM.")

paused = st.toggle("Pause live panels", key="dep_paused", help=f"Panels refresh every {REFRESH_S:g} s from /metrics.")


@st.fragment(run_every=None if paused else REFRESH_S)
def liveness():
    """Serving, idle, stalled, degraded or checking, from core.deployment.liveness; the checks run on a thread of
    their own, because a stalled server's canary takes its whole timeout."""
    watch = ss.get("dep_watch")
    if watch is None or not watch.alive or watch.base_url != info.base_url:
        if watch is not None:
            watch.stop()
        watch = ss.dep_watch = LivenessWatch(info.base_url, ss.get("dep_key"), interval_s=REFRESH_S).start()
    v = watch.latest()
    if v is None:
        st.info("Liveness: checking (counters on /metrics, /health, a 1-token canary, the engine's processes)...")
        return
    show = {"serving": st.success, "idle": st.info, "stalled": st.error, "degraded": st.warning,
            "checking": st.info}[v.state]
    text = f"**Liveness: {fmt_liveness(v.state, v.kind).lower()}.** {markdown_literal(v.headline)}"
    show(text + (f"  \n**What to do:** {markdown_literal(v.remedy)}" if v.remedy else ""))
    st.caption("Evidence: " + markdown_literal("; ".join(f"{k} {val}" for k, val in v.evidence.items())))


liveness()


@st.fragment(run_every=None if paused else REFRESH_S)
def live():
    try:
        snap = scrape(info.base_url, timeout_s=5.0, api_key=ss.get("dep_key"))
    except TriageError as exc:
        st.warning(f"Could not read /metrics: {markdown_literal(exc)}")
        return
    if snap.logging_disabled:
        st.warning("This server answers /metrics but publishes no vllm:* series: it was started with "
                   "--disable-log-stats. Restart it without that flag to see its scheduler, KV cache and latency "
                   "metrics. The probe below still measures the client side.")
        return
    ss.dep_t0 = ss.get("dep_t0") or snap.t
    row = dashboard_row(snap, ss.get("dep_prev"), ss.dep_t0)
    ss.dep_prev = snap
    rows = ss.setdefault("dep_rows", [])
    rows.append(row)
    del rows[:-KEEP_ROWS]

    cfg = snap.cache_config
    st.caption("KV cache config (vllm:cache_config_info): " + markdown_literal(
        f"dtype {cfg.get('cache_dtype', 'N/A')}, block size {cfg.get('block_size', 'N/A')} tokens, "
        f"{cfg.get('num_gpu_blocks', 'N/A')} blocks, {cfg.get('kv_cache_size_tokens', 'N/A')} tokens, "
        f"prefix caching {cfg.get('enable_prefix_caching', 'N/A')}") if cfg else "vllm:cache_config_info: N/A")

    src = (lambda f: f"vLLM /metrics {snap.sources[f]}" if f in snap.sources else "not reported by this server")
    # Two rows (scheduler and cache, then throughput): seven in one row cut "3.6 tok/s" to "3.6 to…".
    m = st.columns(4) + st.columns(4)
    m[0].metric("Running", num(row["running"], "{:.0f}"), help=src("running"))
    m[1].metric("Waiting", num(row["waiting"], "{:.0f}"), help=src("waiting"))
    m[2].metric("KV cache usage", num(row["kv_cache_usage_pct"], suffix=" %"), help=src("kv_cache_usage"))
    m[3].metric("Preemptions", num(row["preemptions_total"], "{:.0f}"),
                delta=None if not row["preemptions_new"] else f"+{row['preemptions_new']:.0f}", delta_color="inverse",
                help=f"Total since start; {src('preemptions')}. Rising with KV usage near 100 %: cache too small.")
    m[4].metric("Generation", num(row["generation_tok_s"], suffix=" tok/s"),
                help=f"Rate between the last two scrapes of {src('generation_tokens')}")
    m[5].metric("Prompt", num(row["prompt_tok_s"], suffix=" tok/s"), help=f"Rate of {src('prompt_tokens')}")
    m[6].metric("Prefix cache hits", num(row["prefix_hit_pct_total"], suffix=" %"),
                help=f"Share of looked-up prompt tokens found cached, since start; {src('prefix_cache_hits')}")

    def chart(col, fig, key):
        col.plotly_chart(fig, key=key, config={"displayModeBar": False})

    c = st.columns(3)
    chart(c[0], dc.timeseries(rows, {"running": "running", "waiting": "waiting"}, "Scheduler state", "requests",
                              source="vllm:num_requests_running / _waiting"), "dep_sched")
    chart(c[1], dc.timeseries(rows, {"kv_cache_usage_pct": "KV cache usage"}, "KV cache usage", "%",
                              source=src("kv_cache_usage"), y_range=(0, 105)), "dep_kv")
    chart(c[2], dc.timeseries(rows, {"generation_tok_s": "generation", "prompt_tok_s": "prompt"}, "Token throughput",
                              "tokens/s", source="rate of vllm:*_tokens_total between scrapes"), "dep_tput")
    c = st.columns(3)
    chart(c[0], dc.latency_percentiles(row, "ttft", source=src("ttft")), "dep_ttft")
    chart(c[1], dc.latency_percentiles(row, "itl", source=src("itl")), "dep_itl")
    chart(c[2], dc.timeseries(rows, {"preemptions_total": "preemptions (total)",
                                     "prefix_hit_pct_recent": "prefix cache hit % (interval)"},
                              "Preemptions and prefix cache", "count / %",
                              source="vllm:num_preemptions_total, vllm:prefix_cache_hits/queries"), "dep_pre")


live()

st.subheader("Probe")
st.caption("Sends N streamed completions of exactly the chosen prompt length (each starts differently, so the prefix "
           "cache cannot shortcut the prefill) and sets the latency measured here beside the server's own histograms "
           "over the same window. Live panels pause while it runs.")
with st.form("dep_probe_form"):
    c = st.columns(4)
    n = c[0].number_input("Requests", 1, 64, 8)
    prompt_tokens = c[1].number_input("Prompt tokens", 1, 8192, 128)
    new_tokens = c[2].number_input("New tokens per request", 2, 512, 32)
    concurrency = c[3].number_input("Concurrent requests", 1, 16, 1)
    if st.form_submit_button("Probe", type="primary"):
        with st.spinner(f"Sending {n} requests to {markdown_literal(info.base_url)}"):
            try:
                ss.dep_probe = probe(info.base_url, int(n), int(prompt_tokens), int(new_tokens), int(concurrency),
                                     api_key=ss.get("dep_key"), engine=ss.get("dep_engine"))
                ss.dep_probe.record()
            except TriageError as exc:
                st.error(markdown_literal(exc))

res = ss.get("dep_probe")
if res is not None:
    probe_view.show(res.to_dict(), "dep_probe")

sweep_view.section(info.base_url, ss.get("dep_key"), ss.get("dep_engine"))
local_servers.remedy_section(info.base_url, ss.get("dep_key"))
golden_view.section(info.base_url, ss.get("dep_key"))
