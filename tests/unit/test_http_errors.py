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
