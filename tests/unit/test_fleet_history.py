"""A fleet refresh against a real Prometheus (scraping replayed vLLM /metrics pages, tests/promstack.py) is saved to
History with its real start and end, so History shows how long it took, and its saved payload opens in the Fleet
page's own view with the same table as the live refresh."""
from __future__ import annotations

import json
import time

import pytest
from streamlit.testing.v1 import AppTest

from tests import promstack


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory):
    why = promstack.missing_reason()
    if why:
        pytest.fail(why)
    replay = promstack.ReplayServer(3, slow={2})
    targets, labels = replay.targets()
    prom = promstack.PrometheusServer([promstack.scrape_job("replay", targets, 1.0, labels)],
                                      tmp_path_factory.mktemp("prom") / "prometheus.log").start()
    try:
        yield prom.url
    finally:
        prom.stop()
        replay.stop()


def _show(payload):
    from views.common import fleet_view

    fleet_view.show(payload, "t")


def test_a_refresh_is_saved_with_its_duration_and_reopens_in_the_fleet_view(prom_url, tmp_path, monkeypatch):
    from core.fleet import table
    from core.fleet.prom import Prometheus
    from core.store import Store
    from diagnostics import fleet

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    prom = Prometheus(prom_url)
    for _ in range(60):  # until every replica has been scraped at least twice (rates need two samples)
        if len(prom.query('count_over_time(vllm:num_requests_running{job="replay"}[1m]) >= 2')) == 3:
            break
        time.sleep(0.5)
    before = time.time()
    run = fleet.run(prom, '{job="replay"}', window="1m")
    (saved,) = Store(tmp_path / "h.sqlite").list_runs("fleet")
    full = Store(tmp_path / "h.sqlite").get_run(saved.id)
    assert saved.duration_s is not None and saved.duration_s > 0  # not start = end any more
    assert before - 1 <= saved.created_at < saved.finished_at <= time.time() + 1

    at = AppTest.from_function(_show, args=(json.loads(json.dumps(full.payload)),), default_timeout=30).run()
    assert not at.exception, at.exception
    shown = at.dataframe[0].value
    assert list(shown["instance"]) == [r["instance"] for r in table.rows(run.snapshot)]
    assert shown.iloc[0]["instance"] == "replica-0002"  # the slow one, worst first
