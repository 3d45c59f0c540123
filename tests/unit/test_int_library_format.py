"""The format conversions of core/engines/fast/kernels/library.py on the CPU: torch's CPU build has tinygemm's format
and arithmetic (`_convert_weight_to_int4pack_for_cpu`, `_weight_int4pack_mm_for_cpu`), so the conversion from the
torch engine's INT4 storage is checked here; the CUDA kernels themselves in tests/gpu/test_int_library_gpu.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from core.engines.fast import int_weight as IW  # noqa: E402
from core.engines.fast.kernels import library  # noqa: E402
from core.engines.torch import quant  # noqa: E402


@pytest.fixture(scope="module")
def iw():
    g = torch.Generator().manual_seed(5)
    return IW.quantize((torch.randn(96, 512, generator=g) * 0.02).to(torch.bfloat16), IW.MODE_INT4)


def test_codes_unpack_to_the_torch_engines_weights(iw):
    codes = library.unpack_codes(iw)
    assert codes.shape == (96, 512) and int(codes.max()) <= 15
    g = torch.arange(512) // library.GROUP
    w = ((codes.float() - iw.zero.float()[:, g]) * iw.scale.float()[:, g]).to(torch.bfloat16)
    assert torch.equal(w, quant.dequantize_int4(iw.w, iw.scale, iw.zero, 512).to(torch.bfloat16))


def test_tinygemm_format_is_close_but_not_the_same_weights(iw):
    """tinygemm's (q - 8) * scale + zero with bf16 scale and zero cannot hold (q - zp) * s16 exactly in general:
    what its CPU kernel reads back is what tinygemm_weight_error models, a fraction of a step from ours."""
    params = library.tinygemm_params(iw.scale, iw.zero)
    theirs = library.tinygemm_cpu_weights(library.unpack_codes(iw), params)
    ours = IW.reference_dequantized(iw)
    err = library.tinygemm_weight_error(iw)
    assert abs(float((theirs == ours).float().mean()) - err["equal_share"]) < 1e-9
    assert err["max_diff_steps"] < 0.125
    assert err["equal_share"] < 1.0  # a float16 scale rarely fits bf16: not bit for bit (docs/perf-log/integer.md)
