"""Whether the fast decode path can run a setup, and why not: checks on the device, precision and config. Importing
this module imports neither torch nor triton; asking about a CUDA device loads the linear methods' table (torch).
The engine and the factory both ask here."""
from __future__ import annotations

import importlib.util

from core.precision import Device, KVDtype, Precision

# Triton's E4M3 type (float8e4nv) and FP8 tensor-core dots exist from Ada/Hopper on.
FP8_MIN_CC = (8, 9)
BF16_MIN_CC = (8, 0)


def fast_precisions() -> tuple[Precision, ...]:
    """The precisions the fast engine runs: the keys of its linear methods' table (methods/__init__.py)."""
    from core.engines.fast.methods import METHODS

    return tuple(METHODS)


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
    runs = fast_precisions()
    if precision not in runs:
        reasons.append(f"The fast decode path runs {', '.join(p.label for p in runs)}; {precision.label} runs on "
                       "the eager torch engine.")
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
