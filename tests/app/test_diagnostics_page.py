"""The Diagnostics page under streamlit.testing AppTest: a real 5 s run over a started sampler (an A100 from the
FakeNvml scenario table, the real host), cards in severity order with charts, the three downloads, no traceback."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import core.telemetry.sampler as sampler_mod
from core.telemetry.host import HostSource
from core.telemetry.nvml import NvmlSource
from core.telemetry.sampler import Sampler, shutdown_sampler
from diagnostics.report import SkipGroup, group_skips

from tests.fakes.nvml import A100, FakeNvml

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "checklist.py")
HOSTILE = "[click](javascript:alert(1)) <img src=x onerror=alert(1)>"


@pytest.fixture
def a100_sampler():
    from types import SimpleNamespace

    shutdown_sampler()
    nvml = FakeNvml(table={**A100, "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=40, memory=30)})
    s = Sampler([NvmlSource(nvml=nvml), HostSource()], rate_hz=10).start()
    sampler_mod._SAMPLER = s  # the page's runner reads the process singleton
    yield s
    shutdown_sampler()


def run_to_results(at: AppTest, launch: str = "") -> AppTest:
    at.slider[0].set_value(5)
    if launch:
        at.text_area[0].input(launch)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    job = at.session_state["diag_job"]
    assert job is not None and at.get("progress"), "the progress bar shows while the window runs"
    for _ in range(240):
        if job.done:
            break
        time.sleep(0.25)
    assert job.done and job.error is None, job.error
    return at.run()


def test_run_shows_cards_in_severity_order_with_charts_and_downloads(a100_sampler, monkeypatch):
    monkeypatch.setenv("TRIAGE_VLLM_PYTHON", "")  # the committed flag table: no 20 s vLLM import here
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception and at.button[0].label == "Run the checklist"
    at = run_to_results(at, f"vllm serve m --quantization fp8 --fp8-w8a16 {HOSTILE}")
    assert not at.exception, [e.value for e in at.exception]
    assert at.subheader[0].value == "Findings"

    result = at.session_state["diag_job"].result
    statuses = {f.check_id: f.status.value for f in result.findings}
    assert statuses["fp8.capability"] == "FAIL"  # FP8 W8A8 on an A100 (8.0)
    assert statuses["vllm.unknown_flags"] == "FAIL"
    assert statuses["gpu.idle"] == "WARN"  # 40% util, load unknown without a vLLM URL
    assert statuses["gpu.bandwidth_bound"] == "SKIP"  # no GPM on an A100

    # One card per finding, in the order of the result (FAIL first, SKIP last), except that checks skipped for the
    # same reason (no vLLM URL) share one card that names them all.
    ids = [m.value.split("`")[1] for m in at.markdown if m.value.startswith("**") and "· `" in m.value]
    groups = [g for g in group_skips(result.findings) if isinstance(g, SkipGroup)]
    grouped = {f.check_id for g in groups for f in g.findings}
    assert ids == [f.check_id for f in result.findings if f.check_id not in grouped]
    assert {"vllm.reachable", "vllm.kv_pressure"} <= grouped
    group_titles = [m.value for m in at.markdown if m.value.startswith("**") and "checks skipped" in m.value]
    assert group_titles == [f"**{g.title}**" for g in groups]
    shown_captions = "\n".join(c.value for c in at.caption)
    assert all(f"`{i}`" in shown_captions for i in grouped)
    assert [m.label for m in at.metric] == ["FAIL", "ERROR", "WARN", "PASS", "SKIP"]
    assert len(at.get("plotly_chart")) >= 2  # GPU util and host memory evidence
    assert len(at.get("download_button")) == 3

    # Text from the launch command is shown as text: every bracket and angle bracket of it is escaped.
    shown = "\n".join(m.value for m in at.markdown)
    assert "--fp8-w8a16" in shown and "\\<img" in shown
    assert not re.search(r"(?<!\\)<img|(?<!\\)\]\(javascript", shown)


def test_a_run_is_saved_to_history_as_running_then_finished(a100_sampler, monkeypatch, tmp_path):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_VLLM_PYTHON", "")
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = run_to_results(AppTest.from_file(PAGE, default_timeout=60).run())
    job = at.session_state["diag_job"]
    run = Store(tmp_path / "h.sqlite").get_run(job.run_id)
    assert run.kind == "checklist" and run.status == "finished" and run.title == "Checklist, 5 s on this host"
    assert run.summary == {**job.result.counts(), "window_s": job.result.window_s, "cancelled": False,
                           "summary": run.summary["summary"]}
    assert [f["id"] for f in run.payload["findings"]] == [f.check_id for f in job.result.findings]


def test_bad_url_is_an_error_not_a_traceback(a100_sampler):
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.text_input[0].input("ftp://nowhere")
    at.button[0].click().run()
    assert not at.exception
    assert at.error and "Cannot start" in at.error[0].value and at.session_state["diag_job"] is None


def _show_payload(payload):
    from views.common import checklist_view

    checklist_view.show(payload, "t")


def test_saved_payloads_old_and_unfinished_open_without_a_traceback():
    """What History and recorded mode hand the view: a full run (charts, JSON round trip), a payload from an older
    version (fields missing, an unknown status) and an unfinished run's inputs-only payload."""
    import json

    from diagnostics.context import CheckContext, Series
    from diagnostics.findings import Chart, Finding, RunResult, Severity, Status
    from diagnostics.runner import evaluate

    chart = Chart("Host MemAvailable", (Series("MemAvailable", "bytes", "psutil", (0.0, 1.0, 2.0), (3.0, None, 2.0)),),
                  "GiB", ((2.5, "limit"),))
    warn = Finding("host.mem_leak", "Host memory leak", Severity.HIGH, Status.WARN, "falls", "find it",
                   {"slope_mib_per_min": -5.0}, (chart,))
    full = RunResult("2026-01-01T13:05:00+01:00", 5.0, 5.0, False, "host", {"vllm_url": None},
                     (warn, *evaluate(CheckContext(gpu_reason="No NVIDIA driver here: no libnvidia-ml."))))
    payload = json.loads(json.dumps(full.to_dict()))
    old = {"findings": [{"id": "gpu.idle", "status": "MAYBE", "verdict": "old text"}, {"id": "x.y", "status": "PASS"}]}
    for p in (payload, old, {"inputs": {"vllm_url": "http://h:8000"}, "requested_s": 60}, {}):
        at = AppTest.from_function(_show_payload, args=(p,), default_timeout=30).run()
        assert not at.exception, (p, [e.value for e in at.exception])
    at = AppTest.from_function(_show_payload, args=(payload,), default_timeout=30).run()
    assert len(at.get("plotly_chart")) == 1 and len(at.get("download_button")) == 3
    titles = [m.value for m in at.markdown if "GPU checks skipped: no NVIDIA driver here" in m.value]
    assert len(titles) == 1  # every GPU check's identical "no driver" skip on one card, with its remedy once
    assert sum("docker run --gpus all" in m.value for m in at.markdown) == 1
    assert RunResult.from_dict(payload).to_dict() == payload  # nothing lost on the way through History


