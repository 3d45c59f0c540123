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
