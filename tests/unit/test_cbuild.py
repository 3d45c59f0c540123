"""core/engines/torch/cbuild.py: the CPU's flags, and a C library's build, its switch and its reasons for not serving."""
import pytest

from core.engines.torch import cbuild

SOURCE = "int triage_answer(void) { return 42; }\n"


def test_cpu_flags_are_the_first_cpus_words():
    flags = cbuild.cpu_flags()
    if flags is None:
        pytest.skip("no flags line in /proc/cpuinfo here")
    assert flags and all(f == f.strip() and f for f in flags) and ":" not in flags


def test_a_library_builds_once_and_its_switch_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setattr(cbuild, "kernel_dir", lambda: tmp_path)
    lib = cbuild.Library("triage_test", SOURCE, lambda lib: None, "TRIAGE_TEST_KERNEL", "the test kernel")
    assert lib.available() and lib.get() is lib.get() and lib.why_not() is None
    assert len(list(tmp_path.glob("triage_test_*.so"))) == 1
    with lib.turned_off():
        assert not lib.available()
    assert lib.available()
    monkeypatch.setenv("TRIAGE_TEST_KERNEL", "0")
    off = cbuild.Library("triage_test", SOURCE, lambda lib: None, "TRIAGE_TEST_KERNEL", "the test kernel")
    assert not off.available() and off.why_not() == "turned off by TRIAGE_TEST_KERNEL=0"


def test_a_library_that_cannot_build_or_serve_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(cbuild, "kernel_dir", lambda: tmp_path)
    broken = cbuild.Library("triage_broken", "this is not C;\n", lambda lib: None, "TRIAGE_TEST_KERNEL",
                            "the test kernel")
    assert not broken.available() and broken.why_not().startswith("the test kernel could not be built (")
    refused = cbuild.Library("triage_test", SOURCE, lambda lib: "this CPU lacks it", "TRIAGE_TEST_KERNEL",
                             "the test kernel")
    assert not refused.available() and refused.why_not() == "this CPU lacks it"
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    missing = cbuild.Library("triage_other", SOURCE + "\n", lambda lib: None, "TRIAGE_TEST_KERNEL", "the test kernel")
    assert not missing.available() and "could not be built" in missing.why_not()
