"""The Model page in Streamlit's AppTest: real engine, real embedded model."""
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT

PAGE = str(ROOT / "views" / "model.py")


def run_page():
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    return at


def test_first_visit_loads_the_embedded_model_and_shows_memory(embedded_dir):
    at = run_page()
    labels = [m.label for m in at.metric]
    assert "Weights" in labels and "Peak (last run)" in labels and "Runtime copies" in labels
    assert any("Gemma 3 270M · BF16 · torch eager · CPU" in m.value for m in at.markdown)  # the short label
    assert "BF16" in at.session_state["setup"].label


def test_prompt_streams_an_answer_with_timings(embedded_dir):
    at = run_page()
    at.text_area[0].set_value("The capital of France is")
    at.number_input[0].set_value(6)
    at.button[1].click().run()  # the Generate button (Load is the first form's)
    assert not at.exception, at.exception
    assert at.code and at.code[0].value.strip()
    assert any(m.label == "TTFT" and m.value.endswith(("ms", "s")) for m in at.metric)


def test_a_generation_is_saved_to_history(embedded_dir, tmp_path, monkeypatch):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = run_page()
    at.text_area[0].set_value("History: the capital of Spain is")
    at.number_input[0].set_value(3)
    at.button[1].click().run()
    runs = Store(tmp_path / "h.sqlite").list_runs("generate")
    assert [r.title for r in runs] == ["Gemma 3 270M · BF16 · torch eager · CPU: History: the capital of Spain is"]
    assert runs[0].status == "finished" and runs[0].duration_s > 0  # saved with its start
    run = Store(tmp_path / "h.sqlite").get_run(runs[0].id)
    assert run.summary["new_tokens"] == 3 and "BF16" in run.summary["setup"]
    assert run.summary["engine"] == run.payload["engine"]  # which engine ran is saved
    assert run.payload["engine"].startswith("torch eager on CPU, matmul decode attention")
    assert "torch eager on CPU" in run.summary["setup"]
    assert run.summary["engine_short"] == run.payload["engine_short"] == "torch eager · CPU"
    assert run.payload["text"] == at.code[0].value and len(run.payload["token_times_s"]) == 3


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


def test_fp16_overflow_gets_a_warning_not_a_silent_empty_answer(embedded_dir):
    # Gemma 3 overflows FP16 (NaN from decoder layer 7 on): the output is pad tokens and must be called out.
    at = run_page()
    at.selectbox[1].set_value(next(p for p in at.selectbox[1].options if "FP16" in p))  # Precision
    at.button[0].click().run()  # Load
    assert not at.exception, at.exception
    assert "FP16" in at.session_state["setup"].label
    at.text_area[0].set_value("The capital of France is")
    at.number_input[0].set_value(3)
    at.button[1].click().run()
    assert not at.exception, at.exception
    warning = " ".join(w.value for w in at.warning)
    assert "NaN log-probabilities" in warning and "Use BF16 or FP32" in warning, warning


def test_an_out_of_range_number_shows_its_range_and_says_what_is_wrong(embedded_dir):
    at = run_page()
    new_tokens = at.number_input(key="model_new_tokens")
    assert new_tokens.label == "New tokens (1 to 1,024)"
    new_tokens.set_value(1_000_000_000)
    at.button[1].click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == ["New tokens must be between 1 and 1,024; it is 1,000,000,000. Enter a "
                                           "value in that range."]
    assert not at.code  # nothing ran


def test_the_sidebar_names_models_a_comparison_loaded_when_none_is_chosen(embedded_dir):
    def script():
        import streamlit as st

        from core.engines.pool import DEFAULT_SETUP
        from views.common import session

        session.init()
        session.pooled(DEFAULT_SETUP)  # as a comparison loads its sides, without choosing one for the session
        session.sidebar_status(st.sidebar.empty())

    at = AppTest.from_function(script, default_timeout=600).run()
    assert not at.exception, at.exception
    line = at.sidebar.caption[0].value
    assert line.startswith("Loaded: ") and "Gemma 3 270M · BF16" in line and "No model loaded yet" not in line
