"""Whether the fast decode path can run a setup, and why not: pure checks on the device, precision and config,
importing neither torch nor triton. The engine and the factory both ask here."""
from __future__ import annotations

import importlib.util

from core.precision import Device, KVDtype, Precision

# INT8 W8A8 has kernels (kernels/intlinears.py) but is not routed here yet: compiled on the H200 its per-token
# activation quantization does not yet give torch._int_mm's result bit for bit (docs/PERFORMANCE.md).
FAST_PRECISIONS = (Precision.BF16, Precision.FP8, Precision.FP8_WEIGHT_ONLY, Precision.INT8_WEIGHT_ONLY,
                   Precision.INT4, Precision.INT4_AWQ)
# Triton's E4M3 type (float8e4nv) and FP8 tensor-core dots exist from Ada/Hopper on.
FP8_MIN_CC = (8, 9)
BF16_MIN_CC = (8, 0)


def fast_decode_unavailable_reasons(device: Device, precision: Precision, kv_dtype: KVDtype,
                                    config=None) -> list[str]:
    """Full-sentence reasons why the fast decode path cannot run this combination; an empty list means it can.

    `config` (a transformers config), when given, is checked too: only Llama-architecture models run here.
    """
    reasons: list[str] = []
    if device.kind != "cuda":
        reasons.append(f"The fast decode path (static KV cache, CUDA graphs, Triton kernels) needs an NVIDIA GPU; "
                       f"found {device.name}. The eager torch engine runs instead.")
        return reasons
    if importlib.util.find_spec("triton") is None:
        reasons.append("The fast decode path needs the triton package, which is not installed; "
                       "install the PyTorch build's matching triton or use the eager torch engine.")
    if precision not in FAST_PRECISIONS:
        reasons.append(f"The fast decode path runs BF16, FP8 (W8A8 and weight-only), INT8 weight-only and "
                       f"INT4 (g128, plain and AWQ); {precision.label} runs on the eager torch engine.")
    cc = device.capability
    if cc is not None:
        if cc < BF16_MIN_CC:
            reasons.append(f"The fast decode path needs BF16 (compute capability >= 8.0); found {device.cc_text} "
                           f"({device.name}). Use the eager torch engine.")
        elif (precision.is_fp8 or kv_dtype is KVDtype.FP8) and cc < FP8_MIN_CC:
            what = "FP8 weights" if precision.is_fp8 else "an FP8 KV cache"
            reasons.append(f"The fast decode path's Triton kernels for {what} need compute capability >= "
                           f"{FP8_MIN_CC[0]}.{FP8_MIN_CC[1]}; found {device.cc_text} ({device.name}). Use BF16 "
                           "with the auto KV cache here, or the eager torch engine.")
    if config is not None:
        from core.engines.fast.model import unsupported_config_reasons

        reasons += unsupported_config_reasons(config)
    return reasons
