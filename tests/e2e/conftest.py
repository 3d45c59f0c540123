"""Browser end-to-end fixtures: the real app started once per test session on 127.0.0.1 (a free port, its own
history database), Debian's headless Chromium through Playwright, and a page per test that fails the test if any
JavaScript dialog (alert, confirm, prompt) opens: hostile text must never run.

The server's output goes to artifacts/e2e-server.log and screenshots to artifacts/screenshots/.
"""
from __future__ import annotations

import atexit
from pathlib import Path

import pytest

from tests.e2e.helpers import APP, ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, AppServer, new_page

try:
    from playwright import sync_api as playwright_api
except ImportError:  # the app's own requirements do not include it; requirements-dev.txt does
    playwright_api = None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    if playwright_api is None:
        reason = "the browser tests need Playwright (bash scripts/setup.sh --dev)"
    elif not Path(CHROMIUM).exists():
        reason = f"no Chromium at {CHROMIUM} (bash scripts/setup.sh --dev installs Debian's)"
    else:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    db = tmp_path_factory.mktemp("e2e") / "history.sqlite"
    server = AppServer(APP, db, ARTIFACTS / "e2e-server.log")
    atexit.register(server.stop)  # even if pytest itself is interrupted
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=120_000)
        yield b
        b.close()


@pytest.fixture
def dialogs():
    """Messages of JavaScript dialogs opened on this test's pages; any one fails the test."""
    found: list[str] = []
    yield found
    assert not found, f"JavaScript dialogs opened (hostile text was executed?): {found}"


@pytest.fixture
def page(browser, dialogs):
    context, pg = new_page(browser, dialogs)
    yield pg
    context.close()


@pytest.fixture(scope="session")
def history_db(app_server):
    """The server's history database, opened from this process (SQLite WAL: both sides see committed rows)."""
    from core.store import Store

    s = Store(app_server.db)
    yield s
    s.close()
