"""What every linear method of the fast engine provides, and `Linear`, a method plus its tensors.

A method is one precision family (methods/__init__.py's METHODS names them): it owns its weight format
(`quantize`), its eager reference numerics (`ref`, delegating to the torch engine's), its prompt-pass product
(`prompt`), its decode product (`decode`: the tuning table's winner for the shape, or `default_config`), what the
decode step may fold into it (`folds`, `prologue`) and its tuner candidates (`candidates`: named kernel launches,
timed by methods/tuner.py). The kernel modes (strings or ints a kernel takes) are made only inside a method.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.engines.fast.methods import tuning
from core.precision import Precision


@dataclass(frozen=True)
class Launch:
    """One named kernel launch a tuner may pick: `run(weights, x, out, cfg, silu_x)` computes out[M, N] = x @ W^T
    (with silu_x, x is [M, 2K] gate|up and the input SiLU(gate) * up); `configs(rows, n, k)` lists its candidate
    launch parameters for one shape; `takes(weights, rows)` says whether it can run it (else the method's first
    launch runs the cfg's shape). `product(weights, x, cfg, silu_x, **inputs)`, where given, returns the product in
    the kernel's own output instead of `out` (a library's float32 tensor: kernels/library.py), which the decode step
    reads as it is (its next kernel rounds to bf16 as it loads), saving the copy into `out`."""
    name: str
    run: Callable
    configs: Callable[[int, int, int], list[dict]]
    takes: Callable = lambda weights, rows: True
    product: Callable | None = None


class LinearMethod:
    """A precision family's linears. Subclasses set `precisions` and the flags, and define quantize / ref /
    launches / default_config / timing_weights; `prompt`, `decode` and `candidates` follow from them."""

    precisions: tuple[Precision, ...] = ()
    folds: frozenset = frozenset()  # DecodeGraph folds measured faster at batch 1 (docs/fast-engine.md#folds)
    prologue = False  # has a one-row product with the norm folded in front (kernels.gemv_prologue)
    e4m3_inputs = False  # the decode kernels read E4M3 copies of their inputs, written by the producing kernels
    f16_inputs = False  # at several rows the decode kernels read f16 copies of their inputs
    needs_calibration = False  # quantize needs activation statistics (AWQ's input scales)
    tune_tolerance = 2e-2  # a candidate further than this from the expected product is broken, not timed

    def __init__(self, precision: Precision):
        if precision not in self.precisions:
            raise ValueError(f"{type(self).__name__} runs {[p.value for p in self.precisions]}, not {precision}")
        self.precision = precision

    # ---- weight format and numerics (subclasses) ----
    def quantize(self, weight: torch.Tensor, calibration=None):
        """The stored weights of one fused bf16 projection [N, K]; calibration: what needs_calibration asks for."""
        raise NotImplementedError

    def ref(self, weights, x: torch.Tensor) -> torch.Tensor:
        """The torch engine's eager numerics for these weights."""
        raise NotImplementedError

    def prompt(self, weights, x: torch.Tensor) -> torch.Tensor:
        """The prompt pass's product (many rows), with `ref`'s numerics."""
        return self.ref(weights, x)

    # ---- decode launches and their tuner ----
    def launches(self) -> dict[str, Launch]:
        """This method's named kernel launches, the first the fallback; add a library's here (docs/fast-engine.md)."""
        raise NotImplementedError

    def default_config(self, rows: int, n: int, k: int) -> dict:
        raise NotImplementedError

    def config(self, rows: int, n: int, k: int) -> dict:
        """The launch for one shape: the tuning table's winner, else the default (also when the winner is a library
        launch this machine does not have, e.g. gemlite not installed)."""
        won = tuning.winner(self.precision, rows, n, k)
        if won is None or ("kernel" in won and won["kernel"] not in self.launches()):
            return self.default_config(rows, n, k)
        return won

    def chosen(self, weights, rows: int, cfg: dict) -> Launch:
        """The launch cfg["kernel"] names, or the first where it is unknown or does not take this shape."""
        launches = self.launches()
        chosen = launches.get(cfg.get("kernel"), next(iter(launches.values())))
        return chosen if chosen.takes(weights, rows) else next(iter(launches.values()))

    def launch(self, weights, x, out, cfg: dict, silu_x: bool = False, **inputs) -> torch.Tensor:
        """One product through the launch cfg["kernel"] names, no fallback: what the tuner times."""
        return self.chosen(weights, x.shape[0], cfg).run(weights, x, out, cfg, silu_x, **inputs)

    def decode(self, weights, x, out, silu_x: bool = False, **inputs) -> torch.Tensor:
        """The decode product written into `out`: `launch` with this shape's configuration."""
        n, k = self.shape(weights)
        return self.launch(weights, x, out, self.config(x.shape[0], n, k), silu_x, **inputs)

    def product(self, weights, x, out, silu_x: bool = False, **inputs) -> torch.Tensor:
        """The decode step's product: `out`, or the launch's own output where it has a `product` (Launch)."""
        self.decode(weights, x, out, silu_x, **inputs)
        return out

    def input_divisors(self, weights, rows: int) -> torch.Tensor | None:
        """[S, K] float32 input scales the kernel producing this linear's input divides by (kernels/norm.py's
        `div`), passed back as `x_div`; None: the linear reads its input as it is (all but INT4 AWQ's library
        launches)."""
        return None

    def decode_prologue(self, weights, x, out, delta, x_out, norm_weight, eps: float, silu_out: bool):
        """One row with the norm (and W8A8's quantization) folded in front; methods with `prologue` only."""
        raise NotImplementedError(f"{type(self).__name__} has no folded prologue (its `folds` are empty)")

    def candidates(self, rows: int, n: int, k: int, kernels: set[str] | None = None) -> list[dict]:
        """Every launch configuration the tuner times for one shape (only those of `kernels` when given)."""
        return [{"kernel": name, **cfg} for name, la in self.launches().items()
                if kernels is None or name in kernels for cfg in la.configs(rows, n, k)]

    def timing_weights(self, n: int, k: int, segments: list[int], copies: int, device="cuda") -> list:
        """`copies` random weights of an [n, k] projection fused from `segments` rows, for the tuner."""
        raise NotImplementedError

    def timing_inputs(self, rows: int, k: int, device="cuda") -> tuple[torch.Tensor, dict]:
        """Activations [rows, k] as the decode step gives them to `launch`, and the launch's extra inputs."""
        return torch.randn(rows, k, device=device, dtype=torch.bfloat16), {}

    def expected(self, weights, x: torch.Tensor, inputs: dict) -> torch.Tensor | None:
        """The product a candidate must reproduce (within tune_tolerance); None: the first candidate's result."""
        return None

    # ---- what it ran ----
    def label(self) -> str:
        """What the decode linears run, for the engine's `ran` line ("" when nothing beyond the default)."""
        return ""

    @staticmethod
    def shape(weights) -> tuple[int, int]:
        return weights.n, weights.k


