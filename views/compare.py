"""Precision compare: the same prompts through a reference and a candidate precision, side by side, with the
agreement measures experts use. Widgets -> core.compare.run -> render."""
import json

import streamlit as st

from core.compare import charts, render
from core.compare.agreement import BANDED_METRICS, KL_SOURCE_TEXT
from core.compare.prompts import PROMPT_FILE_EXTENSIONS, default_prompts, parse_user_prompts, prompts_from_bytes
from core.compare.result import Side, save_to_history
from core.compare.run import load_engine, run
from core.engines.pool import Setup
from core.errors import InputError, TriageError
from core.fmt import markdown_literal
from core.models import parse_model
from core.precision import KVDtype, Precision
from views.common import session

ss = st.session_state
STATUS = {"identical": st.success, "fine": st.success, "watch": st.warning, "calibration failed": st.error}


def loader(side: Side, progress):
    # Torch engines come from the shared pool, so the Model page and this page hold one copy of each setup.
    if side.engine != "torch":
        return load_engine(side, progress)
    return session.pooled(Setup(parse_model(side.model), side.precision, side.kv_dtype), progress)


def side_inputs(col, title: str, default: Precision, key: str):
    col.markdown(f"**{title}**")
    prec = col.selectbox("Precision", list(Precision), index=list(Precision).index(default),
                         format_func=lambda p: p.label, key=f"{key}_prec")
    kv = col.selectbox("KV cache", list(KVDtype), format_func=lambda k: k.label, key=f"{key}_kv")
    url = col.text_input("Server URL (optional)", key=f"{key}_url", placeholder="empty: in-process torch engine",
                         help="An OpenAI-compatible vLLM server already running at this precision and KV dtype; "
                              "the choices above then only label it.")
    return prec, kv, url.strip()


st.title("Precision compare")
st.caption("Same prompts, two precisions, greedy decoding. Free-running outputs side by side, then both sides score "
           "the reference continuation teacher-forced for KL and top-token agreement. Token ids are compared, "
           "never strings.")
defaults = default_prompts()
with st.form("cmp_form"):
    c = st.columns(2)
    ref_prec, ref_kv, ref_url = side_inputs(c[0], "Reference", Precision.FP32, "cmp_ref")
    cand_prec, cand_kv, cand_url = side_inputs(c[1], "Candidate", Precision.FP8, "cmp_cand")
    c = st.columns([3, 1, 1, 1])
    chosen = c[0].multiselect("Built-in prompts", [p.name for p in defaults], default=[p.name for p in defaults])
    max_new = c[1].number_input("Max new tokens", 1, 512, 32)
    top_k = c[2].number_input("Top-k", 1, 20, 8, help="Logprobs kept per position; vLLM's rule checks top-8.")
    model = c[3].text_input("Model", "embedded", help="embedded, an HF model directory or a .gguf file")
    c = st.columns([3, 2])
    own = c[0].text_area("Your prompts, one per line (write \\n for a newline)", height=90)
    upload = c[1].file_uploader("or a prompts file (.txt, .jsonl, .json)", type=list(PROMPT_FILE_EXTENSIONS))
    noise = st.checkbox("Also run the noise floor (the reference against itself)",
                        help="1.0 and KL 0 when the engine repeats itself exactly, as the in-process engines do. A "
                             "vLLM server batches requests as they arrive, and on some CPUs and GPUs its kernels "
                             "round by batch shape, so near-ties can part: that is its real noise floor.")
    submitted = st.form_submit_button("Compare", type="primary")

if submitted:
    try:
        prompts = [p for p in defaults if p.name in chosen] + parse_user_prompts(own)
        if upload is not None:
            prompts += prompts_from_bytes(upload.getvalue(), upload.name)
        if not prompts:
            raise InputError("Choose at least one built-in prompt or type your own.")
        # A server serves its own model: the model box is for the in-process engine.
        ref = Side(ref_prec, ref_kv, "" if ref_url else model, "remote" if ref_url else "torch", ref_url)
        cand = Side(cand_prec, cand_kv, "" if cand_url else model, "remote" if cand_url else "torch", cand_url)
        with st.status(f"Comparing {len(prompts)} prompts…", expanded=True) as status:
            bar = st.progress(0.0)
            step = lambda f, m: bar.progress(min(max(f, 0.0), 1.0), text=m)  # noqa: E731
            result = run(ref, cand, prompts, max_new_tokens=int(max_new), top_k=int(top_k), progress=step,
                         loader=loader)
            floor = None
            if noise:
                floor = run(ref, ref, prompts, max_new_tokens=int(max_new), top_k=int(top_k),
                            progress=lambda f, m: step(f, f"Noise floor: {m}"), loader=loader)
            # Replaced together, so a failed run leaves the previous result and its history note as they were.
            ss.cmp_result, ss.cmp_noise = result, floor
            ss.cmp_saved = save_to_history(result, floor) or False
            status.update(label=f"Compared in {ss.cmp_result.timings['total']:.1f} s", state="complete",
                          expanded=False)
    except TriageError as exc:
        st.error(f"The comparison did not run: {markdown_literal(exc)}")

