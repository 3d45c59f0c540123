"""The History page in the browser: lists runs saved in the server's database (also by another process), reopens
one, compares two, exports and deletes with confirmation. Run titles are hostile HTML and must show as text."""
import json
from pathlib import Path

import pytest

from tests.e2e.helpers import errors_on, goto, page_registered, screenshot, wait_idle
from tests.e2e.test_model_flow import generate

pytestmark = pytest.mark.e2e
EVIL = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.fixture
def history_page():
    if not page_registered("views/history.py"):
        pytest.skip("views/history.py is not in app.py's PAGES yet")
    return "history"


def choose(page, label_start: str) -> None:
    """Pick an option of the runs multiselect by the start of its label."""
    page.locator('[data-testid="stMultiSelect"] input').first.click()
    page.get_by_role("option").filter(has_text=label_start).first.click()
    page.keyboard.press("Escape")
    wait_idle(page)


def test_saved_runs_are_listed_reopened_compared_exported_and_deleted(app_server, page, history_db, history_page):
    a = history_db.save_run("compare", f"{EVIL} fp32 vs fp8", {"prompts": ["p"], "note": EVIL},
                            {"mean_kld": 0.0125, "same_top": 0.97, "verdict": EVIL})
    b = history_db.save_run("compare", "fp32 vs bf16", {"prompts": ["p"]}, {"mean_kld": 0.0025, "same_top": 0.99})
    keep = history_db.save_run("bench", "kept", {"x": 1}, {"tok_s": 10.0})
    goto(page, app_server, history_page)
    assert not errors_on(page)
    cells = page.locator('[data-testid="stDataFrame"] [role="gridcell"]')  # the grid's accessible copy of its cells
    cells.first.wait_for(state="attached")
    texts = cells.all_text_contents()
    for title in (f"{EVIL} fp32 vs fp8", "fp32 vs bf16", "kept"):
        assert title in texts, texts
    screenshot(page, "flow-history-list")
    choose(page, f"#{a} ·")
    page.get_by_test_id("stText").get_by_text(f"{EVIL} fp32 vs fp8", exact=True).wait_for()  # the title, as text
    page.get_by_text("mean_kld").first.wait_for()
    screenshot(page, "flow-history-reopen")
    choose(page, f"#{b} ·")
    page.get_by_role("heading", name=f"#{a} (A) against #{b} (B)").wait_for()
    screenshot(page, "flow-history-compare")

    with page.expect_download() as download:
        page.get_by_role("button", name="Export 2 as JSON").click()
    doc = json.loads(Path(download.value.path()).read_text())
    assert sorted(r["id"] for r in doc["runs"]) == sorted([a, b])
    assert {r["summary"]["mean_kld"] for r in doc["runs"]} == {0.0125, 0.0025}

    page.get_by_role("button", name="Delete 2").click()
    page.get_by_text("for good?").wait_for()
    assert history_db.get_run(a) is not None  # nothing goes before the confirmation
    page.get_by_role("button", name="Yes, delete").click()
    page.get_by_text("Deleted 2 run(s).").wait_for()
    wait_idle(page)
    assert history_db.get_run(a) is None and history_db.get_run(b) is None
    assert history_db.get_run(keep) is not None
    assert not errors_on(page)


def test_a_generation_on_the_model_page_appears_in_history(app_server, page, history_db, history_page):
    prompt = "History check: the capital of Italy is"
    goto(page, app_server, "")
    page.get_by_role("heading", name="Prompt").wait_for(timeout=300_000)
    generate(page, prompt, new_tokens=2)
    runs = [r for r in history_db.list_runs("generate") if r.title == prompt]
    assert len(runs) == 1 and runs[0].status == "finished"
    run = history_db.get_run(runs[0].id)
    assert run.payload["prompt"] == prompt and run.summary["new_tokens"] == 2
    goto(page, app_server, history_page)
    choose(page, f"#{run.id} ·")
    page.get_by_test_id("stText").get_by_text(prompt, exact=True).wait_for()
    assert not errors_on(page)
