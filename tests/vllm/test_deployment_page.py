"""The Deployment page through Streamlit's AppTest: against local HTTP servers that serve the real /metrics fixtures
(no vLLM needed) and, marked `vllm`, against the live server from conftest.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "deployment.py")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def models_json(model_id: str = "gemma-3-270m") -> str:
    return json.dumps({"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "vllm",
                                                   "max_model_len": 2048}]})


@pytest.fixture
def fake_vllm(web_server):
    """A local HTTP server answering like vLLM, with a real /metrics page from tests/fixtures."""

    def make(metrics_fixture: str, model_id: str = "gemma-3-270m") -> str:
        return web_server({
            "/v1/models": (200, "application/json", models_json(model_id), {}),
            "/version": (200, "application/json", '{"version": "0.32.0"}', {}),
            "/metrics": (200, "text/plain; version=0.0.4", (FIXTURES / metrics_fixture).read_text(), {}),
        })

    return make


def connect(url: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    # by label: the page's "Start a local vLLM" panel has its own text boxes and buttons
    next(t for t in at.text_input if t.label == "Server base URL").set_value(url)
    next(b for b in at.button if b.label == "Connect").click()
    at.run()
    assert not at.exception, at.exception
    return at


def test_not_connected_explains_what_to_enter():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception and "base URL of a vLLM OpenAI server" in at.info[0].value


def test_refused_url_shows_a_clear_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    at = connect(f"http://127.0.0.1:{port}")
    assert "refused" in at.error[0].value and not at.metric


def test_fixture_metrics_render_as_panels(fake_vllm):
    at = connect(fake_vllm("vllm-0.32-cpu-metrics-after-3-requests.txt"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Running"] == "0" and metrics["KV cache usage"] == "0.0 %" and metrics["Preemptions"] == "0"
    assert any("block size 128" in c.value for c in at.caption)
    at.run()  # a second scrape gives rates
    assert {m.label: m.value for m in at.metric}["Generation"] == "0.0 tok/s"


def test_disable_log_stats_is_explained(fake_vllm):
    at = connect(fake_vllm("vllm-0.32-cpu-metrics-disable-log-stats.txt"))
    assert any("--disable-log-stats" in w.value for w in at.warning)
    assert not at.metric


def test_server_text_is_escaped(fake_vllm):
    at = connect(fake_vllm("vllm-0.32-cpu-metrics-after-3-requests.txt", model_id="**x** <b>y</b> [z](http://e)"))
    caption = next(c.value for c in at.caption if c.value.startswith("Connected to"))
    assert r"\*\*x\*\* \<b\>y\</b\> \[z\]\(http\://e\)" in caption


@pytest.mark.vllm
def test_live_server_panels_and_probe(vllm_engine, monkeypatch, tmp_path):
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    at = connect(vllm_engine.base_url)
    assert {m.label: m.value for m in at.metric}["Running"] == "0"
    at.number_input[0].set_value(2)  # requests
    at.number_input[1].set_value(32)  # prompt tokens
    at.number_input[2].set_value(4)  # new tokens
    next(b for b in at.button if b.label == "Probe").click()
    at.run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert (table["client (ms)"] > 0).all() and (table["server (ms)"] > 0).all()
    runs = Store(tmp_path / "h.sqlite").list_runs("probe")
    assert len(runs) == 1 and runs[0].summary["requests"] == 2 and runs[0].summary["client"]["ttft"]["p50"] > 0
    assert runs[0].duration_s == pytest.approx(runs[0].summary["wall_s"], abs=1)  # saved with its start
    at.session_state["dep_watch"].stop()  # its canaries must not land in the next tests' exact counts


@pytest.mark.vllm
def test_a_golden_set_recorded_from_the_live_server_replays_fine_and_is_kept(vllm_engine, monkeypatch, tmp_path):
    """The Quality watch section: record 3 built-in prompts x 8 tokens from the real server, replay them there twice;
    the server answers as it did (fine, no drift), the file sits in the cache dir and History has all three runs."""
    from core.compare.golden.golden import GoldenSet
    from core.store import Store

    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    at = connect(vllm_engine.base_url)
    next(n for n in at.number_input if n.label == "Built-in prompts").set_value(3)
    next(n for n in at.number_input if n.label == "Greedy tokens each").set_value(8)
    next(b for b in at.button if b.label == "Record a golden set from this server").click()
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any("3 prompts x 8 greedy tokens" in m.value for m in at.markdown)
    (path,) = (tmp_path / "cache" / "golden").glob("*.json")
    assert len(GoldenSet.load(path).prompts) == 3
    for _ in range(2):
        next(b for b in at.button if b.label == "Replay it on this server now").click()
        at.run()
        assert not at.exception and not at.error
    table = at.dataframe[-1].value
    # The same server, unchanged: fine, within its own noise floor. 24 scored positions are few: one near-tie
    # flipped (seen at 0-0.2% of positions between replays) leaves the interval spanning bands, inconclusive, never
    # worse, and no drift (one position is under the noise allowance of two).
    assert list(table["replica"]) == [vllm_engine.base_url] and table["status"][0] in ("fine", "inconclusive"), table
    assert list(table["drift"]) == [""]
    assert any(m.value.startswith("Round 2 at ") for m in at.markdown)
    kinds = [r.kind for r in Store(tmp_path / "h.sqlite").list_runs()]
    assert sorted(kinds) == ["golden-record", "golden-watch", "golden-watch"], kinds
    at.session_state["dep_watch"].stop()  # its canaries must not land in the next tests' exact counts
