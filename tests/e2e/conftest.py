"""Browser end-to-end tests skip cleanly without Playwright or Chromium. Their fixtures live in tests/e2e/fixtures.py,
registered in tests/conftest.py so that tests/vllm shares the same app server and browser."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import CHROMIUM

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
