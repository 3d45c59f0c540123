"""Precisions a model is known to break in, found from its config (model_type and architectures), never from its
name: the Precision compare page warns before a run and keeps such a precision out of the default reference.

Reading a config here is a JSON read of the model directory's config.json (no transformers import, no weights), so a
page can ask on every rerun. A model whose config is not at hand yet (the embedded model before its first
conversion, a GGUF file) has no known failures: the run's own verdict still names a side that broke.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.models import SYNTHETIC_CONFIGS, ModelError, embedded_converted_dir, parse_model
from core.precision import Precision

# vLLM refuses float16 for these model types for the same reason (vllm/config/model.py,
# _FLOAT16_NOT_SUPPORTED_MODELS); the embedded Gemma 3 gives NaN from decoder layer 7 on in FP16 (measured here).
_GEMMA_FP16 = ("FP16 tops out at 65504 and this model's activations go past it: the forward pass overflows to NaN "
               "and the output is padding (vLLM refuses float16 for it too)")
KNOWN_FAILURES: dict[str, dict[Precision, str]] = {
    "gemma2": {Precision.FP16: _GEMMA_FP16},
    "gemma3": {Precision.FP16: _GEMMA_FP16},
    "gemma3_text": {Precision.FP16: _GEMMA_FP16},
}
# The reference a comparison offers first: the widest precision the model is not known to break in.
REFERENCE_PREFERENCE = (Precision.FP32, Precision.BF16, Precision.FP16)


def _config_json(model: str) -> dict:
    try:
        spec = parse_model(model)
    except ModelError:
        return {}
    if spec.kind == "synthetic":
        return {"model_type": "llama"} if spec.path in SYNTHETIC_CONFIGS else {}
    folder = embedded_converted_dir() if spec.kind == "embedded" else Path(spec.path) if spec.kind == "hf_dir" else None
    try:
        return json.loads((folder / "config.json").read_text()) if folder else {}
    except (OSError, ValueError):
        return {}


def model_types(model: str) -> set[str]:
    """The model's model_type, its text model's model_type (multimodal configs nest one) and its architectures."""
    cfg = _config_json(model)
    found = {cfg.get("model_type"), (cfg.get("text_config") or {}).get("model_type"), *(cfg.get("architectures") or [])}
    return {x for x in found if isinstance(x, str) and x}


def known_failures(model: str) -> dict[Precision, str]:
    """Precision -> why it fails on this model, from every model type its config names."""
    out: dict[Precision, str] = {}
    for kind in sorted(model_types(model)):
        out.update(KNOWN_FAILURES.get(kind, {}))
    return out


def default_reference(failures: dict[Precision, str]) -> Precision:
    """The first of REFERENCE_PREFERENCE that the model is not known to break in."""
    return next((p for p in REFERENCE_PREFERENCE if p not in failures), Precision.FP32)
