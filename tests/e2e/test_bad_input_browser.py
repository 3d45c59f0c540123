"""Bad input that only a real browser can judge: script in prompts and in generated tokens must show as text and
never run (any alert() fails the test through the `dialogs` fixture), a 5 MB paste into the prompt box, and numbers
typed out of range. After each, the app still answers /_stcore/health and saved history is untouched.
The rest of the corpus runs faster in AppTest: tests/app/test_bad_input.py."""
import re

import pytest

from tests.e2e.helpers import LOAD_TIMEOUT_S, errors_on, goto, screenshot, wait_idle
from tests.e2e.test_model_flow import generate

pytestmark = pytest.mark.e2e
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.fixture
def saved(history_db):
    rid = history_db.save_run("checklist", "saved before bad input", {"findings": [1]}, {"pass": 1})
    before = history_db.get_run(rid).to_dict()
    yield
    assert history_db.get_run(rid).to_dict() == before, "a saved run changed"


@pytest.fixture
def model_page(app_server, page):
    goto(page, app_server, "", timeout_s=LOAD_TIMEOUT_S)
    page.get_by_role("heading", name="Prompt").wait_for(timeout=LOAD_TIMEOUT_S * 1000)
    return page


def no_injected_markup(page) -> None:
    assert page.locator("script", has_text="alert(").count() == 0
    assert page.locator('img[src="x"]').count() == 0


def test_script_in_prompts_and_in_generated_tokens_is_shown_as_text(app_server, model_page, saved):
    page = model_page
    # Greedy decoding repeats the pattern, so the model's own tokens are markup too.
    out = generate(page, (HOSTILE + "\n") * 3 + "<script>alert(", new_tokens=8)
    page.wait_for_timeout(1000)  # an injected onerror handler would have fired by now
    screenshot(page, "bad-input-script")
    assert "<" in out or "alert" in out, f"the model did not echo markup this time: {out!r}"
    no_injected_markup(page)
    assert not errors_on(page)
    assert app_server.healthy()


def test_a_5_mb_paste_gets_a_clear_message_and_the_app_keeps_serving(app_server, model_page, saved):
    page = model_page
    box = page.get_by_role("textbox", name="Prompt", exact=True)
    box.click()
    page.keyboard.press("Control+A")
    big = "The quick brown fox jumps over the lazy dog. " * 116_000  # 5.2 MB, pasted as a user would (trusted input)
    page.keyboard.insert_text(big)
    assert page.evaluate("() => document.querySelector('textarea[aria-label=\"Prompt\"]').value.length") == len(big)
    page.get_by_role("button", name="Generate").click()
    alert = page.locator('[data-testid="stAlertContentError"]')
    alert.first.wait_for(timeout=240_000)
    wait_idle(page)
    screenshot(page, "bad-input-5mb")
    message = alert.first.inner_text()
    assert f"{len(big):,} characters" in message and "Long context" in message, message
    assert not errors_on(page) and app_server.healthy()
    out = generate(page, "The capital of France is", new_tokens=2)  # the same session still generates
    assert out.strip()


@pytest.mark.parametrize("typed", ["-5", "0", "99999999999", "1e308", "abc"])
def test_out_of_range_numbers_are_refused_in_the_browser(app_server, model_page, typed, saved):
    page = model_page
    box = page.get_by_label("New tokens")
    box.fill("")
    box.type(typed)
    box.press("Tab")
    wait_idle(page)
    value = box.input_value()
    assert not errors_on(page)
    shown = float(value) if re.fullmatch(r"-?[\d.]+(e\d+)?", value or "") else None
    # Either the box refuses the text (keeps a number in 1..1024), or Generate refuses the value in words, with the
    # range the label already shows, and runs nothing.
    if not (shown is not None and 1 <= shown <= 1024):
        page.get_by_role("button", name="Generate").click()
        page.get_by_text("New tokens must be between 1 and 1,024").wait_for(timeout=30_000)
        wait_idle(page)
    screenshot(page, f"bad-input-number-{re.sub(r'[^0-9a-z]', '_', typed)}")
    assert app_server.healthy()
