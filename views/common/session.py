"""Streamlit glue shared by every page: per-user state in one place, and the process's engine pool.

The pool (core/engines/pool.py) is held by st.cache_resource, so every browser session shares it. Loading happens
outside any cached function so its progress bar can update the page.
"""
from __future__ import annotations

import math

import streamlit as st

from core.engines.pool import EnginePool, Setup
from core.errors import EngineError, InputError
from core.precision import Precision
from core.throttle import throttled

DEFAULTS = {"setup": None}  # the Setup this browser session has loaded, or None


def init() -> None:
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)


@st.cache_resource(show_spinner=False)
def _pool() -> EnginePool:
    """Process-wide: one engine pool for every browser session (core/engines/pool.py)."""
    return EnginePool()


def pooled(setup: Setup, progress=None):
    """The process's shared engine for `setup`, loaded if needed, without making it this session's current model
    (a comparison's sides)."""
    return _pool().load(setup, progress)


def release_idle() -> list[Setup]:
    """Unload the shared engines nobody is generating with (before a page loads engines of its own)."""
    return _pool().release_idle()


def load(setup: Setup, progress=None):
    """Load (or reuse) the engine for `setup` and make it this session's current one. Raises on failure, leaving
    the previous setup current and loaded."""
    engine = _pool().load(setup, progress)
    st.session_state["setup"] = setup
    return engine


def load_with_progress(setup: Setup):
    """load() with progress that tells time: elapsed, the load's own steps, and before it starts the time recent
    loads of this setup took on this machine (core.store speeds, kept here after each load)."""
    import time

    from core import store
    from views.common import runs

    fresh = _pool().get(setup) is None
    per_s = store.recent_speed("load", setup.label) if fresh else None
    progress = runs.RunProgress(f"Loading; recent loads of this setup here took about {1 / per_s:.0f} s"
                                if per_s else "Loading")
    t0 = time.monotonic()
    try:
        engine = load(setup, progress.fraction)
    finally:
        progress.clear()
    if fresh:
        store.add_speed("load", setup.label, 1 / max(time.monotonic() - t0, 1e-3))
    return engine


def current():
    """(setup, engine) of this session, or (None, None) when nothing is loaded yet."""
    setup = st.session_state.get("setup")
    if setup is None:
        return None, None
    engine = _pool().get(setup)
    return setup, engine if engine is not None else load(setup)


def offer_loaded_elsewhere() -> bool:
    """On a page that needs this tab's model when the tab has chosen none: say which models the process has loaded
    (the sidebar lists the same ones) and offer each with a button that makes it this tab's at once. True when any."""
    others = _pool().loaded()
    if not others:
        return False
    names = ", ".join(f"{s.model_short} · {s.precision.label}" for s, _ in reversed(others))
    st.info(f"This tab has not chosen a model; loaded by another tab or a comparison: {names}.")
    for s, _ in reversed(others):
        if st.button(f"Use {s.model_short} · {s.precision.label} here", key=f"adopt-{s.label}"):
            load(s)  # already in the pool: no load, the tab just takes it
            st.rerun()
    return True


def headline(setup: Setup, engine) -> str:
    """The loaded setup in a few words: "Gemma 3 270M · FP8 W8A8 · torch eager · CPU"."""
    return f"{setup.model_short} · {setup.short_label(engine)}"


def details(setup: Setup, engine) -> str:
    """Everything the headline leaves out, for a popover or a tooltip: the model's source, the full precision and
    what really executes (kernels, packed layouts, fused ops)."""
    return (f"**Model:** {setup.spec.label}  \n**Precision:** {setup.precision.label}; KV cache "
            f"{setup.kv_dtype.label}  \n**What ran:** {engine.ran}")


def show_setup(setup: Setup, engine, prefix: str = "") -> None:
    """The headline with the full "what ran" one click away."""
    text, more = st.columns([6, 1], vertical_alignment="center")
    text.markdown(f"{prefix}**{headline(setup, engine)}**")
    with more.popover("What ran", icon=":material/info:"):
        st.markdown(details(setup, engine))


def sidebar_status(box) -> None:
    """The loaded model's line in the sidebar placeholder `box`; the full label is its tooltip."""
    setup = st.session_state.get("setup")
    engine = _pool().get(setup) if setup else None
    if engine is not None:
        box.caption(f"Loaded: {headline(setup, engine)}", help=details(setup, engine))
    elif setup:
        box.caption(f"Chosen: {setup.model_short} · {setup.precision.label} (unloaded to free memory; reloads when "
                    "used)")
    elif others := _pool().loaded():  # loaded by a comparison or another tab, none chosen in this one
        box.caption("Loaded: " + ", ".join(f"{s.model_short} · {s.precision.label}" for s, _ in others)
                    + " (by a comparison or another tab; the Model page picks the one prompts run on)")
    else:
        box.caption("No model loaded yet: open the Model page.")


