"""The quality watch on a page (core.compare.golden): a golden set and a watch round drawn from what History saved
(the set's source and noise floor with its prompts; each replica's verdict with its numbers and any drift), and the
vLLM deployment page's section that records a golden set from the connected server and replays it there."""
from __future__ import annotations

import json
import time

import streamlit as st

from core.compare.golden.golden import GoldenSet, source_line
from core.compare.golden.replay import ReplicaRound
from core.compare.golden.watch import noise_floor_line, replica_line, threshold_line
from core.engines.base import Cancelled
from core.errors import TriageError
from core.fmt import fmt_utc, markdown_literal, short_path
from core.settings import settings
from views.common import runs

ss = st.session_state


def show_record(doc: dict, key: str) -> None:
    """A golden set: what produced it, its noise floor, and per prompt the lengths it holds."""
    recorded = fmt_utc(doc.get("recorded_at") or None, unknown="unknown time")
    st.markdown(markdown_literal(f"Golden set recorded {recorded}: {source_line(doc)}."))
    st.caption(markdown_literal("Noise floor (the reference replayed on itself right after recording): "
                                + noise_floor_line(doc.get("noise_floor"))))
    rows = [{"prompt": p.get("name", ""), "prompt tokens": len(p.get("prompt_ids") or []),
             "golden tokens": len(p.get("ids") or []), "text": (p.get("text") or "")[:120]}
            for p in doc.get("prompts") or []]
    st.dataframe(rows, hide_index=True, width="stretch", key=f"{key}_prompts")
    st.caption("Watch replicas against it: `python -m diagnostics golden watch --golden FILE --url URL` "
               "(the file the record wrote; History keeps this copy for reading).")


def show_watch(doc: dict, key: str) -> None:
    """One round: each replica's verdict with its numbers (a replica without an answer, or a broken one whose numbers
    vLLM could not send, has "-" and says why in its line below), its drift, the round's cost."""
    replicas = [ReplicaRound(**r) for r in doc.get("replicas") or []]
    fine = sum(r.status == "fine" for r in replicas)
    started = fmt_utc(doc.get("started_at") or None, unknown="unknown time")
    st.markdown(markdown_literal(f"Round {doc.get('round')} at {started}: {fine} of {len(replicas)} replicas fine."))
    rows = []
    for r in replicas:
        s = r.summary or {}
        rows.append({"replica": r.url, "status": r.status,
                     "same top token": "-" if s.get("same_top") is None else f"{100 * s['same_top']:.1f}%",
                     "mean KLD (nats)": "-" if s.get("mean_kld") is None else f"{s['mean_kld']:.3g}",
                     "p99 KLD (nats)": "-" if s.get("p99_kld") is None else f"{s['p99_kld']:.3g}",
                     "tokens": f"{(r.tokens or {}).get('total', 0):,}", "seconds": f"{r.seconds:.1f}",
                     "drift": "yes" if r.drift else ""})
    st.dataframe(rows, hide_index=True, width="stretch", key=f"{key}_replicas")
    for r in replicas:
        if r.drift:
            st.warning(markdown_literal(f"{r.url}: {r.drift}"))
    for r in replicas:
        st.text(replica_line(r))
    st.caption(markdown_literal(f"Cost: {doc.get('tokens', 0):,} tokens this round, {doc.get('seconds', 0.0):.1f} s; "
                                + threshold_line(doc.get("noise") or {}) + "."))


def _keep(golden: GoldenSet, source: str) -> None:
    """Hold `golden` for this page's rounds (a new set starts a new watch: drift is judged against one set)."""
    from core.compare.golden.watch import Watch

    ss.gold_set, ss.gold_source, ss.gold_round = golden, source, None
    ss.gold_watch = Watch(golden, [])


def _record(base_url: str, api_key: str | None, prompts: int, new_tokens: int) -> None:
    from core.compare.golden.record import history, record
    from core.compare.prompts import default_prompts

    t0 = time.time()
    with st.spinner(f"Recording {prompts} prompts x {new_tokens} tokens from {base_url}, then replaying them there "
                    "for the noise floor"), runs.stoppable(button="gold_stop", key="gold_record_run") as control:
        golden = record(base_url, default_prompts()[:prompts], max_new_tokens=new_tokens, api_key=api_key)
        if control.stop_asked():  # a stop cuts the streams short: what came back is no golden set
            raise Cancelled("Stopped on the page.")
    folder = settings().cache_dir / "golden"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{golden.model.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t0))}.json"
    golden.save(path)
    history(golden, str(path), t0)
    _keep(golden, str(path))


