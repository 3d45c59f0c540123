"""The Precision compare page in Streamlit's AppTest: the empty state, input errors, and one real (small) comparison
on the embedded model: FP32 against itself (the noise floor), one prompt of the user's, 6 tokens. Each comparison
is saved to a temporary history database (TRIAGE_DB), never the user's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.compare.result import CompareResult
from core.precision import Precision
from core.store import Store

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "compare.py")


@pytest.fixture(autouse=True)
def db(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(path))
    s = Store(path)
    yield s
    s.close()


def _page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    return at


def test_page_renders_the_form_with_enum_choices():
    at = _page()
    assert at.title[0].value == "Precision compare"
    precisions = at.selectbox(key="cmp_ref_prec").options
    # every precision the torch engine runs, the integer ones included (a server side refuses what it cannot run)
    assert len(precisions) == len(Precision) and at.selectbox(key="cmp_cand_prec").value.value == "fp8"
    assert len(at.selectbox(key="cmp_cand_kv").options) == 2
    assert any("press Compare" in i.value for i in at.info)


def test_no_prompts_is_a_clear_error():
    at = _page()
    at.multiselect[0].set_value([])
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("Choose at least one" in e.value for e in at.error)


def test_an_out_of_range_number_says_its_range_and_runs_nothing(db):
    at = _page()
    assert at.number_input(key="cmp_max_new_tokens").label == "Max new tokens (1 to 512)"
    assert at.number_input(key="cmp_top_k").label == "Top-k (1 to 20)"
    at.number_input(key="cmp_max_new_tokens").set_value(1_000_000_000)
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("Max new tokens must be between 1 and 512; it is 1,000,000,000" in e.value for e in at.error), \
        [e.value for e in at.error]
    assert db.list_runs("compare") == []


def test_the_time_budget_shows_its_range_and_refuses_outside_it(db):
    at = _page()
    budget = at.number_input(key="cmp_budget_s")
    assert budget.label == "Time budget (s) (10 to 3,600)" and budget.value == 120
    budget.set_value(5)
    at.button[0].click()
    at.run()
    assert any("Time budget (s) must be between 10 and 3,600; it is 5" in e.value for e in at.error), \
        [e.value for e in at.error]
    assert db.list_runs("compare") == []


def test_an_undecided_comparison_says_how_many_more_prompts_would_decide_it(db):
    # FP8 against FP32 on one prompt of 4 tokens: 4 positions cannot place the same-top share in one band
    at = _page()
    at.selectbox(key="cmp_cand_prec").set_value(Precision.FP8)
    at.multiselect[0].set_value([])
    at.text_area[0].input("The capital of France is")
    at.number_input(key="cmp_max_new_tokens").set_value(4)
    at.button[0].click()
    at = at.run(timeout=600)
    assert not at.exception, at.exception
    verdict = next(i.value for i in at.info if i.value.startswith("Inconclusive")).replace("\\", "")  # markdown
    assert re.match(r"Inconclusive: the one prompt given was scored; about \d+ more prompts would decide it\. ",
                    verdict), verdict
    assert any("1 of 1 prompts scored, every prompt given was scored" in c.value for c in at.caption)
    assert db.list_runs("compare")[0].summary["verdict_band"] == "inconclusive"


def test_a_precision_the_model_breaks_in_is_warned_and_not_the_default_reference():
    # The embedded model's config says gemma3_text: FP16 overflows (core.compare.known), read from data, not a name.
    at = _page()
    assert any("FP16" in w.value and "gemma3_text" in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.selectbox(key="cmp_ref_prec").value is Precision.FP32
    fp16 = at.selectbox(key="cmp_ref_prec").options[list(Precision).index(Precision.FP16)]
    assert fp16.endswith("(fails on this model)"), fp16


def _compare_fp32_with_itself(at: AppTest, prompt: str = "The capital of France is <script>x</script>") -> AppTest:
    at.selectbox(key="cmp_cand_prec").set_value(Precision.FP32)
    at.multiselect[0].set_value([])
    at.text_area[0].input(prompt)
    at.number_input(key="cmp_max_new_tokens").set_value(6)
    at.button[0].click()
    return at.run(timeout=600)


def test_a_real_comparison_renders_summary_side_by_side_and_exports(db):
    at = _compare_fp32_with_itself(_page())
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # FP32 against FP32 is the noise floor: one engine load, and the result must be exact.
    assert any(m.value.startswith("Identical") for m in at.success), [m.value for m in at.success]
    assert len(at.metric) == 6 and at.metric[0].label.startswith("Top-3 token match")
    assert len(at.dataframe) == 1
    html = [e for e in at.get("html")]
    assert html and "&lt;script&gt;" in html[0].proto.body and "<script>x" not in html[0].proto.body
    assert len(at.get("download_button")) == 2
    # A long run keeps its outcome in view: a toast, and the status above the form (the first block of the page)
    assert any("Comparison done" in t.value for t in at.toast)


def test_a_comparison_is_saved_to_history_and_can_be_rebuilt(db):
    assert db.list_runs("compare") == []
    at = _compare_fp32_with_itself(_page(), "What is 123 * 456?")
    assert not at.exception, at.exception
    runs = db.list_runs()
    assert [r.kind for r in runs] == ["compare"] and runs[0].status == "finished"
    assert any(f"run #{runs[0].id}" in c.value for c in at.caption)
    s = runs[0].summary
    assert s["reference_precision"] == s["candidate_precision"] == "fp32"
    assert s["reference"].startswith("FP32") and s["candidate"].startswith("FP32")
    assert s["verdict_band"] == "identical" and s["mean_kld_nats"] == 0.0 and s["p99_kld_nats"] == 0.0
    assert s["same_top_pct"] == 100.0 and s["top3_match"] == 1.0 and s["vllm_rule_passed"] == s["vllm_rule_total"] == 1
    assert all(not isinstance(v, (dict, list)) for v in s.values())  # flat: the History page diffs it field by field
    # The payload is enough to reopen the run: the same prompt, ids and summary as the page showed.
    payload = db.get_run(runs[0].id).payload
    rebuilt = CompareResult.from_dict(json.loads(json.dumps(payload)))
    assert rebuilt.prompts[0].prompt == "What is 123 * 456?" and len(rebuilt.prompts[0].ref_ids) == 6
    assert rebuilt.summary.to_dict() == at.session_state["cmp_result"].summary.to_dict()
    assert rebuilt.to_dict() == payload


def test_an_unwritable_history_still_shows_the_comparison(tmp_path, monkeypatch):
    # Injected fault: TRIAGE_DB names a directory, so the history cannot be opened.
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))
    at = _compare_fp32_with_itself(_page(), "The capital of France is")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any(m.value.startswith("Identical") for m in at.success)
    assert any("not saved to History" in c.value for c in at.caption)


def test_a_broken_fp16_reference_is_named_and_nothing_judges_the_candidate(db):
    # Gemma 3 really overflows in FP16 (core.compare.known): its logits are NaN, so the FP8 candidate measured against
    # it is not judged anywhere on the page (cards, table, diff colours, charts), and History's bands say so too.
    at = _page()
    at.selectbox(key="cmp_ref_prec").set_value(Precision.FP16)
    at.selectbox(key="cmp_cand_prec").set_value(Precision.FP8)
    at.multiselect[0].set_value([])
    at.text_area[0].input("The capital of France is")
    at.number_input(key="cmp_max_new_tokens").set_value(6)
    at.button[0].click()
    at = at.run(timeout=600)
    assert not at.exception, at.exception
    assert any(e.value.startswith("Reference broken") for e in at.error), [e.value for e in at.error]
    cards = {m.label: (m.value, m.proto.delta) for m in at.metric}
    assert len(cards) == 6 and all(v == ("not judged", "the reference is broken") for v in cards.values()), cards
    table = at.dataframe[0].value
    judged = [c for c in table.columns if c not in ("prompt", "tokens (ref/cand)")]
    assert (table[judged] == "not judged").all().all(), table.to_dict("records")
    body = at.get("html")[0].proto.body
    assert "not judged: the reference is broken" in body
    assert not re.search(r'class="[^"]*cmp-(same|first|after|tfmiss)', body)  # no token coloured by agreement
    assert "first divergence" not in body
    assert not at.get("plotly_chart")
    assert any("Agreement charts: not judged: the reference is broken" in c.value for c in at.caption)
    timing = next(c.value for c in at.caption if "Measured when it ran" in c.value)
    assert ", of which load " in timing, timing
    s = db.list_runs("compare")[0].summary
    assert s["verdict_band"] == "reference broken" and s["top3_match_band"] == s["same_top_band"] == "not judged"
