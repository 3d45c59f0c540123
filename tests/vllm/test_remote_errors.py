"""Wrong URLs give clear errors: refused port, a socket that accepts and never answers, HTML, 404, redirects,
malformed metrics. Real local sockets and HTTP servers; no vLLM needed, so these are not marked `vllm`."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from core.engines.base import GenerationParams
from core.engines.remote import RemoteEngine, RemoteError
from core.http import normalize_base_url
from core.telemetry.vllm_metrics import MetricsError, scrape


@pytest.fixture
def refused_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: nothing listens there


@pytest.fixture
def hanging_url():
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_refused_port(refused_url):
    with pytest.raises(RemoteError, match="refused: nothing is listening"):
        RemoteEngine(refused_url).connect()
    with pytest.raises(RemoteError, match="refused"):
        scrape(refused_url)


def test_hanging_server_times_out_with_a_clear_message(hanging_url):
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="accepted the connection but sent no answer within 1 s"):
        RemoteEngine(hanging_url, timeout_s=1.0).connect()
    with pytest.raises(RemoteError, match="sent no answer"):
        scrape(hanging_url, timeout_s=1.0)
    assert time.monotonic() - t0 < 30  # bounded, not hung (generous: the machine may be busy)


def test_html_server_is_not_vllm(web_server):
    url = web_server({"/v1/models": (200, "text/html", "<!doctype html><html><body>Welcome</body></html>", {}),
                      "/metrics": (200, "text/html", "<html><body>hi</body></html>", {})})
    with pytest.raises(RemoteError, match="HTML page, not JSON"):
        RemoteEngine(url).connect()
    with pytest.raises(MetricsError, match="HTML"):
        scrape(url)


def test_404_everywhere_is_not_an_openai_server(web_server):
    url = web_server({})
    with pytest.raises(RemoteError, match="not an OpenAI-compatible API"):
        RemoteEngine(url).connect()
    with pytest.raises(MetricsError, match="404"):
        scrape(url)


def test_redirects_are_not_followed(web_server):
    url = web_server({"/v1/models": (302, "text/plain", "", {"Location": "http://example.invalid/v1/models"}),
                      "/metrics": (301, "text/plain", "", {"Location": "http://example.invalid/metrics"})})
    with pytest.raises(RemoteError, match="redirect to 'http://example.invalid/v1/models'"):
        RemoteEngine(url).connect()
    with pytest.raises(RemoteError, match="does not follow redirects"):
        scrape(url)


def test_malformed_metrics(web_server):
    url = web_server({"/metrics": (200, "text/plain", "vllm:num_requests_running{engine=\"0\" oops\n", {})})
    with pytest.raises(MetricsError, match="not valid Prometheus text"):
        scrape(url)


def test_api_key_required(web_server):
    url = web_server({"/v1/models": (401, "application/json", '{"error": "Unauthorized"}', {})})
    with pytest.raises(RemoteError, match="--api-key"):
        RemoteEngine(url).connect()


def test_openai_server_without_token_ids(web_server):
    """An OpenAI-compatible server that is not vLLM: connect works, token-level generation says why it cannot."""
    models = '{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}'
    stream = ('data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'
              "data: [DONE]\n\n")
    url = web_server({"/v1/models": (200, "application/json", models, {}),
                      "/v1/completions": (200, "text/event-stream", stream, {})})
    engine = RemoteEngine(url)
    info = engine.connect()
    assert info.models == ["m"] and not info.is_vllm
    with pytest.raises(RemoteError, match="return_token_ids"):
        engine.generate(["x"], GenerationParams(max_new_tokens=2))


@pytest.mark.parametrize("url, expected", [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://host:8000/v1/", "http://host:8000"),
    ("https://h.example/prefix/v1", "https://h.example/prefix"),
])
def test_normalize_base_url(url, expected):
    assert normalize_base_url(url) == expected


@pytest.mark.parametrize("url", ["", "ftp://host/", "http://", "http://h:99999", "http://h:8000/?a=1"])
def test_bad_urls_are_refused(url):
    with pytest.raises(RemoteError):
        normalize_base_url(url)


def test_client_itl_spreads_coalesced_chunks():
    from core.engines.base import Generation
    from core.deployment.probe import client_itl
    from core.stats import nearest_rank_percentiles as _percentiles

    # 5 tokens: first at 0.1 s, then one chunk of 1 token, one chunk of 3 tokens arriving together at 0.7 s
    gen = Generation(prompt_ids=[2], token_ids=[1, 2, 3, 4, 5], token_times=[0.1, 0.2, 0.7, 0.7, 0.7])
    assert client_itl(gen) == pytest.approx([0.1, 0.5 / 3, 0.5 / 3, 0.5 / 3])
    assert sum(client_itl(gen)) == pytest.approx(gen.token_times[-1] - gen.token_times[0])  # mean is TPOT
    assert _percentiles([3.0, 1.0, 2.0]) == {"p50": 2.0, "p90": 3.0, "p99": 3.0}
    assert _percentiles([]) == {"p50": None, "p90": None, "p99": None}
