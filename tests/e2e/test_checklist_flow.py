"""The Diagnostics page by clicking: a 5 s checklist window on this host runs with progress, the findings and the
three report downloads appear, checks skipped for the same reason share a card, and the run is in History as
finished."""
import pytest

from tests.e2e.helpers import errors_on, goto, screenshot, wait_idle

pytestmark = pytest.mark.e2e


def test_the_checklist_runs_shows_findings_and_is_saved(app_server, page, history_db):
    goto(page, app_server, "checklist")
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
    assert page.get_by_text("gpu.", exact=False).count() > 0  # GPU checks are listed (skipped without a GPU)
    assert not errors_on(page)
    new = [r for r in history_db.list_runs("checklist") if r.id not in before]
    assert len(new) == 1 and new[0].status == "finished", new
    assert new[0].summary["window_s"] >= 4
    # Checks skipped for one reason (on a host without a GPU: every GPU check) share one card naming them all.
    findings = history_db.get_run(new[0].id).payload["findings"]
    reasons = [f["missing"] for f in findings if f["status"] == "SKIP" and f["missing"]]
    shared = {r for r in reasons if reasons.count(r) > 1}
    assert page.get_by_text(" checks skipped", exact=False).count() == len(shared)
