"""Quality: did quantizing break it? Perplexity of each precision over a document, and against a reference: KL
divergence (mean, median, p99, p99.9, max), same top token and RMS delta-p, beside memory and speed; the positions
where candidates differ most, tokens shown as text. Progress, a Stop button (its click reruns this script, which stops
the running one between two windows) and History as on the Long context page.
"""
import streamlit as st

from core import textfile
from core.engines.base import Cancelled
from core.errors import TriageError
from core.fmt import markdown_literal
from core.models import ModelSpec
from core.precision import COMPARED_BY_DEFAULT, Precision
from core.quality import charts, history, layers
from core.quality import run as quality
from core.speedup import display_row, measured_speedups, recorded_here, recorded_on, source_line
from core.compare.result import last_run_hint
from views.common import inputs, quality_view, runs, session

ss = st.session_state
STATIC = [f"fp8-static:{n}" for n in (32, 512, 4096)]
CHOICES = [p.value for p in Precision] + STATIC
STOPPED = ("The last quality run was stopped before its end (its Stop, a widget changed or the page left): History "
           "has it as cancelled, with the rows of the precisions it had finished.")

st.title("Quality")
st.caption("Perplexity and KL divergence of quantized precisions on your document, as llama.cpp's perplexity tool "
           "reports them: evaluated in windows of the model's context, against a reference precision. Every "
           "precision loads the embedded model (Gemma 3 270M) afresh on the torch engine and is unloaded after.")
top = st.container()  # a run's progress, Stop and outcome: at the top, where they stay in view


def read_upload():
    ss.q_error = None
    if (f := ss.get("q_file")) is not None:
        try:
            ss.q_text = textfile.decode_bytes(f.getvalue(), f.name)
            ss.q_doc_name = f.name
        except textfile.DocumentError as exc:
            ss.q_error = str(exc)


def use_sample():
    ss.q_text = textfile.source_text()
    ss.q_error, ss.q_doc_name = None, "shipped sample prose"


def pasted():
    ss.q_doc_name = "pasted document"


left, right = st.columns([5, 2])
with right:
    st.file_uploader(f"Upload ({', '.join(textfile.EXTENSIONS)})", type=list(textfile.EXTENSIONS), key="q_file",
                     on_change=read_upload)
    st.button("Use the shipped sample", on_click=use_sample, help="The prose this project ships (~1,170 tokens)")
text = left.text_area("Document", key="q_text", height=200, on_change=pasted, placeholder="Paste a document, upload one, or use the "
                                                                         "shipped sample")
if ss.get("q_error"):
    st.error(ss.q_error)

c = st.columns([1, 3, 1, 1])
reference = c[0].selectbox("Reference", [p.value for p in Precision], index=1, key="q_ref")
candidates = c[1].multiselect("Candidates", CHOICES, default=[p.value for p in COMPARED_BY_DEFAULT],
                                 key="q_cands")
window_in = inputs.number("Window (tokens)", *quality.WINDOW_RANGE, quality.DEFAULT_WINDOW, where=c[2], step=16,
                          key="q_window")
window = int(window_in.value)
# The stride's range is the window's: its label says so once, not a number that would change under the cursor.
stride = int(c[3].number_input("Stride (tokens) (1 to the window)", value=quality.DEFAULT_STRIDE, step=16,
                               key="q_stride", help="Tokens between window starts; every token is scored once, with "
                                                    "at least window - stride tokens of context"))
stride_in = inputs.Bounded("Stride (tokens)", 1, window, stride)
with st.expander("Calibration text (INT4 AWQ scales, FP8 static scales)"):
    calibration = st.text_area("Calibration text", key="q_calib", height=120,
                               placeholder="Empty: the shipped sample prose") or None

if runs.last_stop("q_run") is not None:
    top.warning(STOPPED)

