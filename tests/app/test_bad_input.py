"""What careless or hostile users send, through Streamlit's AppTest on the real pages and the real embedded model:
each input gets a clear message, the page keeps serving (the loaded model stays usable), and saved history is never
touched. The browser-only parts (script in prompts must not run, a 5 MB paste, the health endpoint) are in
tests/e2e/test_bad_input_browser.py."""
from __future__ import annotations

import math
import os

import pytest
from streamlit.testing.v1 import AppTest

from core.engines.base import GenerationParams
from tests.conftest import ROOT

MODEL_PAGE = str(ROOT / "views" / "model.py")
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.fixture
def history(tmp_path, monkeypatch):
    """A history database with runs in it; after the test every run must still be there, unchanged."""
    from core.store import Store

    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(path))
    s = Store(path)
    before = [s.save_run("checklist", "before bad input", {"findings": [1, 2]}, {"fail": 0}),
              s.save_run("compare", HOSTILE, {"note": HOSTILE}, {"mean_kld": 0.01})]
    snapshot = [s.get_run(i).to_dict() for i in before]
    yield s
    assert [s.get_run(i).to_dict() for i in before] == snapshot, "saved runs changed"
    s.close()


def model_page() -> AppTest:
    at = AppTest.from_file(MODEL_PAGE, default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["setup"] is not None
    return at


def generate(at: AppTest, prompt: str, new_tokens: int = 2) -> AppTest:
    at.text_area[0].set_value(prompt)
    at.number_input[0].set_value(new_tokens)
    at.button[1].click().run()  # Generate (Load is the first form's button)
    assert not at.exception, at.exception
    return at


def load(at: AppTest, source: str, path: str = "", precision: str | None = None, synthetic: str | None = None):
    at.selectbox[0].set_value(source)
    if precision:
        at.selectbox[1].set_value(next(o for o in at.selectbox[1].options if o == precision))
    if synthetic:
        at.selectbox[3].set_value(synthetic)
    at.text_input[0].set_value(path)
    at.button[0].click().run()
    assert not at.exception, at.exception
    return " ".join(e.value for e in at.error)


def still_serving(at: AppTest, before) -> None:
    """The previous model is still this session's and still answers."""
    assert at.session_state["setup"] == before
    generate(at, "The capital of France is", 2)
    assert at.code and at.code[0].value.strip()


# ---- prompts --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t\r\n ", "\u3000\u00a0"],
                         ids=["empty", "spaces", "newlines", "unicode-space"])
def test_empty_and_whitespace_prompts_are_refused_politely(embedded_dir, history, prompt):
    at = generate(model_page(), prompt)
    assert any("empty" in w.value for w in at.warning), [w.value for w in at.warning]
    assert not at.code  # nothing was generated


def test_a_5_mb_paste_gets_a_clear_message_and_the_model_keeps_answering(embedded_dir, history):
    at = model_page()
    before = at.session_state["setup"]
    big = "The quick brown fox jumps over the lazy dog. " * 116_000  # 5.2 MB
    generate(at, big, 2)
    errors = " ".join(e.value for e in at.error)
    assert f"{len(big):,} characters" in errors and "Long context page" in errors, errors
    still_serving(at, before)


def test_html_and_script_in_a_prompt_are_plain_text(embedded_dir, history):
    at = generate(model_page(), HOSTILE * 3, 4)
    assert at.code and at.code[0].value  # shown in a code block: text, never HTML
    for el in list(at.markdown) + list(at.caption) + list(at.error) + list(at.warning):
        assert "<script>" not in el.value and "onerror=" not in el.value, el.value


