"""The console's TRIAGE_* variables are read in one typed module (core/settings.py; the fast engine's six in
core/engines/fast/options.py), and a changed variable takes effect (tests set TRIAGE_DB per test)."""
from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings, settings

ROOT = Path(__file__).resolve().parents[2]
READERS = {"core/settings.py", "core/engines/fast/options.py"}


def test_only_the_settings_modules_read_triage_variables_from_the_environment():
    read = re.compile(r"(environ(\.get)?|getenv)\(?\s*\[?\s*[\"']TRIAGE_")
    offenders = sorted(str(p.relative_to(ROOT)) for top in ("app.py", "views", "diagnostics", "core")
                       for p in ([ROOT / top] if top.endswith(".py") else (ROOT / top).rglob("*.py"))
                       if str(p.relative_to(ROOT)) not in READERS and read.search(p.read_text(encoding="utf-8")))
    assert not offenders, offenders


def test_settings_are_typed_with_their_defaults():
    s = Settings.from_env({})
    assert s.cache_dir == Path.home() / ".cache" / "triage-console" and s.db is None and s.quality_cache is None
    assert s.trust_remote_code is False and s.cpu_fast is True and not s.cpu_kernels_off
    assert s.vllm_python is None and s.vllm_url == "http://127.0.0.1:8000" and s.prometheus_url == ""
    s = Settings.from_env({"TRIAGE_TRUST_REMOTE_CODE": " 1 ", "TRIAGE_CPU_FAST": "0", "TRIAGE_INT_CPU_KERNEL": "0",
                           "TRIAGE_VLLM_PYTHON": "", "TRIAGE_DB": "~/h.sqlite"})
    assert s.trust_remote_code and not s.cpu_fast and s.cpu_kernels_off == {"TRIAGE_INT_CPU_KERNEL"}
    assert s.vllm_python == "" and s.db == Path.home() / "h.sqlite"  # set but empty is not unset


def test_a_changed_variable_takes_effect(monkeypatch, tmp_path):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "a.sqlite"))
    first = settings()
    assert first.db == tmp_path / "a.sqlite" and settings() is first  # parsed once while nothing changes
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "b.sqlite"))
    assert settings().db == tmp_path / "b.sqlite"
