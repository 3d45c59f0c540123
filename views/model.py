"""Model page: pick a source, precision and KV cache dtype; load with progress; memory; a streaming prompt box."""
import streamlit as st

from core.engines.pool import DEFAULT_SETUP, Setup
from core.errors import TriageError
from core.fmt import fmt_bytes, fmt_s
from core.models import EMBEDDED, SYNTHETIC_CONFIGS, ModelError, ModelSpec, parse_model, shown_path
from core.precision import KVDtype, Precision
from core.speedup import display_row, measured_speedups, recorded_on, source_line
from views.common import session

st.title("Model")
st.caption("Load a model at a chosen precision, see where its memory goes, and time a prompt token by token.")

SOURCES = {
    "Embedded Gemma 3 270M": "embedded",
    "Hugging Face directory": "hf_dir",
    "GGUF file": "gguf",
    "Synthetic shape (random weights: speed and memory only)": "synthetic",
}

device = session.device()
st.info(f"Device: **{device.name}**" + (f", compute capability {device.cc_text}" if device.capability else "")
        + (f", {fmt_bytes(device.total_bytes)}" if device.total_bytes else ""), icon=":material/developer_board:")

with st.form("load"):
    c1, c2, c3 = st.columns([2, 1, 1])
    kind = SOURCES[c1.selectbox("Source", list(SOURCES))]
    precision = c2.selectbox("Precision", list(Precision), format_func=lambda p: p.label, index=1)
    kv_dtype = c3.selectbox("KV cache", list(KVDtype), format_func=lambda k: k.label)
    path = st.text_input("Model directory or .gguf path", placeholder="/models/my-model  or  /models/model.gguf",
                         help="Only for the directory and GGUF sources. Nothing is downloaded.")
    synthetic = st.selectbox("Synthetic shape", list(SYNTHETIC_CONFIGS), help="Only for the synthetic source.")
    submitted = st.form_submit_button("Load", type="primary")

if submitted or st.session_state.get("setup") is None:
    try:
        if submitted:
            spec = {"embedded": lambda: ModelSpec(EMBEDDED), "synthetic": lambda: ModelSpec("synthetic", synthetic)}.get(
                kind, lambda: parse_model(path))()
            if kind in ("hf_dir", "gguf") and spec.kind != kind:
                raise ModelError(f"{shown_path(path)} is not a {'GGUF file' if kind == 'gguf' else 'model directory'}.")
            setup = Setup(spec, precision, kv_dtype)
        else:  # first visit: the embedded model at BF16, so the console answers right away
            setup = DEFAULT_SETUP
        with st.status(f"Loading {setup.label}", expanded=True) as status:
            bar = st.progress(0.0)
            loaded = session.load(setup, progress=lambda f, msg: bar.progress(min(max(f, 0.0), 1.0), text=msg))
            status.update(label=f"Loaded {session.headline(setup, loaded)}", state="complete", expanded=False)
    except Exception as exc:  # noqa: BLE001 - every load failure is shown to the user, the app keeps running
        st.error(f"Could not load: {exc}")
        prev = st.session_state.get("setup")
        if prev:
            st.caption(f"Still loaded: {prev.label}")

setup, engine = session.current()
if engine is None:
    st.stop()
session.show_setup(setup, engine, prefix="Runs: ")

st.subheader("Memory")
memory_box = st.container()  # filled at the end of the script, so it includes a generation made on this run


