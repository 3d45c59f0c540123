"""Shared fixtures. The embedded model is real: converted once per machine and cached (see core/models.py)."""
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository (pytest.ini puts it on sys.path)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests must never reach for a hub
# Pages, jobs and the CLI save runs to History: tests write to a throwaway database, never the user's (subprocesses
# inherit it). Tests that need their own database set TRIAGE_DB themselves.
os.environ["TRIAGE_DB"] = str(Path(tempfile.mkdtemp(prefix="triage-tests-")) / "history.sqlite")

# One app server and one browser for the whole session, whichever directory asks first (tests/e2e/fixtures.py).
from tests.e2e.fixtures import app_server, browser, dialogs, history_db, page  # noqa: F401


@pytest.fixture(scope="session")
def embedded_dir():
    from core.models import embedded_model_dir

    return embedded_model_dir()


@pytest.fixture(scope="session")
def engine_cache():
    """One engine per (precision, kv dtype) for the whole session: loading is the slow part on 2 cores."""
    from core.engines.torch_engine import TorchEngine
    from core.models import ModelSpec
    from core.precision import KVDtype, Precision

    engines = {}

    def get(precision: str, kv: str = "auto"):
        key = (precision, kv)
        if key not in engines:
            engines[key] = TorchEngine(ModelSpec("embedded"), Precision(precision), KVDtype(kv), device="cpu")
        return engines[key]

    return get
