"""Long context: paste or upload a document, count its tokens, check the fit, size its KV cache, and time prefill and
decode on the loaded model. A stop (Cancel, a widget change, another page, a closed tab) reaches the engine, which
lets go between two prefill chunks; results finished before it stay on the page and in the history
(views/common/runs.py, core/long_context/history.py), drawn by views/common/long_context_view.py as History does.
"""
from pathlib import Path

import streamlit as st

from core import textfile
from core.engines.pool import Setup
from core.long_context import charts as lc
from core.long_context import document as longdoc
from core.long_context import runs as longrun
from core.models import ModelSpec, embedded_converted_dir
from core.precision import Precision
from views.common import inputs
from views.common import long_context_panels as lcp
from views.common import long_context_view as lcv
from views.common import runs as ui
from views.common import session

ss = st.session_state
st.title("Long context")
st.caption("Does a long input fit, how much KV cache does it need, how long until the first token, how fast after, "
           "and is a fact in the middle still used? Times are measured here, on this machine.")


@st.cache_resource(show_spinner="Reading the embedded model's tokenizer")
def embedded_tokenizer_only(model_dir: str):
    return longdoc.embedded_tokenizer_only(Path(model_dir))


setup, engine = session.current()
# The document's statistics and the KV calculator need a tokenizer and a config, not weights: without a loaded model
# they use the embedded model's, read from disk; only the timed runs wait for a load.
text_model = engine
if engine is None:
    model_dir = embedded_converted_dir()
    text_model = embedded_tokenizer_only(str(model_dir)) if model_dir else None
    needs = ("Token counts and the KV cache calculator use the embedded model's tokenizer and config; timed runs "
             "need a model chosen in this tab." if text_model else "Token counts and runs need one.")
    if session.offer_loaded_elsewhere():  # the sidebar lists the same models: both say what the process holds
        st.caption(needs)
    else:
        st.info("No model is loaded yet. " + needs)
    if st.button("Load the embedded model (Gemma 3 270M) at BF16", type="primary"):
        try:
            session.load_with_progress(Setup(ModelSpec("embedded"), Precision.BF16))
        except Exception as exc:  # any load failure: say so and stay on this page
            st.error(f"Loading failed: {exc}")
        else:
            st.rerun()
    if text_model is None:
        st.stop()
    model_label = text_model.label
else:
    model_label = session.headline(setup, engine)  # History titles: the short form; the full one goes in params
    session.show_setup(setup, engine, prefix="Model: ")
    st.caption(f"{engine.max_positions or 'unknown'} positions.")


SAMPLE_TOKENS = (256, 32000)


def set_sample():
    sample = inputs.Bounded("Sample size", *SAMPLE_TOKENS, ss.lc_sample_tokens)
    ss.lc_error = sample.problem
    if sample.problem is None:
        ss.lc_text = longdoc.sample_document(int(ss.lc_sample_tokens),
                                             lambda s: longdoc.count_tokens(text_model.tokenizer, s))


def read_upload():
    ss.lc_error = None
    if (f := ss.get("lc_file")) is not None:
        try:
            ss.lc_text = textfile.decode_bytes(f.getvalue(), f.name)
        except textfile.DocumentError as exc:
            ss.lc_error = f"{exc} The document box was not changed." if ss.get("lc_text") else str(exc)


left, right = st.columns([5, 2])
with right:  # the uploader enforces server.maxUploadSize itself; decode_bytes repeats the check for other callers
    # Any file is taken and checked here: a type filter in the browser refuses a .bin with a bare red "!"
    st.file_uploader(f"Upload a text file ({', '.join('.' + e for e in textfile.EXTENSIONS)})", key="lc_file",
                     on_change=read_upload)
    inputs.number("Sample size (tokens)", *SAMPLE_TOKENS, 2000, step=256, key="lc_sample_tokens")
    st.button("Build a sample document", on_click=set_sample, help="Prose, code and JSON from text this project ships")
text = left.text_area("Document", key="lc_text", height=230, placeholder="Paste a long document here")
if ss.get("lc_error"):
    st.error(ss.lc_error)
if not text.strip():
    st.info("Paste a document, upload a file or build a sample to see its tokens, KV cache and timings.")
    st.stop()


@st.cache_data(max_entries=4, show_spinner="Counting tokens")
def doc_stats(text, model, max_len, reserve):
    textfile.check_text(text)
    return longdoc.stats(text, text_model.tokenizer, text_model.max_positions, max_len, reserve,
                         len(longrun.bos(text_model)))


