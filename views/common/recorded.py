"""The "Live / Recorded" switch and the banner of a recorded view, shared by every page that can replay a recording
shipped with the console (core/recordings). A recorded view is never mixed with live data: the page draws one or
the other, and the recorded one always under banner()."""
from __future__ import annotations

import streamlit as st

from core.fmt import markdown_literal
from core.recordings import Recording, available

LIVE, RECORDED = "Live", "Recorded"


def pick(kind: str, key: str) -> Recording | None:
    """At the top of a page: Live or Recorded (and which recording, when there are several). Shown only when
    recordings of `kind` exist. Returns the recording to draw, or None for the live page. `?recorded=1` in the
    address opens the page in recorded mode (a demo link)."""
    recs = available(kind)
    if not recs:
        return None
    demo_link = st.query_params.get("recorded") in ("1", "true", "yes")
    c = st.columns([1, 4], vertical_alignment="bottom")  # the picker wide enough for a recording's whole title
    mode = c[0].segmented_control("Data", [LIVE, RECORDED], default=RECORDED if demo_link else LIVE, key=key,
                                  help="Recorded: a real run captured on another machine and shipped with the console "
                                       "(for a demo without a GPU or a server). Never mixed with live data.")
    if mode != RECORDED:
        return None
    if len(recs) == 1:
        return recs[0]
    return c[1].selectbox("Recording", recs, key=f"{key}_which", format_func=lambda r: r.label)


def banner(rec: Recording) -> None:
    """The marker over every recorded view: where and when it was recorded, that it is not live, and how."""
    st.warning(f"**Recorded on {markdown_literal(rec.machine)}, {rec.date} — not live.**  \n"
               f"{markdown_literal(rec.title)}. Captured by `{rec.captured_by}`."
               + (f"  \n{markdown_literal(rec.note)}" if rec.note else ""), icon=":material/history:")
