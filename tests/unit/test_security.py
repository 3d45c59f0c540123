"""Security defaults, checked on the source tree: the server config, trust_remote_code, and every place that renders
raw HTML. The rules are read from the code with ast, so a new page or module is covered without editing this file."""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("views", "core", "diagnostics", "bench", "scripts")
EXCLUDE = {".venv", ".venv-vllm", ".git", "__pycache__", "tests", ".cache", "artifacts"}

# Raw-HTML sinks whose argument is built by a renderer that escapes every piece of user, server or model text, each
# with the test that proves it on hostile input. A new sink must either pass a string literal or be added here with
# such a test (after review).
REVIEWED_RENDERERS = {
    "side_by_side_html": "tests/unit/test_compare_render.py::test_side_by_side_escapes_every_token_and_name",
    "gauge_row": "tests/unit/test_monitor.py::test_gauge_na_shows_the_reason_on_hover_and_escapes_everything",
    "gpu_table": "tests/unit/test_monitor.py::test_gpu_table_escapes_names_processes_and_reasons",
}
# Fields of the Live monitor's shared frame that hold HTML, built once per moment for every viewer (so the page
# renders the field, not the call): field -> the reviewed renderer that builds it (core/monitor/frames.py).
REVIEWED_HTML_FIELDS = {"gauges_html": "gauge_row", "gpu_table_html": "gpu_table"}
# Calls that may pass a non-constant trust_remote_code because a user switched it on explicitly: "path:function".
# Each passes core.models.trust_remote_code(), which is True only when the console was started with
# TRIAGE_TRUST_REMOTE_CODE=1 (tested below).
# core/settings.py reads the user's own switch (TRIAGE_TRUST_REMOTE_CODE=1); the others pass that setting on.
USER_TOGGLED_TRUST_REMOTE_CODE: set[str] = {
    "core/settings.py:from_env", "core/models.py:load_config", "core/engines/torch/engine.py:_load",
    "core/engines/fast/engine.py:_load_hf"}


def python_files() -> list[Path]:
    files = [ROOT / "app.py"]
    for d in SOURCE_DIRS:
        files += [p for p in (ROOT / d).rglob("*.py") if not EXCLUDE & set(p.relative_to(ROOT).parts)]
    return [f for f in files if f.exists()]


def parsed():
    for f in python_files():
        yield f.relative_to(ROOT).as_posix(), ast.parse(f.read_text(), filename=str(f))


def enclosing_functions(tree: ast.AST) -> dict[ast.AST, str]:
    owner = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                owner.setdefault(node, fn.name)
    return owner


# ---- .streamlit/config.toml ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def config():
    return tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())


def test_server_binds_loopback_only(config):
    assert config["server"]["address"] == "127.0.0.1"
    assert config["browser"].get("serverAddress", "127.0.0.1") in ("127.0.0.1", "localhost")


def test_xsrf_protection_is_on(config):
    assert config["server"]["enableXsrfProtection"] is True
    assert config["server"].get("enableCORS", True) is True  # Streamlit turns XSRF off when CORS is off


def test_uploads_are_limited(config):
    assert 1 <= config["server"]["maxUploadSize"] <= 200  # MB


def test_errors_do_not_leak_tracebacks_to_the_browser(config):
    assert config.get("client", {}).get("showErrorDetails") in ("none", False, "false")


def test_usage_statistics_are_off(config):
    assert config["browser"]["gatherUsageStats"] is False


def test_the_server_does_not_watch_the_checkout_for_changes(config):
    # the watcher walks the virtual environment inside the checkout and slowed every run ~3x (config.toml says why)
    assert config["server"]["fileWatcherType"] == "none"


# ---- trust_remote_code ------------------------------------------------------------------------------------------
def test_no_code_trusts_remote_code_unless_a_user_turned_it_on():
    bad = []
    for path, tree in parsed():
        owner = enclosing_functions(tree)
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.Call):
                values = [(kw.value, node) for kw in node.keywords if kw.arg == "trust_remote_code"]
            elif isinstance(node, ast.Dict):
                values = [(v, node) for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "trust_remote_code"]
            for value, where in values:
                if isinstance(value, ast.Constant) and value.value is False:
                    continue
                site = f"{path}:{owner.get(where, '<module>')}"
                if isinstance(value, ast.Constant) or site not in USER_TOGGLED_TRUST_REMOTE_CODE:
                    bad.append(f"{path}:{where.lineno} trust_remote_code={ast.unparse(value)}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "--trust-remote-code" in node.value:
                site = f"{path}:{owner.get(node, '<module>')}"
                if site not in USER_TOGGLED_TRUST_REMOTE_CODE and "flags" not in path:
                    bad.append(f"{path}:{node.lineno} passes --trust-remote-code")
    assert not bad, "trust_remote_code must stay off unless the user turns it on:\n" + "\n".join(bad)


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("true", False), ("1", True),
                                       (" 1 ", True)])
def test_remote_code_runs_only_when_the_console_was_started_with_the_switch(monkeypatch, value, on):
    from core.models import trust_remote_code

    if value is None:
        monkeypatch.delenv("TRIAGE_TRUST_REMOTE_CODE", raising=False)
    else:
        monkeypatch.setenv("TRIAGE_TRUST_REMOTE_CODE", value)
    assert trust_remote_code() is on


