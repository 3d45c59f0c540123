"""A precision comparison drawn the same way wherever it is shown: on the Precision compare page after it ran, and in
History when a saved comparison is reopened. Input is the saved form (core.compare.result.history_payload), so both
show exactly the same thing; a payload saved by an older version shows what it holds."""
from __future__ import annotations

import json

import streamlit as st

from core.compare import charts, render
from core.compare.agreement import (BAND_RULE, BANDED_METRICS, BROKEN, INCONCLUSIVE, KL_SOURCE_TEXT, LOW, NOT_JUDGED,
                                    not_judged)
from core.compare.result import CompareResult
from core.fmt import markdown_literal

NOBAR = {"displayModeBar": False}
# "calibration failed" is how older versions named the low band; their saved summaries still carry it.
STATUS = {"identical": st.success, "fine": st.success, "watch": st.warning, INCONCLUSIVE: st.info,
          LOW: st.error, "calibration failed": st.error, **{b: st.error for b in BROKEN}}
COLOUR = {"fine": "green", "watch": "orange", LOW: "red"}


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _summary_only(payload: dict, why: Exception) -> None:
    """A payload without the per-prompt data (saved by an older version, or cut short): its verdict and numbers."""
    s = payload.get("summary") or {}
    box = STATUS.get(s.get("status") or s.get("verdict_band"), st.info)
    box(markdown_literal(s.get("verdict") or "No verdict was saved with this comparison."))
    st.caption(markdown_literal(f"This comparison was saved without everything its full view needs ({why!r} is "
                                "missing or unreadable), so only its summary is shown; the raw JSON below has the "
                                "rest."))
    numbers = {k: v for k, v in s.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if numbers:
        st.dataframe([{"field": k, "value": v} for k, v in numbers.items()], hide_index=True)


def what_ran(res: CompareResult) -> None:
    """The full description of each side (engine, kernels, server), one click away from the short names."""
    with st.expander("What ran"):
        for role, side in (("Reference", res.reference), ("Candidate", res.candidate)):
            where = side.url or side.model or "(the server's model)"
            st.markdown(f"**{role}**: {markdown_literal(side.label)}  \n"
                        f"engine {markdown_literal(side.engine)} · {markdown_literal(where)}")


def numbers(res: CompareResult) -> None:
    """The headline metrics, banded where the seed's bands apply, and what they rest on. With a broken side each
    card says it judged nothing: an agreement with a broken side is no measure of the other."""
    s = res.summary
    # A band is coloured only when the verdict rests on it: not when the interval spans bands or a side broke.
    settled = s.status not in (INCONCLUSIVE, *BROKEN)
    why = not_judged(s.status)

    def card(col, label: str, value: str, help: str) -> None:
        if why:
            col.metric(label, NOT_JUDGED, delta=why.removeprefix(f"{NOT_JUDGED}: "), delta_color="off",
                       delta_arrow="off", help=f"{why.capitalize()}: measured {value} against it, which says nothing "
                       "about the other side.")
        else:
            col.metric(label, value, help=help)

    def banded(col, name: str, label: str, value: str) -> None:
        band = s.bands[name]
        if why:
            card(col, label, value, band.label)
            return
        col.metric(label, value, delta=band.name, delta_color=COLOUR.get(band.name, "off") if settled else "off",
                   delta_arrow="off", help=band.label)

    # Two rows of three: six columns truncated labels and KL values ("0.02…") in the browser. One row per way of
    # measuring, because free-running and teacher-forced numbers answer different questions.
    st.caption("Free-running: each side generates greedily on its own")
    m = st.columns(3)
    banded(m[0], "top3_match", "Top-3 token match (seed)", _fmt(s.top3_match, ".2f"))
    card(m[1], "Exact prefix", _fmt(s.exact_prefix_mean, ".1f") + " tok", "Mean tokens before the first "
         f"difference (free-running); position-wise top-1 agreement {_fmt(s.top1_agreement_free, '.2f')}")
    card(m[2], "vLLM rule", f"{s.vllm_passed}/{s.vllm_total} prompts", "check_logprobs_close: at the first "
         f"divergence, each side's token must be in the other's top-{res.top_k}")
    st.caption(f"Teacher-forced: both sides score the reference continuation ({s.positions} positions)")
    m = st.columns(3)
    banded(m[0], "same_top", "Same top token", _fmt(s.same_top and 100 * s.same_top, ".1f") + " %")
    card(m[1], "Mean KLD", _fmt(s.mean_kld, ".3g") + " nats", KL_SOURCE_TEXT[s.kl_source] + "; like "
         "llama.cpp's perplexity --kl-divergence (Q8_0 on Llama-3-8B: 0.00136)")
    card(m[2], "99th pct KLD", _fmt(s.p99_kld, ".3g") + " nats", f"Over all {s.positions} scored positions; "
         f"max {_fmt(s.max_kld, '.3g')} nats")
    st.caption(f"Bands ({BAND_RULE}) come from the seed and are applied only to "
               + " and ".join(BANDED_METRICS.values()) + "; when the 95% interval of the same top token share "
               "spans two bands, the verdict is inconclusive, and a run adds prompts in batches until it does not "
               "or its time budget is spent" + (f" ({res.scored_text})" if res.scored_text else "") + ". A side whose own logits are not finite, or whose "
               f"every output is one token repeated, is named as broken. Measured when it ran: {timing_text(res)}.")


def timing_text(res: CompareResult) -> str:
    """Where the run's time went, its total with the load in it: "total 58.0 s, of which load 35.3 s; generate ..."
    (the compare's own "total" timing starts after the load)."""
    t = {k: 0.0 for k in ("load", "reference_generate", "candidate_generate", "reference_score", "candidate_score",
                          "total")} | res.timings
    return (f"total {t['total'] + t['load']:.1f} s, of which load {t['load']:.1f} s; generate "
            f"{t['reference_generate']:.1f} s (reference) + {t['candidate_generate']:.1f} s (candidate), "
            f"teacher-forced scoring {t['reference_score']:.1f} s + {t['candidate_score']:.1f} s")


def show(payload: dict, key: str) -> None:
    """The verdict, the metrics, the per-prompt table, the side-by-side tokens, the charts and the downloads of one
    comparison. `key` prefixes every widget key, so two views can share a page."""
    try:
        res = CompareResult.from_dict(payload)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        _summary_only(payload, exc)
        return
    s = res.summary
    STATUS.get(s.status, st.info)(markdown_literal(s.verdict))
    floor = (payload.get("noise_floor_run") or {}).get("summary")
    if floor:
        ok = bool(floor.get("identical"))
        (st.caption if ok else st.warning)(("Noise floor: " if ok else "Noise floor NOT clean: ")
                                           + markdown_literal(floor.get("verdict", "")))
    what_ran(res)

    numbers(res)
    if not res.prompts:
        return
    why = not_judged(s.status)

    def number(label=None, format=None, width=None, help=None):
        # with a broken side the cells are text ("not judged"): a number column would show them empty
        if why:
            return st.column_config.TextColumn(label, width=width, help=help)
        return st.column_config.NumberColumn(label, format=format, width=width, help=help)

    if why:
        st.caption(f"Per prompt: {why}, so no agreement is shown.")
    # Widths for a laptop: ten columns, every one readable without scrolling sideways.
    st.dataframe(render.prompt_table(res), hide_index=True, width="stretch", key=f"{key}_table", placeholder="n/a",
                 column_config={
                     "prompt": st.column_config.TextColumn(width=110, pinned=True),
                     "tokens (ref/cand)": st.column_config.TextColumn("tokens", width=65),
                     "top-3 match": number(format="%.2f", width=80), "exact prefix": number(width=80),
                     "free top-1 agreement": number("free top-1", format="%.2f", width=80),
                     f"vLLM rule (top-{res.top_k})": st.column_config.TextColumn("vLLM rule", width=75),
                     "same top token %": number("same top %", format="%.1f", width=85),
                     f"top-{res.top_k} overlap": number(format="%.3f", width=90),
                     "mean KLD (nats)": number("mean KLD", format="%.3g", width=85,
                                               help="Teacher-forced, nats"),
                     "max KLD (nats)": number("max KLD", format="%.3g", width=80, help="Teacher-forced, nats")})
    # The diff opens on the prompt that parted first: the one a reader came to see, not an identical one.
    order = range(len(res.prompts))
    idx = st.selectbox("Prompt", order, index=render.most_divergent(res), key=f"{key}_prompt",
                       format_func=lambda i: render.prompt_choice(res.prompts[i], s.status),
                       help="Opens on the prompt with the lowest free-running top-1 agreement") \
        if len(res.prompts) > 1 else 0
    st.html(render.side_by_side_html(res, idx))
    if why:  # both charts plot agreement (KL, overlap, the seed's bands): none means anything against a broken side
        st.caption(f"Agreement charts: {why}. Each side's own tokens and top-k are in the outputs above.")
    else:
        c = st.columns([3, 2])
        c[0].plotly_chart(charts.position_chart(res, idx), key=f"{key}_pos", config=NOBAR)
        c[1].plotly_chart(charts.prompts_chart(res), key=f"{key}_prompts", config=NOBAR)
    c = st.columns(2)
    c[0].download_button("Download JSON", json.dumps(payload, indent=1), "precision_compare.json", "application/json",
                         on_click="ignore", key=f"{key}_json", icon=":material/download:")
    c[1].download_button("Download CSV (per position)", render.to_csv(res), "precision_compare.csv", "text/csv",
                         on_click="ignore", key=f"{key}_csv", icon=":material/download:")
