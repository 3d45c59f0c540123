"""The unit tests need no server and little memory: while they run, the session's two vLLM servers start in the
background for tests/vllm, the directory after this one (tests/vllm/servers.py, SessionServers)."""
import pytest


@pytest.fixture(scope="package", autouse=True)
def vllm_servers_start_early(request):
    from tests.vllm.servers import SERVERS

    if SERVERS.wanted(request.session):
        SERVERS.begin(request)
    yield
