"""The fast engine's Triton kernels (being split by family, #36: kernels.py moved here as linears.py first)."""
from core.engines.fast.kernels.linears import *  # noqa: F401,F403 - the module's names, as before
from core.engines.fast.kernels.linears import (  # noqa: F401 - names with an underscore, used by bench/ and tune.py
    _attn_combine_kernel, _attn_split_kernel, _gemv_kernel, _gemv_prologue_kernel, _launch, _linear_torch,
    _linear_triton, _pdl_enter,
)
