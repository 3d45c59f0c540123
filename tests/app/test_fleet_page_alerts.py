"""The Fleet page's alerting part in Streamlit's AppTest, over a hand-made fleet with one stalled replica: the state
column says STALLED, the stall query is shown as it stands (pasteable as an alert rule) and the rule file is offered
for download. The page over a real Prometheus and real vLLM servers is tests/vllm/test_fleet_browser.py's."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from diagnostics.checks.fleet import CHECKS
from diagnostics.findings import RunResult
from diagnostics.fleet import FleetRun
from diagnostics.runner import evaluate
from tests.unit.test_fleet_stall import _replica, _snap

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "fleet.py")


def test_the_fleet_page_shows_the_stall_query_and_offers_the_rule_file():
    stuck = _replica("stuck", running=4.0, work_min=4.0, stalled=4.0, progress_last_t=970.0)
    snap = _snap([_replica("busy", running=2.0, progress=10.0), stuck], prometheus_url="http://127.0.0.1:9")
    result = RunResult("now", 300.0, 300.0, False, "host", {}, tuple(evaluate(snap, CHECKS)), ())
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["fleet_run"] = FleetRun(snap, result)
    at.run()
    assert not at.exception, at.exception
    assert snap.promql["stalled"] in [c.value for c in at.code]
    table = at.dataframe[0].value
    assert table.iloc[0]["instance"] == "stuck" and table.iloc[0]["state"].startswith("STALLED")
    button = at.get("download_button")[0]
    assert "alert rules" in button.label


def _show_payload(payload):
    from views.common import fleet_view

    fleet_view.show(payload, "t")


def test_a_saved_refresh_opens_in_the_same_view_and_old_payloads_do_not_crash():
    """The dict a refresh is saved as (History, recordings) through JSON and back draws the same table; a payload
    with fields missing (an older version) or without a snapshot shows what it has."""
    import json

    from core.fleet.fleet import FleetSnapshot

    stuck = _replica("stuck", running=4.0, work_min=4.0, stalled=4.0, progress_last_t=970.0)
    snap = _snap([_replica("busy", running=2.0, progress=10.0), stuck], prometheus_url="http://127.0.0.1:9")
    result = RunResult("2026-01-01T00:00:00+00:00", 300.0, 300.0, False, "host", {"auth": "no credentials"},
                       tuple(evaluate(snap, CHECKS)), ())
    payload = json.loads(json.dumps(FleetRun(snap, result).to_dict()))
    assert FleetSnapshot.from_dict(payload["fleet"]).to_dict() == payload["fleet"]
    at = AppTest.from_function(_show_payload, args=(payload,), default_timeout=30).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["instance"]) == ["stuck", "busy"] and table.iloc[0]["state"].startswith("STALLED")
    assert snap.promql["stalled"] in [c.value for c in at.code]
    old = {"fleet": {"prometheus_url": "http://old:9090", "replicas": [{"name": "a", "up": True}]}}
    for p in (old, {"fleet": None}, {}, {"fleet": payload["fleet"]}):
        at = AppTest.from_function(_show_payload, args=(p,), default_timeout=30).run()
        assert not at.exception, (p, at.exception)


def test_recorded_mode_draws_a_recorded_refresh_under_its_banner_without_querying(tmp_path, monkeypatch):
    """A recording file of the shipped format in a folder of its own (the page reads core.recordings.DIR): the
    page shows the banner and the recorded table, and neither the connect form nor anything live."""
    import json

    import core.recordings as recordings

    stuck = _replica("stuck", running=4.0, work_min=4.0, stalled=4.0, progress_last_t=970.0)
    snap = _snap([_replica("busy", running=2.0, progress=10.0), stuck], prometheus_url="http://127.0.0.1:9")
    result = RunResult("2026-01-01T00:00:00+00:00", 300.0, 300.0, False, "host", {}, tuple(evaluate(snap, CHECKS)), ())
    (tmp_path / "fleet-test.json").write_text(json.dumps({
        "kind": "fleet", "title": "Two replicas, one stalled", "machine": "test host", "recorded_at": "2026-01-01T00:00Z",
        "captured_by": "this test", "payload": FleetRun(snap, result).to_dict()}))
    monkeypatch.setattr(recordings, "DIR", tmp_path)
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["fleet_data"] = "Recorded"
    at.run()
    assert not at.exception, at.exception
    assert "Recorded on test host" in at.warning[0].value
    assert not at.text_input  # no Prometheus URL field: nothing live is drawn or asked for
    table = at.dataframe[0].value
    assert list(table["instance"]) == ["stuck", "busy"]
