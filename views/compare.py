"""Precision compare: the same prompts through a reference and a candidate precision, side by side, with the
agreement measures experts use. Widgets -> core.compare.run -> views/common/compare_view.py (History draws a
saved comparison with it too)."""
import time

import streamlit as st

from core.compare.prompts import PROMPT_FILE_EXTENSIONS, default_prompts, parse_user_prompts, prompts_from_bytes
from core.compare.agreement import BROKEN
from core.compare.known import default_reference, known_failures, model_types
from core.compare.result import Side, history_payload, last_run_hint, save_stopped, save_to_history
from core.compare.run import BATCH_PROMPTS, DEFAULT_BUDGET_S, LIMITS, load_engine, run
from core import store
from core.engines.pool import Setup
from core.errors import InputError, TriageError
from core.fmt import markdown_literal
from core.models import parse_model
from core.precision import KVDtype, Precision
from views.common import compare_view, inputs, runs, session

ss = st.session_state


def loader(side: Side, progress):
    # Torch engines come from the shared pool, so the Model page and this page hold one copy of each setup.
    if side.engine != "torch":
        return load_engine(side, progress)
    return session.pooled(Setup(parse_model(side.model), side.precision, side.kv_dtype), progress)


def side_inputs(col, title: str, default: Precision, key: str, failures: dict[Precision, str]):
    col.markdown(f"**{title}**")
    prec = col.selectbox("Precision", list(Precision), index=list(Precision).index(default), key=f"{key}_prec",
                         format_func=lambda p: p.label + (" (fails on this model)" if p in failures else ""))
    kv = col.selectbox("KV cache", list(KVDtype), format_func=lambda k: k.label, key=f"{key}_kv")
    url = col.text_input("Server URL (optional)", key=f"{key}_url", placeholder="empty: in-process torch engine",
                         help="An OpenAI-compatible vLLM server already running at this precision and KV dtype; "
                              "the choices above then only label it.")
    return prec, kv, url.strip()


def number(col, name: str, value: int, help: str | None = None) -> inputs.Bounded:
    """A number box showing its allowed range (core.compare.run.LIMITS); an out-of-range value is refused in words
    when Compare is pressed."""
    label, lo, hi = LIMITS[name]
    return inputs.number(label, lo, hi, value, where=col, help=help, key=f"cmp_{name}")


st.title("Precision compare")
st.caption("Same prompts, two precisions, greedy decoding. Free-running outputs side by side, then both sides score "
           "the reference continuation teacher-forced for KL and top-token agreement. Token ids are compared, "
           "never strings.")
defaults = default_prompts()
failures = known_failures(ss.get("cmp_model") or "embedded")
if failures:
    kinds = ", ".join(f"`{k.replace('`', '')}`" for k in sorted(model_types(ss.get("cmp_model") or "embedded")))
    st.warning(f"Known to fail on this model ({kinds} in its config): "
               + "; ".join(f"**{p.label}**: {markdown_literal(why)}" for p, why in failures.items())
               + ". Such a side is marked in the lists below and is not the default reference.")
top = st.container()  # the run's progress and outcome, above the form
with st.form("cmp_form"):
    c = st.columns(2)
    ref_prec, ref_kv, ref_url = side_inputs(c[0], "Reference", default_reference(failures), "cmp_ref", failures)
    cand_prec, cand_kv, cand_url = side_inputs(c[1], "Candidate", Precision.FP8, "cmp_cand", failures)
    c = st.columns([3, 1, 1, 1, 1])
    chosen = c[0].multiselect("Built-in prompts", [p.name for p in defaults], default=[p.name for p in defaults],
                              help="Run in this order, in batches, until the verdict is decided.")
    max_new = number(c[1], "max_new_tokens", 32)
    top_k = number(c[2], "top_k", 8, help="Logprobs kept per position; vLLM's rule checks top-8.")
    budget = number(c[3], "budget_s", DEFAULT_BUDGET_S,
                    help=f"Prompts run in batches of {BATCH_PROMPTS} until the 95% interval of the same-top-token "
                         "share lies inside one band; the run stops before a batch that would end past this many "
                         "seconds (loads included) and then says how many more prompts would decide it.")
    model = c[4].text_input("Model", "embedded", key="cmp_model", help="embedded, an HF model directory or a .gguf "
                            "file")
    c = st.columns([3, 2])
    own = c[0].text_area("Your prompts, one per line (write \\n for a newline)", height=90)
    upload = c[1].file_uploader("or a prompts file (.txt, .jsonl, .json)", type=list(PROMPT_FILE_EXTENSIONS))
    noise = st.checkbox("Also run the noise floor (the reference against itself)",
                        help="1.0 and KL 0 when the engine repeats itself exactly, as the in-process engines do. A "
                             "vLLM server batches requests as they arrive, and on some CPUs and GPUs its kernels "
                             "round by batch shape, so near-ties can part: that is its real noise floor.")
    submitted = st.form_submit_button("Compare", type="primary")


