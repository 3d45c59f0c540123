"""Moved to kernels/attn_e4m3.py (#36). Kept for core/engines/fast/engine.py's import until it names the new place."""
from core.engines.fast.kernels.attn_e4m3 import why_not  # noqa: F401
