"""Browser fixtures shared by tests/e2e and tests/vllm: the real app started once per test session on 127.0.0.1 (a
free port, its own history database), Debian's headless Chromium through Playwright, and a page per test that fails
the test if any JavaScript dialog (alert, confirm, prompt) opens: hostile text must never run.

They are registered once, in tests/conftest.py: a second import of them elsewhere would make a second session
fixture, and so a second app server and a second Playwright, which cannot start inside the first one's event loop.
The server's output goes to artifacts/e2e-server.log and screenshots to artifacts/screenshots/.
"""
from __future__ import annotations

import atexit

import pytest

from tests.e2e.helpers import APP, ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, AppServer, new_page

try:
    from playwright import sync_api as playwright_api
except ImportError:  # the app's own requirements do not include it; requirements-dev.txt does
    playwright_api = None


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