c = st.columns(3)
max_len_in = inputs.number("Configured max length (tokens)", 16, text_model.max_positions or 10**7,
                           text_model.max_positions or 32768, where=c[0], help="As vLLM's --max-model-len",
                           key="lc_max_len")
new_in = inputs.number("New tokens per run", 2, 1024, 16, where=c[1], key="lc_new")
if inputs.refused(max_len_in, new_in):
    st.stop()
max_len, new_tokens = int(max_len_in.value), int(new_in.value)
try:
    s = doc_stats(text, model_label, max_len, new_tokens)
except textfile.DocumentError as exc:
    st.error(str(exc))
    st.stop()
ui.metrics(longdoc.headline(s))
mode = "head" if s.fits else c[2].radio("Truncate", list(longdoc.TRUNCATIONS), format_func=longdoc.TRUNCATIONS.get)
ids, over = longdoc.fit(s, mode)
if over:
    st.warning(over)
st.plotly_chart(lc.section_tokens(s.sections), key="lc_sections", config=ui.NOBAR)

run_tokens = len(ids) + s.special_tokens + new_tokens  # after truncation: what a run here holds in its cache
lcp.kv_calculator(text_model.config, "loaded model" if engine is not None else "embedded model", run_tokens,
                  session.device())

if engine is None:
    st.info("Load a model (the button above, or the Model page) to time prefill and decode on this document.")
    st.stop()

stopped = ui.stopped_test()
filler, lim, n_prompt = ids or [0], max(s.limit, 256), len(ids) + s.special_tokens
doc = {"new_tokens": new_tokens, "document_chars": s.chars, "document_tokens": s.prompt_tokens,
       "truncation": mode if over else None, "device": engine.device.name,  # saved with each run: enough to reopen
       "setup": setup.ran_label(engine), "engine": engine.ran, "engine_short": engine.ran_short}


def hint(prompt_tokens: int) -> str | None:
    """How long the prompt passes should take, from this machine's recent prefill speed on this setup."""
    return ui.speed_hint("prefill", doc["setup"], prompt_tokens, "prompt tokens")


def results(test: str) -> None:
    if got := ui.results(test, stopped):
        lcv.draw(test, got, f"lc_{test}")


tabs = st.tabs(["Single run", "Length ramp", "Needle", "Batch 1/4/8"], key="lc_tabs")
with tabs[0]:
    if st.button(f"Run: prefill {n_prompt:,} tokens + {new_tokens} new", type="primary", key="lc_go_single"):
        ui.run("single", model_label, {**doc, "prompt_tokens": n_prompt}, engine, lambda p, keep: keep(
            longrun.run_once(engine, longrun.exact_prompt(engine, filler, n_prompt), new_tokens, progress=p)),
            hint(n_prompt))
    results("single")
with tabs[1]:
    steps = longrun.ramp_steps(lim)
    lengths = st.multiselect("Prompt lengths (tokens)", steps, steps[:3],
                             help="Cut from this document at exact lengths, repeated if it is shorter")
    if st.button("Run the ramp", type="primary", disabled=not lengths, key="lc_go_ramp"):
        ui.run("ramp", model_label, {**doc, "lengths": lengths}, engine,
               lambda p, keep: longrun.ramp(engine, filler, lengths, new_tokens, p, on_result=keep),
               hint(sum(lengths)))
    results("ramp")
with tabs[2]:
    cap = max(longrun.needle_max_tokens(engine, max_len) or 32768, 128)
    total = inputs.number("Prompt length (tokens)", 128, cap, min(1024, cap), key="lc_needle_tokens",
                          help="The answer is scored after the prompt, within the model's positions")
    st.caption(longrun.NEEDLE_NOTE)
    if st.button("Run the needle test", type="primary", key="lc_go_needle") and not inputs.refused(total):
        n = int(total.value)
        ui.run("needle", model_label, {**doc, "prompt_tokens": n}, engine, lambda p, keep: longrun.needle_test(
            engine, filler, n, progress=p, on_result=keep, max_length=max_len), hint(4 * n))
    results("needle")
with tabs[3]:
    bt = inputs.number("Prompt tokens per sequence", 16, lim, min(256, lim), key="lc_batch_tokens")
    if st.button("Run batch 1, 4 and 8", type="primary", key="lc_go_batch") and not inputs.refused(bt):
        n = int(bt.value)
        ui.run("batch", model_label, {**doc, "prompt_tokens": n, "batches": [1, 4, 8]}, engine, lambda p, keep:
               longrun.batch_sweep(engine, filler, n, new_tokens, progress=p, on_result=keep), hint(13 * n))
    results("batch")

lcp.h200_measurements(setup.kv_dtype.value, engine.device.name)
