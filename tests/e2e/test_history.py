"""The History page in the browser: lists runs saved in the server's database (also by another process), reopens
one, compares two, exports and deletes with confirmation. Run titles are hostile HTML and must show as text."""
import json
import time
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
    page.get_by_text("only its summary is shown").wait_for()  # a payload the compare view cannot rebuild
    page.get_by_text("Raw JSON of the run").click()  # kept one click away
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
    runs = [r for r in history_db.list_runs("generate") if r.title.endswith(": " + prompt)]  # short setup first
    assert len(runs) == 1 and runs[0].status == "finished"
    run = history_db.get_run(runs[0].id)
    assert run.payload["prompt"] == prompt and run.summary["new_tokens"] == 2
    goto(page, app_server, history_page)
    choose(page, f"#{run.id} ·")
    page.get_by_test_id("stText").get_by_text(": " + prompt).first.wait_for()  # the title: short setup, then prompt
    page.locator('[data-testid="stMetric"]', has_text="TTFT").wait_for()  # reopened in the Model page's view
    assert page.locator('[data-testid="stCode"]').first.inner_text().strip() == run.payload["text"].strip()
    screenshot(page, "flow-history-reopen-generate")
    assert not errors_on(page)


def reopen(page, run_id: int) -> None:
    """Make run_id the only chosen run: the chips already chosen are removed with their own buttons first."""
    box = page.locator('[data-testid="stMultiSelect"]').first
    for _ in range(5):
        tags = box.locator("[data-tag]").evaluate_all("tags => tags.map(t => t.getAttribute('aria-label'))")
        if not tags:
            break
        box.get_by_role("button", name=f"Remove {tags[0]}", exact=True).click()
        wait_idle(page)
    choose(page, f"#{run_id} ·")


def test_compare_quality_and_checklist_runs_reopen_in_their_views(app_server, page, history_db, history_page,
                                                                   monkeypatch, engine_cache):
    """Real runs made with the embedded model (and a real 1 s checklist on this machine), saved into the server's
    history through the same core calls the pages make, then reopened in the browser: charts and token diff. The
    engines come from the session's cache (the engine tests use the same two): loading them is most of the runs."""
    from core.compare.prompts import Prompt
    from core.compare.result import Side, save_to_history
    from core.compare.run import run as compare
    from core.models import ModelSpec
    from core.precision import Precision
    from core.quality import history as quality_history
    from core.quality import run as quality
    from diagnostics import runner, report

    monkeypatch.setenv("TRIAGE_DB", str(app_server.db))  # core's history calls write where the app reads
    res = compare(Side(Precision.FP32), Side(Precision.BF16), [Prompt("italy", "The capital of Italy is")],
                  max_new_tokens=4, loader=lambda side, progress: engine_cache(side.precision.value))
    compare_id = save_to_history(res)
    doc = "The capital of Italy is Rome. The capital of France is Paris. " * 6
    ref, cand = quality.parse_variant("bf16"), [quality.parse_variant("fp32")]
    params = {"reference": "bf16", "candidates": ["fp32"], "document": "capitals", "window": 32, "stride": 32}
    spec = ModelSpec("embedded")
    out = quality_history.run_recorded(spec.label, params, lambda keep: quality.run(
        spec, doc, ref, cand, window=32, stride=32, document_name="capitals", use_cache=False, on_result=keep,
        load=lambda variant, progress: engine_cache(variant.precision.value)))
    started = time.time()
    checklist = runner.run(duration_s=1.0)
    checklist_id = history_db.save_run("checklist", report.history_title(checklist.inputs, 1.0), checklist.to_dict(),
                                       started_at=started)
    assert compare_id and out.run_id and out.status == "finished"

    goto(page, app_server, history_page)
    reopen(page, compare_id)
    page.locator(".cmp-wrap .cmp-head").nth(1).wait_for()  # the side-by-side token diff
    page.locator(".js-plotly-plot").nth(1).wait_for()  # both charts
    assert "FP32" in page.locator(".cmp-wrap .cmp-head").first.inner_text()
    page.get_by_text("Raw JSON of the run").wait_for()
    assert not errors_on(page)
    screenshot(page, "flow-history-reopen-compare")

    reopen(page, out.run_id)
    page.get_by_text("Where the candidates differ most").wait_for()
    page.locator(".js-plotly-plot").first.wait_for()  # the KLD distribution
    assert page.locator(".cmp-wrap").count() == 0
    screenshot(page, "flow-history-reopen-quality")

    reopen(page, checklist_id)
    page.get_by_role("heading", name="Findings").wait_for()
    assert page.locator('[data-testid="stMetric"]').count() >= 3  # the counts per status
    assert not errors_on(page)
    screenshot(page, "flow-history-reopen-checklist")
