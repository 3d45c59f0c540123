"""The Fleet page in headless Chromium against the session's real Prometheus: connect, see the table with the slow
replica first, the anatomy columns, the fleet checklist (the queued replica saturated), a chart, and the run in
History; hostile selector text gives a message."""

import pytest

from tests.e2e.helpers import errors_on, goto, metric_value, require_browser, screenshot, wait_idle

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
require_browser()


def test_fleet_page_in_the_browser(prom_stack, app_server, page, history_db):
    goto(page, app_server, "fleet")
    page.get_by_role("textbox", name="Prometheus URL").fill(prom_stack.url)
    page.get_by_role("textbox", name="Label selector (optional)").fill('{job="x"} or vector(1)')
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("is not a label selector").wait_for(timeout=60_000)
    assert not page.locator('[data-testid="stException"]').count()
    page.get_by_role("textbox", name="Label selector (optional)").fill("")
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("Replicas, worst first").wait_for(timeout=60_000)
    page.get_by_text("Fleet checklist").wait_for(timeout=60_000)
    wait_idle(page, 120)
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)  # the over-time chart (query_range) drew
    assert int(metric_value(page, "Replicas")) >= 11
    body = page.inner_text("body")
    assert "fleet.slow_replica" in body and "replica-0003" in body and "vllm.metrics_off" in body
    # the replay with queueing added is flagged, and the target that never answered is counted down
    assert "fleet.saturation" in body and "queued-0000" in body and "Capacity-bound" in body
    assert int(metric_value(page, "Down")) >= 1
    screenshot(page, "flow-fleet")
    assert not errors_on(page)
    runs = history_db.list_runs("fleet")
    assert runs and runs[0].summary["replicas"] >= 11
