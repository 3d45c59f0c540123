"""The default precision compare (6 built-in prompts, 32 tokens, FP32 against FP8 W8A8) as a user runs it: the app
served by `streamlit run app.py` with the repository's .streamlit/config.toml, the Compare button clicked in headless
Chromium, the phases read back from the run the page saved to history. --watcher sets Streamlit's file watcher
(STREAMLIT_SERVER_FILE_WATCHER_TYPE, which overrides config.toml): the config's own setting, or auto/poll/none.

    .venv/bin/python -m bench.app_compare_time --runs 2 --watcher auto,config

Each run starts a fresh server (both engines load on the first compare, then a second compare is timed with them
loaded); watcher settings alternate. Prints one JSON line per run. Record results in docs/perf-log/fp8-cpu.md.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.fp8_cpu_bench import cpu_model
from core.store import Store
from tests.e2e.helpers import APP, CHROMIUM, CHROMIUM_ARGS, AppServer, goto, new_page, wait_idle


def compare_once(page, server: AppServer, db: Store) -> dict:
    before = {r.id for r in db.list_runs("compare")}
    goto(page, server, "compare", timeout_s=300)
    page.get_by_role("button", name="Compare").click()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        new = [r for r in db.list_runs("compare") if r.id not in before]
        if new:
            wait_idle(page, 300)
            return {k: round(v, 1) for k, v in db.get_run(new[0].id).payload["timings_s"].items()}
        page.wait_for_timeout(1000)
    raise TimeoutError("no compare was saved within 15 minutes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--watcher", default="config", help="comma-separated: config, auto, poll, none")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    for run in range(args.runs):
        for watcher in args.watcher.split(","):
            tmp = Path(tempfile.mkdtemp())
            env = {} if watcher == "config" else {"STREAMLIT_SERVER_FILE_WATCHER_TYPE": watcher}
            server = AppServer(APP, tmp / "history.sqlite", tmp / "server.log", env=env).start()
            db = Store(server.db)
            try:
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    context, page = new_page(browser, [])
                    cold = compare_once(page, server, db)
                    warm = compare_once(page, server, db)
                    context.close()
                    browser.close()
                main_cpu = server.cpu_seconds(main_thread_only=True)
            finally:
                db.close()
                server.stop()
            print(json.dumps({"run": run + 1, "watcher": watcher, "cpu": cpu_model(), "cpus": os.cpu_count(),
                              "utc": time.strftime("%H:%M", time.gmtime()), "first": cold, "second": warm,
                              "server_main_thread_cpu_s": round(main_cpu, 1)}), flush=True)


if __name__ == "__main__":
    main()
