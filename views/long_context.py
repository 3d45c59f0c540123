"""Long context: paste or upload a long document, count its tokens, check the fit, size its KV cache, and time
prefill and decode on the loaded model. Cancel works through Streamlit itself: the click reruns this script, which
stops the running one at its next progress update (every token); results finished before it are in session state.
"""
import streamlit as st

from core import kvcache as kv, longdoc, longdoc_charts as lc, longrun, session
from core.engines.base import Cancelled, EngineError
from core.models import ModelSpec
from core.precision import Precision

ss = st.session_state
NOBAR = {"displayModeBar": False}
st.title("Long context")
st.caption("Does a long input fit, how much KV cache does it need, how long until the first token, how fast after, "
           "and is a fact in the middle still used? Times are measured here, on this machine.")


def metrics(rows):
    for col, (label, value, hint) in zip(st.columns(len(rows)), rows):
        col.metric(label, value, help=hint or None)


setup, engine = session.current()
if engine is None:
    st.info("No model is loaded in this session; token counts and runs need one.")
    if st.button("Load the embedded model (Gemma 3 270M) at BF16", type="primary"):
        bar = st.progress(0.0, "Loading")
        try:
            session.load(session.Setup(ModelSpec("embedded"), Precision.BF16), lambda f, m: bar.progress(f, m))
        except Exception as exc:  # any load failure: say so and stay on this page
            st.error(f"Loading failed: {exc}")
        else:
            st.rerun()
    st.stop()
st.caption(f"Model: {setup.label}; {engine.max_positions or 'unknown'} positions.")


def set_sample():
    ss.lc_text = longdoc.sample_document(ss.lc_sample_tokens, lambda s: longdoc.count_tokens(engine.tokenizer, s))


def read_upload():
    ss.lc_error = None
    if (f := ss.get("lc_file")) is not None:
        try:
            ss.lc_text, ss.lc_error = longdoc.decode_bytes(f.getvalue(), f.name), None
        except longdoc.DocumentError as exc:
            ss.lc_error = str(exc)


left, right = st.columns([3, 1])
with right:  # the uploader enforces server.maxUploadSize itself; decode_bytes repeats the check for other callers
    st.file_uploader(f"Upload ({', '.join(longdoc.EXTENSIONS)})", type=list(longdoc.EXTENSIONS), key="lc_file",
                     on_change=read_upload)
    st.number_input("Sample size (tokens)", 256, 32000, 2000, 256, key="lc_sample_tokens")
    st.button("Build a sample document", on_click=set_sample, help="Prose, code and JSON from text this project ships")
text = left.text_area("Document", key="lc_text", height=230, placeholder="Paste a long document here")
if ss.get("lc_error"):
    st.error(ss.lc_error)
if not text.strip():
    st.info("Paste a document, upload a file or build a sample to see its tokens, KV cache and timings.")
    st.stop()


@st.cache_data(max_entries=4, show_spinner="Counting tokens")
def doc_stats(text, model, max_len, reserve):
    longdoc.check_text(text)
    return longdoc.stats(text, engine.tokenizer, engine.max_positions, max_len, reserve, len(longrun.bos(engine)))


c = st.columns(3)
max_len = c[0].number_input("Configured max length (tokens)", 16, engine.max_positions or 10**7,
                            engine.max_positions or 32768, help="As vLLM's --max-model-len", key="lc_max_len")
new_tokens = int(c[1].number_input("New tokens per run", 2, 1024, 16, key="lc_new"))
try:
    s = doc_stats(text, setup.label, int(max_len), new_tokens)
except longdoc.DocumentError as exc:
    st.error(str(exc))
    st.stop()
metrics(longdoc.headline(s))
ids = s.ids
if not s.fits:
    mode = c[2].radio("Truncate", list(longdoc.TRUNCATIONS), format_func=longdoc.TRUNCATIONS.get)
    ids, dropped = longdoc.truncate_ids(ids, s.limit - s.special_tokens, mode)
    st.warning(f"Over the limit: runs use {len(ids) + s.special_tokens:,} tokens, {dropped:,} dropped "
               f"({longdoc.TRUNCATIONS[mode]}).")
st.plotly_chart(lc.section_tokens(s.sections), key="lc_sections", config=NOBAR)

with st.expander("KV cache calculator (vLLM arithmetic)", expanded=True):
    k = st.columns(6)
    src = k[0].selectbox("Config", ["loaded model", *kv.BUILTIN_CONFIGS])
    config = engine.config if src == "loaded model" else kv.BUILTIN_CONFIGS[src]
    dtype = k[1].selectbox("KV dtype", list(kv.DTYPE_BYTES))
    block = k[2].number_input("Block size", 1, 256, kv.DEFAULT_BLOCK_SIZE, help="vLLM --block-size")
    tokens = k[3].number_input("Tokens", 1, 10**7, s.prompt_tokens + new_tokens, key=f"lc_kv_{s.tokens}_{new_tokens}")
    gpu = k[4].number_input("GPU memory (GiB)", 1.0, 1024.0, 80.0)
    est = round((kv.estimate_weight_bytes(config) or 0) / kv.GiB, 2)
    weights = k[5].number_input("Weights (GiB)", 0.0, 2048.0, est, key=f"lc_w_{src}",
                                help="Default: estimated from the config at 2 bytes per parameter")
    try:
        r = kv.report(kv.shape_from_config(config), dtype, int(tokens), int(block), gpu * kv.GiB, weights * kv.GiB,
                      gpu_memory_utilization=0.9)  # vLLM's default
    except kv.KVConfigError as exc:
        st.error(str(exc))
    else:
        metrics(kv.headline(r))
        capped = ", sliding-window layers capped at their window" if r.sliding_layers else ""
        st.caption(f"2 (K, V) x {r.layers} layers x {r.kv_heads} KV heads x head_dim {r.head_dim} x "
                   f"{kv.DTYPE_BYTES[dtype]} bytes per token{capped}. {r.note}")


