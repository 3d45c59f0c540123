"""The console's TRIAGE_* environment variables, named, typed and parsed in one place (the fast engine's six
switches are core/engines/fast/options.py's FastOptions, the model for this module). README.md lists them.

- TRIAGE_CACHE_DIR: the console's cache directory (default ~/.cache/triage-console): embedded model, kernels.
- TRIAGE_DB: the history database file (default history.sqlite in the cache directory's default place).
- TRIAGE_QUALITY_CACHE: where Quality keeps reference passes (default quality-refs/ in the cache directory).
- TRIAGE_TRUST_REMOTE_CODE=1: run a model directory's own Python (transformers' trust_remote_code); off by default.
- TRIAGE_CPU_FAST=0, TRIAGE_FP8_CPU_KERNEL=0, TRIAGE_INT_CPU_KERNEL=0: the torch engine's CPU speed-ups off.
- TRIAGE_VLLM_PYTHON: the Python of the vLLM environment (default .venv-vllm/bin/python).
- TRIAGE_VLLM_URL: the Deployment page's first server URL; TRIAGE_PROMETHEUS_URL: the Fleet page's first Prometheus.
- TRIAGE_PROM_TOKEN, or TRIAGE_PROM_USER + TRIAGE_PROM_PASSWORD: Prometheus credentials (never saved or shown).

`settings()` parses the environment into one frozen `Settings` and keeps it until a TRIAGE_* variable changes (a
test's monkeypatch.setenv then takes effect); nothing else in the product reads these variables. Importing this
module imports neither torch nor streamlit.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

PREFIX = "TRIAGE_"


@dataclass(frozen=True)
class Settings:
    cache_dir: Path  # TRIAGE_CACHE_DIR
    db: Path | None  # TRIAGE_DB; None: the default place (core/store.py)
    quality_cache: Path | None  # TRIAGE_QUALITY_CACHE; None: quality-refs/ in cache_dir
    trust_remote_code: bool  # TRIAGE_TRUST_REMOTE_CODE=1
    cpu_fast: bool  # TRIAGE_CPU_FAST
    cpu_kernels_off: frozenset[str]  # C kernels' switches set to 0 (TRIAGE_FP8_CPU_KERNEL, TRIAGE_INT_CPU_KERNEL, ...)
    vllm_python: str | None  # TRIAGE_VLLM_PYTHON as given; None: unset (.venv-vllm beside the checkout); "": set empty
    vllm_url: str  # TRIAGE_VLLM_URL
    prometheus_url: str  # TRIAGE_PROMETHEUS_URL
    prom_token: str | None  # TRIAGE_PROM_TOKEN
    prom_user: str | None  # TRIAGE_PROM_USER
    prom_password: str | None  # TRIAGE_PROM_PASSWORD

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        env = os.environ if env is None else env

        def path(name: str) -> Path | None:
            value = (env.get(name) or "").strip()
            return Path(value).expanduser() if value else None

        return cls(
            cache_dir=path("TRIAGE_CACHE_DIR") or Path.home() / ".cache" / "triage-console",
            db=path("TRIAGE_DB"), quality_cache=path("TRIAGE_QUALITY_CACHE"),
            trust_remote_code=(env.get("TRIAGE_TRUST_REMOTE_CODE") or "").strip() == "1",
            cpu_fast=env.get("TRIAGE_CPU_FAST", "1") != "0",
            cpu_kernels_off=frozenset(n for n, v in env.items() if n.startswith(PREFIX) and n.endswith("_KERNEL")
                                      and v == "0"),
            vllm_python=env.get("TRIAGE_VLLM_PYTHON"),
            vllm_url=env.get("TRIAGE_VLLM_URL") or "http://127.0.0.1:8000",
            prometheus_url=env.get("TRIAGE_PROMETHEUS_URL") or "",
            prom_token=env.get("TRIAGE_PROM_TOKEN") or None, prom_user=env.get("TRIAGE_PROM_USER") or None,
            prom_password=env.get("TRIAGE_PROM_PASSWORD"))


_LOCK = threading.Lock()
_CURRENT: tuple[tuple, Settings] | None = None


def settings() -> Settings:
    """The settings in force: the environment's TRIAGE_* variables as last parsed (again only after one changed)."""
    global _CURRENT
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))
    current = _CURRENT
    if current is None or current[0] != key:
        with _LOCK:
            current = _CURRENT = (key, Settings.from_env())
    return current[1]