def show_memory() -> None:
    try:
        mem = engine.memory_report()
    except TriageError as exc:  # unloaded by another session's load since this page got it
        memory_box.warning(str(exc))
        return
    cols = memory_box.columns(5)
    cols[0].metric("Weights", fmt_bytes(mem.weights_bytes), help=f"What {setup.precision.label} stores: each "
                   "parameter and buffer at its dtype's bytes, tied weights counted once (quantized linears at 8 or "
                   "4 bits with their scales; embeddings and lm_head stay at the base dtype). A linear repacked in "
                   "place for oneDNN counts here: same dtype, same bytes.")
    cols[1].metric("Runtime copies", fmt_bytes(mem.runtime_bytes), help="Held beside the weights only to run faster "
                   "on this machine (listed below): not part of what the precision stores.")
    cols[2].metric("KV cache (last run)", fmt_bytes(mem.kv_cache_bytes), help="Bytes held by the KV cache at the "
                   "end of the last generation on this model.")
    cols[3].metric("Peak (last run)", fmt_bytes(mem.peak_bytes), help=f"Source: {mem.peak_source}.")
    cols[4].metric("Device", mem.device)
    rows = [{"part": "weights", "dtype or copy": k, "bytes": v, "size": fmt_bytes(v)}
            for k, v in sorted(mem.weights_by_dtype.items(), key=lambda kv: -kv[1])]
    rows += [{"part": "runtime copy", "dtype or copy": k, "bytes": v, "size": fmt_bytes(v)}
             for k, v in sorted(mem.runtime_copies.items())]
    memory_box.dataframe(rows, hide_index=True)


# Recorded elsewhere (core/data): collapsed and captioned with where and when, so nobody reads it as this machine's.
speedups = measured_speedups(setup.kv_dtype.value)
if speedups:
    where, when = recorded_on()
    with st.expander(f"Decode speed by precision, recorded on an {where}: not this machine", expanded=False):
        st.caption(f"Measured on an {where} ({when}), not on this machine ({engine.device.name}).")
        mine = [r for r in speedups if r.get("precision") == setup.precision.value]
        if mine:
            st.markdown("This setup's precision there: " + ", ".join(
                f"batch {r['batch']}: **{r['speedup_vs_bf16']:.2f}x** BF16 ({r['tok_s']:.0f} tok/s)" for r in mine))
        st.dataframe([display_row(r) for r in speedups], hide_index=True)
        st.caption(source_line())

st.subheader("Prompt")
with st.form("prompt"):
    prompt = st.text_area("Prompt", "The capital of France is", height=100)
    c1, c2 = st.columns(2)
    max_new = c1.number_input("New tokens", min_value=1, max_value=1024, value=48)
    temperature = c2.number_input("Temperature (0 = greedy)", min_value=0.0, max_value=5.0, value=0.0, step=0.1)
    go = st.form_submit_button("Generate", type="primary")



def run_prompt() -> None:
    if not prompt.strip():
        st.warning("The prompt is empty: type some text first.")
        return
    out = st.empty()
    try:
        gen = session.stream_generate(engine, prompt, int(max_new), float(temperature),
                                      lambda text: out.code(text, language=None, wrap_lines=True))
    except TriageError as exc:
        st.error(str(exc))
        return
    if (warning := session.non_finite_warning(gen, setup)) is not None:
        st.warning(warning)
    t = gen.timing_summary()
    if session.record_generation(setup, engine, prompt, int(max_new), float(temperature), gen) is None:
        st.caption("This run could not be saved to History (see the server log).")
    cols = st.columns(4)
    cols[0].metric("TTFT", fmt_s(t["ttft_s"]), help="Request start to first token, measured here (prefill).")
    cols[1].metric("ITL median", fmt_s(t["itl_median_s"]), help="Median gap between consecutive tokens.")
    cols[2].metric("Decode", f"{t['decode_tok_s']:.1f} tok/s" if t["decode_tok_s"] else "N/A",
                   help="Tokens after the first, divided by their time.")
    cols[3].metric("Tokens", f"{t['prompt_tokens']} in / {t['new_tokens']} out")
    if t["itl_max_s"] and t["itl_median_s"] and t["itl_max_s"] > 2 * t["itl_median_s"]:
        st.caption(f"Decode tok/s counts every gap, the median ITL does not: 10% of the gaps were over "
                   f"{fmt_s(t['itl_p90_s'])} and the longest {fmt_s(t['itl_max_s'])}. Single long gaps are "
                   "usually the host (other work on its CPU), not the model.")


if go:
    run_prompt()
show_memory()
