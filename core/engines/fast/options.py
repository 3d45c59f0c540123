"""The fast engine's switches: its six TRIAGE_* environment variables, read once into one frozen `FastOptions`.

Every switch defaults to on; "0" turns it off (README.md, "GPU hosts", lists them):

- TRIAGE_PDL=0: no programmatic dependent launch (kernels/launch.py).
- TRIAGE_FOLD=0: no kernels folded into the batch-1 linears that read them (model.py, `DecodeGraph.default_folds`).
- TRIAGE_FP8_FAST_ACCUM=0: the W8A8 prompt pass's FP8 GEMMs promote partial sums to float32 (model.py).
- TRIAGE_ATTN_E4M3_CUDA=0: decode attention over the E4M3 cache keeps the Triton kernel (kernels/attn_e4m3.py).
- TRIAGE_FA3=0: the prompt's attention goes through SDPA, not FlashAttention-3 (fa3/).
- TRIAGE_FA3_LIB=PATH: FlashAttention-3's library file (default: fa3/build/libtriage_fa3.so).

`options()` reads the environment the first time it is asked and keeps the result for the process. Tests and
benchmarks that compare both sides of a switch use `overridden(...)` rather than the environment.
Importing this module imports neither torch nor triton.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class FastOptions:
    pdl: bool = True  # TRIAGE_PDL
    fold: bool = True  # TRIAGE_FOLD
    fp8_fast_accum: bool = True  # TRIAGE_FP8_FAST_ACCUM
    attn_e4m3_cuda: bool = True  # TRIAGE_ATTN_E4M3_CUDA
    fa3: bool = True  # TRIAGE_FA3
    fa3_lib: str | None = None  # TRIAGE_FA3_LIB; None: the default path beside fa3/

    @classmethod
    def from_env(cls, env=None) -> "FastOptions":
        env = os.environ if env is None else env

        def on(name: str) -> bool:
            return env.get(name, "1") != "0"

        return cls(pdl=on("TRIAGE_PDL"), fold=on("TRIAGE_FOLD"), fp8_fast_accum=on("TRIAGE_FP8_FAST_ACCUM"),
                   attn_e4m3_cuda=on("TRIAGE_ATTN_E4M3_CUDA"), fa3=on("TRIAGE_FA3"),
                   fa3_lib=env.get("TRIAGE_FA3_LIB") or None)


_LOCK = threading.Lock()
_CURRENT: FastOptions | None = None


def options() -> FastOptions:
    """The switches in force: the environment as first read in this process, or what `overridden` set."""
    global _CURRENT
    if _CURRENT is None:
        with _LOCK:
            if _CURRENT is None:
                _CURRENT = FastOptions.from_env()
    return _CURRENT


@contextlib.contextmanager
def overridden(**changes) -> Iterator[FastOptions]:
    """Within this block (the whole process) the switches are `options()` with `changes`, e.g.
    `overridden(fa3=False)`: for tests and benchmarks that compare both sides of a switch."""
    global _CURRENT
    before = options()
    _CURRENT = dataclasses.replace(before, **changes)
    try:
        yield _CURRENT
    finally:
        _CURRENT = before
