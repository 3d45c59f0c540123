"""The vLLM deployment page's local servers: "Start a local vLLM" (a model and vLLM flags), the list of the servers
the console launched with Stop, and "Try a remedy" under a sweep: a launched server is started again with the
remedy's flags and swept the same way; for any other server, the exact flag change and the comparison with the
previous sweep of the same URL.

Starting processes from a web page is a power to guard: it is offered only while the app listens on loopback (the
shipped .streamlit/config.toml) or a login guards the app (st.login, [auth] in .streamlit/secrets.toml)."""
from __future__ import annotations

import time

import streamlit as st

from core.deployment import remedy, servers
from core.engines.base import Cancelled
from core.engines.remote import RemoteEngine
from core.errors import TriageError
from core.fmt import markdown_literal
from core.throttle import throttled
from diagnostics.cli.serve import flag_errors
from views.common import remedy_view, runs

LOOPBACK = ("127.0.0.1", "localhost", "::1")
ss = st.session_state


def _login_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file at all: no login configured
        return False


def launch_allowed() -> tuple[bool, str]:
    """(allowed, why) from Streamlit's server.address and the login."""
    address = str(st.get_option("server.address") or "")
    if address in LOOPBACK or address.startswith("127."):
        return True, f"The app listens on {address} only, so only this host can start servers here."
    if _login_configured():
        if getattr(st.user, "is_logged_in", False):
            return True, "The app is behind a login and you are logged in."
        return False, "Log in (the app is behind a login) to start local servers."
    where = address or "every network address"
    return False, (f"Starting servers is off: the app listens on {where}, so anyone who reaches it could start "
                   "processes on this host. Run it with server.address = \"127.0.0.1\" (.streamlit/config.toml, as "
                   "shipped), or configure a login ([auth] in .streamlit/secrets.toml, Streamlit's st.login).")


def connect(url: str) -> None:
    """Connect the page to `url`, as its Connect button does."""
    info = RemoteEngine(url, timeout_s=10.0).connect()
    ss.update(dep_info=info, dep_url=info.base_url, dep_key=None, dep_rows=[], dep_prev=None, dep_t0=None,
              dep_probe=None)


def panel() -> None:
    """Start a local vLLM, and the list of the servers the console launched."""
    running = servers.list_servers()
    with st.expander("Start a local vLLM", expanded=bool(running) or bool(ss.get("loc_open"))):
        ok, why = launch_allowed()
        st.caption(markdown_literal(why) + " The server runs vLLM's OpenAI server on 127.0.0.1 at a free port and "
                   "stops when the console exits.")
        with st.form("loc_start"):
            c = st.columns([2, 4, 1], vertical_alignment="bottom")
            model = c[0].text_input("Model", servers.EMBEDDED,
                                    help=f"'{servers.EMBEDDED}' (the console's model) or a local model directory")
            flags = c[1].text_input("vLLM flags", "--max-num-seqs 2",
                                    help="any flags of `vllm serve`, checked against vLLM's own parser first")
            go = c[2].form_submit_button("Start", type="primary", disabled=not ok)
        if go and ok:
            ss.loc_open = True
            bar = st.progress(0.0, "Starting vLLM")
            shown = throttled(lambda f, m: bar.progress(min(max(f, 0.0), 1.0), m))
            try:
                # Stop: the start gives up and its processes go (a stop also comes by leaving the page)
                with runs.stoppable(button="loc_start_stop", label="Stop starting") as control:
                    server = servers.start_server(model, flags, check_flags=flag_errors, progress=shown,
                                                  should_stop=control.should_stop)
                connect(server.base_url)
                st.rerun()
            except Cancelled:
                pass  # the page reruns at once (the click that stopped it); nothing of the start is left
            except TriageError as exc:
                st.error(markdown_literal(exc))
            finally:
                bar.empty()
        _listing(running)


def _listing(running: list[servers.LocalServer]) -> None:
    if not running:
        st.caption("No local vLLM server started by the console is running.")
        return
    for s in running:
        c = st.columns([5, 1, 1], vertical_alignment="center")
        c[0].markdown(markdown_literal(f"{s.base_url} · pid {s.pgid} · {s.model} · flags: "
                                       f"{' '.join(s.flags) or '(none)'} · {owner_text(s)}") + f"  \nlog `{s.log_path}`")
        if c[1].button("Connect", key=f"loc_connect_{s.port}"):
            try:
                connect(s.base_url)
                st.rerun()
            except TriageError as exc:
                st.error(markdown_literal(exc))
        confirm = f"loc_confirm_{s.port}"
        if c[2].button("Stop", key=f"loc_stop_{s.port}"):
            if s.owned_here:
                servers.stop_server(s)
                st.rerun()
            ss[confirm] = True  # another console's server: that console may be using it
        if ss.get(confirm) and not s.owned_here:
            st.warning(markdown_literal(f"{s.base_url} was {owner_text(s)}: stopping it ends whatever that console "
                                        "runs on it. Stop it anyway?"))
            yes, no = st.columns(2)
            if yes.button("Yes, stop it", key=f"loc_yes_{s.port}"):
                ss.pop(confirm)
                servers.stop_server(s)
                st.rerun()
            if no.button("Keep it", key=f"loc_keep_{s.port}"):
                ss.pop(confirm)
                st.rerun()


