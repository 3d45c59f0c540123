"""core/engines/fast/fa3 without a GPU: it says why FlashAttention-3 cannot run (and the prompt pass then keeps
SDPA) instead of failing: off CUDA, turned off, the library missing, or a file there that is not the library.
The kernel itself is tested on a Hopper GPU (tests/gpu/test_fa3.py)."""
from __future__ import annotations

import pytest

from core.engines.fast import fa3


@pytest.fixture(autouse=True)
def fresh_loader():
    fa3._entry.cache_clear()
    yield
    fa3._entry.cache_clear()


def test_off_the_gpu_or_turned_off_it_says_so(monkeypatch):
    assert fa3.why_not("cpu", 32, 8, 128) == "not on a CUDA device"
    monkeypatch.setenv("TRIAGE_FA3", "0")
    assert fa3.why_not("cuda", 32, 8, 128) == "turned off (TRIAGE_FA3=0)"


def test_a_missing_library_names_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setenv("TRIAGE_FA3_LIB", str(tmp_path / "none.so"))
    why = fa3._entry(str(fa3.lib_path()))
    assert isinstance(why, str) and "scripts/build_fa3.sh" in why and "none.so" in why


def test_a_file_that_is_not_the_library_is_refused_with_the_reason(monkeypatch, tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF not really")
    monkeypatch.setenv("TRIAGE_FA3_LIB", str(junk))
    assert fa3._entry(str(fa3.lib_path())).startswith(f"FlashAttention-3's library at {junk} does not load:")
