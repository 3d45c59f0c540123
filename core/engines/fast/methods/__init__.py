"""The fast engine's linear methods: one class per precision family, found in one table.

    from core.engines.fast.methods import method_for
    method = method_for(Precision.INT4)        # IntWeightOnly(Precision.INT4)
    lin = Linear(method, weight)               # a method plus its tensors: lin.ref(x), lin.prompt(x), lin.fast(...)

METHODS maps each precision the fast engine runs to its method class; core/engines/fast/support.py's
fast_precisions() are its keys. INT8 W8A8 has a method (Int8W8A8: kernels, tuner candidates, tests) but no entry:
compiled on the H200 its per-token activation quantization does not yet give torch._int_mm's result bit for bit
(docs/perf-log/integer.md), so the eager engine runs it.

Adding a precision: its value in core/precision.py, its method class (here, or a file beside these), its kernel
module under kernels/, its quantizer (the torch engine's), and one line in METHODS.
"""
from __future__ import annotations

from core.engines.fast.methods.base import Launch, Linear, LinearMethod
from core.engines.fast.methods.dense import Bf16, Fp8W8A8, Fp8WeightOnly
from core.engines.fast.methods.integer import Int8W8A8, IntWeightOnly
from core.precision import Precision

METHODS: dict[Precision, type[LinearMethod]] = {
    Precision.BF16: Bf16,
    Precision.FP8: Fp8W8A8,
    Precision.FP8_WEIGHT_ONLY: Fp8WeightOnly,
    **{p: IntWeightOnly for p in IntWeightOnly.precisions},
}


def method_for(precision: Precision) -> LinearMethod:
    """The method that runs `precision`'s linears (any family, routed or not: tests and benches time Int8W8A8)."""
    cls = METHODS.get(precision) or (Int8W8A8 if precision in Int8W8A8.precisions else None)
    if cls is None:
        raise ValueError(f"The fast engine has no linear method for {precision.label}.")
    return cls(precision)


__all__ = ["METHODS", "method_for", "Launch", "Linear", "LinearMethod", "Bf16", "Fp8W8A8", "Fp8WeightOnly",
           "IntWeightOnly", "Int8W8A8"]
