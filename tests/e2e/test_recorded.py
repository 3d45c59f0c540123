"""Recorded mode in Chromium, with no GPU and no vLLM server: the Live monitor replays the H200 recording and the vLLM
deployment page shows the recorded load sweep, each under its "Recorded on ... — not live" banner, with its charts
and no error, and nothing cut at 1400 px. One page load: the monitor opens from a demo link (?recorded=1), the
deployment page by its switch.
Screenshots: artifacts/screenshots/recorded-monitor.png, recorded-deployment.png."""
from __future__ import annotations

import pytest

from core.recordings import available
from tests.e2e.helpers import errors_on, goto, screenshot, wait_idle
from tests.e2e.test_recorded_pages import clipped

pytestmark = pytest.mark.e2e


def test_monitor_and_deployment_replay_recordings(app_server, page):
    monitor, sweep = available("monitor")[0], available("sweep")[0]
    goto(page, app_server, "monitor?recorded=1")
    banner = page.get_by_text("Recorded on", exact=False).first
    banner.wait_for()
    text = banner.inner_text()
    assert monitor.machine.split(" (")[0] in text and "not live" in text and monitor.date in text
    gauges = page.locator("[data-gauge]")
    gauges.first.wait_for()
    assert gauges.count() >= 4  # GPU util, DRAM BW util, GPU memory, host MemAvailable
    assert "N/A" not in page.locator('[data-gauge="GPU util"]').inner_text()  # a real reading from the recording
    charts = page.locator('[data-testid="stVegaLiteChart"]')
    charts.nth(1).wait_for()
    assert charts.count() == 2 and not errors_on(page)
    assert clipped(page) == []  # fits a 1400 px window
    screenshot(page, "recorded-monitor")

    page.get_by_role("link", name="vLLM deployment").click()
    page.get_by_role("heading", name="vLLM deployment").wait_for()
    wait_idle(page)
    page.get_by_role("radiogroup", name="Data").get_by_role("radio", name="Recorded").click()
    page.get_by_text("Recorded on", exact=False).first.wait_for()
    wait_idle(page)
    assert sweep.machine.split(",")[0] in page.get_by_text("Recorded on", exact=False).first.inner_text()
    plots = page.locator('[data-testid="stPlotlyChart"]')
    plots.nth(2).wait_for()
    assert plots.count() == 3 and not errors_on(page)
    assert clipped(page) == []  # the steps table in parts, every chart's subtitle inside its chart
    screenshot(page, "recorded-deployment")
