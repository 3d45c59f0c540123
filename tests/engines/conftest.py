"""The engine tests run in this process and leave about a core idle on 2 cores (their torch work averages 1.3 cores):
tests/serving's server, the next directory's, starts beside them (tests/serving/server.py). An idle server takes about
1% of a core; its start, about one core for 45-60 s. The engines these tests cache stay: the server fits beside them."""
import pytest


@pytest.fixture(scope="package", autouse=True)
def serving_server_starts_early(request):
    from tests.serving.server import SERVING

    if SERVING.wanted(request.session):
        SERVING.begin(request, free_engines=False)
    yield
