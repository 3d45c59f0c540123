"""The pages' side of local servers and remedies, in AppTest without a server: the deployment page offers "Start a
local vLLM" only on loopback (or behind a login) and says why otherwise; a tried remedy saved to History reopens in
its own view (verdict, before/after with % change, the command to copy)."""
from __future__ import annotations

import shlex

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from core.deployment import remedy
from core.store import Store
from tests.conftest import ROOT
from tests.unit.test_remedy import CAPACITY, launch, server, step, sweep_doc


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "history.sqlite"))
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    s = Store(tmp_path / "history.sqlite")
    yield s
    s.close()


@pytest.fixture
def address():
    before = config.get_option("server.address")
    yield lambda a: config.set_option("server.address", a)
    config.set_option("server.address", before)


def start_button(at: AppTest):
    return next(b for b in at.button if b.label == "Start")


@pytest.mark.parametrize("where, allowed", [("127.0.0.1", True), ("0.0.0.0", False), ("", False)])
def test_starting_servers_is_offered_only_on_loopback(db, address, where, allowed):
    address(where)
    at = AppTest.from_file(str(ROOT / "views" / "deployment.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert any(e.label == "Start a local vLLM" for e in at.expander)
    assert start_button(at).disabled is (not allowed)
    captions = " ".join(c.value for c in at.caption).replace("\\", "")  # markdown escapes
    if allowed:
        assert "only this host can start servers" in captions
    else:
        assert "Starting servers is off" in captions and "server.address" in captions and "st.login" in captions


def test_a_tried_remedy_reopens_in_history(db):
    slo = {"ttft_p99": 2.0}
    before = sweep_doc([step(2, 0.5, 1.0), step(8, 0.52, 1.9)], CAPACITY, slo=slo)
    after = sweep_doc([step(2, 0.6, 0.5, 0.1), step(8, 1.21, 0.9, 0.2)], {"kind": "not saturated"}, slo=slo)
    s = server(["--max-num-seqs", "2"])
    t = remedy.Trial(remedy.Remedy("more slots", {"--max-num-seqs": "8"}), before, after, s.flags,
                     remedy.apply_flags(s.flags, {"--max-num-seqs": "8"}))
    t.argv = launch(8001, t.flags_after)
    t.comparison = remedy.compare(before, after)
    t.verdict = remedy.judge(t.comparison, slo, "--max-num-seqs 8")
    doc = remedy.result_of([t], s)
    run_id = remedy.record(doc)
    assert run_id and db.get_run(run_id).kind == "remedy"
    at = AppTest.from_file(str(ROOT / "views" / "history.py"), default_timeout=60).run()
    at.multiselect(key="hist_sel").set_value([run_id]).run()
    assert not at.exception, at.exception
    shown = [s.value.replace("\\", "") for s in at.success]  # markdown escapes
    assert any("goodput 0.52 -> 1.21 req/s" in v for v in shown), shown
    rows = next(d.value for d in at.dataframe if "goodput at the SLO (req/s)" in list(d.value.iloc[:, 0]))
    assert round(float(rows["change %"][0])) == 133
    assert any(c.value == shlex.join(launch(8001, ["--max-num-seqs", "8"])) for c in at.code)  # what started it


def test_the_recorded_deployment_page_shows_the_recorded_remedy(db):
    at = AppTest.from_file(str(ROOT / "views" / "deployment.py"), default_timeout=60)
    at.query_params["recorded"] = "1"
    at.run()
    assert not at.exception, at.exception
    assert any(s.value == "A remedy tried" for s in at.subheader)
    banners = [w.value for w in at.warning if "not live" in w.value]
    assert len(banners) == 2  # the sweep's and the remedy's, each with its machine and date
    assert any("The remedy helped" in s.value for s in at.success)
    # recorded before the argv was kept: the console's own serve with the winner's flags, which runs here
    assert any("-m diagnostics serve --model embedded --max-num-seqs 8" in c.value for c in at.code)
    assert not any("vllm serve" in c.value for c in at.code)
