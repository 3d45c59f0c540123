"""The Model page's main flow by clicking: the embedded model loads on first visit, a prompt is typed, Generate
streams tokens and the timings appear."""
import re

import pytest

from tests.e2e.helpers import LOAD_TIMEOUT_S, errors_on, goto, metric_value, screenshot, wait_idle

pytestmark = pytest.mark.e2e


def generate(page, prompt: str, new_tokens: int = 6, timeout_s: float = 240.0):
    """Type a prompt, set the token count, press Generate; returns the output box's text."""
    page.get_by_role("textbox", name="Prompt", exact=True).fill(prompt)
    box = page.get_by_label("New tokens")
    box.fill(str(new_tokens))
    box.press("Tab")
    page.get_by_role("button", name="Generate").click()
    page.locator('[data-testid="stMetric"]', has_text="TTFT").wait_for(timeout=timeout_s * 1000)
    wait_idle(page, timeout_s)
    return page.locator('[data-testid="stCode"]').first.inner_text()


def test_embedded_model_loads_and_a_prompt_streams_with_timings(app_server, page):
    goto(page, app_server, "", timeout_s=LOAD_TIMEOUT_S)
    page.get_by_text("Loaded Gemma 3 270M").first.wait_for(timeout=LOAD_TIMEOUT_S * 1000)
    assert page.get_by_role("heading", name="Memory").count() == 1
    assert re.search(r"\d", metric_value(page, "Weights"))
    out = generate(page, "The capital of France is", new_tokens=6)
    screenshot(page, "flow-model-generate")
    assert out.strip(), "no tokens appeared"
    ttft = metric_value(page, "TTFT")
    assert re.fullmatch(r"[\d.,]+ ?(ms|s)", ttft.strip()), ttft
    assert re.search(r"\d+ in / [1-6] out", metric_value(page, "Tokens"))
    assert not errors_on(page)


def start_long_generation(page, prompt: str):
    """Generate up to 1,024 tokens and return once the decode has counted a few: a run to stop midway."""
    page.get_by_role("textbox", name="Prompt", exact=True).fill(prompt)
    box = page.get_by_label("New tokens")
    box.fill("1024")
    box.press("Tab")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(re.compile(r"Decode: ([3-9]|\d\d+) of 1,024 tokens")).first.wait_for(timeout=240_000)


def new_generations(history_db, before: set[int], n: int = 1, timeout_s: float = 30.0) -> list:
    """The generate runs saved since `before` once there are `n` (polled: the server writes them as it stops)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        new = [r for r in history_db.list_runs("generate") if r.id not in before]
        if len(new) >= n or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def test_a_generation_stopped_by_its_button_by_leaving_or_by_closing_the_tab_is_saved_as_cancelled(
        app_server, page, history_db, browser, dialogs):
    """The Stop button shows (outside the form) while a generation runs; a click stops it, and so do a switch to
    another page and a closed tab: each one is saved to History as cancelled, dated to its stop, with the text
    generated until then, and the server's CPU goes idle."""
    import time

    from tests.e2e.helpers import SCREENSHOTS, new_page
    from tests.e2e.test_long_context_flow import idle_after

    goto(page, app_server, "", timeout_s=LOAD_TIMEOUT_S)
    page.get_by_text("Loaded Gemma 3 270M").first.wait_for(timeout=LOAD_TIMEOUT_S * 1000)
    before = {r.id for r in history_db.list_runs("generate")}

    start_long_generation(page, "Write a long story about a lighthouse keeper.")
    stop = page.get_by_role("button", name="Stop")
    assert stop.count() == 1 and not page.locator('[data-testid="stForm"]').filter(has=stop).count()
    page.set_viewport_size({"width": 1400, "height": 900})
    stop.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "model-generate-stop-button.png"))  # as a 1400x900 window shows it
    clicked = time.time()
    stop.click()
    to_idle = idle_after(app_server.proc.pid)
    print(f"\nStop button to idle CPU: {to_idle:.2f} s")
    new = new_generations(history_db, before)
    assert [r.status for r in new] == ["cancelled"], [(r.id, r.status) for r in new]
    run = history_db.get_run(new[0].id)
    assert run.payload["finish_reason"] == "cancelled" and run.payload["text"].strip()
    assert clicked - 1 <= run.finished_at <= time.time()
    wait_idle(page, 60)
    body = page.inner_text('[data-testid="stMain"]')
    assert "The last generation was stopped before its end" in body and not errors_on(page), body[-3000:]
    assert not page.get_by_role("button", name="Stop").count()

    start_long_generation(page, "Write a long poem about the sea.")  # then leave for the History page
    page.locator('[data-testid="stSidebarNavLink"]', has_text="History").click()
    new = new_generations(history_db, before, 2)
    assert [r.status for r in new] == ["cancelled"] * 2, [(r.id, r.status) for r in new]
    print(f"page switch to idle CPU: {idle_after(app_server.proc.pid):.2f} s")
    wait_idle(page, 60)
    assert page.get_by_text(re.compile(r"[1-9]\d* cancelled")).count(), page.inner_text("body")[:2000]

    context, other = new_page(browser, dialogs)  # a second tab, closed while it generates
    goto(other, app_server, "", timeout_s=LOAD_TIMEOUT_S)
    start_long_generation(other, "Describe every planet of the solar system in detail.")
    context.close()
    new = new_generations(history_db, before, 3)
    assert [r.status for r in new] == ["cancelled"] * 3, [(r.id, r.status) for r in new]
    print(f"closed tab to idle CPU: {idle_after(app_server.proc.pid):.2f} s")
