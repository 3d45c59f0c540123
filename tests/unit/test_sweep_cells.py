"""The sweep views never print Python's None or pandas' nan: a cell without a number says "-" and a line under the
table says why, on the recorded sweep and remedy (saved by an older version, without some columns) and on a live
sweep run without an SLO."""
from __future__ import annotations

import copy
import re

from streamlit.testing.v1 import AppTest

from core.recordings import available
from views.common.sweep import dashed, shown_rows, step_rows, summary_cell

NONE = re.compile(r"\b(None|nan|NaN)\b")


def _texts(at: AppTest) -> list[str]:
    """Every sentence and every table cell the script drew."""
    out = [e.value for kind in ("markdown", "caption", "warning", "info", "success", "error") for e in at.get(kind)]
    out += [f"{m.label} {m.value}" for m in at.metric]
    for df in at.dataframe:
        out += [str(v) for v in df.value.astype(str).to_numpy().ravel()]
    return out


def _render(kind: str, mutate=None) -> AppTest:
    def script(kind: str, mutate):
        from core.recordings import available
        from views.common import remedy_view, sweep

        payload = available(kind)[0].payload
        if mutate is not None:
            payload = mutate(payload)
        (sweep.show if kind == "sweep" else remedy_view.show)(payload, "t")

    at = AppTest.from_function(script, args=(kind, mutate), default_timeout=60).run()
    assert not at.exception, at.exception
    return at


def test_the_recorded_sweep_says_why_a_column_is_empty_instead_of_none():
    payload = available("sweep")[0].payload
    rows, why = shown_rows(payload)
    assert all(v is not None for r in rows for v in r.values())
    assert {r["before engine % of TTFT"] for r in rows} == {"-"} and {r["requests timed"] for r in rows} == {"-"}
    assert "before engine % of TTFT: not in this saved sweep" in why and "requests timed: not in this saved" in why
    assert step_rows(payload)[0]["requests timed"] is None  # the CSV keeps an empty cell, not a dash
    at = _render("sweep")
    bad = [t for t in _texts(at) if NONE.search(t)]
    assert not bad, bad
    assert any("in the steps is a number the step does not have" in c.value for c in at.caption)


def _without_slo(payload: dict) -> dict:
    payload = copy.deepcopy(payload)
    payload["slo"], payload["goodput"] = None, None
    for s in payload["steps"]:
        s["meets_slo"] = None
    return payload


def test_a_sweep_without_an_slo_says_so_in_its_meets_slo_column():
    rows, why = shown_rows(_without_slo(available("sweep")[0].payload))
    assert {r["meets SLO"] for r in rows} == {"-"} and "meets SLO: no SLO was given for this sweep" in why
    at = _render("sweep", _without_slo)
    bad = [t for t in _texts(at) if NONE.search(t)]
    assert not bad, bad


def test_the_recorded_remedy_has_no_none_in_any_cell():
    at = _render("remedy")
    bad = [t for t in _texts(at) if NONE.search(t)]
    assert not bad, bad


def test_summary_cells_and_dashed_columns():
    assert summary_cell(None, "knee_load") == "none in the sweep"
    assert summary_cell(None, "goodput_rps", {"slo": None}) == "no SLO given"
    assert summary_cell(None, "goodput_rps", {"slo": {"ttft_p99": 2.0}}) == "none met the SLO"
    assert summary_cell(None) == "-" and summary_cell(12.34567, nd=1) == "12.3"
    rows, empty = dashed([{"a": 1.5, "b": None, "c": True}, {"a": 2.0, "b": 3.0, "c": False}])
    assert rows == [{"a": 1.5, "b": "-", "c": "yes"}, {"a": 2.0, "b": "3", "c": "no"}] and empty == ["b"]


def test_the_recorded_remedy_says_its_verdict_once():
    """The summary above the best trial was its verdict's headline again ('The remedy helped ...' twice)."""
    at = _render("remedy")
    doc = available("remedy")[0].payload
    best = doc["trials"][doc["best"]]["verdict"]["headline"]
    said = [t for t in _texts(at) if t.replace("\\", "") == best or t.replace("\\", "") == f"**{best}**"]
    assert len(said) == 1, said
    assert len([e for e in at.expander if e.label.startswith("Try ")]) == len(doc["trials"]) - 1  # the others
