"""The fast engine's integer kernels (core/engines/fast/kernels/int_tile.py, int_gemv.py, int_prompt.py, launched
through methods/integer.py) under Triton's interpreter on the CPU,
against the torch engine's own ops (core/engines/torch/quant.py): the dequantized weights bit for bit, the int8
activation quantization bit for bit, W8A8's result bit for bit, weight-only products to float32-accumulation
rounding. Small shapes (the interpreter runs every program in numpy); the real kernels run in tests/gpu."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels then run in numpy on the CPU
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from core.engines.fast import int_weight as IW  # noqa: E402
from core.engines.fast.kernels import int_prompt, int_tile  # noqa: E402
from core.engines.fast.methods import method_for, tuning  # noqa: E402
from core.engines.torch import quant  # noqa: E402
from core.precision import Precision  # noqa: E402

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

INTERPRETED = isinstance(int_tile._int_linear_kernel, InterpretedFunction)
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("the kernels were imported without Triton's interpreter and there is no GPU", allow_module_level=True)

DEV = "cpu" if INTERPRETED else "cuda"
N, K = 96, 384  # three INT4 groups; 96 rows: q|k|v-like segments of 64, 16, 16 for AWQ


def _weight(seed: int, n: int = N, k: int = K) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[3, 5] = 0.3  # an outlier, so a group's range is not typical
    return w.to(torch.bfloat16).to(DEV)


def _awq(seed: int, rows=(64, 16, 16), k: int = K):
    g = torch.Generator().manual_seed(seed + 100)
    scales = [torch.exp(torch.randn(k, generator=g) * 0.7) for _ in rows]
    return [s / (s.max() * s.min()).sqrt() for s in scales], list(rows)


def _method(mode: str):
    return method_for(Precision(mode))


def _storage(mode: str, seed: int = 0) -> IW.IntWeight:
    w = _weight(seed)
    method = _method(mode)
    return method.quantize(w, _awq(seed) if method.needs_calibration else None)


INT_METHODS = [method_for(p) for p in (Precision.INT4, Precision.INT4_AWQ, Precision.INT8_WEIGHT_ONLY,
                                       Precision.INT8)]


def int_linear(x, iw: IW.IntWeight, out, silu_x: bool = False, cfg: dict | None = None, **inputs):
    """The decode product as the engine launches it: the weight's method, through the launch cfg names."""
    method = next(m for m in INT_METHODS if m.kernel_mode == iw.mode)
    return method.launch(iw, x, out, cfg, silu_x, **inputs)


@pytest.mark.parametrize("mode", ["int4", "int4-awq", "int8-wo"])
def test_dequantize_is_the_torch_engines_weights_bit_for_bit(mode):
    iw = _storage(mode)
    ref = IW.reference_dequantized(iw)
    got = int_prompt.dequantize(iw)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_fused_awq_storage_is_each_projections_int4linear():
    """Quantizing q|k|v fused with each projection's AWQ scales gives Int4Linear's weights for each projection."""
    w = _weight(1)
    s, rows = _awq(1)
    iw = _method("int4-awq").quantize(w, (s, rows))
    deq = IW.reference_dequantized(iw)
    start = 0
    for si, r in zip(s, rows):
        lin = torch.nn.Linear(K, r, bias=False).to(DEV)
        lin.weight.data = w[start:start + r].clone()
        ref = quant.Int4Linear(lin, si).dequantized(torch.bfloat16)
        assert torch.equal(deq[start:start + r].view(torch.int16), ref.view(torch.int16))
        start += r


@pytest.mark.parametrize("mode", ["int4", "int4-awq", "int8-wo"])
def test_one_hot_rows_read_back_each_dequantized_weight(mode):
    """x = e_k picks column k of the weight the kernel built in registers: exactly the reference's bf16 weight."""
    iw = _storage(mode, seed=2)
    ref = IW.reference_dequantized(iw)
    cols = [0, 1, 127, 128, 255, 382, 383]
    x = torch.zeros(len(cols), K, dtype=torch.bfloat16, device=DEV)
    x[torch.arange(len(cols)), cols] = 1.0
    out = torch.empty(len(cols), N, dtype=torch.bfloat16, device=DEV)
    int_linear(x, iw, out, cfg=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=2))
    assert torch.equal(out.view(torch.int16), ref[:, cols].t().contiguous().view(torch.int16))


