"""A router for browser tests of the Live monitor on a multi-GPU host that this machine does not have: it installs
the process's sampler on the fault-injecting NVML fake with TRIAGE_FAKE_GPUS GPUs (one lost, one without power
readings, one throttled: multi_gpu_table), then serves the real monitor page. Started by tests/e2e/test_monitor_gpus.py.
"""
import os
from pathlib import Path

import streamlit as st

import core.telemetry.sampler as sampler_mod
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource
from tests.fakes.nvml import FakeNvml, multi_gpu_table

ROOT = Path(__file__).resolve().parents[2]


@st.cache_resource
def install_fake_sampler() -> None:
    n = int(os.environ["TRIAGE_FAKE_GPUS"])
    with sampler_mod._LOCK:
        if sampler_mod._SAMPLER is None:
            nvml = NvmlSource(nvml=FakeNvml(gpus=n, table=multi_gpu_table(n)))
            sampler_mod._SAMPLER = sampler_mod.Sampler([nvml, HostSource()]).start()


st.set_page_config(page_title="Triage console", layout="wide")
install_fake_sampler()
st.navigation([st.Page(str(ROOT / "views" / "monitor.py"), title="Live monitor")]).run()
