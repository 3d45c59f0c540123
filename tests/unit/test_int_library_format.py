"""The format conversions of core/engines/fast/kernels/library.py on the CPU: torch's CPU build has tinygemm's format
and arithmetic (`_convert_weight_to_int4pack_for_cpu`, `_weight_int4pack_mm_for_cpu`), so the conversion from the
torch engine's INT4 storage is checked here; the CUDA kernels themselves in tests/gpu/test_int_library_gpu.py.
Also how the decode step reads a library's own output (float32, INT4 AWQ's row blocks) and writes AWQ's divided
rows, through the row kernels under Triton's interpreter (tests/gpu checks the same bit for bit on the hardware)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels then run in numpy on the CPU
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from core.engines.fast import int_weight as IW  # noqa: E402
from core.engines.fast.kernels import library, norm, rope  # noqa: E402
from core.engines.torch import quant  # noqa: E402

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

INTERPRETED = isinstance(norm._silu_mul_kernel, InterpretedFunction)
DEV = "cpu" if INTERPRETED else "cuda"
needs_kernels = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                   reason="the row kernels were imported without Triton's interpreter, and no GPU")


def _as_bf16(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 as the kernels convert: round to nearest even on a GPU; the interpreter truncates."""
    if not INTERPRETED:
        return t.to(torch.bfloat16)
    return (t.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


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


@needs_kernels
def test_the_step_reads_a_library_output_as_its_bf16_copy():
    """A float32 product read directly (the residual's delta, gate|up, q|k|v) gives what its bf16 copy gave; INT4
    AWQ's row blocks (gate and up, or q, k and v, each valid in its own block) read as the gathered row."""
    g = torch.Generator().manual_seed(3)
    M, N, I = 3, 256, 128
    x0 = torch.randn(M, N, generator=g).to(torch.bfloat16).to(DEV)
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(torch.bfloat16).to(DEV)
    delta = torch.randn(M, N, generator=g).to(DEV)
    xa, xb, ha, hb = x0.clone(), x0.clone(), torch.empty_like(x0), torch.empty_like(x0)
    norm.add_rmsnorm(xa, delta, w, 1e-5, ha)
    norm.add_rmsnorm(xb, _as_bf16(delta), w, 1e-5, hb)
    assert torch.equal(xa, xb) and torch.equal(ha, hb)

    gu = torch.randn(2 * M, 2 * I, generator=g).to(DEV)  # gate in rows 0..M-1, up in rows M..2M-1
    flat = torch.cat([gu[:M, :I], gu[M:, I:]], dim=1)
    a_blocks, a_pair, a_flat = (torch.empty(M, I, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    norm.silu_mul(gu, a_blocks)
    norm.silu_mul((gu[:M, :I].contiguous(), gu[M:, I:].contiguous()), a_pair)  # one kernel per projection
    norm.silu_mul(_as_bf16(flat), a_flat)
    assert torch.equal(a_blocks, a_flat) and torch.equal(a_pair, a_flat)

    B, HQ, HKV, D, T = 2, 4, 2, 32, 16
    qkv = torch.randn(3 * B, (HQ + 2 * HKV) * D, generator=g).to(DEV)
    q_end, k_end = HQ * D, (HQ + HKV) * D
    gathered = torch.cat([qkv[:B, :q_end], qkv[B:2 * B, q_end:k_end], qkv[2 * B:, k_end:]], dim=1)
    pos = torch.tensor([3, 7], device=DEV)
    ang = torch.arange(T)[:, None] * torch.rand(D // 2, generator=g)[None]
    cos, sin = (t.to(torch.bfloat16).float().to(DEV) for t in (ang.cos(), ang.sin()))
    parts = (qkv[:B, :q_end].contiguous(), qkv[B:2 * B, q_end:k_end].contiguous(), qkv[2 * B:, k_end:].contiguous())
    got = []
    for src in (qkv, _as_bf16(gathered), gathered, parts):
        q = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=DEV)
        kc, vc = (torch.zeros(B, HKV, T, D, dtype=torch.bfloat16, device=DEV) for _ in range(2))
        rope.rope_store(src, pos, cos, sin, q, kc, vc, None, None, HQ, HKV, D)
        got.append((q, kc, vc))
    assert all(torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d) for a, b, c, d in zip(*got))


@needs_kernels
def test_awq_divided_rows_are_written_by_the_producing_kernel():
    """add_rmsnorm and silu_mul write h / s (a / s) per projection in row blocks: the rows AwqFold divides itself."""
    g = torch.Generator().manual_seed(4)
    M, N = 2, 256
    x = torch.randn(M, N, generator=g).to(torch.bfloat16).to(DEV)
    w = torch.ones(N, dtype=torch.bfloat16, device=DEV)
    div = torch.exp(0.3 * torch.randn(3, N, generator=g)).to(DEV)
    h, out = torch.empty_like(x), torch.empty(3 * M, N, dtype=torch.bfloat16, device=DEV)
    norm.add_rmsnorm(x, None, w, 1e-5, h, div=div, div_out=out)
    assert torch.equal(out, _as_bf16(torch.cat([h.float() / div[j] for j in range(3)])))
    gu = torch.randn(M, 2 * N, generator=g).to(torch.bfloat16).to(DEV)
    a, a_div = torch.empty(M, N, dtype=torch.bfloat16, device=DEV), torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    norm.silu_mul(gu, a, div=div[:1], div_out=a_div)
    assert torch.equal(a_div, _as_bf16(a.float() / div[0]))
    with pytest.raises(AssertionError):
        norm.add_rmsnorm(x, None, w, 1e-5, h, div=div, div_out=out[:M])  # one block per projection, no fewer
