"""Model page: pick a source, precision and KV cache dtype; load with progress; memory; a streaming prompt box."""
import time

import streamlit as st

from core.engines.pool import DEFAULT_SETUP, Setup
from core.errors import TriageError
from core.engines.base import Cancelled, InProcessEngine
from core.fmt import fmt_bytes, fmt_per_s
from core.models import EMBEDDED, SYNTHETIC_CONFIGS, ModelError, ModelSpec, parse_model, shown_path
from core.precision import KVDtype, Precision
from core.speedup import display_row, measured_speedups, recorded_here, recorded_on, source_line
from views.common import generate_view, inputs, runs, session
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
            loaded = session.load_with_progress(setup)
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
    here = "this machine's kind of GPU" if recorded_here() else "not this machine"
    with st.expander(f"Decode speed by precision, recorded on an {where}: {here}", expanded=False):
        st.caption(f"Measured on an {where} ({when}), {here} ({engine.device.name}).")
        mine = [r for r in speedups if r.get("precision") == setup.precision.value]
        if mine:
            st.markdown("This setup's precision there: " + ", ".join(
                f"batch {r['batch']}: **{r['speedup_vs_bf16']:.2f}x** BF16 ({fmt_per_s(r['tok_s'], 'tok')})"
                for r in mine))
        st.dataframe([display_row(r) for r in speedups], hide_index=True)
        st.caption(source_line())

st.subheader("Prompt")
with st.form("prompt"):
    prompt = st.text_area("Prompt", "The capital of France is", height=100)
    c1, c2 = st.columns(2)
    max_new = inputs.number("New tokens", 1, 1024, 48, where=c1, key="model_new_tokens")
    temperature = inputs.number("Temperature (0 = greedy)", 0.0, 5.0, 0.0, where=c2, key="model_temperature")
    go = st.form_submit_button("Generate", type="primary")


def run_prompt() -> None:
    if not prompt.strip():
        st.warning("The prompt is empty: type some text first.")
        return
    if inputs.refused(max_new, temperature):
        return
    n_new, temp = int(max_new.value), float(temperature.value)
    hint = runs.speed_hint("decode", setup.label, n_new, "tokens")
    progress = runs.RunProgress(f"Expected: {hint}" if hint else None)
    streamed, started = [""], time.time()

    def show(text: str) -> None:
        streamed[0] = text
        out.code(text, language=None, wrap_lines=True)

    def save_stopped(stopped_at: float) -> int | None:
        return session.record_stopped_generation(setup, engine, prompt, n_new, temp, streamed[0], started, stopped_at)

    try:
        with runs.stoppable(progress, button="model_stop", on_stop=save_stopped, key="model_run"):  # Stop under the bar
            out = st.empty()
            runs.wait_for_engine(engine, progress)
            if isinstance(engine, InProcessEngine):  # the clock ticks on the prompt's first chunk
                progress.step(0, len(engine.encode(prompt)), "prompt tokens", "Prefill")
            gen = session.stream_generate(engine, prompt, n_new, temp, show,
                                          on_token=lambda i: progress.step(i, n_new, "tokens", "Decode"))
            saved = session.record_generation(setup, engine, prompt, n_new, temp, gen)  # before the next page update
    except Cancelled:
        return  # the page reruns at once (the click or the widget change that stopped it) and says so
    except TriageError as exc:
        st.error(str(exc))
        return
    finally:
        progress.clear()
    if (warning := session.non_finite_warning(gen, setup)) is not None:
        st.warning(warning)
    if saved is None:
        st.caption("This run could not be saved to History (see the server log).")
    generate_view.timing(gen.timing_summary())


if (stopped := runs.last_stop("model_run")) is not None:
    st.warning("The last generation was stopped before its end: the engine was handed back at the stop and "
               + ("History has it as cancelled, with the text generated until then." if stopped["saved"] else
                  "it could not be saved to History (see the server log)."))
if go:
    run_prompt()
show_memory()
