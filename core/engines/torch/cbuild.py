"""The CPU this runs on, and the small C libraries built for it (fp8_cpu.py, int_cpu.py).

A library is built once per machine with the system C compiler into the cache folder, keyed by a hash of its source,
the compiler, its flags and the CPU (`-march=native` code is only valid on the CPU it was built for); a build or
load that fails raises OSError or SubprocessError with the reason, which each caller turns into its fallback.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable
from core.settings import settings

FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-lm"]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_id() -> str:
    """The CPU model and flags lines of /proc/cpuinfo ("" where it cannot be read)."""
    lines = [ln for ln in _cpuinfo().splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """The instruction-set flags of the first CPU (x86 "flags", Arm "Features"); None where /proc/cpuinfo has none."""
    line = next((ln for ln in _cpuinfo().splitlines() if ln.startswith(("flags", "Features"))), "")
    flags = line.partition(":")[2].split()
    return frozenset(flags) if flags else None


def packs_bf16() -> bool:
    """Whether oneDNN takes bf16 weights on this CPU (torch's check: AVX-512 BW/VL/DQ or AVX-NE-CONVERT). Without
    it bf16 linears stay plain: oneDNN refuses to reorder them (an AVX2-only AMD EPYC, 2026-12-02), and where it
    would emulate bf16 it is no faster than F.linear."""
    import torch

    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def packs_fp16() -> bool:
    """Whether oneDNN has fp16 GEMMs on this CPU (AVX-512 FP16 or AMX-FP16). Where it has, fp16 linears stay plain
    `nn.Linear`: packing them natively was never measured on such a CPU."""
    import torch

    return torch.ops.mkldnn._is_mkldnn_fp16_supported()


def build(name: str, source: str, cache: Path) -> ctypes.CDLL:
    """Compile `source` into cache/<name>_<key>.so unless it is there, and load it (`Library` does this once)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler (cc or gcc) on PATH")
    key = hashlib.sha256("\n".join([source, " ".join(FLAGS), cc, cpu_id()]).encode()).hexdigest()[:16]
    target = cache / f"{name}_{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / f"{name}.c"
            src.write_text(source)
            out = Path(tmp) / target.name
            proc = subprocess.run([cc, *FLAGS, "-o", str(out), str(src)], capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise OSError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
            os.replace(out, target)  # atomic: a concurrent builder writes the same bytes
    return ctypes.CDLL(str(target))


def kernel_dir() -> Path:
    from core.models import cache_dir

    return cache_dir() / "kernels"


class Library:
    """One C library of this project, built at most once per process. `declare(lib)` gives its functions their
    ctypes signatures and returns why the library cannot serve on this CPU, or None. Where it cannot be built or
    serve, or the environment variable `off_var` is "0", callers take their torch path: `available()` says whether
    to use it, `why_not()` why not."""

    def __init__(self, name: str, source: str, declare: Callable[[ctypes.CDLL], str | None], off_var: str,
                 what: str):
        self.name, self.source, self.declare, self.off_var, self.what = name, source, declare, off_var, what
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._why_not: str | None = None
        self._off = threading.local()

    def get(self) -> ctypes.CDLL | None:
        """The built library, or None (then `why_not()` says why)."""
        if self._lib is not None or self._why_not is not None:
            return self._lib
        with self._lock:
            if self._lib is None and self._why_not is None:
                if self.off_var in settings().cpu_kernels_off:
                    self._why_not = f"turned off by {self.off_var}=0"
                    return None
                try:
                    lib = build(self.name, self.source, kernel_dir())
                    problem = self.declare(lib)
                except (OSError, subprocess.SubprocessError) as exc:
                    self._why_not = f"{self.what} could not be built ({exc})"
                    return None
                if problem:
                    self._why_not = problem
                    return None
                self._lib = lib
        return self._lib

    @contextlib.contextmanager
    def turned_off(self):
        """Within this block (this thread only) callers take their torch path: for benchmarks and tests that
        compare."""
        self._off.on, before = True, getattr(self._off, "on", False)
        try:
            yield
        finally:
            self._off.on = before

    def available(self) -> bool:
        return not getattr(self._off, "on", False) and self.get() is not None

    def why_not(self) -> str | None:
        self.get()
        return self._why_not
