"""ITL and decode tok/s as the pages show them: the Model page generates 32 tokens, the Long context page runs a
256-token sample with 32 new tokens, in headless Chromium against the app of the checkout given.

    .venv/bin/python -m bench.page_timing_ab /path/to/checkout-A      # then checkout B, alternating, same machine

Prints one JSON line. Compare checkouts in one sitting and alternate them (these machines are noisy).
"""
import json, re, sys, tempfile
from pathlib import Path
from playwright.sync_api import sync_playwright
from tests.e2e.helpers import CHROMIUM, CHROMIUM_ARGS, AppServer, goto, metric_value, new_page, wait_idle

# the file watcher off in both checkouts, also in those from before .streamlit/config.toml turned it off
# the checkout measured serves its own app (its folder is the app's first import path), this one only drives it
srv = AppServer("app.py", Path(tempfile.mkdtemp()) / "h.sqlite", Path(tempfile.mkdtemp()) / "server.log",
                env={"STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"}, root=Path(sys.argv[1]).resolve()).start()
out = {"repo": sys.argv[1]}
try:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx, page = new_page(b, [])
        goto(page, srv, "", timeout_s=300)
        page.get_by_role("heading", name="Prompt").wait_for(timeout=300_000)
        box = page.get_by_label("New tokens"); box.fill("32"); box.press("Tab")
        page.get_by_role("button", name="Generate").click()
        page.locator('[data-testid="stMetric"]', has_text="TTFT").wait_for(timeout=300_000); wait_idle(page)
        out["model_itl_median"] = metric_value(page, "ITL median"); out["model_decode"] = metric_value(page, "Decode")
        page.locator('[data-testid="stSidebarNav"]').get_by_text("Long context", exact=True).click()
        page.get_by_label("Sample size (tokens)").wait_for(timeout=120_000); wait_idle(page)
        box = page.get_by_label("Sample size (tokens)"); box.fill("256"); box.press("Tab"); wait_idle(page)
        page.get_by_role("button", name="Build a sample document").click(); wait_idle(page)
        box = page.get_by_label("New tokens per run"); box.fill("32"); box.press("Tab"); wait_idle(page)
        page.get_by_role("button", name=re.compile(r"^Run: prefill")).click()
        page.locator('[data-testid="stMetric"]', has_text="ITL p50").wait_for(timeout=300_000); wait_idle(page)
        out["lc_itl_p50"] = metric_value(page, "ITL p50"); out["lc_decode"] = metric_value(page, "Decode")
        out["lc_ttft"] = metric_value(page, "TTFT")
        ctx.close(); b.close()
finally:
    srv.stop()
print(json.dumps(out))
