"""Diagnostics and Fleet in recorded mode, in a real browser: the demo link (?recorded=1) opens the shipped recording
under its "Recorded on <machine>, <date>" banner, with the finding cards (Diagnostics) and the replica table (Fleet),
and without the live form beside it."""
import pytest

from core.recordings import available
from tests.e2e.helpers import errors_on, goto, screenshot

pytestmark = pytest.mark.e2e


def _recording(kind: str):
    recs = available(kind)
    if not recs:
        pytest.fail(f"no {kind} recording ships with the console (core/data/recordings/*.json of kind {kind!r})")
    return recs[0]  # newest first: the one the switch opens


def test_diagnostics_and_fleet_open_their_recordings_under_the_banner(app_server, page):
    rec = _recording("checklist")
    goto(page, app_server, "checklist?recorded=1")
    main = page.get_by_test_id("stMain")
    main.get_by_text(f"Recorded on {rec.machine}, {rec.date}", exact=False).wait_for()
    assert main.get_by_role("heading", name="Findings").count() == 1
    first = rec.payload["findings"][0]
    assert main.get_by_text(first["id"], exact=True).count() >= 1  # its card (the worst finding comes first)
    assert main.get_by_text("checks skipped: ", exact=False).count() >= 1  # identical skips share one card
    assert page.get_by_role("button", name="Run the checklist").count() == 0  # no live form beside a recording
    screenshot(page, "recorded-diagnostics")
    assert not errors_on(page)

    rec = _recording("fleet")
    goto(page, app_server, "fleet?recorded=1")
    main.get_by_text(f"Recorded on {rec.machine}, {rec.date}", exact=False).wait_for()
    table = main.locator('[data-testid="stDataFrame"]').first
    table.wait_for()
    replicas = rec.payload["fleet"]["replicas"]
    assert main.get_by_role("heading", name="Replicas, worst first").count() == 1
    assert replicas, "the recorded refresh has replicas"
    assert page.get_by_label("Prometheus URL").count() == 0  # the recorded view never asks a Prometheus
    screenshot(page, "recorded-fleet")
    assert not errors_on(page)