pressed = st.button("Run quality", type="primary", disabled=not candidates, key="q_go")
if pressed and not inputs.refused(window_in, stride_in, where=top):
    ss.q_result, ss.q_warning = None, None
    with top:
        progress = runs.RunProgress("Starting: the bar counts each precision's windows")
    stop_box = top.container()
    note = top.empty()
    note.caption("The table appears below when the run ends.")
    try:
        textfile.check_text(text)
        ref = quality.parse_variant(reference)
        cands = [quality.parse_variant(x) for x in candidates]
        spec = ModelSpec("embedded")
        # the run loads its own eager engines, one at a time: the pool's (Model, Compare) go first, so the app
        # never holds both sets (the default compare then quality reached 4.3 GiB RSS with them kept)
        if released := session.release_idle():
            note.caption("The table appears below when the run ends. Unloaded for this run (reloaded when next "
                         "used): " + ", ".join(f"{s.model_short} {s.precision.label}" for s in released) + ".")
        name = ss.get("q_doc_name") or "pasted document"
        params = {"reference": ref.name, "candidates": [x.name for x in cands], "document": name,
                  "window": window, "stride": stride}
        # no prefill counts: the bar counts windows, each a prefill of its own
        with runs.stoppable(button="q_stop", where=stop_box, key="q_run"):
            out = history.run_recorded(spec.label, params, lambda keep: quality.run(
                spec, text, ref, cands, window=window, stride=stride, calibration=calibration,
                document_name=name, progress=progress.fraction, on_result=keep))
            if out.status == "cancelled":  # kept in History as cancelled; a stop, which the rerun it asked says
                raise Cancelled(out.message)
    except Cancelled:
        st.rerun()  # the stop's own rerun, which says where the run went
    except TriageError as exc:
        out = history.Outcome("failed", None, str(exc), None, None)
    progress.clear()
    note.empty()
    if out.message:
        (top.warning if out.status == "cancelled" else top.error)(out.message)
    else:
        top.success(f"Quality run done in {out.result['total_s']:.0f} s: the table is below"
                    + (f" (saved to History as run #{out.run_id})." if out.run_id else "."))
        st.toast("Quality run done: the table is below.", icon=":material/check_circle:")
    ss.q_result, ss.q_warning = out.result, out.warning

if ss.get("q_warning"):
    st.warning(ss.q_warning)
table_tab, layer_tab = st.tabs(["Quality table", "Which layer broke it"])
with table_tab:
    result = ss.get("q_result")
    if not result:
        last = last_run_hint("quality")
        st.info(f"Choose a document and the precisions, then Run quality (default window of {quality.DEFAULT_WINDOW} "
                "tokens). Each precision gets a verdict: fine, degraded or broken. The progress bar counts windows "
                "and says how long is left from the speed measured as it goes"
                + (f"; {markdown_literal(last)}." if last else "."))
    else:
        quality_view.show(result, "q")
    if speeds := measured_speedups():
        where, when = recorded_on()
        here = "this machine's kind of GPU" if recorded_here() else "not this machine"
        with st.expander(f"Decode speed by precision, recorded on an {where} ({when}): {here}"):
            st.caption(source_line())
            st.dataframe([display_row(r) for r in speeds], hide_index=True, key="q_h200")

with layer_tab:
    st.caption("Each linear layer's relative output error under each quantizer, against the unquantized model on the "
               "calibration text (256 tokens), with the activation statistics behind it. INT8 per-tensor is the "
               "baseline that per-channel weights and per-token activations improve on.")
    if st.button("Measure each layer", key="q_layers_go"):
        bar = st.progress(0.0, "Loading")
        base = Precision(reference)
        base = base if not (base.is_fp8 or base.is_int) else Precision.BF16
        try:
            ss.q_layers = layers.analyze(ModelSpec("embedded"), base, calibration,
                                         progress=lambda f, m: bar.progress(min(max(f, 0.0), 1.0), m))
        except TriageError as exc:
            st.error(str(exc))
        bar.empty()
    lay = ss.get("q_layers")
    if lay:
        summ = layers.summary(lay)
        st.caption(f"{summ['layers']} layers at {lay['base']} on {lay['tokens']} tokens ({lay['calibration']}). "
                   "Mean relative error: " + ", ".join(f"{q} {100 * v:.3f}%" for q, v in summ["mean_rel_error"].items())
                   + f". Per-channel INT8 beat per-tensor on {summ['per_channel_int8_better']} of {summ['layers']} "
                   f"layers; AWQ no worse than plain INT4 on {summ['awq_not_worse']}.")
        by = st.selectbox("Rank by", lay["quantizers"], index=lay["quantizers"].index("int4"), key="q_layers_by")
        st.dataframe(layers.ranked(lay, by, None), hide_index=True, key="q_layers_table")
        st.plotly_chart(charts.layer_heatmap(lay), key="q_heatmap", config={"displayModeBar": False})
        st.plotly_chart(charts.activation_histograms(lay, by), key="q_hist", config={"displayModeBar": False})
