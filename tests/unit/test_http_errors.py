"""A URL that cannot be reached is reported for what was asked there: Prometheus (the Fleet page) is named as
Prometheus, with what was tried and what to check; a vLLM URL keeps vLLM's sentence. Real sockets, real refusals."""
from __future__ import annotations

import socket

import pytest
import requests

from core.errors import RemoteError
from core.fleet.prom import Prometheus
from core.http import describe, http_get


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound, then closed (the kernel refuses connections to it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_prometheus_is_named_with_what_was_tried_and_what_to_check(closed_port):
    prom = Prometheus(f"http://127.0.0.1:{closed_port}")
    with pytest.raises(RemoteError) as err:
        prom.query("up")
    msg = str(err.value)
    assert msg.startswith("Prometheus is not reachable: the connection to "
                          f"http://127.0.0.1:{closed_port}/api/v1/query was refused")
    assert f"nothing is listening on 127.0.0.1:{closed_port}" in msg
    assert "9090" in msg and "port-forward" in msg  # what to check
    assert "vLLM" not in msg
    assert prom.cost.requests == 1  # counted even when it failed


def test_unreachable_vllm_keeps_its_own_sentence(closed_port):
    url = f"http://127.0.0.1:{closed_port}/metrics"
    with pytest.raises(RemoteError) as err:
        http_get(url, timeout_s=5)
    assert str(err.value) == (f"Connection to {url} was refused: nothing is listening there. Is the vLLM server "
                              "running on that port?")


def test_other_failures_name_the_service_asked_for():
    url = "https://p:9090/api/v1/query"
    tls = describe(requests.exceptions.SSLError("wrong version number"), url, 15, "Prometheus", "Check it.")
    assert "Use http:// for Prometheus if it serves plain HTTP." in tls
    timeout = describe(requests.ConnectTimeout("x"), url, 15, "Prometheus", "Check it.")
    assert timeout.startswith("Prometheus is not reachable: connecting to") and timeout.endswith("Check it.")
    assert "vLLM" not in describe(requests.ReadTimeout("Read timed out"), url, 15, "Prometheus", "Check it.")
    assert describe(requests.exceptions.SSLError("x"), url, 15).endswith("Use http:// for a plain vLLM server.")


@pytest.mark.parametrize("url, words", [
    ("not a url at all", "contains a space"),
    ("http://exa mple.com:8000", "contains a space"),
    ("http://x!y:80", "characters a host name cannot have ('!')"),
    ("http://h..x:80", "an empty part between dots"),
    ("http://[fe80::zz]:80", "not a valid URL"),
])
def test_url_errors_are_plain_words_at_every_entry_point(url, words):
    """One home for URL validation (core.http.normalize_base_url): the vLLM URL, the remote engine and the
    Prometheus URL all refuse a malformed address before any request, in words, never urllib3's parser text."""
    from core.engines.remote import RemoteEngine
    from core.http import normalize_base_url
    from core.telemetry.vllm_metrics import scrape

    for attempt in (lambda: normalize_base_url(url), lambda: RemoteEngine(url), lambda: Prometheus(url),
                    lambda: scrape(url)):
        with pytest.raises(Exception) as err:
            attempt()
        msg = str(err.value)
        assert words in msg and "e.g. http://127.0.0.1:8000" in msg, msg
        assert "Failed to parse" not in msg and "invalid character" not in msg


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "localhost:8000/v1", "http://[::1]:9090", "http://a_b:80",
                                 "https://prom.example.com./"])
def test_real_addresses_still_pass(url):
    from core.http import normalize_base_url

    assert normalize_base_url(url).startswith("http")


def test_a_parser_error_from_requests_is_worded_too():
    msg = describe(requests.exceptions.InvalidURL("Failed to parse: http://a b"), "http://a b/x", 5)
    assert "is not a URL the console can request" in msg and "Failed to parse" not in msg
