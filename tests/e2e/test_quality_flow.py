"""The Quality page by clicking: a pasted document carrying HTML, windows of 32 tokens, BF16 against INT8 W8A8 on
the embedded model; an out-of-range window is refused with its range first; then the verdict, the table, the host
timings apart, the KLD chart and the worst positions appear, and the document's HTML stays text. And a run stopped by
its button while a candidate is scored: History keeps it as cancelled with the reference's row."""
import pytest

from tests.e2e.helpers import LOAD_TIMEOUT_S, errors_on, goto, keep_only_chip, screenshot, wait_idle

pytestmark = pytest.mark.e2e
DOC = "<b>bold</b> & the capital of Italy is Rome. The capital of France is Paris. " * 8


def set_number(page, label: str, value: int) -> None:
    box = page.get_by_role("spinbutton", name=label)
    box.fill(str(value))
    box.press("Tab")
    wait_idle(page, 180)


def test_quality_run_in_the_browser(app_server, page):
    goto(page, app_server, "quality", timeout_s=LOAD_TIMEOUT_S)
    page.get_by_role("textbox", name="Document").fill(DOC)
    page.get_by_role("textbox", name="Document").press("Control+Enter")
    wait_idle(page)
    keep_only_chip(page, "Candidates", "int8")
    set_number(page, "Window (tokens) (16 to 32,000)", 1_000_000_000)
    page.get_by_role("button", name="Run quality").click()
    page.get_by_text("Window (tokens) must be between 16 and 32,000; it is 1,000,000,000").wait_for(timeout=60_000)
    screenshot(page, "quality-out-of-range")
    set_number(page, "Window (tokens) (16 to 32,000)", 32)
    set_number(page, "Stride (tokens) (1 to the window)", 32)
    page.get_by_role("button", name="Run quality").click()
    page.get_by_text("Where the candidates differ most").wait_for(timeout=3 * LOAD_TIMEOUT_S * 1000)
    wait_idle(page, LOAD_TIMEOUT_S)
    assert not errors_on(page)
    assert page.locator('[data-testid="stDataFrame"]').count() >= 2
    verdict = page.locator('[data-testid="stMarkdown"]', has_text="Verdict").first.inner_text()
    assert "int8" in verdict and any(v in verdict for v in ("fine", "degraded", "broken")), verdict
    assert "mean KLD" in verdict and "nats" in verdict
    assert page.get_by_text("Host timings and peak memory: not comparable across rows").count() == 1
    # Streamlit loads the Plotly bundle lazily: the chart is drawn after the run settles, later on a slow machine
    page.locator(".js-plotly-plot").first.wait_for(timeout=LOAD_TIMEOUT_S * 1000)
    assert page.locator("main b", has_text="bold").count() == 0  # the document's HTML never becomes markup
    screenshot(page, "quality-run-verdict")


def test_a_quality_run_stopped_by_its_button_is_saved_as_cancelled_with_its_finished_rows(app_server, page,
                                                                                          history_db):
    """Stop pressed while the candidate's windows are scored: the app's CPU goes idle, History has the run as
    cancelled with the reference's row it had finished, and the page says where the run went."""
    import re
    import time

    from tests.e2e.test_long_context_flow import idle_after

    before = {r.id for r in history_db.list_runs("quality")}
    goto(page, app_server, "quality", timeout_s=LOAD_TIMEOUT_S)
    page.get_by_role("button", name="Use the shipped sample").click()
    wait_idle(page)
    keep_only_chip(page, "Candidates", "int8")
    set_number(page, "Window (tokens) (16 to 32,000)", 32)
    set_number(page, "Stride (tokens) (1 to the window)", 32)
    page.get_by_role("button", name="Run quality").click()
    page.get_by_text(re.compile(r"int8: window \d+ of \d+")).first.wait_for(timeout=3 * LOAD_TIMEOUT_S * 1000)
    page.locator(".st-key-q_stop button").first.click()
    print(f"\nStop button to idle CPU: {idle_after(app_server.proc.pid):.2f} s")
    deadline = time.monotonic() + 30
    while not (new := [r for r in history_db.list_runs("quality") if r.id not in before
                       and r.status != "running"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [r.status for r in new] == ["cancelled"], [(r.id, r.status) for r in new]
    rows = history_db.get_run(new[0].id).payload["rows"]
    assert [r["role"] for r in rows] == ["reference"], rows  # the row it finished before the stop
    wait_idle(page, 60)
    assert page.get_by_text("The last quality run was stopped before its end").count() and not errors_on(page)
    assert not page.locator(".st-key-q_stop button").count()
    screenshot(page, "quality-stopped")