def owner_text(s: servers.LocalServer) -> str:
    """Whose server it is, in words: this app's, another console's (its pid, when it started), or an orphan."""
    at = time.strftime("%H:%M:%S", time.localtime(s.started_at))
    if s.owned_here:
        return f"started by this app at {at}"
    if s.orphaned:
        return f"orphan: started at {at} by a console (pid {s.owner_pid}) that has exited"
    return f"started by another console (pid {s.owner_pid}) at {at}"


def remedy_section(base_url: str, api_key: str | None) -> None:
    """Under the sweep: each remedy with a flag change as a button (a launched server), or the change to make and
    the comparison with the previous sweep of this URL (any other server)."""
    doc = ss.get("dep_sweep")
    if not doc or doc.get("base_url") != base_url or not doc.get("steps"):
        return
    st.subheader("Try a remedy")
    server = servers.find_server(base_url)
    concrete = [r for r in remedy.remedies_for(doc, server) if r.concrete]
    if server is None:
        _not_launched(doc, concrete)
        return
    if not concrete:
        st.info("No remedy of this sweep names a flag change to try (or its flags are already set): "
                + markdown_literal((doc.get("verdict") or {}).get("remedy", "")))
    else:
        st.caption("Starts this server again beside the original, on a new port, with the remedy's flags (same model, "
                   "every other flag unchanged), runs the same sweep on it and compares. About 45 s to start plus the "
                   "sweep; the original keeps serving.")
        cols = st.columns(min(4, len(concrete) + (len(concrete) > 1)))
        chosen = None
        for i, r in enumerate(concrete):
            if cols[i % len(cols)].button(f"Try {r.flag_text()}", key=f"loc_try_{i}", help=r.text):
                chosen = [r]
        if len(concrete) > 1 and cols[-1].button("Try each in turn", key="loc_try_all"):
            chosen = concrete
        if chosen:
            try:
                _run(doc, server, chosen, api_key)
            except Cancelled:
                pass  # stopped: History has the finished tries as cancelled; the page reruns at once
    shown = ss.get("dep_remedy")
    if shown and shown.get("base_url") == base_url:
        remedy_view.show(shown, "dep_remedy")
        _switch(shown, server)


def _run(doc: dict, server: servers.LocalServer, chosen: list, api_key: str | None) -> None:
    bar, started = st.progress(0.0, "Starting"), time.time()
    trials = []

    def stopped(at: float) -> None:  # History gets the trials that finished, as cancelled
        for t in trials:  # a stopped run is not shown to pick from: no remedied server is kept running
            if t.server:
                servers.stop_server(t.server["port"])
                t.server = None
        result = remedy.result_of(trials, server)
        result["stopped"] = f"Stopped on the page after {len(trials)} of {len(chosen)} tries."
        remedy.record(result, started_at=started, stopped_at=at)

    with runs.stoppable(button="loc_try_stop", on_stop=stopped) as control:
        for n, r in enumerate(chosen):
            step = (lambda f, m, n=n: bar.progress(min(1.0, (n + max(0.0, min(f, 1.0))) / len(chosen)),
                                                   f"Try {n + 1} of {len(chosen)}: {m}"))
            trial = remedy.try_remedy(doc, server, r, check_flags=flag_errors, keep=True, api_key=api_key,
                                      progress=throttled(step), should_stop=control.should_stop)
            if control.should_stop():  # the trial's server start or sweep gave up: it ended no try
                if trial.server:
                    servers.stop_server(trial.server["port"])
                raise Cancelled("Stopped on the page.")
            trials.append(trial)
    result = remedy.result_of(trials, server)
    for i, t in enumerate(trials):  # keep only the winner's server running
        if t.server and i != result["best"]:
            servers.stop_server(t.server["port"])
            t.server = None
    result = remedy.result_of(trials, server)
    result["history_id"] = remedy.record(result, started_at=started)
    ss.dep_remedy = result
    bar.empty()
    st.toast(result["summary"])


def _switch(shown: dict, server: servers.LocalServer) -> None:
    best = shown.get("best")
    kept = (shown["trials"][best].get("server") or {}) if best is not None else {}
    if not kept or not servers.find_server(kept.get("base_url", "")):
        return
    c = st.columns(2)
    if c[0].button(f"Keep the remedied server ({kept['base_url']}), stop the original", key="loc_keep"):
        servers.stop_server(server)
        connect(kept["base_url"])
        ss.dep_sweep = shown["trials"][best]["after"]
        ss.dep_remedy = None
        st.rerun()
    if c[1].button("Stop the remedied server", key="loc_drop"):
        servers.stop_server(kept["port"])
        st.rerun()


def _not_launched(doc: dict, concrete: list) -> None:
    from views.common import sweep as sweep_view

    changes = "; ".join(f"`{r.flag_text()}`" for r in concrete) or "no remedy of this sweep names a flag change"
    st.info(f"This server was not started by the console, so it is not restarted here. Change its flags ({changes}), "
            "restart it, and run the same sweep again: the next sweep of this URL is compared with this one here, and "
            "History compares any two sweeps chosen together.")
    previous = remedy.previous_sweep(doc.get("base_url", ""), doc.get("history_id"))
    if previous is not None:
        run_id, payload = previous
        st.caption(f"Compared with the previous sweep of this URL (History #{run_id}):")
        sweep_view.show_comparison(payload, doc, (f"#{run_id}", "this sweep"))


def recorded_remedies() -> None:
    """The recorded mode's tried remedies, each under its own recorded banner."""
    from core.recordings import available
    from views.common import recorded

    for rec in available("remedy"):
        st.subheader("A remedy tried")
        recorded.banner(rec)
        remedy_view.show(rec.payload, f"rec_{rec.name}")
