"""Pick the engine for a setup: the fast CUDA-graph path where it can run, the eager torch engine otherwise."""
from __future__ import annotations


def build_engine(spec, precision, kv_dtype, progress=None):
    from core.engines.torch_engine import TorchEngine, current_device

    device = current_device()
    if device.kind == "cuda" and spec.kind in ("synthetic", "hf_dir"):
        from core.engines.fast import fast_decode_unavailable_reasons
        from core.models import load_config

        if not fast_decode_unavailable_reasons(device, precision, kv_dtype, load_config(spec)):  # no reason: it can run
            from core.engines.fast import FastLlamaEngine

            return FastLlamaEngine(spec, precision, kv_dtype, progress=progress)
    return TorchEngine(spec, precision, kv_dtype, progress=progress)
