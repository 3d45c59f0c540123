"""The Precision compare page in Streamlit's AppTest: the empty state, input errors, and one real (small) comparison
on the embedded model: FP32 against itself (the noise floor), one prompt of the user's, 6 tokens."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from core.precision import Precision

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "compare.py")


def _page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    return at


def test_page_renders_the_form_with_enum_choices():
    at = _page()
    assert at.title[0].value == "Precision compare"
    precisions = at.selectbox(key="cmp_ref_prec").options
    assert len(precisions) == 5 and at.selectbox(key="cmp_cand_prec").value.value == "fp8"
    assert len(at.selectbox(key="cmp_cand_kv").options) == 2
    assert any("press Compare" in i.value for i in at.info)


def test_no_prompts_is_a_clear_error():
    at = _page()
    at.multiselect[0].set_value([])
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("Choose at least one" in e.value for e in at.error)


def test_a_real_comparison_renders_summary_side_by_side_and_exports():
    at = _page()
    at.selectbox(key="cmp_cand_prec").set_value(Precision.FP32)
    at.multiselect[0].set_value([])
    at.text_area[0].input("The capital of France is <script>x</script>")
    at.number_input[0].set_value(6)
    at.button[0].click()
    at.run(timeout=600)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # FP32 against FP32 is the noise floor: one engine load, and the result must be exact.
    assert any(m.value.startswith("Identical") for m in at.success), [m.value for m in at.success]
    assert len(at.metric) == 6 and at.metric[0].label.startswith("Top-3 token match")
    assert len(at.dataframe) == 1
    html = [e for e in at.get("html")]
    assert html and "&lt;script&gt;" in html[0].proto.body and "<script>x" not in html[0].proto.body
    assert len(at.get("download_button")) == 2