def _round(base_url: str, api_key: str | None, prompts: int) -> None:
    watch = ss.gold_watch
    watch.urls, watch.api_key = [base_url], api_key
    last, number = dict(watch.last), watch.number
    with st.spinner(f"Round {watch.number + 1}: replaying {prompts} prompts on {base_url}"), \
            runs.stoppable(button="gold_round_stop", key="gold_round_run") as control:
        rnd = watch.step()
        if control.stop_asked():  # a stop closes the replay's streams: the replica did answer, it was cut short
            watch.last, watch.number = last, number  # a cut round is no baseline for the next one's drift
            raise Cancelled("Stopped on the page.")
    rnd.record(ss.gold_source)
    ss.gold_round = rnd.to_dict()


def _upload() -> None:
    f = ss.get("gold_file")
    if f is None:
        return
    try:
        _keep(GoldenSet.from_dict(json.loads(f.getvalue()), f.name), f.name)
    except TriageError as exc:  # JSON, but no golden set this console reads (an InputError is a ValueError too)
        ss.gold_error = str(exc)
    except (ValueError, UnicodeDecodeError) as exc:  # not JSON at all
        ss.gold_error = f"{f.name} could not be read as JSON ({exc}). Upload a file `golden record` wrote."


def section(base_url: str, api_key: str | None) -> None:
    """Record a golden set from the connected server (or upload one), replay it there round after round: each round
    judged against the set with the compare's bands, drift named against the previous round, saved to History."""
    st.subheader("Quality watch")
    st.caption("Is this server still answering right? Record its greedy answers to built-in prompts with their top-k "
               "logprobs (a golden set), then replay them here later, after a restart, an upgrade or a new flag: each "
               "round is judged token by token against the set, and a change beyond the noise floor is named as drift. "
               "Requests are tagged user=triage-golden; other checks count them as the console's own.")
    if ss.get("gold_error"):
        st.error(markdown_literal(ss.pop("gold_error")))
    # a Stop reruns the page at once: the rerun says what the stop left
    if runs.last_stop("gold_record_run") is not None:
        st.info("Recording stopped: no golden set was kept, and its requests to the server were closed.")
    if runs.last_stop("gold_round_run") is not None:
        st.info("Round stopped: nothing was saved, and the next round's drift is judged against the last whole round.")
    golden: GoldenSet | None = ss.get("gold_set")
    with st.form("gold_record_form"):
        c = st.columns([1, 1, 2], vertical_alignment="bottom")
        prompts = c[0].number_input("Built-in prompts", 1, 48, 8, help="The first N of the compare's 48 built-in "
                                    "prompts; each round costs about twice their tokens")
        new_tokens = c[1].number_input("Greedy tokens each", 1, 512, 16)
        go = c[2].form_submit_button("Record a golden set from this server",
                                     type="primary" if golden is None else "secondary")
    st.file_uploader("or upload a golden set (.json from `python -m diagnostics golden record`)", type=["json"],
                     key="gold_file", on_change=_upload)
    if go:
        try:
            _record(base_url, api_key, int(prompts), int(new_tokens))
        except Cancelled:
            pass  # stopped: nothing is kept; the page reruns at once and says so
        except TriageError as exc:
            st.error(markdown_literal(exc))
        golden = ss.get("gold_set")
    if golden is None:
        return
    st.markdown(markdown_literal(f"Golden set ({short_path(ss.gold_source)}): {source_line(golden.to_dict())}."))
    st.caption(markdown_literal("Noise floor: " + noise_floor_line(golden.noise_floor)))
    c = st.columns([2, 2, 3])
    c[1].download_button("Download the golden set", json.dumps(golden.to_dict()), "golden.json", "application/json",
                         on_click="ignore")
    if c[0].button("Replay it on this server now", type="primary", key="gold_go"):
        try:
            _round(base_url, api_key, len(golden.prompts))
        except Cancelled:
            pass  # stopped: no round is saved (its requests were cut short, not unanswered); the page reruns
    c[2].caption("To watch continuously, with every replica of a fleet: `python -m diagnostics golden watch "
                 "--golden FILE --url URL --every 60`.")
    if ss.get("gold_round"):
        show_watch(ss.gold_round, "gold_round")
