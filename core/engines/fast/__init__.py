"""Fast decode on CUDA: a compact Llama decoder, a static KV cache, and a decode step captured in a CUDA graph.

    from core.engines.fast import fast_decode_unavailable_reasons, FastLlamaEngine
    reasons = fast_decode_unavailable_reasons(device, precision, kv_dtype, config)  # [] means it can run
    engine = FastLlamaEngine(spec, precision, kv_dtype)                    # same public methods as TorchEngine

Importing this package imports neither torch nor triton (core stays cheap to import); FastLlamaEngine, FastLlama
and the kernels load on first use.
"""
from __future__ import annotations

from core.engines.fast.support import FAST_PRECISIONS, fast_decode_unavailable_reasons  # noqa: F401 - the package's API


def __getattr__(name):
    if name == "FastLlamaEngine":
        from core.engines.fast.engine import FastLlamaEngine

        return FastLlamaEngine
    if name in ("FastLlama", "DecodeGraph", "StaticKVCache", "Dims"):
        from core.engines.fast import model

        return getattr(model, name)
    raise AttributeError(name)


__all__ = ["fast_decode_unavailable_reasons", "FastLlamaEngine", "FAST_PRECISIONS"]
