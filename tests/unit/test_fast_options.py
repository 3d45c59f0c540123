"""The fast engine's switches (core/engines/fast/options.py): each TRIAGE_* variable read once, "0" turns it off."""
from __future__ import annotations

from core.engines.fast.options import FastOptions, options, overridden


def test_every_switch_defaults_to_on():
    assert FastOptions.from_env({}) == FastOptions()
    assert FastOptions().pdl and FastOptions().fa3 and FastOptions().fa3_lib is None


def test_zero_turns_each_switch_off():
    names = {"pdl": "TRIAGE_PDL", "fold": "TRIAGE_FOLD", "fp8_fast_accum": "TRIAGE_FP8_FAST_ACCUM",
             "attn_e4m3_cuda": "TRIAGE_ATTN_E4M3_CUDA", "fa3": "TRIAGE_FA3"}
    for field, var in names.items():
        opts = FastOptions.from_env({var: "0"})
        assert getattr(opts, field) is False
        assert all(getattr(opts, other) for other in names if other != field)
        assert getattr(FastOptions.from_env({var: "1"}), field) is True


def test_the_library_path_is_read_as_given_and_empty_means_the_default():
    assert FastOptions.from_env({"TRIAGE_FA3_LIB": "/x/lib.so"}).fa3_lib == "/x/lib.so"
    assert FastOptions.from_env({"TRIAGE_FA3_LIB": ""}).fa3_lib is None


def test_overridden_changes_the_options_in_force_for_the_block_only():
    before = options()
    with overridden(fold=False) as inside:
        assert options() is inside and not inside.fold and inside.pdl == before.pdl
    assert options() is before