@st.cache_resource(show_spinner=False)
def device():
    """Where the torch engine would run (CPU, or the first CUDA GPU with its compute capability)."""
    from core.engines.device import current_device

    return current_device()


# The Model page's prompt box takes any paste (a browser-side max_chars would drop a longer paste without a word);
# this bound refuses it with a message before tokenizing megabytes.
PROMPT_MAX_CHARS = 200_000


def stream_generate(engine, prompt: str, max_new_tokens: int, temperature: float, on_text, on_token=None):
    """Generate for one prompt, calling on_text with the text so far a few times a second and with the whole text at
    the end, and on_token(tokens so far) as often (a progress bar)."""
    from core.engines.base import GenerationParams

    if len(prompt) > PROMPT_MAX_CHARS:
        raise InputError(f"The prompt is {len(prompt):,} characters; this box runs at most {PROMPT_MAX_CHARS:,}. "
                         "For a long document use the Long context page: it counts the tokens and truncates to fit.")
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=temperature)
    show = throttled(on_text)  # a page update per token would slow the decode it times

    def on_step(ev) -> None:
        show(ev.texts[0])
        if on_token is not None:
            on_token(ev.step + 1)

    try:
        gen = engine.generate([prompt], params, on_step=on_step)[0]
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError; other ones are bugs
        if not isinstance(exc, MemoryError) and "out of memory" not in str(exc).lower():
            raise
        what = (str(exc) or type(exc).__name__).splitlines()[0][:200]
        raise EngineError(f"Out of memory while generating ({what}). Ask for fewer new "
                          "tokens or a shorter prompt, unload other models, or load a smaller precision.") from exc
    on_text(gen.text)
    return gen


def non_finite_warning(gen, setup: Setup) -> str | None:
    """What to tell the user when a generation's log-probabilities were NaN: the forward pass overflowed and the
    tokens picked from it (argmax of NaN: token 0, the pad token) mean nothing."""
    n = sum(1 for lp in gen.logprobs if math.isnan(lp))
    if not n:
        return None
    why = ("FP16 tops out at 65504 and Gemma 3's activations go past it (vLLM refuses float16 for Gemma 3 too)"
           if setup.precision is Precision.FP16 else "The activations left this precision's range")
    return (f"{n} of {len(gen.logprobs)} generated tokens came from NaN log-probabilities: the forward pass "
            f"overflowed at {setup.precision.label}, so this output means nothing. {why}. Use BF16 or FP32.")


def record_stopped_generation(setup: Setup, engine, prompt: str, max_new_tokens: int, temperature: float,
                              text: str, started_at: float, stopped_at: float | None) -> int | None:
    """Save a Model page generation the user stopped: cancelled, dated to its stop, with the text streamed so far."""
    import time

    from core import store

    label = {"setup": setup.ran_label(engine), "setup_short": headline(setup, engine), "engine": engine.ran,
             "engine_short": engine.ran_short}
    payload = {**label, "prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": temperature,
               "text": text, "finish_reason": "cancelled", "token_ids": [], "token_times_s": [], "timing": {}}
    summary = {**label, "precision": setup.precision.value, "kv_dtype": setup.kv_dtype.value}
    return store.record("generate", f"{headline(setup, engine)}: {prompt}", payload, summary, started_at=started_at,
                        status="cancelled", error="Stopped by the user.", finished_at=stopped_at or time.time())


def record_generation(setup: Setup, engine, prompt: str, max_new_tokens: int, temperature: float, gen) -> int | None:
    """Save one Model page generation to history; None when history could not be written (the user keeps the
    result)."""
    import time

    from core import store

    timing = gen.timing_summary()
    payload = {"setup": setup.ran_label(engine), "setup_short": headline(setup, engine), "engine": engine.ran,
               "engine_short": engine.ran_short, "prompt": prompt,
               "max_new_tokens": max_new_tokens, "temperature": temperature,
               "text": gen.text, "finish_reason": gen.finish_reason, "token_ids": gen.token_ids,
               "token_times_s": gen.token_times, "timing": timing}
    summary = {"setup": setup.ran_label(engine), "setup_short": headline(setup, engine), "engine": engine.ran,
               "engine_short": engine.ran_short, "precision": setup.precision.value,
               "kv_dtype": setup.kv_dtype.value, **timing}
    # the title leads with the short setup, so History's list tells runs of one prompt at two precisions apart
    # token times count from the request's start, so the last one is the generation's duration
    started = time.time() - (gen.token_times[-1] if gen.token_times else 0.0)
    if timing.get("decode_tok_s"):  # for the next run's hint
        store.add_speed("decode", setup.label, timing["decode_tok_s"])
    return store.record("generate", f"{headline(setup, engine)}: {prompt}", payload, summary, started_at=started)
