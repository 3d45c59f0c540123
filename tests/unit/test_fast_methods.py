"""The fast engine's linear methods on the CPU: one table of precisions, each family's eager numerics the torch
engine's own, and a library's launch joining a method's tuner candidates (docs/fast-engine.md#adding-a-candidate)."""
from __future__ import annotations

import pytest
import torch

from core.engines.fast import fast_precisions
from core.engines.fast.methods import METHODS, Int8W8A8, IntWeightOnly, Launch, Linear, method_for
from core.engines.torch import fp8, quant
from core.precision import Precision


def _weight(n=48, k=256, seed=0) -> torch.Tensor:
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02).to(torch.bfloat16)


def test_the_fast_engine_runs_the_precisions_its_method_table_names():
    assert fast_precisions() == tuple(METHODS)
    assert Precision.INT8 not in METHODS and isinstance(method_for(Precision.INT8), Int8W8A8)  # written, not routed
    with pytest.raises(ValueError, match="no linear method"):
        method_for(Precision.FP32)


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8_WEIGHT_ONLY, Precision.INT8_WEIGHT_ONLY,
                                       Precision.INT4, Precision.INT8])
def test_a_linear_computes_the_torch_engines_layer(precision):
    w, x = _weight(), torch.randn(3, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    lin = torch.nn.Linear(256, 48, bias=False)
    lin.weight.data = w.clone()
    eager = {Precision.BF16: lambda: lin, Precision.FP8_WEIGHT_ONLY: lambda: fp8.FP8Linear(lin, w8a8=False),
             Precision.INT8_WEIGHT_ONLY: lambda: quant.Int8Linear(lin, w8a8=False),
             Precision.INT4: lambda: quant.Int4Linear(lin), Precision.INT8: lambda: quant.Int8Linear(lin, w8a8=True)}
    got = Linear(method_for(precision), w).ref(x)
    ref = eager[precision]()(x)
    if precision is Precision.FP8_WEIGHT_ONLY:  # on the CPU FP8Linear runs its C kernel: same weights, other sums
        assert float((got.float() - ref.float()).norm() / ref.float().norm()) < 1e-2
    else:
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_a_method_that_needs_calibration_says_so():
    with pytest.raises(ValueError, match="input scales"):
        Linear(method_for(Precision.INT4_AWQ), _weight())


def test_a_library_launch_joins_the_candidates_and_runs_where_it_takes_the_shape():
    """How a library kernel (tinygemm, gemlite) is added: one more named Launch; the tuner's candidates name it, a
    winner naming it runs it, and a shape it does not take falls back to the method's first launch."""
    calls = []

    class WithLibrary(IntWeightOnly):
        def launches(self):
            def run(w, x, out, cfg, silu_x, **_):
                calls.append(("library", x.shape[0], cfg.get("tiles")))
                return out

            return {**super().launches(), "library": Launch("library", run, lambda rows, n, k: [{"tiles": 2}],
                                                            takes=lambda w, rows: rows <= 4)}

    method = WithLibrary(Precision.INT4)
    cands = method.candidates(1, 48, 1024)
    assert {"kernel": "library", "tiles": 2} in cands and {c["kernel"] for c in cands} == {"tile", "gemv", "library"}
    assert method.candidates(1, 48, 1024, kernels={"library"}) == [{"kernel": "library", "tiles": 2}]
    w = method.quantize(_weight())
    out = torch.empty(2, 48, dtype=torch.bfloat16)
    method.launch(w, torch.zeros(2, 256, dtype=torch.bfloat16), out, {"kernel": "library", "tiles": 2})
    assert calls == [("library", 2, 2)]
    chosen = []
    method.launches = lambda: {"tile": Launch("tile", lambda *a, **k: chosen.append("tile"), lambda r, n, k: []),
                               "library": Launch("library", lambda *a, **k: chosen.append("library"),
                                                 lambda r, n, k: [], takes=lambda w, rows: rows <= 4)}
    method.launch(w, torch.zeros(8, 256, dtype=torch.bfloat16), torch.empty(8, 48), {"kernel": "library"})
    assert chosen == ["tile"]  # 8 rows: not the library's shape


def test_the_decode_step_reads_a_library_launchs_own_output():
    """A launch with `product` (a library kernel: kernels/library.py) hands the step its own output tensor instead of
    writing the step's buffer; a launch without one writes `out` and returns it; AWQ's input scales are asked for
    only where a library launch reads divided rows."""
    own = torch.full((1, 48), 7.0)

    class WithLibrary(IntWeightOnly):
        def launches(self):
            return {**super().launches(),
                    "library": Launch("library", lambda *a, **k: None, lambda rows, n, k: [{}],
                                      product=lambda w, x, cfg, silu_x, **inputs: own)}

        def config(self, rows, n, k):
            return {"kernel": "library"} if rows == 1 else super().config(rows, n, k)

    class Written(IntWeightOnly):
        def launches(self):
            return {"kernel": Launch("kernel", lambda w, x, out, cfg, silu_x, **k: out.fill_(1.0),
                                     lambda rows, n, k: [{}])}

    lin = Linear(WithLibrary(Precision.INT4), _weight())
    out = torch.empty(1, 48, dtype=torch.bfloat16)
    assert lin.fast(torch.zeros(1, 256, dtype=torch.bfloat16), None, out) is own
    assert lin.input_divisors(1) is None  # not AWQ
    plain = Linear(Written(Precision.INT4), _weight())
    out = torch.zeros(2, 48, dtype=torch.bfloat16)
    assert plain.fast(torch.zeros(2, 256, dtype=torch.bfloat16), None, out, x_div=None) is out
    assert bool((out == 1).all()) and plain.input_divisors(2) is None
