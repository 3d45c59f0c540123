"""The Model page in Streamlit's AppTest: real engine, real embedded model."""
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT

PAGE = str(ROOT / "pages" / "model.py")


def run_page():
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    return at


def test_first_visit_loads_the_embedded_model_and_shows_memory(embedded_dir):
    at = run_page()
    labels = [m.label for m in at.metric]
    assert "Weights" in labels and "Peak" in labels
    assert "BF16" in at.session_state["setup"].label


def test_prompt_streams_an_answer_with_timings(embedded_dir):
    at = run_page()
    at.text_area[0].set_value("The capital of France is")
    at.number_input[0].set_value(6)
    at.button[1].click().run()  # the Generate button (Load is the first form's)
    assert not at.exception, at.exception
    assert at.code and at.code[0].value.strip()
    assert any(m.label == "TTFT" and m.value.endswith(("ms", "s")) for m in at.metric)


def test_wrong_path_gives_a_message_and_keeps_the_loaded_model(embedded_dir, tmp_path):
    at = run_page()
    before = at.session_state["setup"]
    at.selectbox[0].set_value("GGUF file")
    at.text_input[0].set_value(str(tmp_path / "nope.gguf"))
    at.button[0].click().run()
    assert not at.exception
    assert any("No model at" in e.value for e in at.error)
    assert at.session_state["setup"] == before


def test_empty_prompt_is_refused_politely(embedded_dir):
    at = run_page()
    at.text_area[0].set_value("   ")
    at.button[1].click().run()
    assert not at.exception
    assert any("empty" in w.value for w in at.warning)