def speed_key(ref: Side, cand: Side) -> str:
    """The setup whose recent speed (tokens compared a second, loads included) hints how long a run will take."""
    return f"{ref.model}:{ref.precision.value}/{ref.kv_dtype.value} vs {cand.precision.value}/{cand.kv_dtype.value}"


def compare_and_save(ref: Side, cand: Side, prompts: list, status) -> None:
    """Run the comparison (and the noise floor) under a progress bar that tells time and a stop that reaches the
    engine; keep and save the result."""
    started, partial = time.time(), {}
    progress = runs.RunProgress(f"Up to {budget.value:,} s: batches of prompts until the verdict is decided")
    for side, role in ((ref, "reference"), (cand, "candidate")):
        if side.engine == "torch" and side.precision in failures:
            st.warning(f"The {side.precision.label} {role} is known to fail on this model; the run goes ahead and "
                       "its verdict names the side that broke.")
    # no prefill counts: the bar counts prompts scored of those needed so far, at this run's own pace
    counted = dict(budget_s=budget.value, max_new_tokens=max_new.value, top_k=top_k.value, loader=loader,
                   progress=progress.fraction, on_batch=lambda r: partial.update(result=r))
    with runs.stoppable(button="cmp_stop", key="cmp_run", on_stop=lambda at: save_stopped(
            ref, cand, len(prompts), started, at, partial.get("result"))):
        result = run(ref, cand, prompts, on_prompts=lambda d, n, m: progress.step(d, n, "prompts", "Scored"),
                     **counted)
        floor = None
        if noise:
            partial["result"] = result  # a stop in the noise floor keeps the whole comparison
            floor = run(ref, ref, prompts, on_prompts=lambda d, n, m: progress.step(d, n, "prompts",
                                                                                 "Noise floor, scored"),
                        **{**counted, "on_batch": None})
    progress.clear()
    work = len(result.prompts) * max_new.value
    store.add_speed("compare", speed_key(ref, cand), work / max(time.time() - started, 1e-3))
    # Replaced together, so a failed run leaves the previous result and its history note as they were.
    ss.cmp_result, ss.cmp_payload = result, history_payload(result, floor)
    ss.cmp_saved = save_to_history(result, floor, started_at=started) or False
    sm = result.summary
    head = sm.status.capitalize() + (
        "" if sm.same_top is None or sm.status in BROKEN else f": same top token {100 * sm.same_top:.1f} %"
        + ("" if sm.mean_kld is None else f", mean KLD {sm.mean_kld:.3g} nats"))
    status.update(label=f"Compared {len(result.prompts)} prompts in {time.time() - started:.1f} s. {head}. The full result is below the form.",
                  state="complete", expanded=False)
    st.toast(f"Comparison done. {head}.", icon=":material/check_circle:")


if (stopped := runs.last_stop("cmp_run")) is not None:
    top.warning("The last comparison was stopped before its end: " + (
        "History has it as cancelled, with its sides and the batches of prompts it had scored (none when it stopped "
        "in its first batch)." if stopped["saved"] else "it could not be saved to History (see the server log)."))
if submitted and not inputs.refused(max_new, top_k, budget, where=top):
    try:
        prompts = [p for p in defaults if p.name in chosen] + parse_user_prompts(own)
        if upload is not None:
            prompts += prompts_from_bytes(upload.getvalue(), upload.name)
        if not prompts:
            raise InputError("Choose at least one built-in prompt or type your own.")
        # A server serves its own model: the model box is for the in-process engine.
        ref = Side(ref_prec, ref_kv, "" if ref_url else model, "remote" if ref_url else "torch", ref_url)
        cand = Side(cand_prec, cand_kv, "" if cand_url else model, "remote" if cand_url else "torch", cand_url)
        # The progress sits above the form, where the eye is when Compare is pressed: a run of minutes under load
        # must not look frozen.
        n = len(prompts)
        with top.status(f"Comparing up to {n} prompt{'s' * (n != 1)}, until decided or {budget.value:,} s…",
                        expanded=True) as status:
            compare_and_save(ref, cand, prompts, status)
    except TriageError as exc:
        top.error(f"The comparison did not run: {markdown_literal(exc)}")

if ss.get("cmp_payload") is None:
    last = last_run_hint()
    st.info("Pick two precisions and press Compare. The progress bar says how long it has run and, from the speed "
            "measured as it goes, how long is left" + (f"; {markdown_literal(last)}." if last else "."))
    st.stop()

st.divider()
compare_view.show(ss.cmp_payload, "cmp")
saved = ss.get("cmp_saved")
if saved:
    st.caption(f"Saved to History as run #{saved}.")
elif saved is False:
    st.caption("This comparison was not saved to History (the history database could not be written; the console's "
               "log says why). The downloads above still have it.")
