"""The Quality page in Streamlit's AppTest: bad documents refused with a message, stored results (the table, the
worst positions with document text shown as text, the layer analysis) rendered. The real run is the browser test's
(tests/e2e/test_quality_flow.py) and the engine test's (tests/engines/test_quality_embedded.py)."""
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT

PAGE = str(ROOT / "views" / "quality.py")


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    return at


RESULT = {
    "model": "Gemma", "reference": "bf16", "candidates": ["int4"], "window": 64, "stride": 64, "windows": 2,
    "positions": 127, "document": {"name": "pasted document", "sha256": "x", "tokens": 128, "chars": 600},
    "reference_cache": {"path": None, "reused": True, "kept": "top-64 log-probs + tail"}, "calibration": "default",
    "total_s": 1.0,
    "rows": [
        {"name": "bf16", "label": "BF16", "role": "reference", "perplexity": 20.0, "kld": None, "same_top": None,
         "rms_dp": None, "weights_bytes": 2**29, "peak_bytes": 2**31, "prefill_tok_s": 500.0, "decode_tok_s": 20.0},
        {"name": "int4", "label": "INT4 weight-only", "role": "candidate", "perplexity": 30.0,
         "kld": {"mean": 0.4, "median": 0.3, "p99": 2.0, "p99_9": 3.0, "max": 4.0},
         "same_top": {"share": 0.6, "ci95": [0.5, 0.7], "positions": 127}, "rms_dp": 0.1, "weights_bytes": 2**28,
         "peak_bytes": 2**31, "prefill_tok_s": 400.0, "decode_tok_s": 15.0, "kernels": ["int4 unpack"],
         "kld_values": [0.1, 0.3, 4.0],
         "worst": [{"position": 5, "kld": 4.0, "context": "<b>bold</b>\n", "token": "<i>", "reference_top": "x",
                    "candidate_top": "y"}]},
    ]}


def test_stored_result_renders_table_chart_and_escaped_tokens():
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["q_result"] = RESULT
    at.run()
    assert not at.exception, at.exception
    table, timings, full, worst, h200 = at.dataframe
    assert list(table.value["precision"]) == ["bf16 (ref)", "int4"]
    assert list(table.value["KLD mean"].fillna(-1)) == [-1, 0.4]  # numbers: the page formats and sorts them
    # A verdict per precision: INT4 at 0.4 nats and perplexity x1.5 is broken, the thresholds in the help.
    assert list(table.value["verdict"]) == ["reference", "broken"]
    verdict = next(m for m in at.markdown if "Verdict" in m.value)
    assert "broken" in verdict.value and "perplexity >= x1.500" in verdict.value.replace("\\", "")
    assert "0.05 nats" in verdict.proto.help
    # Host timings and peak memory are one pass each: apart from the quality numbers, captioned as not comparable
    assert not {"prefill tok/s", "decode tok/s", "peak mem"} & set(table.value.columns)
    assert {"prefill tok/s", "decode tok/s", "peak memory"} <= set(timings.value.columns)
    assert any(e.label.startswith("Host timings") and "not comparable across rows" in e.label for e in at.expander)
    assert "runs as" not in table.value.columns and "runs as" in full.value.columns
    assert list(full.value["same top %"]) == ["n/a", "60.00 (50.0-70.0)"]
    assert list(worst.value["context"]) == ["<b>bold</b>\\n"] and list(worst.value["token"]) == ["<i>"]
    assert not any("<b>" in m.value for m in at.markdown)  # never rendered as Markdown/HTML
    assert "H200" in h200.value.to_string() or len(h200.value) > 0
    assert any("NVIDIA H200" in e.label and "not this machine" in e.label for e in at.expander)


def test_the_help_names_the_real_default_window_and_paths_are_short():
    import os

    from core.quality.run import DEFAULT_WINDOW

    at = page()
    assert any(f"default window of {DEFAULT_WINDOW}" in i.value for i in at.info)
    assert not any("about 20 s" in i.value for i in at.info)  # no idle-machine constant
    home = os.path.expanduser("~")
    stored = dict(RESULT, reference_cache={"path": f"{home}/.cache/triage-console/refs/abc.npz", "reused": False,
                                           "kept": "full vocabulary"})
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["q_result"] = stored
    at.run()
    notes = [c.value.replace("\\", "") for c in at.caption if "reference" in c.value]  # Markdown escapes
    assert notes and all(home + "/" not in n for n in notes) and any("~/.cache" in n for n in notes)


def test_empty_and_binary_documents_get_messages():
    at = page()
    at.button(key="q_go").click().run()
    assert not at.exception
    assert any("empty" in e.value for e in at.error)
    at.text_area(key="q_text").set_value("\x01\x02\x03\x04" * 50).run()
    at.button(key="q_go").click().run()
    assert any("looks binary" in e.value for e in at.error)


def test_an_out_of_range_window_says_its_range():
    at = page()
    assert at.number_input(key="q_window").label == "Window (tokens) (16 to 32,000)"
    at.text_area(key="q_text").set_value("The capital of France is Paris. " * 40).run()
    at.number_input(key="q_window").set_value(1_000_000_000).run()
    at.button(key="q_go").click().run()
    assert not at.exception
    assert any("Window (tokens) must be between 16 and 32,000; it is 1,000,000,000" in e.value for e in at.error), \
        [e.value for e in at.error]


def test_stored_layer_analysis_renders_ranked_table_and_heatmap():
    from core.engines.torch import quant

    errs = {q: 0.01 * (i + 1) for i, q in enumerate(quant.LAYER_QUANTIZERS)}
    hist = {"min": -6.0, "max": 1.0, "counts": [1, 5, 2]}
    lay = {"base": "bf16", "tokens": 257, "quantizers": list(quant.LAYER_QUANTIZERS), "calibration": "default",
           "layers": [{"layer": f"model.layers.{i}.mlp.down_proj", "errors": {q: v * (i + 1) for q, v in errs.items()},
                       "max_abs": 10.0 * i, "median_channel_max": 1.0, "outlier_channels": i, "top_channels": [3],
                       "hist_log10_abs": hist} for i in range(3)]}
    at = AppTest.from_file(PAGE, default_timeout=600)
    at.session_state["q_layers"] = lay
    at.run()
    assert not at.exception, at.exception
    table = next(d for d in at.dataframe if "layer" in d.value.columns)
    assert list(table.value["layer"])[0] == "model.layers.2.mlp.down_proj"  # worst by int4 first
    assert any("Per-channel INT8 beat per-tensor on 3 of 3" in c.value for c in at.caption)
