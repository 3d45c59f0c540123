"""core/engines/fast/fa3 without a GPU: it says why FlashAttention-3 cannot run (and the prompt pass then keeps
SDPA) instead of failing: off CUDA, turned off, the library missing, or a file there that is not the library.
The kernel itself is tested on a Hopper GPU (tests/gpu/test_fa3.py)."""
from __future__ import annotations

import pytest

from core.engines.fast import fa3
from core.engines.fast.options import overridden


@pytest.fixture(autouse=True)
def fresh_loader(monkeypatch):
    monkeypatch.setattr(fa3, "_LOADED", {})


def test_off_the_gpu_or_turned_off_it_says_so():
    with overridden(fa3=True):
        assert fa3.why_not("cpu", 32, 8, 128) == "not on a CUDA device"
    with overridden(fa3=False):
        assert fa3.why_not("cuda", 32, 8, 128) == "turned off (TRIAGE_FA3=0)"


def test_a_missing_library_names_the_build_script(tmp_path):
    with overridden(fa3_lib=str(tmp_path / "none.so")):
        why = fa3._entry(str(fa3.lib_path()))
    assert isinstance(why, str) and "scripts/build_fa3.sh" in why and "none.so" in why


def test_a_file_that_is_not_the_library_is_refused_with_the_reason(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF not really")
    with overridden(fa3_lib=str(junk)):
        assert fa3._entry(str(fa3.lib_path())).startswith(f"FlashAttention-3's library at {junk} does not load:")


@pytest.fixture
def no_library(tmp_path):
    with overridden(fa3_lib=str(tmp_path / "none.so")):
        yield


def test_a_call_without_the_library_or_with_wrong_inputs_raises_what_is_wrong(no_library):
    import torch

    q = torch.zeros(1, 4, 2, 128, dtype=torch.bfloat16)
    kv = torch.zeros(1, 4, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="scripts/build_fa3.sh"):
        fa3.causal_attention_bf16(q, kv, kv)
    with pytest.raises(ValueError, match="FA3 got q as torch.float16"):
        fa3.causal_attention_bf16(q.half(), kv, kv)
    with pytest.raises(ValueError, match="last dim contiguous"):
        fa3.causal_attention_bf16(q.transpose(2, 3), kv, kv)
