"""Router only: page config, navigation and the sidebar status line. Each page lives in views/ (not pages/: Streamlit
runs a file of a pages/ folder on its own when a deep link is the first request after a restart, skipping this router).
"""
import sys

import streamlit as st

from views.common import session

st.set_page_config(page_title="Triage console", page_icon=":material/monitor_heart:", layout="wide")

# (file, title, icon). A page is listed here only once it works end to end.
PAGES = [
    ("views/model.py", "Model", ":material/memory:"),
    ("views/monitor.py", "Live monitor", ":material/monitoring:"),
    ("views/checklist.py", "Diagnostics", ":material/checklist:"),
    ("views/compare.py", "Precision compare", ":material/compare:"),
    ("views/quality.py", "Quality", ":material/grading:"),
    ("views/long_context.py", "Long context", ":material/article:"),
    ("views/deployment.py", "vLLM deployment", ":material/dns:"),
    ("views/fleet.py", "Fleet", ":material/lan:"),
    ("views/history.py", "History", ":material/history:"),
]

# Pages that ask for the torch device before drawing more than their title. The first of them opened after a start
# imports PyTorch (about 4 s on 2 busy cores): the router does it under a running status, so the page shows that it
# is coming instead of a lone title. Later runs find it cached (session.device is a cache_resource).
DEVICE_PAGES = ("views/model.py", "views/long_context.py")

nav = st.navigation([st.Page(path, title=title, icon=icon) for path, title, icon in PAGES])
session.init()
if "torch" not in sys.modules and any(nav.title == title for path, title, _ in PAGES if path in DEVICE_PAGES):
    loading = st.empty()
    loading.status("Loading PyTorch (once after a restart, a few seconds)…", state="running")
    try:
        session.device()
    except Exception:  # noqa: BLE001 - the page asks again and shows the failure in its own words
        pass
    finally:
        loading.empty()
status = st.sidebar.empty()  # filled after the page ran: a model loaded on this run shows at once
session.sidebar_status(status)  # and before: a page that ends with st.stop() drops what the finally below draws
try:
    nav.run()
finally:
    session.sidebar_status(status)