def run(name, fn):
    """fn(progress, keep): every finished result goes through keep() into ss[name] at once, so a stop keeps it."""
    ss[name], ss.lc_running = [], name  # lc_running is still set on the next script run only if this one stopped
    bar, cancel = st.progress(0.0, "Starting"), st.empty()
    cancel.button("Cancel", key=f"cancel_{name}")
    try:
        fn(lambda f, msg: bar.progress(min(max(f, 0.0), 1.0), msg),
           lambda r: ss[name].append(r.to_dict() if hasattr(r, "to_dict") else r))
    except Cancelled:
        st.warning("Cancelled.")
    except (ValueError, EngineError) as exc:
        st.error(str(exc))
    bar.empty()
    cancel.empty()
    ss.lc_running = None


# Still set only if the last run did not reach its end. Its note goes inside its tab, so that the tabs keep their
# place on the page, and with it the selected tab.
stopped = ss.pop("lc_running", None)
STOPPED = "The last run was stopped (Cancel, or a widget changed while it ran); results finished before it are shown."
filler, lim, n_prompt = ids or [0], max(s.limit, 256), len(ids) + s.special_tokens
tabs = st.tabs(["Single run", "Length ramp", "Needle", "Batch 1/4/8"], key="lc_tabs")
with tabs[0]:
    if st.button(f"Run: prefill {n_prompt:,} tokens + {new_tokens} new", type="primary", key="lc_go_single"):
        run("lc_single", lambda p, keep: keep(longrun.run_once(
            engine, longrun.exact_prompt(engine, filler, n_prompt), new_tokens, progress=p)))
    if stopped == "lc_single":
        st.warning(STOPPED)
    for r1 in ss.get("lc_single", []):
        metrics(longrun.headline(r1))
        st.plotly_chart(lc.itl_histogram(r1), key="lc_itl", config=NOBAR)
        st.caption(f"KV cache held by the engine after the run: {kv.fmt_bytes(r1['kv_bytes'])} (measured).")
with tabs[1]:
    steps = [n for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if n <= lim]
    lengths = st.multiselect("Prompt lengths (tokens)", steps, steps[:3],
                             help="Cut from this document at exact lengths, repeated if it is shorter")
    if st.button("Run the ramp", type="primary", disabled=not lengths, key="lc_go_ramp"):
        run("lc_ramp", lambda p, keep: longrun.ramp(engine, filler, lengths, new_tokens, p, on_result=keep))
    if stopped == "lc_ramp":
        st.warning(STOPPED)
    if ss.get("lc_ramp"):
        st.plotly_chart(lc.ramp_chart(ss.lc_ramp), key="lc_ramp_chart", config=NOBAR)
        st.table([longrun.table_row(r) for r in ss.lc_ramp])
with tabs[2]:
    # engine.score computes logits at every prompt position (262144-wide for Gemma): 4 GiB at 8K tokens, so cap it
    total = st.number_input("Prompt length (tokens)", 128, min(lim, 8192), min(1024, lim))
    st.caption(f"Fact: \"{longrun.NEEDLE.format(answer=longrun.ANSWER.strip())}\" placed at the start, middle and "
               "end of this document; the answer is scored after a question, against a control without the fact.")
    if st.button("Run the needle test", type="primary", key="lc_go_needle"):
        run("lc_needle", lambda p, keep: longrun.needle_test(engine, filler, int(total), progress=p, on_result=keep))
    if stopped == "lc_needle":
        st.warning(STOPPED)
    if ss.get("lc_needle"):
        st.plotly_chart(lc.needle_chart(ss.lc_needle), key="lc_needle_chart", config=NOBAR)
        st.table([r.row() for r in ss.lc_needle])
with tabs[3]:
    bt = st.number_input("Prompt tokens per sequence", 16, lim, min(256, lim))
    if st.button("Run batch 1, 4 and 8", type="primary", key="lc_go_batch"):
        run("lc_batch", lambda p, keep: longrun.batch_sweep(engine, filler, int(bt), new_tokens, progress=p,
                                                            on_result=keep))
    if stopped == "lc_batch":
        st.warning(STOPPED)
    if ss.get("lc_batch"):
        st.plotly_chart(lc.batch_chart(ss.lc_batch), key="lc_batch_chart", config=NOBAR)
        st.table([longrun.table_row(r) for r in ss.lc_batch])
