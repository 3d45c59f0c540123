"""The Diagnostics page by clicking: on a host without an NVIDIA GPU the page leads with what can be checked there; a
URL that is no URL is refused in plain words; a 5 s checklist window on this host runs with progress, the findings
and the three report downloads appear, the GPU checks skipped for want of a driver read as one line, and the run is
in History as finished."""
import pytest

from tests.e2e.helpers import errors_on, goto, screenshot, wait_idle

pytestmark = pytest.mark.e2e


def _no_gpu_here() -> bool:
    from core.telemetry.nvml import NvmlSource

    return not NvmlSource().probe().ok


def test_the_checklist_runs_shows_findings_and_is_saved(app_server, page, history_db):
    goto(page, app_server, "checklist")
    main = page.get_by_test_id("stMain")
    cpu_host = _no_gpu_here()
    if cpu_host:  # the first thing under the title: what this host can check
        lead = main.get_by_test_id("stAlertContentInfo").first
        assert "No NVIDIA GPU on this host" in lead.inner_text()
        assert all(w in lead.inner_text() for w in ("vLLM server", "Prometheus", "Recorded"))
        screenshot(page, "flow-checklist-cpu-host")

    # A URL that is no URL: refused in words before anything runs, never urllib3's parser text.
    page.get_by_role("textbox", name="vLLM URL (optional)").fill("not a url at all")
    page.get_by_role("button", name="Run the checklist").click()
    wait_idle(page)
    error = main.get_by_test_id("stAlertContentError").first
    error.wait_for()
    text = error.inner_text()
    assert "not a server address" in text and "contains a space" in text and "http://127.0.0.1:8000" in text, text
    assert "Failed to parse" not in text and "invalid character" not in text
    screenshot(page, "flow-checklist-bad-url")
    page.get_by_role("textbox", name="vLLM URL (optional)").fill("")

    slider = page.get_by_role("slider")
    slider.focus()
    slider.press("Home")  # the shortest window, 5 s
    assert page.get_by_test_id("stSliderThumbValue").inner_text().strip() == "5"
    before = {r.id for r in history_db.list_runs("checklist")}
    page.get_by_role("button", name="Run the checklist").click()
    page.get_by_role("heading", name="Findings").wait_for(timeout=180_000)
    wait_idle(page)
    screenshot(page, "flow-checklist")
    assert page.locator('[data-testid="stDownloadButton"]').count() == 3
    assert not errors_on(page)
    new = [r for r in history_db.list_runs("checklist") if r.id not in before]
    assert len(new) == 1 and new[0].status == "finished", new
    assert new[0].summary["window_s"] >= 4
    # Checks skipped for one reason (on a host without a GPU: every GPU check) share one line naming them all.
    findings = history_db.get_run(new[0].id).payload["findings"]
    reasons = [f["missing"] for f in findings if f["status"] == "SKIP" and f["missing"]]
    shared = {r for r in reasons if reasons.count(r) > 1}
    assert main.get_by_text(" checks skipped", exact=False).count() == len(shared)
    if cpu_host:
        gpu = sum(f["missing"].startswith("no GPU") for f in findings)
        line = main.get_by_text(f"{gpu} GPU checks skipped: no NVIDIA driver here", exact=True)
        assert gpu >= 7 and line.count() == 1 and line.is_visible()
        main.get_by_text("Why, what to do, and which checks").first.click()  # the group's reason, once, under it
        assert main.get_by_text("libnvidia-ml", exact=False).count() == 1
        assert main.get_by_text("gpu.idle", exact=False).first.is_visible()
        screenshot(page, "flow-checklist-gpu-skips")