def test_recorded_mode_draws_the_shipped_run_under_its_banner_and_no_form():
    from core.recordings import available

    recs = available("checklist")
    assert recs, "the console ships a recorded checklist run (core/data/recordings)"
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["diag_data"] = "Recorded"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    rec = at.selectbox[0].value if at.selectbox else recs[0]  # the newest (the incident) unless another is picked
    assert rec.name == recs[0].name
    assert at.warning and f"Recorded on {rec.machine}" in at.warning[0].value.replace("\\", "")
    assert not at.slider and not at.text_area  # the live form is not drawn beside a recording
    assert at.subheader[0].value == "Findings"
    ids = [m.value.split("`")[1] for m in at.markdown if m.value.startswith("**") and "· `" in m.value]
    assert ids and set(ids) <= {f["id"] for f in rec.payload["findings"]}
    assert [m.value for m in at.metric] == [str(n) for n in rec.payload["counts"].values()]


@pytest.fixture
def this_host_sampler():
    """The real NVML adapter and host of this machine: on a CPU host, NVML says there is no driver."""
    shutdown_sampler()
    s = Sampler([NvmlSource(), HostSource()], rate_hz=10).start()
    sampler_mod._SAMPLER = s
    yield s
    shutdown_sampler()


def test_a_cpu_host_leads_with_what_it_can_check_and_groups_the_gpu_skips(this_host_sampler, monkeypatch):
    if this_host_sampler.availability("nvml").ok:
        pytest.skip("this host has an NVIDIA GPU: the page does not lead with the CPU host's alternatives")
    monkeypatch.setenv("TRIAGE_VLLM_PYTHON", "")
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    lead = at.info[0].value
    assert "No NVIDIA GPU on this host" in lead
    assert all(w in lead for w in ("vLLM server", "Prometheus", "Recorded"))
    at = run_to_results(at)
    result = at.session_state["diag_job"].result
    gpu_skips = [f for f in result.findings if f.missing.startswith("no GPU")]
    assert len(gpu_skips) >= 7
    lines = [m.value for m in at.markdown if "GPU checks skipped" in m.value]
    assert lines == [f"**{len(gpu_skips)} GPU checks skipped: no NVIDIA driver here**"]
    shown = "\n".join(m.value for m in at.markdown)
    assert shown.count("libnvidia-ml") == 1  # the reason once, under the line