res = ss.get("cmp_result")
if res is None:
    st.info("Pick two precisions and press Compare. On an idle 2-core CPU the built-in prompts take about 17 s for "
            "FP32 against FP8 W8A8, once both are loaded (measured in docs/PERFORMANCE.md).")
    st.stop()

s = res.summary
STATUS.get(s.status, st.info)(markdown_literal(s.verdict))
noise_res = ss.get("cmp_noise")
if noise_res is not None:
    ok = noise_res.summary.identical
    (st.caption if ok else st.warning)(("Noise floor: " if ok else "Noise floor NOT clean: ") + markdown_literal(noise_res.summary.verdict))
fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
COLOUR = {"fine": "green", "watch": "orange", "calibration failed": "red"}


def banded(col, key: str, label: str, value: str) -> None:
    band = s.bands[key]
    col.metric(label, value, delta=band.name, delta_color=COLOUR.get(band.name, "off"), delta_arrow="off",
               help=band.label)


# Two rows of three: six columns truncated labels and KL values ("0.02…") in the browser. One row per way of
# measuring, because free-running and teacher-forced numbers answer different questions.
st.caption("Free-running: each side generates greedily on its own")
m = st.columns(3)
banded(m[0], "top3_match", "Top-3 token match (seed)", fmt(s.top3_match, ".2f"))
m[1].metric("Exact prefix", fmt(s.exact_prefix_mean, ".1f") + " tok", help="Mean tokens before the first difference "
            f"(free-running); position-wise top-1 agreement {fmt(s.top1_agreement_free, '.2f')}")
m[2].metric("vLLM rule", f"{s.vllm_passed}/{s.vllm_total} prompts", help="check_logprobs_close: at the first "
            f"divergence, each side's token must be in the other's top-{res.top_k}")
st.caption(f"Teacher-forced: both sides score the reference continuation ({s.positions} positions)")
m = st.columns(3)
banded(m[0], "same_top", "Same top token", fmt(s.same_top and 100 * s.same_top, ".1f") + " %")
m[1].metric("Mean KLD", fmt(s.mean_kld, ".3g") + " nats", help=KL_SOURCE_TEXT[s.kl_source] + "; like llama.cpp's "
            "perplexity --kl-divergence (Q8_0 on Llama-3-8B: 0.00136)")
m[2].metric("99th pct KLD", fmt(s.p99_kld, ".3g") + " nats", help=f"Over all {s.positions} scored positions; "
            f"max {fmt(s.max_kld, '.3g')} nats")
t = {k: 0.0 for k in ("load", "reference_generate", "candidate_generate", "reference_score", "candidate_score",
                      "total")} | res.timings
st.caption("Bands (>= 0.92 fine, 0.85-0.92 watch, < 0.85 calibration failed) come from the seed and are applied only to "
           + " and ".join(BANDED_METRICS.values()) + f". Measured here: load {t['load']:.1f} s, generate "
           f"{t['reference_generate']:.1f} s (reference) + {t['candidate_generate']:.1f} s (candidate), teacher-forced "
           f"scoring {t['reference_score']:.1f} s + {t['candidate_score']:.1f} s, total {t['total']:.1f} s.")

number = st.column_config.NumberColumn
st.dataframe(render.prompt_table(res), hide_index=True, width="stretch", column_config={
    "top-3 match": number(format="%.2f"), "free top-1 agreement": number(format="%.2f"),
    "same top token %": number(format="%.1f"), f"top-{res.top_k} overlap": number(format="%.3f"),
    "mean KLD (nats)": number(format="%.3g"), "max KLD (nats)": number(format="%.3g")})
names = [p.name for p in res.prompts]
idx = names.index(st.selectbox("Prompt", names, key="cmp_prompt")) if len(names) > 1 else 0
st.html(render.side_by_side_html(res, idx))
c = st.columns([3, 2])
c[0].plotly_chart(charts.position_chart(res, idx), key="cmp_pos", config={"displayModeBar": False})
c[1].plotly_chart(charts.prompts_chart(res), key="cmp_prompts", config={"displayModeBar": False})
saved = ss.get("cmp_saved")
if saved:
    st.caption(f"Saved to History as run #{saved}.")
elif saved is False:
    st.caption("This comparison was not saved to History (the history database could not be written; the console's "
               "log says why). The downloads below still have it.")
c = st.columns(2)
c[0].download_button("Download JSON", json.dumps(res.to_dict(), indent=1), "precision_compare.json", "application/json")
c[1].download_button("Download CSV (per position)", render.to_csv(res), "precision_compare.csv", "text/csv")
