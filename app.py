"""Router only: page config, navigation and the sidebar status line. Each page lives in pages/."""
import streamlit as st

from core import session

st.set_page_config(page_title="Triage console", page_icon=":material/monitor_heart:", layout="wide")

# (file, title, icon). A page is listed here only once it works end to end.
PAGES = [
    ("pages/model.py", "Model", ":material/memory:"),
    ("pages/monitor.py", "Live monitor", ":material/monitoring:"),
    ("pages/checklist.py", "Diagnostics", ":material/checklist:"),
    ("pages/compare.py", "Precision compare", ":material/compare:"),
    ("pages/long_context.py", "Long context", ":material/article:"),
    ("pages/deployment.py", "vLLM deployment", ":material/dns:"),
    ("pages/history.py", "History", ":material/history:"),
]

nav = st.navigation([st.Page(path, title=title, icon=icon) for path, title, icon in PAGES])
session.init()
session.sidebar_status()
nav.run()
