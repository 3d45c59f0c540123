"""Every page the router lists (read from app.py's PAGES, so a newly registered page is covered without editing this
file) opens in a fresh browser session without an exception, and leaves a full-page screenshot in
artifacts/screenshots/."""
import pytest

from tests.e2e.helpers import LOAD_TIMEOUT_S, app_pages, errors_on, goto, screenshot, url_path

pytestmark = pytest.mark.e2e

PAGES = app_pages()


@pytest.mark.parametrize("page_file,title", [(p[0], p[1]) for p in PAGES], ids=[url_path(p[0]) for p in PAGES])
def test_page_loads_without_an_exception(app_server, page, page_file, title):
    # the first page is the default one, served at the root: /model would open a "Page not found" dialog over it
    goto(page, app_server, "" if page_file == PAGES[0][0] else url_path(page_file), timeout_s=LOAD_TIMEOUT_S)
    assert not page.get_by_text("Page not found").count(), f"{title} is not served where the sidebar links it"
    page.wait_for_timeout(1500)  # live fragments draw their first tick
    shot = screenshot(page, f"page-{url_path(page_file)}")
    assert not errors_on(page), f"{title} ({page_file}) shows an error; see {shot} and the server log"
    nav = page.locator('[data-testid="stSidebarNav"]')
    for _, other_title, _ in PAGES if len(PAGES) > 1 else []:  # Streamlit shows no navigation for a single page
        assert nav.get_by_text(other_title, exact=True).count() == 1, f"{other_title} missing from the sidebar"
    assert app_server.healthy()
