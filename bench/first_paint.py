"""Time to first paint of every page in a real Chromium, on a freshly started console.

    python -m bench.first_paint                 # every page, the first open after start and a second open
    python -m bench.first_paint --pages model checklist --rounds 3

For each page, a fresh browser session opens its address and a MutationObserver (installed before the page's own
scripts) notes when the main area first shows something (text, a spinner, a running status or a skeleton: anything
that says the page is coming), when a spinner first shows, when the title shows, and when the script run is over.
Times are from the navigation's start (performance.now()), in seconds. The first round is the first open of each
page after the server started (imports not yet cached) in a fresh browser each time; the later rounds are warm, in
one browser whose HTTP cache holds the app's scripts, as a returning user's does. "app shell" is when Streamlit's own
frontend has mounted (its scripts loaded and parsed): nothing the app does can paint before it. Prints a table and
the machine (CPU model).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.recording import host_description
from tests.e2e.helpers import CHROMIUM, CHROMIUM_ARGS, AppServer, IDLE_JS, app_pages, url_path

OBSERVER = """
(() => {
  window.__paint = {};
  const SPINNERS = '[data-testid="stSpinner"], [data-testid="stExpanderIconSpinner"], [data-testid="stSkeleton"]';
  const note = (k) => { if (!(k in window.__paint)) window.__paint[k] = performance.now() / 1000; };
  new MutationObserver(() => {
    if (document.querySelector('[data-testid="stApp"]')) note('app');
    const main = document.querySelector('[data-testid="stMainBlockContainer"]');
    if (!main) return;
    if (main.querySelector('h1')) note('title');
    if (main.querySelector(SPINNERS)) note('spinner');
    if (main.innerText.trim() || main.querySelector(SPINNERS)) note('first');
  }).observe(document, {childList: true, subtree: true});
})();
"""


def open_page(browser, url: str, timeout_s: float, context=None) -> dict:
    """One page load in `context` (a browser whose HTTP cache holds the app's scripts), or in a fresh one."""
    own = context is None
    if own:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(OBSERVER)
    try:
        page = context.new_page()
        page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
        page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=timeout_s * 1000)
        page.wait_for_function(IDLE_JS, timeout=timeout_s * 1000)
        marks = page.evaluate("() => window.__paint")
        marks["done"] = page.evaluate("() => performance.now() / 1000")
        page.close()
        return marks
    finally:
        if own:
            context.close()


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(prog="python -m bench.first_paint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", nargs="*", help="page names as in their address (model, checklist, ...); all if none")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--root", type=Path, help="serve the app of another checkout (e.g. `git archive` of an older "
                    "commit) to compare before and after")
    args = ap.parse_args(argv)
    pages = [(url_path(f), title) for f, title, _ in app_pages()]
    default = pages[0][0]
    if args.pages:
        pages = [p for p in pages if p[0] in args.pages]
    tmp = Path(tempfile.mkdtemp(prefix="triage-first-paint-"))
    server = AppServer("app.py", tmp / "triage.db", tmp / "app.log", **({"root": args.root} if args.root else {}))
    server.start()
    rows = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            cached = browser.new_context(viewport={"width": 1400, "height": 1000})
            cached.add_init_script(OBSERVER)
            for rnd in range(args.rounds):
                for path, title in pages:
                    address = f"{server.url}/{'' if path == default else path}"  # the default page is the root
                    m = open_page(browser, address, args.timeout, None if rnd == 0 else cached)
                    rows.append((rnd + 1, title, m.get("app"), m.get("first"), m.get("spinner"), m.get("title"),
                                 m["done"]))
            cached.close()
            browser.close()
    finally:
        server.stop()
    fmt = (lambda v: "-" if v is None else f"{v:.2f}")
    print(f"Machine: {host_description()}; load average {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; app from {args.root or 'this checkout'}")
    print(f"{'round':>5}  {'page':20} {'app shell s':>11} {'first paint s':>13} {'spinner s':>9} {'title s':>7} "
          f"{'run done s':>10}")
    for rnd, title, shell, first, spin, head, done in rows:
        print(f"{rnd:>5}  {title:20} {fmt(shell):>11} {fmt(first):>13} {fmt(spin):>9} {fmt(head):>7} "
              f"{fmt(done):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