class Linear:
    """One fused projection: a method plus its tensors."""

    def __init__(self, method: LinearMethod, weight: torch.Tensor, calibration=None):
        self.method = method
        self.out_features, self.in_features = weight.shape
        self.weights = method.quantize(weight, calibration)

    def tensors(self) -> list[torch.Tensor]:
        return self.weights.tensors()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def ref(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.ref(self.weights, x)

    def prompt(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.prompt(self.weights, x)

    def fast(self, x, x_scale, out, silu_x: bool = False, x16=None, x_div=None):
        """The decode product, returned: `out` (bf16), or a library kernel's own output that the step's next kernel
        reads instead (float32 that it rounds to bf16 as it loads; for INT4 AWQ possibly one row block per fused
        projection: LinearMethod.product). x_scale: W8A8 FP8's per-token scale of its E4M3 x; x16: x in f16 where
        its producer wrote that copy; x_div: x divided by `input_divisors`, where its producer wrote that."""
        inputs = dict(x_scale=x_scale, x16=x16) | ({} if x_div is None else {"x_div": x_div})
        return self.method.product(self.weights, x, out, silu_x, **inputs)

    def input_divisors(self, rows: int) -> torch.Tensor | None:
        """LinearMethod.input_divisors at this batch."""
        return self.method.input_divisors(self.weights, rows)

    def fast_prologue(self, x, out, delta=None, x_out=None, norm_weight=None, eps: float = 0.0,
                      silu_out: bool = False):
        """One row with the norm folded in front (methods with `prologue` only)."""
        return self.method.decode_prologue(self.weights, x, out, delta, x_out, norm_weight, eps, silu_out)
