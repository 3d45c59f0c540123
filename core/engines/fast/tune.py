"""Moved to kernels/tune.py (#36). Kept for core/engines/fast/engine.py's import until it names the new place."""
from core.engines.fast.kernels.tune import tune_model  # noqa: F401
