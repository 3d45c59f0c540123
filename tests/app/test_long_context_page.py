"""The Long context page in Streamlit's AppTest, with the real embedded model (loaded once per process)."""
from streamlit.testing.v1 import AppTest

from core.engines.pool import Setup
from core.models import ModelSpec
from core.precision import Precision
from tests.conftest import ROOT

PAGE = str(ROOT / "views" / "long_context.py")
BF16 = Setup(ModelSpec("embedded"), Precision.BF16)


def page(setup=BF16) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["setup"] = setup
    at.run()
    assert not at.exception, at.exception
    return at


def test_without_a_model_it_offers_the_embedded_one(embedded_dir):
    at = page(None)
    assert any("Load the embedded model" in b.label for b in at.button)
    assert at.text_area  # a tokenizer is enough to count: the document box is there at once


def test_empty_input_renders_and_asks_for_a_document(embedded_dir):
    at = page()
    assert any("Paste a document" in i.value for i in at.info)
    assert not at.metric


def test_it_shows_the_recorded_h200_decode_and_time_to_first_token_tables(embedded_dir):
    at = page()
    at.text_area(key="lc_text").set_value("A short document about a slow deployment.\n" * 20).run()
    assert not at.exception, at.exception
    labels = [e.label for e in at.expander]
    assert any(label.startswith("FP8 vs BF16 decode at 512 and 32,768 tokens") for label in labels)
    assert any(label.startswith("Time to first token at 8,192 to 125,000 tokens") for label in labels)
    ttft = next(df.value for df in at.dataframe if "prompt tokens" in df.value.columns)
    assert list(ttft["prompt tokens"]) == ["8,192", "32,768", "125,000"] and (ttft["x BF16"] > 1).all()
    assert any("FlashAttention-3" in c.value for c in at.caption)


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


SHORT_DOC = "# Notes\n\nThe cache filled after a long paste of logs.\n\n## Log\n\n" + "WARN preempted request\n" * 20


def run_single(at: AppTest, new_tokens: int = 2) -> AppTest:
    at.text_area(key="lc_text").set_value(SHORT_DOC).run()
    at.number_input(key="lc_new").set_value(new_tokens).run()
    at.button(key="lc_go_single").click().run()
    assert not at.exception, at.exception
    return at


def test_a_single_run_is_saved_to_history_as_a_longdoc_run(embedded_dir, tmp_path, monkeypatch):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = run_single(page())
    assert any(m.label == "TTFT" for m in at.metric)
    db = Store(tmp_path / "h.sqlite")
    runs = db.list_runs("longdoc")
    assert len(runs) == 1 and runs[0].status == "finished" and "single run" in runs[0].title
    run = db.get_run(runs[0].id)
    summary, result = run.summary, run.payload["results"][0]
    assert summary["new_tokens"] == 2 and summary["prompt_tokens"] == result["prompt_tokens"] > 20
    assert summary["ttft_s"] > 0 and summary["itl_p50_s"] > 0 and summary["decode_tok_s"] > 0
    assert summary["peak_bytes"] > 0
    assert len(result["itl_s"]) == 1 and run.payload["params"]["document_chars"] == len(SHORT_DOC)
    assert "BF16" in run.payload["model"]


def test_a_ramp_is_saved_as_running_then_finished_with_each_length(embedded_dir, tmp_path, monkeypatch):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = page()
    at.text_area(key="lc_text").set_value(SHORT_DOC).run()
    at.number_input(key="lc_new").set_value(2).run()
    at.multiselect[0].set_value([256]).run()
    at.button(key="lc_go_ramp").click().run()
    assert not at.exception, at.exception
    run = Store(tmp_path / "h.sqlite").get_run(Store(tmp_path / "h.sqlite").list_runs("longdoc")[0].id)
    assert run.status == "finished" and run.payload["test"] == "ramp"
    assert [r["prompt_tokens"] for r in run.payload["results"]] == [256]
    assert run.summary["points"] == 1 and set(run.summary["ttft_s_by"]) == {"256"}


def test_when_history_cannot_be_written_the_result_still_shows_with_one_warning(embedded_dir, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))  # a directory: the store refuses it (a real fault, not a fake)
    at = run_single(page())
    assert any(m.label == "TTFT" for m in at.metric)
    warnings = [w.value for w in at.warning if "not saved to the history" in w.value]
    assert len(warnings) == 1 and "is a directory" in warnings[0]
    assert not at.error


def test_the_needle_test_shows_its_table_and_is_saved(embedded_dir, tmp_path, monkeypatch):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = page()
    at.text_area(key="lc_text").set_value(SHORT_DOC).run()
    needle_len = at.number_input(key="lc_needle_tokens")
    assert needle_len.label == "Prompt length (tokens) (128 to 32,758)"  # the model's positions less the answer
    needle_len.set_value(128).run()
    at.button(key="lc_go_needle").click().run()
    assert not at.exception, at.exception
    rows = at.table[0].value
    assert list(rows["needle"]) == ["none (control)", "start", "middle", "end"]
    run = Store(tmp_path / "h.sqlite").get_run(Store(tmp_path / "h.sqlite").list_runs("longdoc")[0].id)
    assert run.status == "finished" and run.payload["test"] == "needle" and len(run.payload["results"]) == 4
    assert set(run.summary["lift_over_control"]) == {"start", "middle", "end"}


def test_opened_directly_it_counts_tokens_and_sizes_the_kv_cache_without_loading(embedded_dir):
    # Only the timed runs need weights: the statistics and the calculator use the embedded model's tokenizer and
    # config from disk, and give the same numbers as with the model loaded.
    doc = "# Incident\n\nThe server stalled after a long paste.\n\n## Log\n\n" + "ERROR kv cache full\n" * 400
    at = page(None)
    at.text_area(key="lc_text").set_value(doc).run()
    assert not at.exception, at.exception
    assert at.session_state["setup"] is None  # nothing was loaded
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Characters"] == f"{len(doc):,}" and metrics["Fits"] == "yes"
    assert metrics["Per token"] == "18.00 KiB" and "vLLM blocks" in metrics
    assert not any(b.key and b.key.startswith("lc_go_") for b in at.button)  # runs wait for a load
    assert any("time prefill and decode" in i.value for i in at.info)
    assert any("Load the embedded model" in b.label for b in at.button)

    loaded = page()
    loaded.text_area(key="lc_text").set_value(doc).run()
    assert not loaded.exception, loaded.exception
    assert {m.label: m.value for m in loaded.metric}["Tokens"] == metrics["Tokens"]


def test_a_model_loaded_by_another_tab_is_named_and_taken_with_one_click(embedded_dir):
    """The sidebar lists what the process has loaded; this page, in a tab that chose none, says the same and offers
    it (it used to say "No model is loaded in this session" beside a sidebar that said "Loaded: ...")."""
    from views.common import session

    session._pool().load(BF16)  # another tab's load: the pool is the process's
    at = page(None)
    assert any("loaded by another tab or a comparison: Gemma 3 270M · BF16" in i.value for i in at.info)
    assert not any("No model is loaded" in i.value for i in at.info)
    at.button(key=f"adopt-{BF16.label}").click().run()
    assert not at.exception, at.exception
    assert at.session_state["setup"] == BF16
    assert any("Model: **Gemma 3 270M" in m.value for m in at.markdown)
