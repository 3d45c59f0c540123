"""The History page in AppTest on a real SQLite file: empty state, listing and filtering, reopening, comparing,
deleting with confirmation, interrupted runs, hostile titles, bad database paths and out-of-range numbers."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from streamlit.testing.v1 import AppTest

from core.store import Store
from tests.conftest import ROOT

PAGE = str(ROOT / "views" / "history.py")
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(path))
    s = Store(path)
    yield s
    s.close()


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception, at.exception
    return at


def pick(at: AppTest, *ids: int) -> AppTest:
    at.multiselect(key="hist_sel").set_value(list(ids)).run()
    assert not at.exception, at.exception
    return at


def test_empty_history_says_so(db):
    at = page()
    assert any("No saved runs yet" in i.value for i in at.info)
    assert str(db.path) in at.caption[0].value


def test_runs_are_listed_newest_first_and_filtered_by_kind(db):
    a = db.save_run("generate", "first", {"p": 1}, {"ttft_s": 0.1})
    b = db.save_run("compare", "second", {"p": 2}, {"mean_kld": 0.01})
    at = page()
    table = at.dataframe[0].value
    assert list(table["id"]) == [b, a] and list(table["title"]) == ["second", "first"]
    at.selectbox(key="hist_kind").set_value("compare").run()
    assert list(at.dataframe[0].value["id"]) == [b]
    at.selectbox(key="hist_kind").set_value("bench").run()
    assert any("No saved runs yet of kind bench" in i.value for i in at.info)


def test_reopening_a_run_shows_its_summary_and_payload(db):
    rid = db.save_run("generate", HOSTILE, {"prompt": HOSTILE, "ids": [1, 2, 3]}, {"ttft_s": 0.25})
    at = pick(page(), rid)
    assert any(t.value == HOSTILE for t in at.text)  # the title as plain text
    bodies = [j.value for j in at.json]
    assert any('"ttft_s"' in v and "0.25" in v for v in bodies) and any(HOSTILE in v for v in bodies)
    for md in at.markdown:
        assert "<script>" not in md.value


def test_two_runs_are_compared_with_a_numeric_diff(db):
    a = db.save_run("compare", "fp32 vs fp8", {}, {"mean_kld": 0.02, "same_top": 0.95, "verdict": "fine"})
    b = db.save_run("compare", "fp32 vs bf16", {}, {"mean_kld": 0.01, "same_top": 0.99, "verdict": "identical"})
    at = pick(page(), a, b)
    assert any(f"#{a} (A) against #{b} (B)" in h.value for h in at.subheader)
    diff = at.dataframe[1].value
    assert list(diff["field"]) == ["mean_kld", "same_top"]
    assert diff.set_index("field").loc["mean_kld", "B - A"] == pytest.approx(-0.01)
    assert diff.set_index("field").loc["same_top", "change %"] == pytest.approx(100 * 0.04 / 0.95)


def test_delete_asks_for_confirmation_and_can_be_cancelled(db):
    a = db.save_run("bench", "doomed", {}, None)
    keep = db.save_run("bench", "kept", {}, None)
    at = pick(page(), a)
    at.button(key="hist_delete").click().run()
    assert any("for good?" in w.value for w in at.warning)
    assert db.get_run(a) is not None  # nothing deleted yet
    at.button(key="hist_confirm_no").click().run()
    assert db.get_run(a) is not None and not any("for good?" in w.value for w in at.warning)
    at.button(key="hist_delete").click().run()
    at.button(key="hist_confirm_yes").click().run()
    assert not at.exception, at.exception
    assert db.get_run(a) is None and db.get_run(keep) is not None
    assert any("Deleted 1 run(s)." in s.value for s in at.success)
    assert list(at.dataframe[0].value["id"]) == [keep]


def test_changing_the_selection_cancels_a_pending_delete(db):
    a = db.save_run("bench", "a", {}, None)
    b = db.save_run("bench", "b", {}, None)
    at = pick(page(), a)
    at.button(key="hist_delete").click().run()
    pick(at, b)
    assert not any("for good?" in w.value for w in at.warning)
    assert db.get_run(a) is not None and db.get_run(b) is not None


def test_a_killed_run_shows_as_interrupted(db):
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from core.store import Store; "
            f"s = Store({str(db.path)!r}); print(s.begin_run('bench', 'killed', {{}}), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    rid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    at = page()
    table = at.dataframe[0].value
    assert table.set_index("id").loc[rid, "status"] == "interrupted"
    assert "1 interrupted" in at.caption[1].value
    at = pick(at, rid)
    assert any("ended before it finished" in w.value for w in at.warning)


@pytest.mark.parametrize("limit", [-5, 0, 10**12])
def test_out_of_range_limits_are_harmless(db, limit):
    db.save_run("bench", "one", {}, None)
    at = page()
    at.number_input(key="hist_limit").set_value(limit).run()
    assert not at.exception, at.exception
    assert 1 <= at.number_input(key="hist_limit").value <= 10_000
    assert len(at.dataframe[0].value) == 1


def test_a_directory_as_database_path_gives_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))
    at = page()
    assert any("is a directory" in e.value and "TRIAGE_DB" in e.value for e in at.error)


def test_a_file_that_is_not_a_database_gives_a_clear_message(tmp_path, monkeypatch):
    bad = tmp_path / "notes.sqlite"
    bad.write_bytes(b"not sqlite at all " * 100)
    monkeypatch.setenv("TRIAGE_DB", str(bad))
    at = page()
    assert any("not a database" in e.value for e in at.error)
    assert bad.read_bytes().startswith(b"not sqlite")


def test_a_large_payload_is_shown_as_text_not_a_tree(db):
    rid = db.save_run("longdoc", "big", {"text": "word " * 200_000}, {"tokens": 200_000})
    at = pick(page(), rid)
    assert any("Large payload" in c.value for c in at.caption)
    assert at.code and len(at.code[0].value) <= 500_000


def _sweep_payload(goodput: float, kind: str = "capacity-bound") -> dict:
    """A saved sweep as core.deployment.sweep writes it (SweepResult.to_dict()), two steps."""
    from tests.unit.test_sweep import step

    from core.deployment.sweep import SweepResult

    res = SweepResult("http://127.0.0.1:8000", "gemma-3-270m", "concurrency", 128, 32, None, {"ttft_p99": 2.0}, 120,
                      steps=[step(1, 1.0, 0.1), step(2, 1.8, 0.9, queue=0.8)], knee={"load": 1, "rps": 1.0,
                                                                                     "how": "by hand"},
                      goodput={"rps": goodput, "step": 1, "load": 2}, wall_s=12.0,
                      verdict={"kind": kind, "headline": f"{kind.capitalize()}: <b>numbers</b>", "remedy": "r"})
    return res.to_dict()


def test_a_saved_sweep_reopens_in_its_own_view_and_two_compare(db):
    a = db.save_run("sweep", "Sweep one", _sweep_payload(1.5), {"goodput_rps": 1.5})
    b = db.save_run("sweep", "Sweep two", _sweep_payload(2.07, "decode-bound"), {"goodput_rps": 2.07})
    at = pick(page(), a)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Knee"] == "1 clients" and metrics["Goodput"] == "1.50 req/s"
    assert any(r"Capacity\-bound\: \<b\>numbers" in w.value for w in at.warning)  # escaped, never HTML
    assert len(at.get("plotly_chart")) == 3
    at = pick(at, a, b)
    table = next(d.value for d in at.dataframe if "goodput (req/s)" in list(d.value.iloc[:, 0]))
    assert round(float(table["change %"][0])) == 38  # goodput +38%