@pytest.mark.parametrize("mode,m,split", [("int4", 1, 1), ("int4-awq", 3, 2), ("int8-wo", 8, 1), ("int8-wo", 2, 3)])
def test_weight_only_products_match_the_reference(mode, m, split):
    iw = _storage(mode, seed=3)
    x = (torch.randn(m, K, generator=torch.Generator().manual_seed(m)) ).to(torch.bfloat16).to(DEV)
    out = torch.full((m, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    int_linear(x, iw, out, cfg=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=split, num_warps=4, num_stages=2))
    ref = (x.float() @ IW.reference_dequantized(iw).float().t())
    rel = float((out.float() - ref).norm() / ref.norm())
    assert rel < 5e-3, rel  # bf16 output rounding; the weights are the same


def test_silu_input_is_the_references_activation():
    iw = _storage("int8-wo", seed=4)
    gu = torch.randn(1, 2 * K, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(DEV)
    out = torch.empty(1, N, dtype=torch.bfloat16, device=DEV)
    int_linear(gu, iw, out, silu_x=True, cfg=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=2))
    g, u = gu.chunk(2, dim=-1)
    act = torch.nn.functional.silu(g) * u  # bf16 ops, as HF's MLP rounds them
    ref = act.float() @ IW.reference_dequantized(iw).float().t()
    assert float((out.float() - ref).norm() / ref.norm()) < 5e-3


@pytest.mark.parametrize("silu", [False, True])
def test_int8_activation_quantization_is_int8_rows_bit_for_bit(silu):
    m = 3
    x = (torch.randn(m, (2 if silu else 1) * K, generator=torch.Generator().manual_seed(5)) * 3).to(torch.bfloat16)
    x[1, 7] = 40.0
    x = x.to(DEV)
    q = torch.empty(m, K, dtype=torch.int8, device=DEV)
    s = torch.empty(m, dtype=torch.float32, device=DEV)
    int_prompt.int8_rows(x, q, s, silu_x=silu)
    if silu:
        g, u = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(g) * u
    rq, rs = quant.int8_rows(x)
    assert torch.equal(q, rq) and torch.equal(s, rs[:, 0])


@pytest.mark.parametrize("m,split", [(1, 1), (5, 2)])
def test_w8a8_is_the_torch_engines_result_bit_for_bit(m, split):
    iw = _storage("int8", seed=6)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(6 + m)).to(torch.bfloat16).to(DEV)
    out = torch.empty(m, N, dtype=torch.bfloat16, device=DEV)
    xq = torch.empty(m, K, dtype=torch.int8, device=DEV)
    xs = torch.empty(m, dtype=torch.float32, device=DEV)
    int_linear(x, iw, out, cfg=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=split, num_warps=4, num_stages=2),
                  xq=xq, xs=xs)
    ref = IW.reference_linear(x, iw)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("mode", ["int4-awq", "int8"])
def test_the_prompt_pass_product_is_the_reference(mode):
    iw = _storage(mode, seed=7)
    x = torch.randn(2, 9, K, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).to(DEV)
    got = int_prompt.prompt_linear(x, iw)
    ref = IW.reference_linear(x, iw)
    assert got.shape == ref.shape == (2, 9, N)
    if mode == "int8":
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))
    else:
        assert float((got.float() - ref.float()).norm() / ref.float().norm()) < 1e-2


GEMV = dict(kernel="gemv", BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=2)


@pytest.mark.parametrize("mode,decode", [("int4", 0), ("int4", 1), ("int4", 2), ("int4-awq", 0), ("int4-awq", 1),
                                         ("int4-awq", 2), ("int8-wo", 0), ("int8-wo", 2)])
def test_gemv_reads_back_each_dequantized_weight(mode, decode):
    """The few-row kernel builds each weight from the int32 words it reads (every code position of a word, the
    groups' first and last inputs): row i of x = e_(k_i) gives exactly the reference's bf16 weight column k_i in
    output row i. Eight rows (no masks, activations read in pairs), three (rows masked) and one."""
    iw = _storage(mode, seed=2)
    ref = IW.reference_dequantized(iw)
    for cols in ([0, 1, 2, 3, 4, 5, 6, 7], [127, 128, 383], [5]):
        x = torch.zeros(len(cols), K, dtype=torch.bfloat16, device=DEV)
        x[torch.arange(len(cols)), cols] = 1.0
        out = torch.empty(len(cols), N, dtype=torch.bfloat16, device=DEV)
        int_linear(x, iw, out, cfg={**GEMV, "DECODE": decode})
        assert torch.equal(out.view(torch.int16), ref[:, cols].t().contiguous().view(torch.int16)), cols


@pytest.mark.parametrize("mode,split,silu,bn,rows", [("int4", 1, False, 32, 1), ("int4", 2, True, 64, 1),
                                                     ("int4-awq", 3, False, 32, 1), ("int8-wo", 1, True, 64, 1),
                                                     ("int8-wo", 2, False, 32, 1), ("int4", 2, False, 32, 8),
                                                     ("int4-awq", 1, True, 64, 2), ("int8-wo", 3, False, 32, 5)])
def test_gemv_products_match_the_reference(mode, split, silu, bn, rows):
    """Tiles that cover N and K exactly (no masks) and tiles that do not (96 rows in tiles of 64; 3 groups in 2
    slices; 5 activation rows in a block of 8)."""
    iw = _storage(mode, seed=3)
    x = torch.randn(rows, (2 if silu else 1) * K, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    x = x.to(DEV)
    out = torch.full((rows, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    int_linear(x, iw, out, silu_x=silu, cfg={**GEMV, "SPLIT_K": split, "BLOCK_N": bn})
    if silu:
        g, u = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(g) * u  # bf16 ops, as HF's MLP rounds them
    ref = x.float() @ IW.reference_dequantized(iw).float().t()
    rel = float((out.float() - ref).norm() / ref.norm())
    assert rel < 5e-3, rel  # bf16 output rounding; the weights are the same


def test_the_ran_line_names_the_gemv_only_where_the_tuning_table_gives_it(monkeypatch):
    monkeypatch.setattr(tuning, "TUNED", {})
    assert "GEMV" not in _method("int4").label()
    monkeypatch.setattr(tuning, "TUNED", {("int4", 1, 6144, 4096): {"kernel": "gemv"},
                                          ("int8-wo", 16, 6144, 4096): {"kernel": "tile", "BLOCK_N": 32}})
    assert "at one row, float32-FMA GEMVs" in _method("int4").label()
    assert "GEMV" not in _method("int8-wo").label() and "GEMV" not in _method("int4-awq").label()
