"""Library integer kernels (core/engines/fast/kernels/library.py) on the GPU, on the torch engine's own integer
storage (core/engines/torch/quant.py, as intlinears.IntWeight holds it):

    PYTHONUNBUFFERED=1 python3 -m pytest -q tests/gpu/test_int_library_gpu.py -s

- gemlite INT4 / INT8 weight-only: one-hot rows read back the weights the kernel multiplies with: the torch engine's
  bf16 weights bit for bit, at 1 row (gemlite's GEMV) and 8 rows (its split-K tensor-core GEMM).
- tinygemm (torch's `_weight_int4pack_mm`): its weights are what library.tinygemm_params says (bf16 scale and zero,
  one FMA rounding), which are NOT the torch engine's bit for bit; the share that differ and by how much is printed.
- INT4 AWQ folded into the activations: the codes read back bit for bit; the product close to the torch engine's.
- W8A8: gemlite's dynamic INT8 against torch._int_mm's result (printed: not required bit for bit, not routed).
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton")

from core.engines.fast import int_weight as IL  # noqa: E402
from core.engines.fast.kernels import library  # noqa: E402
from core.engines.fast.methods import method_for  # noqa: E402
from core.precision import Precision  # noqa: E402

SHAPES = [(6144, 4096, (4096, 1024, 1024)), (4096, 14336, (4096,))]  # q|k|v and down of Llama-3-8B
needs_gemlite = pytest.mark.skipif(not library.gemlite_available(), reason="gemlite is not installed "
                                   "(requirements-gpu.txt)")


def _storage(mode, n, k, rows, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    method = method_for(Precision(mode))
    if mode != "int4-awq":
        return method.quantize(w)
    scales = [torch.exp(torch.randn(k, device="cuda", generator=g) * 0.7) for _ in rows]
    return method.quantize(w, ([s / (s.max() * s.min()).sqrt() for s in scales], list(rows)))


def _read_back(kern, k: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """m one-hot rows: (the columns read, the kernel's weights at those columns [m, N])."""
    cols = torch.randperm(k, device="cuda")[:m]
    e = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
    e[torch.arange(m), cols] = 1.0
    return cols, kern(e)


def _plain(iw: IL.IntWeight) -> IL.IntWeight:
    """The AWQ storage's codes as plain INT4 (what the folded kernels multiply with)."""
    return IL.IntWeight(IL.MODE_INT4, iw.n, iw.k, iw.w, iw.scale, iw.zero)


@needs_gemlite
@pytest.mark.parametrize("n,k,rows", SHAPES)
@pytest.mark.parametrize("mode,cls", [("int4", "GemliteInt4"), ("int8-wo", "GemliteInt8")])
def test_gemlite_weights_are_the_torch_engines_bit_for_bit(mode, cls, n, k, rows):
    iw = _storage(mode, n, k, rows)
    kern = getattr(library, cls)(iw)
    ref_w = IL.reference_dequantized(iw)
    for m in (1, 8):
        cols, got = _read_back(kern, k, m)
        assert torch.equal(got.view(torch.int16), ref_w[:, cols].t().contiguous().view(torch.int16)), (mode, m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw).float()
        rel = float((kern(x).float() - ref).norm() / ref.norm())
        assert rel < 5e-3, (m, rel)  # same weights; float32 sums in another order, bf16 output
        print(f"{cls} {n}x{k} M={m}: weights bit for bit, output rel err {rel:.1e}")


@pytest.mark.parametrize("n,k,rows", SHAPES)
def test_tinygemm_weights_are_its_own_format(n, k, rows):
    """tinygemm multiplies with round_bf16((q - 8) * scale + zero) from library.tinygemm_params: read back, that
    exactly; against the torch engine's weights, close (a fraction of a quantization step) but not bit for bit."""
    iw = _storage("int4", n, k, rows)
    kern = library.TinyGemmInt4(iw)
    codes = library.unpack_codes(iw).float()
    p = library.tinygemm_params(iw.scale, iw.zero).float()
    for m in (1, 8):
        cols, got = _read_back(kern, k, m)
        g = cols // library.GROUP
        theirs = ((codes[:, cols] - 8) * p[g, :, 0].t() + p[g, :, 1].t()).to(torch.bfloat16)
        assert torch.equal(got.view(torch.int16), theirs.t().contiguous().view(torch.int16)), m
    err = library.tinygemm_weight_error(iw)
    assert err["max_diff_steps"] < 0.125, err
    print(f"tinygemm {n}x{k}: {100 * err['equal_share']:.1f}% of weights equal to the torch engine's, largest "
          f"difference {err['max_diff_steps']:.3f} of a quantization step")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n,k,rows", SHAPES)
@pytest.mark.parametrize("kernel", ["TinyGemmInt4", "GemliteInt4"])
def test_awq_folded_into_the_activations(kernel, n, k, rows, split):
    if kernel == "GemliteInt4" and not library.gemlite_available():
        pytest.skip("gemlite is not installed")
    iw = _storage("int4-awq", n, k, rows)
    cls = getattr(library, kernel)
    fold = library.AwqFold(iw, cls, split=split)
    if cls.exact:  # the codes the parts multiply with are the torch engine's (before its division by s)
        cols, got = _read_back(cls(_plain(iw)), k, 8)
        ref_plain = IL.reference_dequantized(_plain(iw))
        assert torch.equal(got.view(torch.int16), ref_plain[:, cols].t().contiguous().view(torch.int16))
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw).float()
        rel = float((fold(x).float() - ref).norm() / ref.norm())
        # the same product in another rounding order (x / s rounded to bf16 where the reference rounds W / s);
        # tinygemm adds its own weight differences (test_tinygemm_weights_are_its_own_format)
        assert rel < (1.5e-2 if kernel == "TinyGemmInt4" else 1e-2), (m, rel)
        print(f"{kernel} + AWQ {'split' if split else 'fold'} {n}x{k} M={m}: output rel err {rel:.1e} against the torch engine's")


@needs_gemlite
@pytest.mark.parametrize("n,k,rows", SHAPES)
def test_gemlite_w8a8_against_int_mm(n, k, rows):
    iw = _storage("int8", n, k, rows)
    kern = library.GemliteW8A8(iw)
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw)
        out = kern(x)
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        equal = float((out.view(torch.int16) == ref.view(torch.int16)).float().mean())
        assert rel < 1e-2, (m, rel)
        print(f"gemlite W8A8 {n}x{k} M={m}: rel err {rel:.1e}, {100 * equal:.1f}% of outputs equal to "
              "torch._int_mm's")
