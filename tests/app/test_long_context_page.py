"""The Long context page in Streamlit's AppTest, with the real embedded model (loaded once per process)."""
from streamlit.testing.v1 import AppTest

from core.models import ModelSpec
from core.precision import Precision
from core.session import Setup
from tests.conftest import ROOT

PAGE = str(ROOT / "pages" / "long_context.py")
BF16 = Setup(ModelSpec("embedded"), Precision.BF16)


def page(setup=BF16) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["setup"] = setup
    at.run()
    assert not at.exception, at.exception
    return at


def test_without_a_model_it_offers_the_embedded_one():
    at = page(None)
    assert any("Load the embedded model" in b.label for b in at.button)
    assert not at.text_area  # nothing to count tokens with yet


def test_empty_input_renders_and_asks_for_a_document(embedded_dir):
    at = page()
    assert any("Paste a document" in i.value for i in at.info)
    assert not at.metric


def test_pasted_document_shows_stats_kv_cache_and_truncation(embedded_dir):
    at = page()
    doc = "# Incident\n\nThe server stalled after a long paste.\n\n## Log\n\n" + "ERROR kv cache full\n" * 400
    at.text_area(key="lc_text").set_value(doc).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Characters"] == f"{len(doc):,}"
    assert int(metrics["Tokens"].replace(",", "")) > 400
    assert metrics["Fits"] == "yes"
    assert metrics["Per token"] == "18.00 KiB"  # loaded model: 18 layers x 1 KV head x 256 x 2 x 2 bytes
    assert "vLLM blocks" in metrics

    # a configured max length below the document's length: the truncation choice appears
    at.number_input(key="lc_max_len").set_value(256).run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["Fits"].startswith("no")
    assert at.radio and any("dropped" in w.value for w in at.warning)


def test_binary_looking_paste_gives_an_error_not_a_crash(embedded_dir):
    at = page()
    at.text_area(key="lc_text").set_value("\x01\x02\x03\x04" * 100).run()
    assert not at.exception
    assert any("looks binary" in e.value for e in at.error)
