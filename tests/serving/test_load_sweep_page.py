"""The Load sweep on the vLLM deployment page, in headless Chromium against the real queueing server: the form, the
progress, the verdict with its charts, and the sweep in History.

The page shows the verdict the sweep saved; which verdict the load earns is test_load_sweep.py's to prove (the CLI's
sweep of the same server, capacity-bound). Here Chromium and the app share the 2 cores with the server, and once in
CI the page's sweep read another verdict (its headline was not kept; this test prints it now)."""
import pytest

from tests.e2e.helpers import errors_on, goto, metric_value, require_browser, screenshot, wait_idle

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]
require_browser()


def test_a_sweep_runs_and_explains_itself_in_the_browser(queued_server, app_server, page, history_db):
    goto(page, app_server, "deployment")
    page.get_by_label("Server base URL").fill(queued_server.base_url)
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("Connected to").wait_for(timeout=60_000)
    page.get_by_text("Pause live panels").click()  # the cleanest numbers
    for label, value in [("Steps", "1,2,4"), ("Prompt length (tokens)", "48"), ("Tokens to generate", "12"),
                         ("SLO: TTFT p99 (s, 0 = none)", "20"), ("Time budget (s)", "600")]:
        field = page.get_by_label(label, exact=True)
        field.fill(value)
        field.press("Tab")
    page.get_by_role("button", name="Run sweep").click()
    page.locator('[data-testid="stMetric"]', has_text="Knee").wait_for(timeout=600_000)
    wait_idle(page, 120)
    sweeps = history_db.list_runs("sweep")
    stopped = history_db.get_run(sweeps[0].id).payload.get("stopped") if sweeps else "no sweep in History"
    assert metric_value(page, "Knee") == "2 clients", (metric_value(page, "Knee"), stopped)
    verdict = history_db.get_run(sweeps[0].id).payload["verdict"]
    print("\n" + verdict["headline"])
    label = verdict["headline"].split(":")[0]  # "Capacity-bound" on a quiet host
    assert page.get_by_text(label).count() >= 1, verdict["headline"]
    assert page.locator(".js-plotly-plot").count() >= 3  # latency, anatomy and throughput against load
    screenshot(page, "flow-deployment-sweep")
    assert not errors_on(page)
    assert sweeps[0].summary["verdict"] == verdict["kind"] and sweeps[0].summary["steps"] == 3