# ---- numbers -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("new_tokens,temperature", [(-5, -1.0), (0, 0.0), (10**9, 1e9), (2**40, 1e308)])
def test_out_of_range_numbers_never_reach_the_engine(embedded_dir, history, new_tokens, temperature):
    # the boxes take any number and show their range; Generate refuses an out-of-range one in words, runs nothing
    at = model_page()
    at.number_input[0].set_value(new_tokens)
    at.number_input[1].set_value(temperature)
    at.text_area[0].set_value("The capital of France is")
    at.button[1].click().run()
    assert not at.exception, at.exception
    errors = " ".join(e.value for e in at.error)
    assert "must be between" in errors and ("New tokens" in errors or "Temperature" in errors), errors
    assert not at.code  # nothing was generated


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=-5), "between 1 and 8192"), (dict(max_new_tokens=10**9), "between 1 and 8192"),
    (dict(temperature=-1.0), "between 0 and 5"), (dict(temperature=math.inf), "between 0 and 5"),
    (dict(temperature=math.nan), "between 0 and 5"), (dict(top_p=0.0), r"\(0, 1\]"),
    (dict(top_logprobs=-1), "between 0 and 20"),
])
def test_engine_parameters_are_checked_again_below_the_page(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationParams(**kwargs).validated()


# ---- model paths --------------------------------------------------------------------------------------------
def _make(tmp, name: str) -> str:
    """Create what a case needs under tmp and return its path text."""
    if name in ("empty_dir", "bad_config", "no_type", "binary_config"):
        (tmp / name).mkdir()
    body = {"bad_config": b"{ this is not json", "no_type": b"{}", "binary_config": os.urandom(4096)}.get(name)
    if body is not None:
        (tmp / name / "config.json").write_bytes(body)
    return str(tmp / name)


LONG_PATH = "/x" * 3000
PATH_CASES = {  # id: (source, path; "@name" is created under tmp_path first)
    "missing-file": ("GGUF file", "@nope.gguf"),
    "missing-dir": ("Hugging Face directory", "@nope"),
    "dir-without-config": ("Hugging Face directory", "@empty_dir"),
    "config-not-json": ("Hugging Face directory", "@bad_config"),
    "config-without-model-type": ("Hugging Face directory", "@no_type"),
    "binary-config": ("Hugging Face directory", "@binary_config"),
    "dir-given-as-gguf": ("GGUF file", "@empty_dir"),
    "empty-path": ("GGUF file", ""),
    "nul-byte": ("GGUF file", "model\x00.gguf"),
    "home-shortcut": ("GGUF file", "~/definitely/not/here.gguf"),
    "very-long-path": ("Hugging Face directory", LONG_PATH),
}

@pytest.mark.parametrize("case", list(PATH_CASES))
def test_a_wrong_model_path_gets_a_clear_message_and_keeps_the_loaded_model(embedded_dir, history, tmp_path, case):
    source, path = PATH_CASES[case]
    if path.startswith("@"):
        path = _make(tmp_path, path[1:])
    at = model_page()
    before = at.session_state["setup"]
    msg = load(at, source, path)
    assert msg.startswith("Could not load:") and len(msg) > len("Could not load: ") + 10, msg
    assert "Traceback" not in msg and "Errno" not in msg, msg
    assert len(msg) < 600, f"{len(msg)} characters"  # says what is wrong, does not dump the input back
    assert at.session_state["setup"] == before
    assert any("Still loaded" in c.value for c in at.caption)


def test_after_wrong_paths_the_loaded_model_still_answers(embedded_dir, history, tmp_path):
    at = model_page()
    before = at.session_state["setup"]
    for source, path in [("GGUF file", str(tmp_path / "nope.gguf")), ("Hugging Face directory", str(tmp_path))]:
        load(at, source, path)
    still_serving(at, before)


# ---- a GGUF that is not a GGUF --------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty"), pytest.param(b"hello, I am a text file\n" * 50, id="text"),
    pytest.param(os.urandom(256 * 1024), id="random-bytes"),
    pytest.param(b"GGUF" + os.urandom(4096), id="magic-then-garbage"),
    pytest.param(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64, id="v3-header-then-huge-counts")])
def test_a_gguf_that_is_not_a_gguf_gets_a_message_and_keeps_the_loaded_model(embedded_dir, history, tmp_path,
                                                                             content):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(content)
    at = model_page()
    before = at.session_state["setup"]
    msg = load(at, "GGUF file", str(fake))
    assert msg.startswith("Could not load:") and "model.gguf" in msg and "GGUF" in msg, msg
    assert "Traceback" not in msg and "JSON" not in msg and len(msg) < 600, msg
    assert at.session_state["setup"] == before


def test_a_model_that_does_not_fit_fails_cleanly_and_the_previous_one_stays_usable(embedded_dir, history):
    at = model_page()
    before = at.session_state["setup"]
    msg = load(at, "Synthetic shape (random weights: speed and memory only)", precision=None, synthetic="llama-3-70b")
    # llama-3-70b at BF16 is ~130 GiB of weights: refused before anything is allocated
    assert "GiB" in msg and "free" in msg, msg
    still_serving(at, before)
