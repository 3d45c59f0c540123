"""A broken test setup fails instead of skipping: CI installs Playwright, Chromium and vLLM's environment, so a
missing one must not turn the browser or vLLM tests into silent skips. Skipping takes an explicit variable."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collect(*paths: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRIAGE_CHROMIUM": "/nonexistent/chromium", **env})


def test_browser_tests_fail_without_chromium_unless_skipped_on_purpose():
    broken = collect("tests/e2e/test_pages.py", "tests/vllm/test_deployment_browser.py")
    assert broken.returncode != 0
    assert "no Chromium at /nonexistent/chromium" in broken.stdout + broken.stderr
    assert "TRIAGE_TESTS_WITHOUT_BROWSER=1" in broken.stdout + broken.stderr
    alone = collect("tests/vllm/test_deployment_browser.py")  # the browser test outside tests/e2e
    assert alone.returncode != 0 and "no Chromium at /nonexistent/chromium" in alone.stdout
    for path in ("tests/e2e/test_pages.py", "tests/vllm/test_deployment_browser.py"):
        on_purpose = collect(path, TRIAGE_TESTS_WITHOUT_BROWSER="1")
        assert on_purpose.returncode in (0, 5), on_purpose.stdout + on_purpose.stderr  # 5: all skipped


def test_fleet_tests_fail_without_prometheus_unless_skipped_on_purpose():
    test = "tests/vllm/test_fleet.py::test_queries_per_refresh_do_not_grow_with_replicas"
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    env = {**os.environ, "TRIAGE_PROMETHEUS": "/nonexistent/prometheus"}
    broken = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert broken.returncode != 0 and "no prometheus binary at /nonexistent/prometheus" in broken.stdout
    assert "TRIAGE_TESTS_WITHOUT_PROMETHEUS=1" in broken.stdout
    skipped = subprocess.run(run + ["-rs"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**env, "TRIAGE_TESTS_WITHOUT_PROMETHEUS": "1"})
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout


def test_test_modules_have_unique_names():
    # the test folders are not packages (rootdir imports): two modules of one name break the whole run's collection
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def test_every_test_directory_is_in_the_run_and_shared_state_is_not_in_a_conftest():
    """pytest.ini lists the test directories in the order their servers' early starts need: a new directory left out
    of it would never run. And a conftest imported by name from another directory is a second copy of it (pytest
    imports each as a module named "conftest"): state shared across directories lives in modules of their own."""
    import configparser

    listed = configparser.ConfigParser()
    listed.read(ROOT / "pytest.ini")
    testpaths = listed["pytest"]["testpaths"].split()
    have = sorted({str(p.parent.relative_to(ROOT)) for p in (ROOT / "tests").glob("*/test_*.py")})
    assert sorted(testpaths) == have, (testpaths, have)
    by_name = re.compile(r"(from|import) tests\.\w+\.conftest\b")
    conftest_imports = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                        if by_name.search(p.read_text())]
    assert not conftest_imports, conftest_imports
