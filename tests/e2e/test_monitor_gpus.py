"""The Live monitor in Chromium on 2 and 8 fake GPUs (the fault-injecting NVML fake; a real multi-GPU host is
checked on the GPU machine): every GPU in the table, the lost one saying so, per-GPU trend lines, the chosen GPU's
detail, no error. Screenshots: artifacts/screenshots/monitor-<n>-gpus.png."""
from __future__ import annotations

import pytest

from tests.e2e.helpers import ARTIFACTS, AppServer, errors_on, new_page, screenshot

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("n", [2, 8])
def test_monitor_shows_every_gpu(n, browser, dialogs, tmp_path):
    server = AppServer("tests/e2e/fake_gpus_app.py", tmp_path / "h.sqlite", ARTIFACTS / f"e2e-monitor-{n}-gpus.log",
                       env={"TRIAGE_FAKE_GPUS": str(n)})
    server.start()
    try:
        ctx, page = new_page(browser, dialogs)
        page.goto(server.url + "/", wait_until="domcontentloaded")
        page.get_by_role("heading", name=f"All {n} GPUs").wait_for(timeout=120_000)
        rows = page.locator("table[data-gpu-table] tbody tr")
        rows.nth(n - 1).wait_for()
        assert rows.count() == n
        assert "is lost" in rows.nth(n - 1).inner_text()
        assert "H200" in rows.nth(0).inner_text() and "N/A" in rows.nth(0).inner_text()  # GPU 0: no power reading
        if n > 2:
            assert "HW thermal" in rows.nth(1).inner_text()
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        charts.nth(3).wait_for()
        assert charts.count() == 4
        page.get_by_role("heading", name="GPU 0 in detail").wait_for()
        page.wait_for_timeout(2500)  # two live refreshes
        assert rows.count() == n and not errors_on(page)
        screenshot(page, f"monitor-{n}-gpus")
        ctx.close()
    finally:
        server.stop()
    assert "Traceback" not in server.log_text()