def test_a_model_directory_with_its_own_code_is_refused_with_the_switch_named(tmp_path, monkeypatch):
    from core.models import ModelError, load_config, parse_model

    monkeypatch.delenv("TRIAGE_TRUST_REMOTE_CODE", raising=False)
    (tmp_path / "config.json").write_text(
        '{"model_type": "xyzmodel", "auto_map": {"AutoConfig": "configuration_xyz.XyzConfig"}}')
    ran = tmp_path / "ran"
    (tmp_path / "configuration_xyz.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    with pytest.raises(ModelError, match="ships its own Python code.*TRIAGE_TRUST_REMOTE_CODE=1"):
        load_config(parse_model(str(tmp_path)))
    assert not ran.exists(), "the model directory's code ran"


# ---- raw HTML -----------------------------------------------------------------------------------------------------
def html_sinks(path: str, tree: ast.AST) -> list[ast.Call]:
    """Calls that render raw HTML in the browser: st.html / container.html in pages, components.html, and any call
    with unsafe_allow_html=True."""
    sinks = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        unsafe = any(kw.arg == "unsafe_allow_html" and not (isinstance(kw.value, ast.Constant) and not kw.value.value)
                     for kw in node.keywords)
        html_call = isinstance(f, ast.Attribute) and f.attr == "html" and (
            path.startswith("views/") or path == "app.py" or ast.unparse(f.value) in ("st", "components", "stc")
            or ast.unparse(f.value).endswith("components.v1"))
        if unsafe or html_call:
            sinks.append(node)
    return sinks


def test_every_raw_html_sink_renders_a_literal_or_an_escaping_renderer():
    bad, seen = [], []
    for path, tree in parsed():
        for call in html_sinks(path, tree):
            arg = call.args[0] if call.args else next((kw.value for kw in call.keywords if kw.arg == "body"), None)
            where = f"{path}:{call.lineno}: {ast.unparse(call)[:120]}"
            seen.append(where)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                continue  # fixed markup, no text from outside
            name = arg.func.attr if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) else (
                arg.func.id if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) else None)
            if name in REVIEWED_RENDERERS:
                continue
            if isinstance(arg, ast.Attribute) and REVIEWED_HTML_FIELDS.get(arg.attr) in REVIEWED_RENDERERS:
                continue
            bad.append(where)
    assert not bad, ("Raw HTML rendered from something that is not a literal or a reviewed escaping renderer "
                     "(route the text through html.escape in a core renderer with a hostile-input test, then list it "
                     "in REVIEWED_RENDERERS):\n" + "\n".join(bad))


@pytest.mark.parametrize("renderer,test", sorted(REVIEWED_RENDERERS.items()))
def test_each_reviewed_renderer_has_its_hostile_input_test(renderer, test):
    file, _, name = test.partition("::")
    source = (ROOT / file).read_text()
    assert f"def {name}(" in source, f"{renderer} is trusted because of {test}, which no longer exists"
    assert renderer in source and "<script>" in source


def test_reviewed_renderer_escapes_hostile_tokens_end_to_end():
    """The compare page's renderer on a result whose every token, prompt and name is hostile markup."""
    from core.compare import render as compare_render
    from tests.unit.test_compare_render import _result  # the hand-made hostile CompareResult

    out = compare_render.side_by_side_html(_result(), 0)
    for raw in ("<script", "<img", '" onmouseover="'):  # no raw tag, no attribute broken out of its quotes
        assert raw not in out, raw


def test_the_sink_detector_finds_what_it_should():
    """The scanner itself: the compare view's sink is found, and unescaped snippets are caught."""
    found = [f"{p}:{c.lineno}" for p, t in parsed() for c in html_sinks(p, t)]
    assert any(f.startswith("views/common/compare_view.py:") for f in found), found
    snippet = ast.parse('st.markdown(f"<b>{token}</b>", unsafe_allow_html=True)\ncol.html(text)\n'
                        'st.markdown("**ok**")\nst.markdown(x, unsafe_allow_html=False)\n')
    assert [c.lineno for c in html_sinks("views/x.py", snippet)] == [1, 2]


@pytest.mark.parametrize("url, message", [
    ("javascript:alert(1)", "is not an http(s) URL"), ("mailto:a@b", "is not an http(s) URL"),
    ("http://[::1", "is not a valid URL"), ("file:///etc/passwd", "is not an http(s) URL with a host")])
def test_urls_that_are_not_servers_are_refused_with_the_reason(url, message):
    from core.errors import RemoteError
    from core.http import normalize_base_url

    with pytest.raises(RemoteError, match=re.escape(message)):
        normalize_base_url(url)
    assert normalize_base_url("localhost:8000/v1/") == "http://localhost:8000"


def test_each_reviewed_html_field_is_built_by_its_renderer():
    source = (ROOT / "core" / "monitor" / "frames.py").read_text()
    for field, renderer in REVIEWED_HTML_FIELDS.items():
        assert f'"{field}": charts.{renderer}(' in source or f"{field}=charts.{renderer}(" in source, field
