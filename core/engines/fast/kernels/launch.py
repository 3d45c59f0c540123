"""How the fast engine's Triton kernels are launched: programmatic dependent launch (PDL) where the GPU and Triton
have it, and the launch options every kernel takes (`launch_options`, with `pdl_enter` first in each kernel)."""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
import triton

from core.engines.fast.options import options

try:  # grid dependency control (programmatic dependent launch), Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:
    HAVE_GDC = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


@functools.lru_cache(maxsize=None)
def _hopper_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_available() -> bool:
    """Programmatic dependent launch: a kernel is scheduled while the one before it drains, instead of after it ends,
    and waits (griddepcontrol.wait, `pdl_enter`) before it touches memory. Hopper and later; TRIAGE_PDL=0 turns
    it off."""
    return HAVE_GDC and options().pdl and _hopper_or_later(torch.cuda.current_device())


_PDL_SCOPE = contextvars.ContextVar("pdl_scope", default=False)


@contextlib.contextmanager
def pdl_scope(on: bool):
    """Launches inside use programmatic dependent launch where available. Decode graphs of one row turn it on:
    faster at batch 1, slower at batch 8 on the H200 (docs/fast-engine.md#pdl)."""
    token = _PDL_SCOPE.set(on)
    try:
        yield
    finally:
        _PDL_SCOPE.reset(token)


def launch_options(allowed: bool = True) -> dict:
    """Launch options every kernel here takes: PDL (the constexpr that compiles `pdl_enter` in) and launch_pdl."""
    on = allowed and _PDL_SCOPE.get() and pdl_available()
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


@triton.jit
def pdl_enter():
    """First thing in every kernel: wait until the kernel before has finished and its writes are visible (nothing
    is read or written before that), then let the next kernel be scheduled."""
    gdc_wait()
    gdc_launch_dependents()
