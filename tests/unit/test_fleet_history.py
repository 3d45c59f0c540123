"""A fleet refresh against a real Prometheus (scraping replayed vLLM /metrics pages, tests/promstack.py) is saved to
History with its real start and end, so History shows how long it took, and its saved payload opens in the Fleet
page's own view with the same table as the live refresh."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests import promstack


@pytest.fixture(scope="module")
def stack(fleet_history_stack):
    """Three replayed replicas (one slow) under a real Prometheus, begun when the session began (tests/conftest.py):
    the past-instant test reviews a whole minute of their samples, which is there by the time it runs."""
    return fleet_history_stack


@pytest.fixture(scope="module")
def prom_url(stack):
    return stack.url


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


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def test_z_at_a_past_instant_the_fleet_is_as_it_was_then(stack, tmp_path, monkeypatch):
    """Last in the file: it stops the replicas. A post-incident review: once the replicas are gone (down now, their
    series stale), `fleet --at`, `run --prometheus-url --since --at` and the page's time picker show them as they
    served at that past instant, with the slow one flagged, and History records the instant."""
    from core.fleet.prom import Prometheus
    from core.store import Store
    from diagnostics import fleet

    db = tmp_path / "h.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(db))
    prom = Prometheus(stack.url)
    # the page's picker has whole minutes: one at least 20 s into the data (rates over its 1m window need samples)
    minute = (int(time.time()) // 60) * 60
    if minute < stack.started + 30:
        minute += 60
    while time.time() < max(minute, stack.started + 30) + 2:  # the instant itself scraped, plus a margin
        time.sleep(0.5)
    then = time.time() - 1
    # The instant reviewed is one Prometheus saw all three up: its scrapes time out at 1 s, and on a loaded 2-core host
    # one that timed out reads the replicas down then, rightly (twice in CI, every replica down at the instant)
    for _ in range(20):
        seen = {s.labels.get("instance"): s.value for s in prom.query('up{job="replay"}', then)}
        if len(seen) == 3 and all(v == 1 for v in seen.values()):
            break
        then -= 1
    assert len(seen) == 3 and all(v == 1 for v in seen.values()), ("no instant with all 3 up in 20 s", seen)
    stack.replay.stop()
    for _ in range(40):  # every replica's last scrape failed: down now
        if len(prom.query('up{job="replay"} == 0')) == 3:
            break
        time.sleep(0.5)
    now = fleet.run(prom, '{job="replay"}', window="10s", save=False)
    assert all(r.up is False for r in now.snapshot.replicas), [(r.name, r.up) for r in now.snapshot.replicas]

    def cli(*args, as_json=True):
        out = subprocess.run([sys.executable, "-m", "diagnostics", *args, "--prometheus-url", stack.url,
                              "--selector", '{job="replay"}', *(["--json"] if as_json else [])],
                             cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if as_json else out.stdout

    ago = int(time.time() - then) + 3  # as a relative time: a few seconds before `then` ("-2m" is documented)
    for args, window, within in ((("fleet", "--at", _iso(then), "--window", "10s"), "10s", 1),
                                 (("run", "--since", _iso(then - 15), "--at", _iso(then)), "15s", 1),
                                 (("run", "--since", f"-{ago + 15}s", "--at", f"-{ago}s"), "15s", 10)):
        got = cli(*args)
        snap, found = got["fleet"], {f["id"]: f for f in got["checklist"]["findings"]}
        assert snap["at"] == pytest.approx(then - (within > 1) * 3, abs=within) and snap["window"] == window, \
            (snap["at"], then)
        assert [r["up"] for r in snap["replicas"]] == [True, True, True], snap["replicas"]
        assert all(r["values"].get("ttft_mean_s") is not None for r in snap["replicas"])
        assert found["fleet.replica_down"]["status"] == "PASS" and found["fleet.slow_replica"]["status"] == "FAIL"
        assert "replica-0002" in found["fleet.slow_replica"]["verdict"]
    # the text report: the instant reviewed and its window, in the header, the findings and the footer; never "the
    # last" (which reads as the minutes before it ran) nor the time it ran
    text = cli("fleet", "--at", f"-{int(time.time() - then) + 3}s", "--window", "10s", as_json=False)
    footer = next(line for line in text.splitlines() if "(a past instant), read on" in line)
    assert "over the 10s up to " in footer and "as it stood at" in text.splitlines()[0], text
    assert "the last " not in text and "over the 10s up to " in text, text
    saved = Store(db).list_runs("fleet")
    instants = [dt.datetime.fromisoformat(r.title.split("as at ")[1].rstrip(")")).timestamp() for r in saved]
    assert len(saved) == 4 and all(abs(t - then) <= 10 for t in instants), [r.title for r in saved]

    page = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "views" / "fleet.py"), default_timeout=60)
    page.run()
    page.text_input[0].set_value(stack.url)
    page.checkbox(key="fleet_past").check()
    page.date_input(key="fleet_at_day").set_value(dt.datetime.fromtimestamp(minute).date())
    page.time_input(key="fleet_at_time").set_value(dt.datetime.fromtimestamp(minute).time())
    page.button[0].click()
    page.run()
    assert not page.exception and not page.error, (page.exception, [e.value for e in page.error])
    run = page.session_state["fleet_run"]
    assert run.snapshot.at == minute and all(r.up for r in run.snapshot.replicas)
    assert any("as it stood at" in c.value for c in page.caption)
    assert len(Store(db).list_runs("fleet")) == 5
