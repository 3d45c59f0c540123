"""The Precision compare page's main flow by clicking: FP32 against FP8 (W8A8) on the embedded model, one built-in
prompt and one typed prompt carrying HTML, 6 tokens each (FP8 runs through torch._scaled_mm, slow on a CPU). The
summary, the side-by-side outputs (opened on the prompt that diverged first) and the hover tooltips appear, and the run
lands in the server's history. An FP16 reference on Gemma 3 is warned before and named as the broken side after; an
out-of-range number is refused with its range. Also: a deep link opened first on a freshly started server goes
through the router."""
import re
import tempfile
from pathlib import Path

import pytest

from core.compare import render
from core.compare.result import CompareResult
from tests.e2e.helpers import (APP, LOAD_TIMEOUT_S, SCREENSHOTS, AppServer, errors_on, goto, keep_only_chip,
                               metric_value, new_page, screenshot, wait_idle)

pytestmark = pytest.mark.e2e
TYPED = "<b>bold</b> & the capital of Italy is"
# Both precisions load on first use and FP8 W8A8 is slow on 2 cores.
RUN_TIMEOUT_S = 2 * LOAD_TIMEOUT_S


def select(page, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label`. The first click on a combobox right after a long run
    sometimes only focuses it (seen in headless Chromium), so click until the list is open."""
    box = page.get_by_role("combobox", name=label, exact=True)
    choice = page.get_by_role("option", name=option, exact=True)
    for _ in range(5):
        box.click()
        try:
            choice.wait_for(state="visible", timeout=2000)
            break
        except Exception:  # noqa: BLE001 - playwright's TimeoutError; try again
            page.keyboard.press("Escape")
    choice.click()
    wait_idle(page)


def test_fp32_against_fp8_shows_summary_side_by_side_and_is_saved(app_server, page, history_db):
    before = {r.id for r in history_db.list_runs("compare")}
    goto(page, app_server, "compare")
    assert page.locator('[data-testid="stSidebar"]').get_by_text("Precision compare").count() == 1
    assert not errors_on(page)
    # The defaults are the comparison this test wants: FP32 reference, FP8 W8A8 candidate, auto KV cache.
    prec = page.get_by_role("combobox", name="Precision", exact=True)
    assert prec.nth(0).input_value() == "FP32" and "W8A8" in prec.nth(1).input_value()
    keep_only_chip(page, "Built-in prompts", "france")
    page.get_by_label("Your prompts, one per line").fill(TYPED)
    page.get_by_label("Max new tokens (1 to 512)").fill("6")
    page.get_by_role("button", name="Compare").click()

    page.locator('[data-testid="stMetric"]', has_text="Mean KLD").wait_for(timeout=RUN_TIMEOUT_S * 1000)
    wait_idle(page, RUN_TIMEOUT_S)
    assert not errors_on(page)
    assert re.fullmatch(r"[0-9.e+-]+ nats", metric_value(page, "Mean KLD").strip())
    assert re.fullmatch(r"[0-9.]+ %", metric_value(page, "Same top token").strip())
    assert re.fullmatch(r"[0-2]/2 prompts", metric_value(page, "vLLM rule").strip())
    verdict = page.locator('[data-testid="stAlert"]', has_text="same top token").first.inner_text()
    assert "FP8" in verdict and "FP32" in verdict and "alibration" not in verdict, verdict

    # The side-by-side view of the first prompt: reference left, candidate right, 6 tokens each.
    # st.html content can arrive after the metrics above it on a loaded machine: wait for it by name.
    page.locator(".cmp-wrap .cmp-head").nth(1).wait_for(timeout=RUN_TIMEOUT_S * 1000)
    heads = page.locator(".cmp-wrap .cmp-head").all_inner_texts()
    assert len(heads) == 2 and heads[0].startswith("Reference: FP32") and heads[1].startswith("Candidate: FP8")
    assert all(h.endswith("6 tokens") for h in heads), heads
    first = page.locator(".cmp-wrap .cmp-col").first.locator(".cmp-tok").first
    first.hover()
    tip = first.locator(".cmp-tip")
    tip.wait_for(state="visible")
    assert "teacher-forced" in tip.inner_text() and "%" in tip.inner_text()
    # The tooltip only shows while hovered, and the full-page screenshot resizes the viewport: take it first.
    box = page.locator(".cmp-wrap").bounding_box()
    page.screenshot(path=str(SCREENSHOTS / "flow-compare-hover.png"),
                    clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": box["height"] + 260})
    page.mouse.move(0, 0)
    screenshot(page, "flow-compare-fp32-fp8")

    # The token diff opens on the prompt that diverged first (lowest free-running top-1 agreement), picker for the
    # rest: the page's choice is checked against the saved run's own numbers.
    saved = page.get_by_text(re.compile(r"Saved to History as run #\d+")).inner_text()
    run_id = int(re.search(r"#(\d+)", saved).group(1))
    rebuilt = CompareResult.from_dict(history_db.get_run(run_id).payload)
    opened = rebuilt.prompts[render.most_divergent(rebuilt)]
    picker = page.get_by_role("combobox", name="Prompt", exact=True)
    assert picker.input_value() == render.prompt_choice(opened)
    assert page.locator(".cmp-legend b").first.inner_text() == opened.name
    if any(p.free.first_divergence is not None for p in rebuilt.prompts):
        assert opened.free.first_divergence is not None, "the diff opened on an identical prompt"
    screenshot(page, "flow-compare-opens-on-divergent-prompt")

    # The typed prompt's HTML is shown as text, never rendered (the dialogs fixture also fails on any alert).
    typed = next(p for p in rebuilt.prompts if p.name == "user-1")
    select(page, "Prompt", render.prompt_choice(typed))
    assert TYPED in page.locator(".cmp-wrap .cmp-prompt").first.inner_text()
    assert page.locator(".cmp-wrap b").count() == 0
    screenshot(page, "flow-compare-typed-prompt")

    new = [r for r in history_db.list_runs("compare") if r.id not in before]
    assert [r.id for r in new] == [run_id] and new[0].status == "finished"
    assert "FP32" in new[0].title and "W8A8" in new[0].title
    s = new[0].summary
    assert s["reference_precision"] == "fp32" and s["candidate_precision"] == "fp8" and s["prompts"] == 2
    assert s["mean_kld_nats"] > 0 and s["verdict_band"] in ("fine", "watch", "inconclusive", "low agreement")
    payload = history_db.get_run(run_id).payload
    assert [p["prompt"] for p in payload["prompts"]] == ["The capital of France is", TYPED]
    assert not errors_on(page)


def test_an_fp16_reference_on_gemma_3_is_warned_then_named_as_the_broken_side(app_server, page):
    """Gemma 3 overflows FP16: the page says so before the run (read from the model's config), keeps it out of the
    default reference, refuses an out-of-range number in words with its range, and after the run blames the FP16
    reference, not the candidate."""
    goto(page, app_server, "compare")
    warning = page.locator('[data-testid="stAlert"]').first.inner_text()
    assert "Known to fail on this model" in warning and "gemma3_text" in warning and "FP16" in warning, warning
    prec = page.get_by_role("combobox", name="Precision", exact=True)
    assert prec.nth(0).input_value() == "FP32"
    keep_only_chip(page, "Built-in prompts", "france")
    page.get_by_label("Max new tokens (1 to 512)").fill("1000000000")
    page.get_by_role("button", name="Compare").click()
    refusal = page.get_by_text("Max new tokens must be between 1 and 512; it is 1,000,000,000")
    refusal.wait_for(timeout=60_000)
    screenshot(page, "flow-compare-out-of-range")

    page.get_by_label("Max new tokens (1 to 512)").fill("4")
    select_nth(page, "Precision", 0, "FP16 (fails on this model)")
    select_nth(page, "Precision", 1, "FP32")
    page.get_by_role("button", name="Compare").click()
    verdict = page.locator('[data-testid="stAlert"]', has_text="Reference broken")
    verdict.wait_for(timeout=RUN_TIMEOUT_S * 1000)
    wait_idle(page, RUN_TIMEOUT_S)
    assert not errors_on(page)
    text = verdict.inner_text()
    assert "the FP16 reference overflowed: its logits are not finite at 100% of positions" in text, text
    assert "candidate was not judged" in text and "alibration" not in text
    # one truth: no card, diff colour or chart judges the candidate against the broken reference
    assert metric_value(page, "Top-3 token match") == "not judged" and metric_value(page, "vLLM rule") == "not judged"
    deltas = page.locator('[data-testid="stMetricDelta"]').all_inner_texts()
    assert len(deltas) == 6 and {d.strip() for d in deltas} == {"the reference is broken"}, deltas
    main = page.inner_text('[data-testid="stMain"]')
    assert "first divergence" not in main, main[-3000:]
    assert "of which load" in main and not page.locator('[data-testid="stPlotlyChart"]').count()
    screenshot(page, "flow-compare-fp16-reference-broken")


def test_a_comparison_stopped_by_its_button_is_saved_as_cancelled(app_server, page, history_db):
    """The Stop button shows under the progress while a comparison runs; a click stops it, History keeps the run as
    cancelled with its sides, and the page says so."""
    import time

    from tests.e2e.test_long_context_flow import idle_after

    before = {r.id for r in history_db.list_runs("compare")}
    goto(page, app_server, "compare")
    page.get_by_label("Max new tokens (1 to 512)").fill("64")
    page.get_by_role("button", name="Compare").click()
    stop = page.get_by_role("button", name="Stop")  # shown while the run goes, under its bar of prompts scored
    stop.wait_for(timeout=RUN_TIMEOUT_S * 1000)
    page.get_by_text(re.compile(r"Scored")).first.wait_for(timeout=RUN_TIMEOUT_S * 1000)  # past the loads
    time.sleep(2)  # inside the first batch's generation
    clicked = time.time()
    stop.click()
    print(f"\nStop button to idle CPU: {idle_after(app_server.proc.pid):.2f} s")
    deadline = time.monotonic() + 30
    while not (new := [r for r in history_db.list_runs("compare") if r.id not in before]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [r.status for r in new] == ["cancelled"], [(r.id, r.status) for r in new]
    assert new[0].title.startswith("Compare FP32 vs FP8") and clicked - 1 <= new[0].finished_at <= time.time()
    wait_idle(page, 60)
    assert page.get_by_text("The last comparison was stopped before its end").count() and not errors_on(page)
    assert not page.get_by_role("button", name="Stop").count()


def select_nth(page, label: str, n: int, option: str) -> None:
    """Pick `option` in the n-th selectbox labelled `label` (the reference's and the candidate's share a label)."""
    page.get_by_role("combobox", name=label, exact=True).nth(n).click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_idle(page)


def test_a_deep_link_on_a_fresh_server_runs_the_router(browser, dialogs):
    """Streamlit treats an app with a folder named pages/ as a pages-folder app until one session has run the
    router: the first deep link after a restart ran the page alone (no router, no wide layout, no sidebar status).
    The pages live in views/ for that reason."""
    server = AppServer(APP, Path(tempfile.mkdtemp()) / "history.sqlite", SCREENSHOTS.parent / "e2e-fresh-server.log")
    try:
        server.start()
        context, page = new_page(browser, dialogs)
        try:
            goto(page, server, "compare")
            sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
            assert "Precision compare" in sidebar, sidebar  # the router's title, not the file name "compare"
        finally:
            context.close()
    finally:
        server.stop()
