"""Fast decode on CUDA: a compact Llama decoder, a static KV cache, and a decode step captured in a CUDA graph.

    from core.engines.fast import fast_decode_unavailable_reasons
    from core.engines.fast.engine import FastLlamaEngine
    reasons = fast_decode_unavailable_reasons(device, precision, kv_dtype, config)  # [] means it can run
    engine = FastLlamaEngine(spec, precision, kv_dtype)                    # same public methods as TorchEngine

Importing this package imports neither torch nor triton (core stays cheap to import); the engine (engine.py), the
model (model.py, cache.py, graph.py), the linear methods (methods/) and the kernels (kernels/) are imported by name
where they are used.
"""
from __future__ import annotations

from core.engines.fast.support import fast_decode_unavailable_reasons, fast_precisions  # noqa: F401 - the API

__all__ = ["fast_decode_unavailable_reasons", "fast_precisions"]
