"""Browser end-to-end tests fail when Playwright or Chromium is missing (CI installs both, so missing means a broken
setup), and skip only when TRIAGE_TESTS_WITHOUT_BROWSER=1 says so. Their fixtures live in tests/e2e/fixtures.py,
registered in tests/conftest.py so that tests/vllm shares the same app server and browser."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.helpers import SKIP_BROWSER_ENV, browser_missing


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.fspath)).parents]
    reason = browser_missing() if ours else None
    if reason is None:
        return
    if os.environ.get(SKIP_BROWSER_ENV) != "1":
        raise pytest.UsageError(f"{reason}. Set {SKIP_BROWSER_ENV}=1 to skip the browser tests on purpose.")
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=reason))
